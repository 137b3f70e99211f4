"""A changed code path (calls inserted, removed or replaced) end to end through the compare, where the change
entered, the verdict's text and the report, on dumps shaped like the transformers 5.10.4 -> 5.23.0 upgrade."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from harness_testing import api, tensor, write_dump
from test_pairing import rope

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.code_path import Leaving
from precision_harness.check.compare.drift_profile import DriftProfile
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.localize.drift_origin import OriginKind
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import check_stage
from precision_harness.check.verdicts.verdict_text import code_path_line
from precision_harness.dumps.stage import DirStage
from precision_harness.report.item_record import ItemRecord
from precision_harness.report.precision_report import PrecisionReport

UPGRADE = EnvironmentDiff.between(
    {"transformers": "5.10.4", "torch": "2.13.0+cpu"}, {"transformers": "5.23.0", "torch": "2.13.0+cpu"}
)
RERECORD = "pytest --precision-golden update"


def check(tmp_path: Path, golden: dict, target: dict, policy: TolerancePolicy | None = None):
    for side, dump in (("golden", golden), ("target", target)):
        write_dump(tmp_path / side / "step_1" / "actor_compute_log_prob", dump["data"])
    return recheck(tmp_path, policy)


def recheck(tmp_path: Path, policy: TolerancePolicy | None = None):
    """The check of the dumps :func:`check` wrote (and a test may have changed since)."""
    golden, target = (DirStage(tmp_path / s / "step_1/actor_compute_log_prob", step=1) for s in ("golden", "target"))
    settings = CheckSettings(
        scenario="grpo_tiny", policy=policy or TolerancePolicy(), environment=UPGRADE, rerecord=RERECORD
    )
    return check_stage(target, golden, settings)


def test_an_upgrade_that_replaces_a_call_with_the_same_values_passes_and_says_so(tmp_path: Path) -> None:
    out = check(tmp_path, rope(new=False), rope(new=True))
    assert out.passed
    [change] = out.verdict.code_paths
    assert change.leaving is Leaving.MATCH and change.ratio == 0
    assert (
        "code path         transformers 5.10.4 -> 5.23.0 changed the code path: Tensor.__matmul__ -> Tensor.__mul__ "
        "(after Torch.where.0.forward, before Tensor.cos.0.forward); every paired value "
        "identical, the values leaving the changed calls identical; "
        f"re-record to refresh: {RERECORD}"
    ) in out.text
    out.environment = UPGRADE  # as check_items gives every item of the pair
    record = ItemRecord.from_outcome(
        out, nodeid="scenarios/grpo_tiny.yaml::actor_compute_log_prob[step_1]", scenario="grpo_tiny", step=1,
        stage="actor_compute_log_prob",
    )  # fmt: skip
    assert record.code_path["what"] == ["Tensor.__matmul__ -> Tensor.__mul__"] and record.code_path["failing"] == 0
    assert ("precision_code_path", record.code_path["line"]) in record.user_properties()
    lines = list(PrecisionReport(mode="check", records=[record]).lines)
    assert (
        "transformers 5.10.4 -> 5.23.0 changed the code path in 1 stage dump(s) of grpo_tiny: "
        "Tensor.__matmul__ -> Tensor.__mul__ (the values leaving the changed calls match the golden's; "
        "re-record to refresh)"
    ) in lines


def test_tolerance_code_path_fail_makes_any_changed_code_path_fail(tmp_path: Path) -> None:
    policy = TolerancePolicy.from_config({"code_path": "fail"})
    out = check(tmp_path, rope(new=False), rope(new=True), policy)
    assert not out.passed
    assert out.origin.kind is OriginKind.CODE_PATH and out.origin.api == "Tensor.__mul__.0.forward"
    assert "tolerance.code_path: fail" in out.text


def test_a_replaced_call_whose_values_differ_is_where_the_change_entered(tmp_path: Path) -> None:
    """A fused op that rounds differently: the stage fails at the block, the software difference named first."""
    target = rope(new=True)
    target["data"]["Tensor.__mul__.0.forward"]["output"][0]["Norm"] = 64.5
    target["data"]["Tensor.cos.0.forward"]["input_args"][0]["Norm"] = 3.0  # what reads it moves too
    out = check(tmp_path, rope(new=False), target)
    assert not out.passed
    assert out.origin.kind is OriginKind.CODE_PATH and out.origin.row == "Tensor.__mul__.0.forward.output.0"
    lines = out.text.splitlines()
    env = next(i for i, line in enumerate(lines) if "environment differs from the golden's" in line)
    entered = next(i for i, line in enumerate(lines) if line.lstrip().startswith("change entered"))
    assert env < entered, out.text
    assert "the code path changed in actor_compute_log_prob: Tensor.__matmul__ -> Tensor.__mul__" in lines[entered]
    assert "upstream" not in out.text


def test_a_numeric_change_after_a_matching_block_is_named_where_it_is(tmp_path: Path) -> None:
    """A replaced call plus a numeric change downstream: the change entered at the downstream API, not the block."""
    golden, target = rope(new=False), rope(new=True)
    target["data"]["Tensor.sin.0.forward"]["output"][0]["Max"] = 0.6
    out = check(tmp_path, golden, target)
    assert not out.passed
    assert out.origin.kind is OriginKind.API and out.origin.api == "Tensor.sin.0.forward"
    assert out.verdict.code_paths[0].matches
    assert "1 other changed block(s) whose values match: Tensor.__matmul__ -> Tensor.__mul__" in out.text


def test_a_removed_no_op_passes(tmp_path: Path) -> None:
    golden = rope(new=False)
    same = tensor(shape=(4, 18, 8), Max=1.0)
    data = list(golden["data"].items())
    data.insert(2, ("Tensor.contiguous.0.forward", api([same], [same])))
    out = check(tmp_path, {"data": dict(data)}, golden)
    assert out.passed and out.verdict.code_paths[0].leaving is Leaving.MATCH
    assert "Tensor.contiguous -> (nothing)" in out.text


def test_dumps_too_different_to_align_are_stale_not_noise(tmp_path: Path) -> None:
    golden = {"data": {f"Functional.linear.{i}.forward": api([tensor()], [tensor()]) for i in range(6)}}
    target = {"data": {f"Functional.conv2d.{i}.forward": api([tensor()], [tensor()]) for i in range(6)}}
    out = check(tmp_path, golden, target)
    assert not out.passed
    assert "stale: only 0 of 6 API calls pair with the golden's, too different to align" in out.text


def test_a_stage_that_fails_on_structure_alone_says_where_the_change_entered(tmp_path: Path) -> None:
    """A softmax whose output lost its float32 upcast: every statistic equal, the dtype narrower."""
    golden = rope(new=False)
    target = copy.deepcopy(golden)
    target["data"]["Tensor.cos.0.forward"]["output"][0]["dtype"] = "torch.bfloat16"
    out = check(tmp_path, golden, target)
    assert not out.passed and not out.verdict.drifts
    assert out.origin is not None and out.origin.row == "Tensor.cos.0.forward.output.0"
    assert out.origin.kind is OriginKind.API and out.origin.structural
    assert "change entered" in out.text


def test_the_changed_call_is_placed_in_the_model_code_that_made_it(tmp_path: Path) -> None:
    """msprobe's stack.json names the frames; the first one outside torch's module machinery is the place."""
    frames = [
        "File /venv/lib/python3.11/site-packages/torch/nn/modules/module.py, line 1789, in _call_impl, \n return f()",
        "File /venv/lib/python3.11/site-packages/transformers/models/qwen2/modeling_qwen2.py, line 89, in forward, \n"
        " freqs = position_ids[..., None].float() * self.inv_freq",
        "File /srv/project/precision_harness/runs/runner/stages.py, line 41, in _forward_logits, \n out = model(x)",
    ]
    check(tmp_path, rope(new=False), rope(new=True))
    stack = tmp_path / "target/step_1/actor_compute_log_prob/step0/rank0/stack.json"
    stack.write_text(json.dumps({"0": [["Tensor.__mul__.0.forward"], frames]}))
    out = recheck(tmp_path)
    site = "at transformers/models/qwen2/modeling_qwen2.py:89 in forward: freqs = position_ids[..., None].float() * "
    assert out.verdict.code_paths[0].site.startswith(site.removeprefix("at "))
    assert site in out.text


def test_a_dtype_changed_inside_the_stage_is_not_called_upstream(tmp_path: Path) -> None:
    """A cast msprobe does not record, dropped: the softmax reads the linear's bf16 output where the golden read it
    in float32. Its input needs no gradient, which alone would read as upstream; it carries a recorded output's
    value, so the change is inside the stage."""
    out_bf16 = tensor("torch.bfloat16", (2, 8), Max=3.0, Min=-2.5, Mean=0.01, Norm=12.5)
    in_fp32 = {**out_bf16, "dtype": "torch.float32"}
    probs = tensor(shape=(2, 8), Max=0.9, Min=0.01, Mean=0.125, Norm=2.1)

    def stream(softmax_input: dict) -> dict:
        return {
            "data": {
                "Functional.linear.0.forward": api([tensor("torch.bfloat16", (2, 4))], [out_bf16]),
                "Functional.softmax.0.forward": api([softmax_input], [probs]),
            }
        }

    out = check(tmp_path, stream(in_fp32), stream(out_bf16))
    assert not out.passed
    assert out.origin.kind is OriginKind.UNRECORDED and out.origin.producer == "Functional.linear.0.forward.output.0"
    assert "upstream" not in out.text
    assert (
        "inside actor_compute_log_prob, through an op msprobe does not record: "
        "Functional.softmax.0.forward.input.0 is the first value that differs (its dtype or shape), and it carries "
        "Functional.linear.0.forward.output.0's value (equal statistics)"
    ) in out.text


def test_a_mask_the_stage_built_as_bool_where_the_golden_cast_it_to_int64_is_not_called_upstream(
    tmp_path: Path,
) -> None:
    """Issue 52's rule for an int/bool change of dtype alone: the loss reads the stage's own ``logits > 0`` mask as
    bool where the golden read it cast to int64 by an op msprobe does not record (``.long()``), the same values.
    msprobe records only Max/Min of such tensors (bool: any/all); the mask still carries the comparison's value."""
    logits = tensor(shape=(2, 8), Max=2.0, Min=-1.0, Mean=0.3, Norm=4.0)
    loss, out = tensor(shape=(2, 8), Max=0.5, Min=-0.5, Mean=0.0, Norm=1.0), tensor(shape=(2, 8), Max=0.5, Norm=0.8)
    as_bool, as_int = (
        tensor("torch.bool", (2, 8), True, False, None, None),
        tensor("torch.int64", (2, 8), 1, 0, None, None),
    )

    def stream(mask: dict) -> dict:
        return {
            "data": {
                "Tensor.__gt__.0.forward": api([logits, {"type": "float", "value": 0.0}], [as_bool]),
                "Tensor.__mul__.0.forward": api([loss, mask], [out]),
            }
        }

    for way, golden, run in (("cast", as_int, as_bool), ("uncast", as_bool, as_int)):
        out_ = check(tmp_path / way, stream(golden), stream(run))
        assert not out_.passed and "upstream" not in out_.text, out_.text
        assert out_.origin.kind is OriginKind.UNRECORDED and out_.origin.structural
        assert out_.origin.producer == "Tensor.__gt__.0.forward.output.0"
        assert (
            "inside actor_compute_log_prob, through an op msprobe does not record: Tensor.__mul__.0.forward.input.1 "
            "is the first value that differs (its dtype or shape), and it carries Tensor.__gt__.0.forward.output.0's "
            "value"
        ) in out_.text


def test_a_dtype_change_of_a_value_from_outside_the_stage_stays_upstream(tmp_path: Path) -> None:
    """The loss reads an int64 mask where the golden read float32 IS weights of 1: no recorded call made either."""
    weights, mask = tensor(shape=(2, 8), Max=1.0, Min=1.0, Mean=1.0, Norm=4.0), tensor("torch.int64", (2, 8), 1, 1)
    loss = [tensor(shape=(2, 8), Max=0.5, Min=-0.5, Mean=0.0, Norm=1.0)]

    def stream(factor: dict) -> dict:
        return {"data": {"Tensor.__mul__.0.forward": api([loss[0], factor], loss)}}

    out = check(tmp_path, stream(weights), stream(mask))
    assert out.origin.kind is OriginKind.UPSTREAM and out.origin.producer is None


def _record(out) -> ItemRecord:
    out.environment = UPGRADE  # as check_items gives every item of the pair
    return ItemRecord.from_outcome(
        out, nodeid="scenarios/grpo_tiny.yaml::actor_compute_log_prob[step_1]", scenario="grpo_tiny", step=1,
        stage="actor_compute_log_prob",
    )  # fmt: skip


def test_an_infinite_paired_ratio_is_never_within_tolerance(tmp_path: Path) -> None:
    """A changed code path and, after it, a paired value narrowed to bf16 (a dtype change stays paired: its ratio is
    infinite). The stage fails, and its code path line says the paired values are beyond tolerance, not "within
    tolerance (worst infx)", and offers no re-record."""
    target = rope(new=True)
    target["data"]["Tensor.sin.0.forward"]["output"][0]["dtype"] = "torch.bfloat16"
    out = check(tmp_path, rope(new=False), target)
    assert not out.passed and out.verdict.profile.max_ratio() == math.inf
    line = _record(out).code_path["line"]
    assert "within tolerance" not in line and "re-record" not in line, line
    assert line.endswith(
        "; paired values beyond tolerance (worst ratio inf: a dtype, shape or finiteness changed, or an exact value "
        "moved), the values leaving the changed calls identical"
    ), line
    assert "within tolerance (worst inf" not in out.text
    records = [_record(out)]
    lines = PrecisionReport(mode="check", records=records).lines
    [summary] = [line for line in lines if "changed the code path" in line]
    assert "re-record" not in summary and summary.endswith("1 fail elsewhere: their verdicts say why)"), summary


def test_a_nan_or_infinite_worst_ratio_reads_beyond_tolerance_and_is_never_offered_a_re_record(tmp_path: Path) -> None:
    out = check(tmp_path, rope(new=False), rope(new=True))
    assert out.passed
    for worst in (math.nan, math.inf, 2.5):
        out.verdict.profile = DriftProfile([("rank0", 0, "Tensor.cos.0.forward.output.0", worst)])
        line = code_path_line(out.verdict, UPGRADE, rerecord=RERECORD)
        assert "within tolerance" not in line and "re-record" not in line, line
        assert "paired values beyond tolerance (worst " in line, line
    out.verdict.profile = DriftProfile([("rank0", 0, "Tensor.cos.0.forward.output.0", 0.5)])
    line = code_path_line(out.verdict, UPGRADE, rerecord=RERECORD)
    assert "every paired value within tolerance (worst 0.5x)" in line and line.endswith(
        f"re-record to refresh: {RERECORD}"
    )
