"""A check compares all its golden holds, and a golden holds something to compare (issue 53, items 2 and 3).

- a scenario narrowed (``global_profiler.steps``, ``precision_debugger.stages``) fails its items naming the golden's
  steps and stages it no longer checks; a ``-k`` selection is not narrowing; empty lists are schema errors;
- recording refuses a stage whose dumps hold no statistic and a run holding NaN/Inf, unless the scenario declares
  where (``tolerance.nonfinite``), and writes nothing under ``golden/``.

No run: the session's runner is a fake that hands over a prepared run folder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from harness_testing import TINY, base_data, write_dump, write_run_json

from precision_harness.check.item_key import ItemKey
from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.cli import main
from precision_harness.errors import ScenarioError
from precision_harness.goldens.narrowing import narrowed
from precision_harness.goldens.store import GoldenStore
from precision_harness.options import PrecisionOptions
from precision_harness.paths import display_path
from precision_harness.runs.launch import RunResult
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session import PrecisionSession

ENV = {"device": "cpu", "torch": "2.13.0"}
STEPS = "  steps: [1, 2]\n"
STAGES = "      stages: [actor_compute_log_prob, ref_compute_log_prob, compute_values, critic_update, actor_update]\n"


def _scenario(root: Path, old: str = "", new: str = "", extra: str = "") -> Scenario:
    """``root/scenarios/tiny_ppo.yaml``: the tiny scenario with ``old`` replaced by ``new``, plus ``extra``."""
    text = TINY.read_text()
    assert old in text
    path = root / "scenarios" / "tiny_ppo.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace(old, new) + extra)
    return Scenario.load(path)


def _run(root: Path, scenario: Scenario, data=None) -> Path:
    """A finished run of ``scenario`` in ``root``: ``data(step, stage)`` (or ``base_data()``) in every stage's dump."""
    for step in scenario.steps:
        for stage in scenario.stages:
            write_dump(root / f"step_{step}" / stage, data(step, stage) if data else base_data())
    (root / "metrics.jsonl").write_text(
        "".join(json.dumps({"training/global_step": s, "actor/pg_loss": 0.1}) + "\n" for s in scenario.steps)
    )
    return write_run_json(root, scenario, ENV)


def _session(root: Path, run_dir: Path, *, mode: str = "check") -> PrecisionSession:
    def runner(s: Scenario, *, out_dir: Path, **kw: Any) -> RunResult:
        return RunResult(s.name, run_dir, json.loads((run_dir / "run.json").read_text()), 0.1)

    options = PrecisionOptions(device="cpu", golden_mode=mode, golden_dir=root / "golden", artifacts=root / "out")
    return PrecisionSession(options, rootdir=root, runner=runner)


def _outcome(root: Path, scenario: Scenario, run_dir: Path, key: ItemKey, *, mode: str = "check", select=None):
    session = _session(root, run_dir, mode=mode)
    try:
        if select is not None:
            session.select(scenario.name, select)
        return session.outcome(scenario, key)
    finally:
        session.close()


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    """``tmp_path`` with the tiny scenario's golden (steps 1 and 2, five stages) under ``golden/``."""
    scenario = _scenario(tmp_path)
    GoldenStore(tmp_path / "golden").promote(_run(tmp_path / "recorded", scenario), scenario, "cpu")
    return tmp_path


# ------------------------------------------------------------------------------------ narrowing
def test_a_scenario_narrowed_to_one_step_fails_naming_the_golden_step_it_no_longer_checks(recorded: Path) -> None:
    scenario = _scenario(recorded, STEPS, "  steps: [1]\n")
    out = _outcome(recorded, scenario, _run(recorded / "run", scenario), ItemKey(1, "actor_update"))
    assert not out.passed and out.kind is OutcomeKind.ERROR
    path = display_path(scenario.path)
    assert out.text == (
        f"{path}: the golden holds step 2 that this scenario no longer checks (5 stage dumps of the golden compared "
        f"by nothing); re-record with: pytest {path} --precision-golden update, or list them again in "
        "global_profiler.steps"
    ), out.text


def test_a_scenario_narrowed_to_one_stage_fails_naming_the_golden_stages(recorded: Path) -> None:
    scenario = _scenario(recorded, STAGES, "      stages: [actor_update]\n")
    out = _outcome(recorded, scenario, _run(recorded / "run", scenario), ItemKey(2, "actor_update"))
    assert not out.passed and "\n" not in out.text
    assert (
        "the golden holds stages actor_compute_log_prob, compute_values, critic_update, ref_compute_log_prob that "
        "this scenario no longer checks (8 stage dumps of the golden compared by nothing)"
    ) in out.text
    assert out.text.endswith("in global_profiler.global_tool_config.precision_debugger.stages")
    golden = GoldenStore(recorded / "golden").load(scenario, "cpu")
    found = narrowed(scenario, golden)  # what the coverage ledger reads
    assert found.steps == () and len(found.stages) == 4 and (1, "critic_update") in found.unchecked


def test_selecting_one_item_is_not_narrowing(recorded: Path) -> None:
    """``pytest -k "actor_update and step_1"`` reruns one stage locally: the scenario still lists every step."""
    scenario = _scenario(recorded)
    key = ItemKey(1, "actor_update")
    out = _outcome(recorded, scenario, _run(recorded / "run", scenario), key, select=[key])
    assert out.passed, out.text


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (STEPS, "  steps: []\n", "global_profiler.steps"),
        (STAGES, "      stages: []\n", "global_profiler.global_tool_config.precision_debugger.stages"),
    ],
    ids=["steps", "stages"],
)
def test_an_empty_list_of_steps_or_stages_is_a_schema_error(tmp_path: Path, old: str, new: str, field: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        _scenario(tmp_path, old, new)
    message = str(exc.value)
    assert "\n" not in message and "tiny_ppo.yaml" in message
    assert f"{field}: [] is empty: an empty list gates nothing; list at least one" in message, message


# ------------------------------------------------------------------------------------ recording
def _empty_actor_update(step: int, stage: str) -> dict:
    return {} if stage == "actor_update" else base_data()


def _nan_at_softmax(step: int, stage: str) -> dict:
    data = base_data()
    data["Functional.softmax.0.forward"]["output"][0]["Max"] = math.nan
    return data


def _golden_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_recording_a_stage_without_statistics_is_refused_and_writes_nothing(recorded: Path) -> None:
    scenario = _scenario(recorded)
    before = _golden_files(recorded / "golden")
    run_dir = _run(recorded / "run", scenario, _empty_actor_update)
    out = _outcome(recorded, scenario, run_dir, ItemKey(1, "critic_update"), mode="update")
    assert not out.passed and out.kind is OutcomeKind.ERROR and "\n" not in out.text
    assert out.text.startswith(
        f"{display_path(scenario.path)}: no golden written: step_1/actor_update holds no statistics on any rank "
        '(its dump.json "data" is {}) (and 1 more stage(s)), a golden that would compare nothing'
    ), out.text
    assert "precision_debugger.list/scope" in out.text
    assert _golden_files(recorded / "golden") == before


def test_recording_a_nan_is_refused_naming_it_and_writes_nothing(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    run_dir = _run(tmp_path / "run", scenario, _nan_at_softmax)
    out = _outcome(tmp_path, scenario, run_dir, ItemKey(1, "actor_update"), mode="update")
    assert not out.passed and out.kind is OutcomeKind.ERROR and "\n" not in out.text
    assert out.text.startswith(
        f"{display_path(scenario.path)}: no golden written: step_1/actor_compute_log_prob/rank0: "
        "Functional.softmax.0.forward.output.0 Max is nan (and 9 more); a golden must be made of numbers"
    ), out.text
    assert "declare where under tolerance.nonfinite" in out.text
    assert not (tmp_path / "golden").exists() or not any((tmp_path / "golden").rglob("manifest.json"))


def test_a_nan_the_scenario_declares_is_recorded(tmp_path: Path) -> None:
    declared = "  nonfinite:\n    - where: Functional.softmax.*.output.*\n      reason: fully masked rows\n"
    scenario = _scenario(tmp_path, extra=f"tolerance:\n{declared}")
    run_dir = _run(tmp_path / "run", scenario, _nan_at_softmax)
    out = _outcome(tmp_path, scenario, run_dir, ItemKey(1, "actor_update"), mode="update")
    assert out.passed and out.kind is OutcomeKind.RECORDED, out.text


def test_a_nonfinite_declaration_without_a_reason_is_a_schema_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as exc:
        _scenario(tmp_path, extra="tolerance:\n  nonfinite:\n    - where: Functional.softmax.*\n")
    assert "tolerance.nonfinite.0" in str(exc.value) and "'reason' is a required property" in str(exc.value)


# ------------------------------------------------------------------------------------ golden verify
def _nan_at_softmax_inf_at_linear(step: int, stage: str) -> dict:
    data = _nan_at_softmax(step, stage)
    data["Functional.linear.0.forward"]["output"][0]["Min"] = -math.inf
    return data


def test_golden_verify_shows_a_declared_nan_as_declared_and_fails_only_on_an_undeclared_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The NaN the scenario declares is listed with its reason and passes; an undeclared one stays a problem."""
    declared = "  nonfinite:\n    - where: Functional.softmax.*.output.*\n      reason: fully masked rows\n"
    scenario = _scenario(tmp_path, extra=f"tolerance:\n{declared}")
    store = GoldenStore(tmp_path / "golden")
    store.promote(_run(tmp_path / "nan", scenario, _nan_at_softmax), scenario, "cpu")
    verify = ["golden", "verify", "--golden-dir", str(tmp_path / "golden")]
    assert main(verify) == 0  # the scenario found in scenarios/ beside golden/
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("golden/tiny_ppo/cpu: 10 NaN/Inf its scenario declares") and out[0].startswith("ok ")
    assert len(out) == 12 and out[-1] == "1 goldens verified, 0 with problems"
    reason = (
        "Functional.softmax.0.forward.output.0 Max is nan, declared (Functional.softmax.*.output.*): fully masked rows"
    )
    assert all(line.endswith(reason) for line in out[1:11]), out
    store.promote(_run(tmp_path / "inf", scenario, _nan_at_softmax_inf_at_linear), scenario, "cpu")
    assert main(verify) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(": 10 problem(s), 10 NaN/Inf its scenario declares") and out[0].startswith("FAIL ")
    problems, declared_lines = out[1:11], out[11:21]
    assert all(line.endswith("Functional.linear.0.forward.output.0 Min is -inf") for line in problems), out
    assert all(line.endswith(": fully masked rows") and "softmax" in line for line in declared_lines), out
    undeclaring = _scenario(tmp_path / "elsewhere")  # a scenario file named on the command line: declares nothing
    assert main([*verify, str(undeclaring.path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(": 20 problem(s)") and "softmax" in "".join(out[1:21]) and "declared" not in "".join(out)
