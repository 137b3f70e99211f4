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

    from precision_harness.runs.verl import engine as verl_engine

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


def test_the_device_verl_example_names_its_device() -> None:
    """A plain ``pytest`` runs it on the NPU (the CPU path refuses its rollout.name); cuda is named beside it."""
    text = (VERL_EXAMPLE / "scenarios" / "qwen3_06b_grpo.yaml").read_text()
    assert yaml.safe_load(text)["device"] == "npu"
    assert re.search(r"^#.*\bcuda\b", text, re.M)


def test_the_device_verl_example_without_its_variables_fails_collection_in_one_line_naming_both(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATA_DIR", raising=False)
    monkeypatch.delenv("MODEL_PATH", raising=False)
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "qwen3_06b_grpo.yaml").write_text(
        (VERL_EXAMPLE / "scenarios" / "qwen3_06b_grpo.yaml").read_text()
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--co", "scenarios")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    lines = [line for line in result.stdout.lines if "is not set" in line or "are not set" in line]
    assert len(lines) == 1, result.stdout.str()
    assert "DATA_DIR, MODEL_PATH are not set" in lines[0] and "qwen3_06b_grpo.yaml: inputs:" in lines[0]


def _job_timeout_s(job: dict) -> int:
    if "timeout-minutes" in job:
        return int(job["timeout-minutes"]) * 60
    m = re.fullmatch(r"(\d+)m", str(job["timeout"]))
    assert m, job["timeout"]
    return int(m.group(1)) * 60


@pytest.mark.parametrize("path", [p for p, _ in CI_FILES], ids=["github", "gitlab"])
def test_ci_job_timeouts_fit_the_runs_each_job_makes(path: Path) -> None:
    """A check may rerun once to judge and once at L1 (3 runs); a recording with pinned rollouts runs verl
    twice, three times at level auto: each job outlasts its runs at precision_timeout, with room for setup."""
    jobs = yaml.safe_load(path.read_text())
    jobs = jobs.get("jobs", jobs)
    for name, runs in (("gate", 3), ("golden", 3)):
        job = next(j for n, j in jobs.items() if name in n and isinstance(j, dict) and ("timeout" in str(j)))
        precision_timeout = int(re.search(r"precision_timeout=(\d+)", yaml.safe_dump(job)).group(1))
        assert _job_timeout_s(job) >= runs * precision_timeout + 10 * 60, (name, _job_timeout_s(job))


def test_github_uploads_keep_the_hidden_precision_folder() -> None:
    """upload-artifact 4.4+ leaves hidden paths out unless include-hidden-files is true."""
    jobs = yaml.safe_load((CI / "github-actions.yml").read_text())["jobs"]
    uploads = [s["with"] for j in jobs.values() for s in j["steps"] if "upload-artifact" in s.get("uses", "")]
    hidden = [u for u in uploads if re.search(r"(^|/|\s)\.\w", u["path"])]
    assert hidden and all(u.get("include-hidden-files") is True for u in hidden), uploads


@pytest.mark.parametrize("path", [p for p, _ in CI_FILES], ids=["github", "gitlab"])
def test_ci_jobs_set_the_example_scenarios_variables_and_install_without_an_index(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    env = doc.get("env") or doc.get("variables")
    read = set(re.findall(r"\$\{oc\.env:(\w+)\}", (VERL_EXAMPLE / "scenarios" / "qwen3_06b_grpo.yaml").read_text()))
    assert read == {"DATA_DIR", "MODEL_PATH"} and read <= set(env), env
    assert env["PYTEST_PRECISION"].startswith("pytest-precision @ git+")
    assert '"$PYTEST_PRECISION"' in path.read_text()
