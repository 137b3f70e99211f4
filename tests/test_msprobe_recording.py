"""What is recorded is not what is computed: a statistic one side's msprobe records and the other's does not.

Plant (issue 52): mindstudio-probe 26.0.0 records Mean and Norm of integer tensors where 26.2.0 (the committed
goldens') writes null. A committed golden stage's dump, with those values added on the run side, is the run of an
msprobe that records more: it passes, naming the msprobe change and counting what it affects. The reverse (the
golden records them, the run does not) is coverage lost: it fails, naming it, until the golden is re-recorded.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from harness_testing import base_data, write_dump

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.stage import compare_stage
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import check_stage
from precision_harness.dumps.rows import numel, tensors
from precision_harness.dumps.stage import DirStage
from precision_harness.goldens.golden import Golden

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "golden" / "grpo_tiny" / "cpu"
STEP, STAGE = 1, "actor_update"
PINNED = {"mindstudio-probe": "26.2.0", "torch": "2.13.0+cpu"}
OLDER = {**PINNED, "mindstudio-probe": "26.0.0"}
EIGHT = {**PINNED, "mindstudio-probe": "8.3.3"}
REREC = "pytest scenarios/grpo_tiny.yaml --precision-golden update"


def as_older_msprobe(dump: dict) -> int:
    """Mean and Norm of every integer tensor whose Max is recorded and whose Mean and Norm are null, as an msprobe that
    records them writes them (the values a constant tensor of its Max would have); how many were added."""
    added = 0
    for _, entry in tensors(dump["data"]):
        dtype = str(entry.get("dtype", ""))
        if not dtype.startswith("torch.int") or entry.get("Max") is None or entry.get("Mean") is not None:
            continue
        entry["Mean"] = float(entry["Max"])
        entry["Norm"] = float(entry["Max"]) * math.sqrt(numel(entry.get("shape")))
        added += 2
    return added


def _stage(root: Path, dump: dict) -> DirStage:
    path = root / f"step_{STEP}" / STAGE / "step0" / "rank0" / "dump.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dump), encoding="utf-8")
    return DirStage(path.parents[2], step=STEP, name=STAGE)


def _settings(golden_env: dict, run_env: dict) -> CheckSettings:
    environment = EnvironmentDiff.between(golden_env, run_env)
    return CheckSettings(scenario="grpo_tiny", policy=TolerancePolicy(), environment=environment, rerecord=REREC)


@pytest.fixture(scope="module")
def committed() -> tuple[Golden, dict, dict, int]:
    """The committed golden, its stage's rank0 dump, that dump as the older msprobe records it, and how many
    statistics it adds."""
    golden = Golden.from_dir(GOLDEN)
    dump = golden.stage(STEP, STAGE).load("rank0")
    older = copy.deepcopy(dump)
    added = as_older_msprobe(older)
    assert added > 0, "the committed golden holds no integer tensor with null Mean and Norm to plant on"
    return golden, dump, older, added


def test_an_msprobe_that_records_more_passes_naming_the_change_and_its_count(committed, tmp_path: Path) -> None:
    golden, _, older, added = committed
    out = check_stage(_stage(tmp_path, older), golden.stage(STEP, STAGE), _settings(PINNED, OLDER))
    assert out.passed, out.text
    lines = out.text.splitlines()
    assert "statistics within tolerance" in lines[0]
    assert lines[1] == (
        f"  recorded          mindstudio-probe 26.2.0 -> 26.0.0 records Mean and Norm of torch.int64 tensors, which "
        f"the golden's did not: {added} statistic(s) not compared (not a numeric change; re-record the golden to "
        "compare them)"
    )
    verdict = out.verdict
    assert sum(verdict.recording.added.values()) == added and not verdict.recording.lost
    assert not verdict.drifts and not verdict.problems


def test_an_msprobe_that_records_less_fails_naming_the_coverage_lost(committed, tmp_path: Path) -> None:
    _, dump, older, added = committed
    golden = _stage(tmp_path / "golden", older)
    out = check_stage(_stage(tmp_path / "run", dump), golden, _settings(OLDER, PINNED))
    assert not out.passed
    lines = out.text.splitlines()
    assert "coverage lost" in lines[0] and f"{added} statistic(s) of the golden not recorded" in lines[0]
    recorded = next(line for line in lines if line.startswith("  recorded "))
    assert recorded.startswith(
        "  recorded          mindstudio-probe 26.0.0 -> 26.2.0 no longer records Mean and Norm of torch.int64 "
        f"tensors, which the golden records: {added} statistic(s) of the golden unchecked (first: rank0: "
    )
    assert recorded.endswith(f"re-record the golden to accept the narrower check: {REREC}")
    assert "structural" not in out.text and "always fails" not in out.text
    assert out.msprobe is None and out.origin is None  # nothing moved: no analysis of what did not change


def test_without_a_recorded_version_the_line_says_one_side_only(tmp_path: Path) -> None:
    golden, target = base_data(), base_data()
    target["Functional.embedding.0.forward"]["input_args"][0].update(Mean=4.5, Norm=12.0)
    write_dump(tmp_path / "golden", golden)
    write_dump(tmp_path / "run", target)
    out = check_stage(DirStage(tmp_path / "run"), DirStage(tmp_path / "golden"), _settings({}, {}))
    assert out.passed
    assert "this run's msprobe records Mean and Norm of torch.int64 tensors, which the golden's did not: 2 " in out.text


def test_a_float_statistic_that_moves_still_fails_beside_a_recording_change(tmp_path: Path) -> None:
    golden, target = base_data(), base_data()
    target["Functional.embedding.0.forward"]["input_args"][0].update(Mean=4.5, Norm=12.0)
    target["Functional.softmax.0.forward"]["output"][0]["Max"] = 0.95
    write_dump(tmp_path / "golden", golden)
    write_dump(tmp_path / "run", target)
    v = compare_stage(DirStage(tmp_path / "run"), DirStage(tmp_path / "golden"), _settings({}, {}))
    assert not v.passed and v.first_divergence.tensor == "Functional.softmax.0.forward.output.0"
    assert sum(v.recording.added.values()) == 2


def test_statistics_are_said_by_the_dtypes_that_share_them() -> None:
    from collections import Counter

    from precision_harness.check.recording import what

    counts = Counter({("Norm", "torch.int64"): 3, ("Mean", "torch.int64"): 3, ("Mean", "torch.int32"): 1})
    counts[("Norm", "torch.int32")] = 1
    counts[("Mean", "torch.bool")] = 2
    assert what(counts) == "Mean of torch.bool tensors; Mean and Norm of torch.int32 and torch.int64 tensors"


def test_a_changed_blocks_inputs_match_by_the_statistics_both_sides_record() -> None:
    """The judgement of a changed block pairs its run call's inputs with the golden block's by their statistics: an
    integer input whose Mean and Norm only one side's msprobe records is still the golden's input."""
    from precision_harness.check.rerun.replay import _same_tensor

    ids = base_data()["Functional.embedding.0.forward"]["input_args"][0]
    assert _same_tensor({**ids, "Mean": 4.5, "Norm": 12.0}, ids) and _same_tensor(ids, {**ids, "Mean": 4.5})
    assert not _same_tensor({**ids, "Max": 8, "Mean": 4.5}, ids)  # what both record differs
    assert not _same_tensor({**ids, "Max": None, "Min": None}, {**ids, "Mean": 4.5, "Norm": 12.0})  # nothing in common


def as_8x_msprobe(dump: dict) -> tuple[dict, int]:
    """``dump`` as the 8.x line records it (issue 52's 8.3.3 row): besides, the calls of low-risk APIs that 26.x's
    risk_level FOCUS leaves out (a ``.to`` and a ``.transpose`` of the first output, each where it would run), and
    the backward of a dropout at p=0 that repeats the backward before it (the same autograd node, hooked twice).
    Returns the dump and how many calls were added."""
    data = dump["data"]
    first, out = next(iter(data)), data[next(iter(data))]["output"][0]
    no_op = {"input_args": [copy.deepcopy(out)], "input_kwargs": {}, "output": [copy.deepcopy(out)]}
    swapped = {**copy.deepcopy(no_op), "output": [{**copy.deepcopy(out), "shape": list(reversed(out["shape"]))}]}
    backward = next(name for name in data if name.endswith(".backward"))
    added = {first: ["Tensor.to.0.forward", "Tensor.transpose.0.forward"], backward: ["Functional.dropout.0.backward"]}
    entries = {"Tensor.to.0.forward": no_op, "Tensor.transpose.0.forward": swapped}
    planted = {}
    for name, entry in data.items():
        planted[name] = entry
        for new in added.get(name, []):
            planted[new] = copy.deepcopy(entries.get(new, entry))
    return {**dump, "data": planted}, 3


def test_an_msprobe_that_records_more_calls_passes_naming_them(committed, tmp_path: Path) -> None:
    """The 8.x line's calls that 26.x does not record are not a changed code path: named with the msprobe change and
    counted, the rest compared as the golden's."""
    golden, dump, _, _ = committed
    run, calls = as_8x_msprobe(dump)
    out = check_stage(_stage(tmp_path, run), golden.stage(STEP, STAGE), _settings(PINNED, EIGHT))
    assert out.passed and "code path" not in out.text, out.text
    (recorded,) = [line for line in out.text.splitlines() if line.startswith("  recorded ")]
    assert recorded == (
        "  recorded          mindstudio-probe 26.2.0 -> 8.3.3 records the calls of 2 low-risk API(s) (msprobe 26.x's "
        "risk_level FOCUS leaves them out: Tensor.to x1, Tensor.transpose x1) and the backward calls of 1 API(s) that "
        "repeat the backward before them (Functional.dropout x1: 8.x records an autograd node again for a call whose "
        f"output is its input), which the golden's left out: {calls} call(s) not compared (not a numeric change; "
        "re-record the golden to compare them)"
    )
    assert sum(out.verdict.recording.calls_added.values()) == calls and not out.verdict.recording.loses


def test_an_msprobe_that_records_fewer_calls_fails_naming_the_coverage_lost(committed, tmp_path: Path) -> None:
    _, dump, _, _ = committed
    golden, calls = as_8x_msprobe(dump)
    out = check_stage(_stage(tmp_path / "run", dump), _stage(tmp_path / "golden", golden), _settings(EIGHT, PINNED))
    assert not out.passed
    lines = out.text.splitlines()
    assert f"coverage lost: {calls} call(s) and 0 statistic(s) of the golden not recorded" in lines[0], lines[0]
    recorded = next(line for line in lines if line.startswith("  recorded "))
    assert recorded.startswith("  recorded          mindstudio-probe 8.3.3 -> 26.2.0 no longer records the calls of 2 ")
    assert f"which the golden records: {calls} call(s) of the golden unchecked (first: rank0: Tensor.to.0.forward)" in (
        recorded
    )
    assert out.msprobe is None and out.origin is None


def test_a_low_risk_call_both_sides_record_is_paired_as_any_other(committed, tmp_path: Path) -> None:
    """Both sides hold low-risk calls (both recorded by the 8.x line, or at risk_level ALL): they are compared as any
    other call, and one whose value moved fails; nothing is taken for a recording difference."""
    _, dump, _, _ = committed
    golden, _ = as_8x_msprobe(dump)
    run = copy.deepcopy(golden)
    data = run["data"]
    data["Tensor.transpose.0.forward"]["output"][0]["Max"] = 3.0
    out = check_stage(_stage(tmp_path / "run", run), _stage(tmp_path / "golden", golden), _settings(EIGHT, EIGHT))
    assert not out.passed and not out.verdict.recording, out.text
