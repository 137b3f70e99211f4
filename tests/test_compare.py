"""Stage and metrics compare on synthetic msprobe dumps: every failure mode the gate claims."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
from harness_testing import base_data, tensor, write_dump

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.metrics import MetricDrift, MetricsVerdict, compare_metrics
from precision_harness.check.compare.stage import compare_stage
from precision_harness.check.localize.msprobe_tools import msprobe_table
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import check_stage
from precision_harness.check.verdicts.verdict_text import metrics_text, stage_text
from precision_harness.dumps.files import load_dump
from precision_harness.dumps.rows import count_statistics, rows
from precision_harness.dumps.stage import DirStage
from precision_harness.errors import GoldenCorruptError

POLICY = TolerancePolicy()


def run(target: Path, golden: Path | DirStage, policy: TolerancePolicy = POLICY):
    golden = golden if isinstance(golden, DirStage) else DirStage(golden)
    return compare_stage(DirStage(target), golden, CheckSettings(scenario="s", policy=policy))


class _Recorded(DirStage):
    """A stage whose statistics count was recorded (as a golden's manifest records it)."""

    def statistics(self) -> int:
        return 41


def out(data, api: str, i: int = 0) -> dict:
    return data[api]["output"][i]


def test_identical_passes(dumps, tmp_path: Path) -> None:
    v = run(*dumps(tmp_path))
    assert v.passed and v.identical  # equal digests: no statistics count recorded, so it is counted
    assert v.checked == count_statistics(load_dump(tmp_path / "golden/step_1/actor_update/step0/rank0/dump.json"))


def test_equal_values_in_other_bytes_pass_through_the_table(dumps, tmp_path: Path) -> None:
    target, golden = dumps(tmp_path)
    dump = target / "step0/rank0/dump.json"
    dump.write_text(dump.read_text() + "\n")
    v = run(target, golden)
    assert v.passed and not v.identical and v.checked == count_statistics(load_dump(dump))


def test_identical_bytes_fast_path(dumps, tmp_path: Path) -> None:
    target, golden = dumps(tmp_path)
    v = run(target, _Recorded(golden))
    assert v.passed and v.identical and v.checked == 41
    assert "identical to the golden (sha256)" in stage_text(v)


def test_drift_beyond_tolerance_names_first_and_largest(dumps, tmp_path: Path) -> None:
    def mutate(d):
        out(d, "Functional.linear.0.forward")["Norm"] = 12.5 * (1 + 1e-4)  # 77x fp32 tolerance
        out(d, "Functional.softmax.0.forward")["Max"] = 0.9 * (1 + 1e-2)  # much larger, later

    v = run(*dumps(tmp_path, mutate))
    assert not v.passed and len(v.drifts) == 2
    assert (
        v.first_divergence.tensor == "Functional.linear.0.forward.output.0" and v.first_divergence.statistic == "Norm"
    )
    assert v.largest.tensor == "Functional.softmax.0.forward.output.0" and v.largest.statistic == "Max"
    text = stage_text(v, rerun='pytest s.yaml -k "actor_update and step_1"')
    assert text.splitlines()[0].startswith("actor_update @ step_1, rank0: 2 of ")
    assert "first divergence  Functional.linear.0.forward.output.0  Norm 12.5 -> 12.50125" in text
    assert "largest" in text and "rerun" in text


def test_drift_within_tolerance_passes(dumps, tmp_path: Path) -> None:
    v = run(*dumps(tmp_path, lambda d: out(d, "Functional.linear.0.forward").update(Norm=12.5 + 1e-6)))
    assert v.passed and not v.identical


def test_mean_judged_against_rms_not_itself(dumps, tmp_path: Path) -> None:
    # Mean 0.01 -> 0.0100005 is a 5e-5 relative change (38x the fp32 rtol), but only
    # 5e-7 against RMS = Norm/sqrt(numel) = 12.5/8 = 1.56: well within tolerance.
    v = run(*dumps(tmp_path, lambda d: out(d, "Functional.linear.0.forward").update(Mean=0.0100005)))
    assert v.passed
    v = run(*dumps(tmp_path / "b", lambda d: out(d, "Functional.linear.0.forward").update(Mean=0.02)))
    assert not v.passed and v.drifts[0].statistic == "Mean"


def test_nan_where_golden_finite_fails_even_with_huge_tolerance(dumps, tmp_path: Path) -> None:
    policy = TolerancePolicy.from_config({"dtypes": {"float32": {"rtol": 1e9, "atol": 1e9}}})
    v = run(*dumps(tmp_path, lambda d: out(d, "Functional.linear.0.forward").update(Max=math.nan)), policy)
    assert not v.passed
    assert any("nan where the golden is finite" in p for p in map(str, v.problems))


def test_dtype_change_fails(dumps, tmp_path: Path) -> None:
    v = run(*dumps(tmp_path, lambda d: out(d, "Functional.linear.0.forward").update(dtype="torch.bfloat16")))
    assert not v.passed
    assert any("dtype/shape torch.float32" in p and "-> torch.bfloat16" in p for p in map(str, v.problems))


def test_shape_change_fails(dumps, tmp_path: Path) -> None:
    """A call that computed another shape is a changed code path (dumps.pairing.reshaped) whose value differs."""
    v = run(*dumps(tmp_path, lambda d: out(d, "Functional.linear.0.forward").update(shape=[2, 5, 8])))
    assert not v.passed and any("[2, 5, 8]" in c.evidence for c in v.failing_code_paths)


def test_api_only_in_golden_fails(dumps, tmp_path: Path) -> None:
    """msprobe drops golden-only rows silently (docs/msprobe.md#compare); the gate sees a removed call whose result
    the run computes nowhere (the softmax's output is not its input)."""
    v = run(*dumps(tmp_path, lambda d: d.pop("Functional.softmax.0.forward")))
    assert not v.passed
    [change] = v.failing_code_paths
    assert change.block.golden == ("Functional.softmax.0.forward",) and not change.block.target
    assert "computed nowhere in this run" in change.evidence
    assert "code path         Functional.softmax -> (nothing)" in stage_text(v)


def test_api_only_in_target_fails(dumps, tmp_path: Path) -> None:
    """An inserted call whose output is not its input (a gelu that computes something) fails."""
    gelu = {"input_args": [tensor()], "input_kwargs": {}, "output": [tensor(Max=0.8, Min=-0.2)]}
    v = run(*dumps(tmp_path, lambda d: d.update({"Functional.gelu.0.forward": gelu})))
    assert not v.passed
    [change] = v.failing_code_paths
    assert change.block.target == ("Functional.gelu.0.forward",) and change.row == "Functional.gelu.0.forward.output.0"
    assert "(nothing) -> Functional.gelu" in stage_text(v)


def test_rank_missing_fails(dumps, tmp_path: Path) -> None:
    target, golden = dumps(tmp_path)
    write_dump(golden, base_data(), rank="rank1")
    v = run(target, golden)
    assert not v.passed and "rank1: in the golden but missing from this run" in map(str, v.problems)


def test_stage_not_dumped_fails(dumps, tmp_path: Path) -> None:
    _, golden = dumps(tmp_path)
    v = run(tmp_path / "nowhere", golden)
    assert not v.passed and "did not run or was not profiled" in str(v.problems[0])


def test_exact_mode_fails_on_any_difference(dumps, tmp_path: Path) -> None:
    target, golden = dumps(tmp_path, lambda d: out(d, "Functional.linear.0.forward").update(Norm=12.5 + 1e-6))
    assert run(target, golden).passed
    v = run(target, golden, TolerancePolicy(mode="exact"))
    assert not v.passed and "must match exactly" in stage_text(v)


def test_verdict_values_differ_on_the_page(dumps, tmp_path: Path) -> None:
    """Values differing only in the 9th significant digit print with 9 digits, not as two equal 7-digit numbers."""
    target, golden = dumps(tmp_path, lambda d: out(d, "Functional.linear.0.forward").update(Norm=12.5000001))
    text = stage_text(run(target, golden, TolerancePolicy(mode="exact")))
    assert "Functional.linear.0.forward.output.0  Norm 12.5 -> 12.5000001 (rel 8.0e-09, must match exactly)" in text
    drift = MetricDrift(step=2, name="actor/pg_loss", golden=0.999900001, target=0.999900002, ratio=2.0, rel=1e-9)
    text = metrics_text(MetricsVerdict(scenario="s", checked=4, drifts=[drift]))
    assert "actor/pg_loss" in text and " 0.999900001 -> 0.999900002 (rel 1.0e-09, 2x tolerance)" in text


def test_api_glob_override_loosens_one_api(dumps, tmp_path: Path) -> None:
    target, golden = dumps(tmp_path, lambda d: out(d, "Functional.softmax.0.forward").update(Max=0.91))
    assert not run(target, golden).passed
    assert run(target, golden, TolerancePolicy.from_config({"apis": {"Functional.softmax.*": {"rtol": 0.05}}})).passed


def test_msprobe_table_written_only_for_failing_stage(dumps, tmp_path: Path) -> None:
    def check(target: Path, golden: Path, artifacts: Path) -> list[Path]:
        settings = CheckSettings(scenario="s", policy=POLICY, artifacts=artifacts)
        check_stage(DirStage(target), DirStage(golden), settings)
        return sorted(artifacts.glob("step_1/actor_update/compare_result_*.csv"))

    assert check(*dumps(tmp_path), tmp_path / "art") == []
    target, golden = dumps(tmp_path / "b", lambda d: out(d, "Functional.linear.0.forward").update(Norm=13.0))
    tables = check(target, golden, tmp_path / "art_b")
    assert tables == [tmp_path / "art_b" / "step_1/actor_update/compare_result_rank0.csv"]
    header = tables[0].read_text().splitlines()[0]
    assert "NPU Name" in header and "NormRelativeErr" in header and "Result" in header


def test_rows_and_values_match_msprobe_table(dumps, tmp_path: Path) -> None:
    """The gate's rows are msprobe's rows: same names, same values for each statistic."""
    target, golden = dumps(tmp_path, lambda d: out(d, "Functional.softmax.0.forward").update(Max=0.95))
    df = msprobe_table(target / "step0/rank0/dump.json", golden / "step0/rank0/dump.json")
    ours = rows(load_dump(target / "step0/rank0/dump.json"))
    assert list(df["NPU Name"]) == list(ours)  # same names, same (execution) order
    for row in df.to_dict("records"):
        item = ours[row["NPU Name"]]
        for stat, col in (("Max", "NPU max"), ("Min", "NPU min"), ("Mean", "NPU mean"), ("Norm", "NPU l2norm")):
            theirs = row[col]
            mine = item.get(stat)
            assert (mine is None and str(theirs) in ("None", "N/A", "nan")) or float(theirs) == float(mine), (
                row["NPU Name"],
                stat,
            )
    # and the drift we flag is the row msprobe shows a non-zero Max diff for
    v = run(target, golden)
    (drift,) = v.drifts
    flagged = df[df["NPU Name"] == drift.tensor].iloc[0]
    assert float(flagged["Max diff"]) == pytest.approx(0.95 - 0.9)


def test_corrupt_dump_is_named(tmp_path: Path) -> None:
    p = tmp_path / "dump.json"
    p.write_text("{not json")
    with pytest.raises(GoldenCorruptError, match=str(p)):
        load_dump(p)


# --------------------------------------------------------------------------------------- metrics
def test_metrics_within_and_beyond() -> None:
    golden = [{"training/global_step": 1, "actor/pg_loss": 0.5, "critic/vf_loss": 1.0}]
    same = compare_metrics(golden, golden, CheckSettings(scenario="s", policy=POLICY))
    assert same.passed and same.checked == 3
    moved = compare_metrics(
        [{"training/global_step": 1, "actor/pg_loss": 0.51, "critic/vf_loss": 1.0}],
        golden,
        CheckSettings(scenario="s", policy=POLICY),
    )
    assert not moved.passed and [d.name for d in moved.drifts] == ["actor/pg_loss"]
    loose = TolerancePolicy.from_config({"metrics": {"actor/*": {"rtol": 0.05}}})
    assert compare_metrics(
        [{"training/global_step": 1, "actor/pg_loss": 0.51, "critic/vf_loss": 1.0}],
        golden,
        CheckSettings(scenario="s", policy=loose),
    ).passed


def test_metrics_missing_step_and_key() -> None:
    golden = [{"training/global_step": 1, "a": 1.0}, {"training/global_step": 2, "a": 1.0}]
    v = compare_metrics([{"training/global_step": 1}], golden, CheckSettings(scenario="s", policy=POLICY))
    assert "step 2: in the golden metrics but missing from this run" in v.problems
    assert "step 1: metric a missing from this run" in v.problems


def test_metrics_nan_fails() -> None:
    v = compare_metrics(
        [{"training/global_step": 1, "a": math.nan}],
        [{"training/global_step": 1, "a": 1.0}],
        CheckSettings(scenario="s", policy=POLICY),
    )
    assert not v.passed


def test_metric_that_turns_null_fails() -> None:
    """A metric that becomes null (or stops being one) is a change, not a skipped value."""
    v = compare_metrics(
        [{"training/global_step": 1, "a": None, "b": 2.0, "c": None}],
        [{"training/global_step": 1, "a": 1.0, "b": None, "c": None}],
        CheckSettings(scenario="s", policy=POLICY),
    )
    assert v.problems == ["step 1: metric a: 1.0 -> None", "step 1: metric b: None -> 2.0"]
    assert v.checked == 1  # training/global_step


def test_a_keyword_argument_has_one_row_name_whatever_the_task() -> None:
    """msprobe's read_op names a tensor saved by task: tensor after its file (``<api>.kwargs.<key>``) and the same
    argument under task: statistics ``<api>.input.<key>``: a capture rerun must pair with the checked run."""
    mask = tensor(shape=(4, 1, 18, 18))
    statistics = {"data": {"Torch.gather.0.forward": {"input_args": [], "input_kwargs": {"index": mask}, "output": []}}}
    saved = copy.deepcopy(statistics)
    saved["data"]["Torch.gather.0.forward"]["input_kwargs"]["index"]["data_name"] = (
        "Torch.gather.0.forward.kwargs.index.pt"
    )
    assert list(rows(saved)) == list(rows(statistics)) == ["Torch.gather.0.forward.input.index"]


def _no_statistics(d: dict) -> None:
    """msprobe records no statistics of a FRACTAL_NZ or fp8 tensor on NPU: the row is there, its values are not."""
    d["Functional.softmax.0.forward"]["output"][0].update(Max=None, Min=None, Mean=None, Norm=None)


def test_a_tensor_row_compared_by_nothing_fails(dumps, tmp_path: Path) -> None:
    v = run(*dumps(tmp_path, _no_statistics, _no_statistics))
    assert not v.passed and v.failing_unchecked == [("rank0", "Functional.softmax.0.forward.output.0")]
    text = stage_text(v)
    assert "1 tensor row(s) compared by nothing" in text.splitlines()[0]
    assert "unchecked         Functional.softmax.0.forward.output.0: msprobe recorded no statistics" in text


def test_a_tensor_row_compared_by_nothing_passes_where_the_scenario_allows_it(dumps, tmp_path: Path) -> None:
    policy = TolerancePolicy.from_config({"unchecked": ["Functional.softmax.*"]})
    v = run(*dumps(tmp_path, _no_statistics, _no_statistics), policy)
    assert v.passed and v.unchecked and not v.failing_unchecked
    assert "1 tensor row(s) unchecked, allowed by tolerance.unchecked" in stage_text(v)


def test_a_bool_mask_is_compared(dumps, tmp_path: Path) -> None:
    """read_op hands a bool tensor's Max/Min over as text: read as 1/0, a mask that turned all False fails."""

    def mask(value: bool):
        def add(d: dict) -> None:
            m = tensor("torch.bool", (2, 4), Max=value, Min=False, Mean=None, Norm=None)
            d["Tensor.__and__.0.forward"] = {"input_args": [m], "input_kwargs": {}, "output": [m]}

        return add

    assert run(*dumps(tmp_path / "same", mask(True), mask(True))).passed
    v = run(*dumps(tmp_path / "moved", mask(False), mask(True)))
    assert not v.passed and v.first_divergence.tensor == "Tensor.__and__.0.forward.input.0"
    assert (v.first_divergence.golden, v.first_divergence.target) == (1.0, 0.0)
