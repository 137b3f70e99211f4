"""The environment diff in the gate: first line after a failing verdict's headline, report.json/md/html,
JUnit, the once-only summary line; a golden of another accelerator model is not used silently.

Fast paths only: synthetic dumps and a fake run (no torch, no GPU). The accelerator model is faked in
the run's and the golden's ``env``; the end-to-end test drives a command scenario (a few lines of
Python writing dumps) through pytest.
"""

from __future__ import annotations

import fnmatch
import json
import platform
import shutil
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from harness_testing import TINY, base_data, has_cpu_flag, write_dump, write_run_json

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.item_key import ItemKey
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import OutcomeKind, check_items
from precision_harness.cli import main
from precision_harness.goldens.golden import Golden
from precision_harness.goldens.store import GoldenStore
from precision_harness.options import PrecisionOptions
from precision_harness.report.item_record import ItemRecord
from precision_harness.report.precision_report import PrecisionReport
from precision_harness.runs.launch import RunResult
from precision_harness.scenarios.scenario import Scenario
from precision_harness.schemas import load_schema
from precision_harness.session import PrecisionSession

ENV = {
    "python": "3.11.7",
    "torch": "2.13.0+cpu",
    "device": "cpu",
    "num_threads": 1,
    "cpu_vendor": "AuthenticAMD",
    "cpu_model": "AMD EPYC 7B13",
    "cpu_flags": "avx2 fma",
}
TORCH_UP = {**ENV, "torch": "2.14.0+cpu"}
H100 = {**ENV, "device": "cuda", "gpu": "NVIDIA H100", "gpu_capability": "9.0"}
A100 = {**H100, "gpu": "NVIDIA A100", "gpu_capability": "8.0"}
ENV_LINE = "  environment differs from the golden's: torch 2.13.0+cpu -> 2.14.0+cpu"


def _drift(data: dict) -> None:
    """1e-4 relative on one output Norm: beyond fp32's same-device rtol, within the cross-device 1e-3."""
    data["Functional.linear.0.forward"]["output"][0]["Norm"] *= 1 + 1e-4


# ------------------------------------------------------------------------- verdict placement
def _check(tmp_path: Path, env: EnvironmentDiff, mutate=None) -> list:
    for side, change in (("golden", None), ("target", mutate)):
        data = base_data()
        if change:
            change(data)
        write_dump(tmp_path / side / "step_1" / "actor_update", data)
        (tmp_path / side / "metrics.jsonl").write_text(json.dumps({"training/global_step": 1, "loss": 1.0}) + "\n")
    if mutate:
        (tmp_path / "target" / "metrics.jsonl").write_text(json.dumps({"training/global_step": 1, "loss": 2.0}) + "\n")
    settings = CheckSettings(scenario="s", policy=TolerancePolicy(), environment=env)
    keys = [ItemKey(1, "actor_update"), ItemKey()]
    return [
        out for _, out in check_items(tmp_path / "target", Golden.from_run_dir(tmp_path / "golden"), keys, settings)
    ]


def _environment(lines: list[str]) -> str:
    """The environment's line: the first after the headline."""
    assert lines[1].startswith("  environment "), lines
    return lines[1]


#: what a verdict adds where other stages of the same run held on this machine
HELD = "; alone it does not explain this drift: 9 other stage dump(s) of this run are identical to their goldens"


def test_failing_verdict_names_the_environment_first(tmp_path: Path) -> None:
    """A stage's and the metrics' verdict name the environment first after the headline; the stage's then says
    where the change entered."""
    stage, metrics = _check(tmp_path, EnvironmentDiff.between(ENV, TORCH_UP), _drift)
    assert not stage.passed and not metrics.passed
    for out in (stage, metrics):
        lines = out.text.splitlines()
        assert "beyond tolerance" in lines[0]  # the headline, then the environment
        assert lines[1] == ENV_LINE, out.text
        assert out.environment.differs
    assert stage.text.splitlines()[2].startswith("  change entered    this API computes differently now")


def test_passing_verdict_and_same_environment_say_nothing(tmp_path: Path) -> None:
    passing = _check(tmp_path / "a", EnvironmentDiff.between(ENV, TORCH_UP))
    assert all(o.passed and "environment" not in o.text for o in passing)
    assert passing[0].environment.differs  # the record still carries it, for the summary
    same = _check(tmp_path / "b", EnvironmentDiff.between(ENV, ENV), _drift)
    assert not same[0].passed and "environment" not in same[0].text


# --------------------------------------------------------------- the session, device model faked
def _run_dir(root: Path, scenario: Scenario, env: dict, mutate=None) -> Path:
    for step in scenario.steps:
        for stage in scenario.stages:
            data = base_data()
            if mutate and (step, stage) == (1, "actor_update"):
                mutate(data)
            write_dump(root / f"step_{step}" / stage, data)
    write_run_json(root, scenario, env)
    return root


@pytest.fixture
def gate(tmp_path: Path):
    """``gate(golden_env, run_env, golden_device=None)``: a session on cuda whose run is a prepared directory
    (the session's runner a fake), and the outcome of ``actor_update @ step_1``."""
    (tmp_path / "scenarios").mkdir()
    shutil.copy(TINY, tmp_path / "scenarios" / "tiny_ppo.yaml")
    scenario = Scenario.load(tmp_path / "scenarios" / "tiny_ppo.yaml")

    def check(golden_env: dict, run_env: dict, golden_device: str | None = None):
        root = tmp_path / f"case{len(list(tmp_path.glob('case*')))}"
        GoldenStore(root / "golden").promote(_run_dir(root / "recorded", scenario, golden_env), scenario, "cuda")
        target = _run_dir(root / "target", scenario, run_env, _drift)

        def runner(s: Scenario, *, out_dir: Path, **kw) -> RunResult:
            return RunResult(s.name, target, json.loads((target / "run.json").read_text()), 0.1)

        options = PrecisionOptions(device="cuda", golden_device=golden_device, golden_dir=root / "golden")
        session = PrecisionSession(options, rootdir=tmp_path, runner=runner)
        try:
            return session.outcome(scenario, ItemKey(1, "actor_update"))
        finally:
            session.close()

    return check


def test_another_gpu_models_golden_is_not_used_silently(gate) -> None:
    out = gate(H100, A100)
    assert out.kind is OutcomeKind.ERROR and not out.passed
    assert "\n" not in out.text
    assert out.text.startswith("recorded on H100, checked on A100: ")  # the models before anything else
    assert "record this model's own (" in out.text and "/golden/tiny_ppo/cuda@A100/, beside it)" in out.text
    assert "--precision-golden-device cuda (tolerance.cross_device rules)" in out.text
    assert "--precision-golden update" in out.text


def test_golden_device_gates_another_model_with_cross_device_rules(gate) -> None:
    out = gate(H100, A100, golden_device="cuda")
    assert out.passed, out.text  # 1e-4 relative: within the cross-device fp32 rtol 1e-3
    assert out.environment.device_model is not None


def test_same_model_keeps_same_device_rules_and_names_the_upgrade(gate) -> None:
    out = gate(H100, {**H100, "torch": "2.14.0+cpu"})
    assert not out.passed and out.kind is OutcomeKind.COMPARED
    # the run's nine other stage dumps are identical to the golden's on this machine: named, not the suspect
    assert _environment(out.text.splitlines()).startswith(ENV_LINE + HELD)


def test_cpu_models_are_not_device_models(gate) -> None:
    """Goldens on CPU are portable across CPUs: another CPU is named, never refused."""
    xeon = {**H100, "cpu_vendor": "GenuineIntel", "cpu_model": "Intel Xeon", "cpu_flags": "avx2 fma avx512f"}
    out = gate(H100, xeon)
    assert out.kind is OutcomeKind.COMPARED
    assert (
        _environment(out.text.splitlines())
        == "  environment differs from the golden's: CPU AMD EPYC 7B13 -> Intel Xeon (avx512f)"
        + HELD
        + " on this machine"
    )


def test_golden_without_its_model_still_gates(gate) -> None:
    old = {k: v for k, v in H100.items() if k not in ("gpu", "gpu_capability")}
    out = gate(old, A100)
    assert out.kind is OutcomeKind.COMPARED
    assert _environment(out.text.splitlines()).startswith(
        "  environment not fully recorded: accelerator model not recorded -> A100"
    )


def test_compare_applies_cross_device_rules_to_another_model(tmp_path: Path, capsys) -> None:
    """``precision-harness compare`` reads both run.json: another GPU model is another device's kernels."""
    scenario = Scenario.load(TINY)
    golden = _run_dir(tmp_path / "golden", scenario, H100)
    artifacts = ["--artifacts", str(tmp_path / "artifacts")]
    a100 = _run_dir(tmp_path / "a100", scenario, A100, _drift)
    assert main(["compare", str(a100), str(golden), *artifacts]) == 0  # within the cross-device fp32 rtol 1e-3
    upgraded = _run_dir(tmp_path / "upgraded", scenario, {**H100, "torch": "2.14.0+cpu"}, _drift)
    capsys.readouterr()
    assert main(["compare", str(upgraded), str(golden), *artifacts]) == 1
    out = capsys.readouterr().out.splitlines()
    failing = next(i for i, line in enumerate(out) if line.startswith("FAIL actor_update @ step_1"))
    assert _environment(out[failing:]) == ENV_LINE  # one stage compared alone: nothing else held


# ----------------------------------------------------------------------- report and summary
def _record(scenario: str, stage: str, env: EnvironmentDiff, *, passed: bool = True) -> ItemRecord:
    return ItemRecord(
        nodeid=f"scenarios/{scenario}.yaml::{stage}[step_1]",
        scenario=scenario,
        step=1,
        stage=stage,
        kind="identical" if passed else "compared",
        passed=passed,
        text=f"{stage} @ step_1, rank0: ..." if passed else f"{stage} @ step_1: 1 beyond\n  {env.headline()}",
        environment_diff=env.to_json(),
    )


def _summary(report: PrecisionReport) -> list[str]:
    return [line for line in report.lines if "environment" in line]


def test_passing_run_says_it_once() -> None:
    env = EnvironmentDiff.between(ENV, TORCH_UP)
    report = PrecisionReport(mode="check")
    report.records = [_record(s, st, env) for s in ("grpo_tiny", "ppo_gae_tiny") for st in ("a", "b", "c")]
    assert _summary(report) == [
        "environment differs from the golden's (torch 2.13.0+cpu -> 2.14.0+cpu): checked, the goldens held"
    ]


def test_failing_run_and_different_diffs_name_their_scenarios() -> None:
    report = PrecisionReport(mode="check")
    report.records = [
        _record("grpo_tiny", "a", EnvironmentDiff.between(ENV, TORCH_UP), passed=False),
        _record("ppo_gae_tiny", "a", EnvironmentDiff.between(ENV, {**ENV, "num_threads": 2})),
        _record("same_env", "a", EnvironmentDiff()),
    ]
    assert _summary(report) == [
        "environment differs from the golden's for grpo_tiny (torch 2.13.0+cpu -> 2.14.0+cpu): "
        "1 failed item(s) name it",
        "environment differs from the golden's for ppo_gae_tiny (threads 1 -> 2): checked, the goldens held",
    ]


def test_not_recorded_alone_is_a_quiet_note() -> None:
    old = {k: v for k, v in ENV.items() if not k.startswith("cpu_")}
    report = PrecisionReport(mode="check")
    report.records = [_record("grpo_tiny", "a", EnvironmentDiff.between(old, ENV))]
    (line,) = _summary(report)
    assert line.startswith("environment not fully recorded (older goldens record less; a re-record adds it): ")
    assert line.endswith("CPU not recorded -> AMD EPYC 7B13 (avx2, fma)")
    assert "differs" not in line


def test_report_files_and_junit_carry_the_diff(tmp_path: Path) -> None:
    env = EnvironmentDiff.between(ENV, TORCH_UP)
    report = PrecisionReport(mode="check")
    report.records = [_record("grpo_tiny", "a", env, passed=False), _record("grpo_tiny", "b", env)]
    report.write(tmp_path)
    doc = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(doc, load_schema("report"))
    row = {"what": "torch", "golden": "2.13.0+cpu", "run": "2.14.0+cpu"}
    assert doc["scenarios"][0]["environment_diff"] == [row]
    assert [r["environment_diff"] for r in doc["items"]] == [[row], [row]]
    md = (tmp_path / "report.md").read_text()
    assert "### Environment differs from the golden's\n\n- grpo_tiny: torch 2.13.0+cpu -> 2.14.0+cpu\n" in md
    html = (tmp_path / "report.html").read_text()
    assert '<section id="environment">' in html and "torch 2.13.0+cpu -&gt; 2.14.0+cpu" in html
    props = dict(report.records[0].user_properties())
    assert props["precision_environment_diff"] == "torch 2.13.0+cpu -> 2.14.0+cpu"
    bad = {**doc, "items": [{**doc["items"][0], "environment_diff": [{"what": "torch"}]}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, load_schema("report"))


def test_same_environment_adds_nothing_to_the_report(tmp_path: Path) -> None:
    report = PrecisionReport(mode="check")
    report.records = [_record("grpo_tiny", "a", EnvironmentDiff())]
    report.write(tmp_path)
    assert "Environment" not in (tmp_path / "report.md").read_text()
    assert 'id="environment"' not in (tmp_path / "report.html").read_text()
    assert "precision_environment_diff" not in dict(report.records[0].user_properties())
    assert _summary(report) == []


# -------------------------------------------------------------- end to end: a command scenario
FAKE = textwrap.dedent(
    """
    import json, os
    from pathlib import Path

    data = json.loads(Path(__file__).with_name("dump_data.json").read_text())
    root = Path(os.environ["PRECISION_DUMP_DIR"])
    for step in map(int, os.environ["PRECISION_STEPS"].split(",")):
        for stage in os.environ["PRECISION_STAGES"].split(","):
            out = root / f"step_{step}" / stage / "step0" / "rank0"
            out.mkdir(parents=True, exist_ok=True)
            dump = json.loads(json.dumps(data))
            if step == 2:
                dump["Functional.linear.0.forward"]["output"][0]["Norm"] *= float(os.environ.get("FAKE_SCALE", "1"))
            out.joinpath("dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "data": dump}))
            out.joinpath("construct.json").write_text("{}")
    """
)


@pytest.fixture
def command_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A command scenario (a fake training run) with its golden recorded, then the golden's environment
    rewritten: recorded on another CPU with another python."""
    scenarios = pytester.path / "scenarios"
    scenarios.mkdir()
    (scenarios / "fake_train.py").write_text(FAKE)
    (scenarios / "dump_data.json").write_text(json.dumps(base_data()))
    (scenarios / "fake.yaml").write_text(
        f"command: [{json.dumps(sys.executable)}, fake_train.py]\n"
        "inputs: [fake_train.py]\n"
        "global_profiler:\n"
        "  steps: [1, 2]\n"
        "  global_tool_config:\n"
        "    precision_debugger:\n"
        "      stages: [actor_update]\n"
        "      strict: true\n"
    )
    (pytester.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.runpytest_subprocess("--precision-golden", "update").assert_outcomes(passed=2)
    path = pytester.path / "golden/fake/cpu/manifest.json"
    manifest = json.loads(path.read_text())
    assert {"cpu_model", "cpu_flags", "num_threads", "determinism_env"} <= set(manifest["env"])  # recorded
    manifest["env"].update(python="3.10.0", cpu_model="Intel Xeon", cpu_flags=" ".join(sorted(_amx_toggled(manifest))))
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return pytester


def _amx_toggled(manifest: dict) -> set[str]:
    """The recording machine's ISA flags with amx_bf16 added, or removed where this machine has it (CI's changes)."""
    return set(manifest["env"]["cpu_flags"].split()) ^ {"amx_bf16"}


def test_gate_names_the_environment_in_verdict_summary_report_and_junit(
    command_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the golden's side names the flag this machine lacks, or this machine's side the flag the golden lacks
    cpu = "CPU Intel Xeon -> *(*amx_bf16)" if has_cpu_flag("amx_bf16") else "CPU Intel Xeon (amx_bf16) -> *"
    env_line = f"environment differs from the golden's: python 3.10.0 -> *; {cpu}"
    monkeypatch.setenv("FAKE_SCALE", "1.0001")
    failing = command_project.runpytest_subprocess("--precision-report", "rep", "--junitxml", "junit.xml")
    failing.assert_outcomes(passed=1, failed=1)
    out = failing.outlines
    head = next(i for i, line in enumerate(out) if line.startswith("actor_update @ step_2, rank0: 1 of "))
    # step 1 is identical on this machine: the environment is named first, with what that shows
    assert fnmatch.fnmatch(_environment(out[head:]), f"  {env_line}; alone it does not explain this drift: 1 *")
    failing.stdout.fnmatch_lines(
        ["environment differs from the golden's (python 3.10.0 -> *): 1 failed item(s) name it"]
    )
    doc = json.loads((command_project.path / "rep/report.json").read_text())
    jsonschema.validate(doc, load_schema("report"))
    assert {r["what"] for r in doc["scenarios"][0]["environment_diff"]} == {"python", "CPU"}
    assert "### Environment differs from the golden's" in (command_project.path / "rep/report.md").read_text()
    assert 'id="environment"' in (command_project.path / "rep/report.html").read_text()
    case = next(c for c in ET.parse(command_project.path / "junit.xml").iter("testcase") if "step_2" in c.get("name"))
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["precision_environment_diff"].startswith("python 3.10.0 -> ")

    monkeypatch.delenv("FAKE_SCALE")
    passing = command_project.runpytest_subprocess()
    passing.assert_outcomes(passed=2)
    held = [line for line in passing.outlines if line.startswith("environment")]
    assert len(held) == 1 and held[0].endswith(": checked, the goldens held"), held


def test_old_golden_without_the_machine_still_gates(command_project: pytest.Pytester) -> None:
    path = command_project.path / "golden/fake/cpu/manifest.json"
    manifest = json.loads(path.read_text())
    manifest["env"] = {"python": platform.python_version(), "command": manifest["env"]["command"]}  # as before
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    result = command_project.runpytest_subprocess()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["environment not fully recorded (older goldens*): *CPU not recorded -> *"])
