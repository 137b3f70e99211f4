"""Goldens per accelerator model (issue 55 item 7): the model a golden records, the line that names another model
first, and the layout that keeps ``golden/<scenario>/<device>@<model>/`` beside ``<device>/``.

No NPU or GPU: ``npu-smi`` and ``nvidia-smi`` are fake scripts on PATH printing those tools' published formats (the
npu-smi table of tests/test_stack.py; nvidia-smi's ``--query-gpu=name --format=csv,noheader`` rows), and the runs are
prepared directories whose ``run.json`` names the model. What real 910B/910C/H100/H200 hosts print was not seen here
(docs/goldens.md, "Another accelerator model").
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from harness_testing import TINY, base_data, write_dump, write_run_json
from test_stack import NPU_SMI_INFO

from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.item_key import ItemKey
from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.goldens.manifest import MANIFEST
from precision_harness.goldens.store import GoldenStore
from precision_harness.options import PrecisionOptions
from precision_harness.paths import join_inside
from precision_harness.report.item_record import ItemRecord
from precision_harness.report.precision_report import PrecisionReport
from precision_harness.runs.host import rank_env, stack
from precision_harness.runs.launch import RunResult
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session import PrecisionSession
from precision_harness.session_plan import model_folder

CPU = {"python": "3.11.7", "torch": "2.13.0+cpu", "num_threads": 1, "cpu_model": "AMD EPYC 7B13"}
H100 = {**CPU, "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "accelerator_model": "H100 80GB HBM3"}
H200 = {**CPU, "device": "cuda", "gpu": "NVIDIA H200", "accelerator_model": "H200"}


def _tool(bin_dir: Path, name: str, output: str) -> None:
    """A fake vendor tool on PATH that prints ``output`` whatever its arguments."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / f"{name}.out").write_text(output)
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\ncat '{bin_dir / f'{name}.out'}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def tools(tmp_path: Path, monkeypatch):
    """``tools(name, output)``: put a fake ``npu-smi``/``nvidia-smi`` first on PATH."""
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return lambda name, output: _tool(bin_dir, name, output)


# ------------------------------------------------------------------------------ what is recorded
def test_both_readings_of_a_model_are_one_name() -> None:
    """torch_npu says ``Ascend910B3``, npu-smi ``910B3``; torch and nvidia-smi say ``NVIDIA H100 80GB HBM3``."""
    assert stack.model_name("npu", "Ascend910B3") == stack.model_name("npu", " 910B3 ") == "910B3"
    assert stack.model_name("npu", "Ascend910_9392") == "910_9392"
    assert stack.model_name("cuda", "NVIDIA  H100 80GB HBM3") == "H100 80GB HBM3"
    assert stack.model_name("cuda", "Tesla V100-SXM2-16GB") == "Tesla V100-SXM2-16GB"
    assert stack.model_name("cpu", "AMD EPYC 7B13") is None and stack.model_name("npu", None) is None
    # a golden recorded before accelerator_model: its device's own reading, normalised
    assert stack.model_of({"device": "npu", "npu_chip": "Ascend910B1"}) == "910B1"
    assert stack.model_of({"gpu": "NVIDIA H200"}) == "H200"
    assert stack.model_of({"accelerator_model": "910B3", "npu_chip": "Ascend910B1"}) == "910B3"
    assert stack.model_of(CPU) is None


def test_the_vendor_tools_reading_is_recorded_under_one_key(tools, tmp_path: Path, monkeypatch) -> None:
    """npu and cuda stacks (built-in, command and verl runs all take it) carry ``accelerator_model``; so does a verl
    rank's own record."""
    tools("npu-smi", NPU_SMI_INFO)
    tools("nvidia-smi", "NVIDIA H200\nNVIDIA H200\n")
    npu = stack.accelerator_stack("npu", {})
    assert (npu["npu_chip"], npu["npu_count"], npu["accelerator_model"]) == ("910B1", 2, "910B1")
    cuda = stack.accelerator_stack("cuda", {})
    assert (cuda["gpu"], cuda["gpu_count"], cuda["accelerator_model"]) == ("NVIDIA H200", 2, "H200")
    assert (stack.host_model("npu"), stack.host_model("cuda"), stack.host_model("cpu")) == ("910B1", "H200", None)
    assert rank_env.write(tmp_path / "run", 0, "npu") is not None
    assert rank_env.read(tmp_path / "run")[0]["accelerator_model"] == "910B1"


def test_a_built_in_run_takes_the_tools_model_else_torchs() -> None:
    """``devices.fingerprint``'s last step: torch's ``npu_chip`` wins as the raw name, the tool's reading as the model
    (the gate reads the tool too, before the run, to pick the golden)."""
    tool_and_torch = {"device": "npu", "accelerator_model": "910B3", "npu_chip": "Ascend910B3"}
    assert stack.with_model(tool_and_torch) == tool_and_torch
    assert stack.with_model({"device": "npu", "npu_chip": "Ascend910B3"})["accelerator_model"] == "910B3"
    assert stack.with_model({"device": "cuda", "gpu": "NVIDIA H200"})["accelerator_model"] == "H200"
    assert stack.with_model(CPU) == CPU


def test_a_host_without_the_tool_records_no_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither tool
    assert "accelerator_model" not in stack.accelerator_stack("cuda", {})
    assert stack.host_model("npu") is None


# ----------------------------------------------------------------------- said first, said once
def test_another_model_leads_the_environment_line() -> None:
    env = EnvironmentDiff.between({**H100, "torch": "2.13.0"}, {**H200, "torch": "2.14.0"})
    assert env.headline() == (
        "recorded on H100 80GB HBM3, checked on H200 (another accelerator model); "
        "environment differs from the golden's: torch 2.13.0 -> 2.14.0"
    )
    assert env.summary.startswith("accelerator model H100 80GB HBM3 -> H200; torch")  # report.json/md/html, JUnit
    alone = EnvironmentDiff.between(H100, H200)
    assert alone.headline() == "recorded on H100 80GB HBM3, checked on H200 (another accelerator model)"


def test_one_chip_read_two_ways_is_no_difference() -> None:
    """An older golden with torch_npu's chip name against a run with npu-smi's: the same model, nothing said."""
    old = {**CPU, "device": "npu", "npu_chip": "Ascend910B3"}
    run = {**CPU, "device": "npu", "npu_chip": "910B3", "accelerator_model": "910B3"}
    assert EnvironmentDiff.between(old, run).changes == ()


def test_the_summary_says_another_model_once_when_everything_passes() -> None:
    env = EnvironmentDiff.between(H100, H200)
    report = PrecisionReport(mode="check")
    report.records = [
        ItemRecord(
            nodeid=f"scenarios/grpo_tiny.yaml::{stage}[step_1]",
            scenario="grpo_tiny",
            step=1,
            stage=stage,
            kind="compared",
            passed=True,
            text="...",
            environment_diff=env.to_json(),
        )
        for stage in ("a", "b")
    ]
    assert [line for line in report.lines if "recorded on" in line] == [
        "recorded on H100 80GB HBM3, checked on H200 (another accelerator model): checked, the goldens held"
    ]


# ------------------------------------------------------------------------------------- layout
def test_a_model_folder_stays_one_plain_name_inside_golden(tmp_path: Path) -> None:
    assert model_folder("cuda", "H100 80GB HBM3") == "cuda@H100-80GB-HBM3"
    assert model_folder("npu", "910B1, 910B3") == "npu@910B1-910B3"
    assert model_folder("npu", "../../etc/passwd") == "npu@etc-passwd"
    assert model_folder("npu", "..") == "npu" and model_folder("npu", "/") == "npu"
    assert len(model_folder("cuda", "x" * 500)) == len("cuda@") + 64
    for model in ("../../etc/passwd", "a\x00b", "\\..\\x", ".", "C:\\"):
        join_inside(tmp_path, "s", model_folder("npu", model), what="golden <scenario>/<device>")


def _run_dir(root: Path, scenario: Scenario, env: dict, drift: float = 0.0) -> Path:
    for step in scenario.steps:
        for stage in scenario.stages:
            data = base_data()
            data["Functional.linear.0.forward"]["output"][0]["Norm"] *= 1 + drift
            write_dump(root / f"step_{step}" / stage, data)
    return write_run_json(root, scenario, env)


@pytest.fixture
def pool(tmp_path: Path, tools):
    """``pool(host, run_env, mode)``: a session on a cuda host whose nvidia-smi names ``host``, its run a prepared
    directory with ``run_env``; the outcome of ``actor_update @ step_1`` and the golden root."""
    (tmp_path / "scenarios").mkdir()
    shutil.copy(TINY, tmp_path / "scenarios" / "tiny_ppo.yaml")
    scenario = Scenario.load(tmp_path / "scenarios" / "tiny_ppo.yaml")
    golden = tmp_path / "golden"

    def gate(host: str, run_env: dict, mode: str = "check", drift: float = 0.0, golden_device: str | None = None):
        tools("nvidia-smi", f"{host}\n")
        target = _run_dir(tmp_path / f"run{len(list(tmp_path.glob('run*')))}", scenario, run_env, drift)

        def runner(s: Scenario, *, out_dir: Path, **kw) -> RunResult:
            return RunResult(s.name, target, json.loads((target / "run.json").read_text()), 0.1)

        # neither rerun (judgement, localisation): the verdict's lines are what is checked
        quick = {"judgement": "off", "localize": "off", "golden_mode": mode}
        options = PrecisionOptions(device="cuda", golden_device=golden_device, golden_dir=golden, **quick)
        session = PrecisionSession(options, rootdir=tmp_path, runner=runner)
        try:
            return session.outcome(scenario, ItemKey(1, "actor_update"))
        finally:
            session.close()

    return gate, golden, scenario


def _manifest_model(folder: Path) -> str | None:
    return stack.model_of(json.loads((folder / MANIFEST).read_text())["env"])


def test_a_mixed_pool_records_a_golden_per_model_and_checks_each_against_its_own(pool) -> None:
    gate, golden, _ = pool
    first = gate("NVIDIA H100 80GB HBM3", H100, mode="update")
    assert first.kind is OutcomeKind.RECORDED and "golden/tiny_ppo/cuda " in first.text + " "
    assert _manifest_model(golden / "tiny_ppo" / "cuda") == "H100 80GB HBM3"
    before = (golden / "tiny_ppo" / "cuda" / MANIFEST).read_bytes()

    refused = gate("NVIDIA H200", H200)  # no H200 golden yet: said first, with the way to record one
    assert refused.kind is OutcomeKind.ERROR
    assert refused.text.startswith("recorded on H100 80GB HBM3, checked on H200: ")
    assert "record this model's own (" in refused.text and "golden/tiny_ppo/cuda@H200/, beside it" in refused.text

    second = gate("NVIDIA H200", H200, mode="update", drift=1e-3)  # the H200's own numbers
    assert second.kind is OutcomeKind.RECORDED and "golden/tiny_ppo/cuda@H200 " in second.text + " "
    assert (golden / "tiny_ppo" / "cuda" / MANIFEST).read_bytes() == before  # the H100 golden kept
    assert _manifest_model(golden / "tiny_ppo" / "cuda@H200") == "H200"
    assert json.loads((golden / "tiny_ppo" / "cuda@H200" / MANIFEST).read_text())["device"] == "cuda"
    assert sorted(GoldenStore(golden).list()) == [("tiny_ppo", "cuda"), ("tiny_ppo", "cuda@H200")]

    assert gate("NVIDIA H200", H200, drift=1e-3).passed  # against cuda@H200: same-device rules
    on_h100 = gate("NVIDIA H100 80GB HBM3", H100, drift=1e-3)  # against cuda/: the drift is caught
    assert on_h100.kind is OutcomeKind.COMPARED and not on_h100.passed

    again = gate("NVIDIA H100 80GB HBM3", H100, mode="update")  # the device golden's own model re-records in place
    assert again.kind is OutcomeKind.RECORDED and "golden/tiny_ppo/cuda " in again.text + " "


def test_a_golden_without_its_model_still_loads_and_a_re_record_adds_it(pool) -> None:
    gate, golden, scenario = pool
    old = {**CPU, "device": "cuda"}
    GoldenStore(golden).promote(_run_dir(golden.parent / "old", scenario, old), scenario, "cuda")
    out = gate("NVIDIA H200", H200, drift=1e-3)
    assert out.kind is OutcomeKind.COMPARED and not out.passed  # gated as before, against cuda/
    assert "environment not fully recorded: accelerator model not recorded -> H200" in out.text
    assert gate("NVIDIA H200", H200, mode="update").kind is OutcomeKind.RECORDED
    assert not (golden / "tiny_ppo" / "cuda@H200").exists()  # no model to keep apart from: re-recorded in place
    assert _manifest_model(golden / "tiny_ppo" / "cuda") == "H200"


def test_across_models_on_purpose_a_failing_item_names_the_models_first(pool) -> None:
    """--precision-golden-device: the cross-device band (fp32 rtol 1e-3); beyond it, the models lead the item."""
    gate, _, _ = pool
    assert gate("NVIDIA H100 80GB HBM3", H100, mode="update").kind is OutcomeKind.RECORDED
    within = gate("NVIDIA H200", {**H200, "torch": "2.14.0"}, drift=1e-4, golden_device="cuda")
    assert within.passed, within.text
    beyond = gate("NVIDIA H200", {**H200, "torch": "2.14.0"}, drift=1e-2, golden_device="cuda")
    assert beyond.kind is OutcomeKind.COMPARED and not beyond.passed
    assert beyond.text.splitlines()[1] == (
        "  recorded on H100 80GB HBM3, checked on H200 (another accelerator model); "
        "environment differs from the golden's: torch 2.13.0+cpu -> 2.14.0"
    )


def test_a_host_whose_tool_does_not_answer_is_told_why_its_own_golden_was_not_read(pool) -> None:
    gate, _, _ = pool
    gate("NVIDIA H100 80GB HBM3", H100, mode="update")
    gate("NVIDIA H200", H200, mode="update")  # cuda@H200/
    out = gate("", H200)  # nvidia-smi prints nothing: the model is read only from the run's record, after it
    assert out.kind is OutcomeKind.ERROR and out.text.startswith("recorded on H100 80GB HBM3, checked on H200: ")
    assert "golden/tiny_ppo/cuda@H200/ holds this model's golden" in out.text
    assert out.text.endswith("(nvidia-smi did not answer): put nvidia-smi on PATH so that the check reads it")


def test_missing_records_a_model_without_a_golden_of_its_own(pool) -> None:
    """``--precision-golden missing`` on a mixed pool: each model's first run records its golden, then checks."""
    gate, golden, _ = pool
    assert gate("NVIDIA H100 80GB HBM3", H100, mode="missing").kind is OutcomeKind.RECORDED
    assert gate("NVIDIA H100 80GB HBM3", H100, mode="missing").kind is OutcomeKind.IDENTICAL
    h200 = gate("NVIDIA H200", H200, mode="missing", drift=1e-3)
    assert h200.kind is OutcomeKind.RECORDED and "golden/tiny_ppo/cuda@H200 " in h200.text + " "
    assert gate("NVIDIA H200", H200, mode="missing", drift=1e-3).kind is OutcomeKind.IDENTICAL
    assert _manifest_model(golden / "tiny_ppo" / "cuda") == "H100 80GB HBM3"
