"""examples/: every scenario loads, the verl example composes against verl 0.9.1 and its data is what
verl's RLHFDataset reads, and the CI jobs are valid GitHub Actions / GitLab CI using real options.

The verl example and the CI jobs need an NPU or GPU runner; nothing here runs them (README says so).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from precision_harness.options import OPTIONS
from precision_harness.runs.kind_runners import load_scenario
from precision_harness.scenarios.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CI = EXAMPLES / "ci"
VERL_EXAMPLE = EXAMPLES / "verl_qwen_grpo"
SCENARIOS = sorted(EXAMPLES.glob("*/scenarios/*.yaml"))


def _verl_example_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """DATA_DIR written by the example's prepare_data.py and a MODEL_PATH with a config.json (its inputs);
    returns the data folder."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    pytest.importorskip("pandas")
    data, model = tmp_path / "data", tmp_path / "Qwen3-0.6B"
    env = {**os.environ, "DATA_DIR": str(data)}
    script = VERL_EXAMPLE / "prepare_data.py"
    subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True, timeout=120)
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}\n')
    monkeypatch.setenv("DATA_DIR", str(data))
    monkeypatch.setenv("MODEL_PATH", str(model))
    return data


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.parent.parent.name for p in SCENARIOS])
def test_example_scenarios_load(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if "engine: verl" in path.read_text():
        _verl_example_env(tmp_path, monkeypatch)
    scenario = load_scenario(path)
    # the examples show the gate over runs of one's own; the device template is a built-in one with real shapes
    kinds = ("builtin",) if path.parent.parent.name == "device_shapes" else ("command", "verl")
    assert scenario.kind in kinds and scenario.steps and scenario.stages


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.parent.parent.name for p in SCENARIOS])
def test_example_inputs_are_data_not_code(path: Path) -> None:
    """inputs define the experiment; a .py under inputs would turn a code edit (a regression) into a stale golden."""
    inputs = yaml.safe_load(path.read_text()).get("inputs") or []
    assert not [x for x in inputs if x.endswith(".py")], inputs


def test_verl_example_identity_is_its_data_and_model_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another dataset makes the golden stale; an edit to the reward function (code) does not."""
    data = _verl_example_env(tmp_path, monkeypatch)
    path = VERL_EXAMPLE / "scenarios" / "qwen3_06b_grpo.yaml"
    base = Scenario.load(path)
    assert {k for k in base.identity if k.startswith("inputs[")} == {
        "inputs[${oc.env:DATA_DIR}/train.parquet]",
        "inputs[${oc.env:MODEL_PATH}/config.json]",
    }
    (data / "reward.py").write_text((data / "reward.py").read_text() + "\n# edited\n")
    assert Scenario.load(path).hash == base.hash
    (data / "train.parquet").write_bytes((data / "train.parquet").read_bytes() + b"\0")
    assert Scenario.load(path).hash != base.hash


def _load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_verl_example_data_and_reward_are_what_its_overrides_point_at(tmp_path: Path, monkeypatch) -> None:
    data = _verl_example_env(tmp_path, monkeypatch)
    import pandas as pd

    from precision_harness.runs import verl_engine

    scenario = Scenario.load(VERL_EXAMPLE / "scenarios" / "qwen3_06b_grpo.yaml")
    cfg = verl_engine.compose(scenario.config["verl"]["overrides"])
    for path in (cfg.data.train_files, cfg.data.val_files, cfg.reward.custom_reward_function.path):
        assert Path(path).is_file(), path
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "Qwen3-0.6B")
    assert Path(cfg.data.train_files) == data / "train.parquet"
    train = pd.read_parquet(cfg.data.train_files)
    assert list(train.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(train) == 64 and train.iloc[0]["prompt"][0]["role"] == "user"
    reward = _load_module(Path(cfg.reward.custom_reward_function.path))
    row = train.iloc[0]
    answer = row["reward_model"]["ground_truth"]
    score = getattr(reward, cfg.reward.custom_reward_function.name)
    assert score(row["data_source"], f"The answer is {answer}", answer) == 1.0
    assert score(row["data_source"], f"The answer is {int(answer) + 1}", answer) == 0.0
    again = tmp_path / "again"
    env = {**os.environ, "DATA_DIR": str(again)}
    subprocess.run([sys.executable, str(VERL_EXAMPLE / "prepare_data.py")], env=env, check=True, timeout=120)
    assert (again / "train.parquet").read_bytes() == Path(cfg.data.train_files).read_bytes()


CI_FILES = [(CI / "github-actions.yml", "vendor.github-workflows"), (CI / "gitlab-ci.yml", "vendor.gitlab-ci")]


def _check_jsonschema(path: Path, schema: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("path", "schema"), CI_FILES, ids=["github", "gitlab"])
def test_ci_job_is_valid_for_its_service(path: Path, schema: str, tmp_path: Path) -> None:
    """Valid against the service's own schema (vendored by check-jsonschema); a broken copy is not."""
    pytest.importorskip("check_jsonschema")
    proc = _check_jsonschema(path, schema)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = tmp_path / path.name
    broken.write_text(path.read_text().replace("runs-on:", "run-on:").replace("stage: gate", "stage: [gate, 1]"))
    assert _check_jsonschema(broken, schema).returncode != 0


@pytest.mark.parametrize("path", [p for p, _ in CI_FILES], ids=["github", "gitlab"])
def test_ci_job_gates_publishes_and_keeps_golden_updates_manual(path: Path) -> None:
    text = path.read_text()
    jobs = yaml.safe_load(text)
    jobs = jobs.get("jobs", jobs)
    gate = next(j for name, j in jobs.items() if name.endswith("gate"))
    update = next(j for name, j in jobs.items() if "golden" in name)
    gate_text, update_text = yaml.safe_dump(gate), yaml.safe_dump(update)
    assert "--junitxml" in gate_text and "report.md" in gate_text and "precision-report" in gate_text
    assert "--precision-golden update" not in gate_text and "--precision-golden update" in update_text
    assert "manual" in update_text or "workflow_dispatch" in update_text
    flags = set(re.findall(r"--precision-[a-z-]+", text))
    known = {f"--precision-{o.name}" for o in OPTIONS if o.pytest in ("option", "both")}
    assert flags and flags <= known, flags - known


@pytest.mark.parametrize("path", [p for p, _ in CI_FILES], ids=["github", "gitlab"])
def test_ci_job_suits_a_device_host(path: Path) -> None:
    """One scenario at a time with a timeout, the full history, the gate installed without extras into the
    runner's stack, and only the reports and the failing stages' folders uploaded."""
    text = path.read_text()
    jobs = yaml.safe_load(text)
    jobs = jobs.get("jobs", jobs)
    for job in (j for name, j in jobs.items() if "gate" in name or "golden" in name):
        job_text = yaml.safe_dump(job)
        assert "--precision-jobs 1" in job_text and "precision_timeout=" in job_text
    assert "fetch-depth: 0" in text or 'GIT_DEPTH: "0"' in text
    assert "[verl]" not in "".join(line for line in text.splitlines() if "pip install" in line)
    paths = re.findall(r"^\s+(?:- )?(\S*\.precision/artifacts\S*)\s*$", text, re.M)
    assert paths and all("step_" in p for p in paths), paths
    if "github" in path.name:
        assert "token: ${{ secrets." in text  # a pull request the default token opens starts no workflow


def test_the_device_shapes_template_loads_with_qwen_7b_layer_shapes_and_stays_out_of_the_cpu_gate() -> None:
    import tomllib

    path = ROOT / "examples" / "device_shapes" / "scenarios" / "qwen25_7b_shapes.yaml"
    scenario = load_scenario(path)
    model = scenario.config["model"]
    assert (model["hidden_size"], model["intermediate_size"]) == (3584, 18944)
    assert (model["num_attention_heads"], model["num_key_value_heads"], model["num_hidden_layers"]) == (28, 4, 2)
    data = scenario.config["data"]
    assert data["max_prompt_length"] + data["max_response_length"] == 512
    assert scenario.config["device"] == "npu" and scenario.level == "auto"
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    assert not any(path.is_relative_to(ROOT / p) for p in testpaths)  # never collected by the CPU gate
