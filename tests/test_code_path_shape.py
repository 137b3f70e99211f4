"""Shape is not value, and a code path is judged by position: the causal mask built through other intermediate
shapes (transformers 4.57.3 against 5.10.4's golden, as their dumps record it), a block from which no tensor
leaves, and a leaving value equal to another place's output."""

from __future__ import annotations

import copy
from pathlib import Path

from harness_testing import api, tensor
from test_code_path import _record, check
from test_pairing import rope

from precision_harness.check.compare.code_path import Leaving
from precision_harness.check.localize.drift_origin import OriginKind
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.dumps.pairing import pair_calls
from precision_harness.report.precision_report import PrecisionReport


def _bool(shape: tuple[int, ...], lo: bool = False) -> dict:
    return tensor("torch.bool", shape, True, lo, None, None)


def _int(shape: tuple[int, ...]) -> dict:
    return tensor("torch.int64", shape, 17, 0, None, None)


def mask(old: bool, *, padded: bool = False) -> dict:
    """A forward's causal mask as transformers 5.10.4 records it (``old``: broadcast ``[1, 1, 18, 18]``
    intermediates) and as 4.57.3 does (``[18, 18]`` and ``[4, 18, 18]``, unsqueezed by a view msprobe does not
    record); the scores it masks, and what reads them, identical on both sides. ``padded``: 4.57.3's mask lets
    no padding through (its Min True where the golden's is False)."""
    scores = tensor(shape=(4, 1, 18, 18), Max=0.0, Min=-3.4e38, Mean=-1.6e38, Norm=1e39)
    le = api([_int((1, 1, 1, 18)), _int((1, 1, 18, 1))], [_bool((1, 1, 18, 18))])
    both = api([_bool((1, 1, 18, 18)), _bool((4, 1, 1, 18))], [_bool((4, 1, 18, 18))])
    if not old:
        le = api([_int((18,)), _int((18,))], [_bool((18, 18))])
        both = api([_bool((18, 18)), _bool((4, 18))], [_bool((4, 18, 18), lo=padded)])
    calls = {
        "Functional.embedding.0.forward": api([_int((4, 18)), tensor(shape=(264, 32))], [tensor(shape=(4, 18, 32))]),
        "Tensor.__le__.0.forward": le,
        "Tensor.__and__.0.forward": both,
        "Torch.where.0.forward": api([_bool((4, 1, 18, 18)), tensor(shape=())], [scores]),
        "Functional.linear.0.forward": api([tensor(shape=(4, 18, 32))], [tensor(shape=(4, 18, 32), Max=2.0)]),
    }
    return {"data": calls}


def test_a_mask_built_through_other_shapes_is_a_changed_code_path_whose_values_match(tmp_path: Path) -> None:
    pairing = pair_calls(mask(old=False), mask(old=True))
    [block] = pairing.blocks
    assert block.what == "Tensor.__le__, Tensor.__and__ (other shapes)"
    out = check(tmp_path, mask(old=True), mask(old=False))
    assert out.passed, out.text
    [change] = out.verdict.code_paths
    assert change.leaving is Leaving.MATCH and change.ratio == 0
    assert "Tensor.__and__.0.forward.output.0 [4, 18, 18] has the statistics of the golden's " in change.evidence
    assert "changed the code path: Tensor.__le__, Tensor.__and__ (other shapes) (after Functional.embedding" in out.text
    assert "upstream" not in out.text


def test_a_mask_built_in_the_stage_whose_values_differ_is_never_upstream(tmp_path: Path) -> None:
    """The mask's inputs are data no recorded call computed, but the mask is the stage's own: where its values
    leave the changed calls different, the change entered there."""
    out = check(tmp_path, mask(old=True), mask(old=False, padded=True))
    assert not out.passed
    assert out.origin.kind is OriginKind.CODE_PATH and out.origin.row == "Tensor.__and__.0.forward.output.0"
    assert "upstream" not in out.text


def _no_tensor_leaves() -> dict:
    """The 5.23.0 side of :func:`rope` with a call inserted that returns nothing (a barrier, a hook)."""
    data = list(rope(new=True)["data"].items())
    data.insert(2, ("Distributed.barrier.0.forward", api([], [])))
    return {"data": dict(data)}


def test_a_block_from_which_no_tensor_leaves_is_undecided(tmp_path: Path) -> None:
    out = check(tmp_path, rope(new=True), _no_tensor_leaves())
    [change] = out.verdict.code_paths
    assert change.leaving is Leaving.NONE and change.undecided and "undecided" in change.evidence
    assert out.passed  # nothing in it differs: the paired rows after it are the evidence, and are the golden's
    assert "1 changed block(s) undecided: no tensor leaves them" in out.text
    assert "the values leaving the changed calls identical" not in out.text
    strict = check(tmp_path, rope(new=True), _no_tensor_leaves(), TolerancePolicy.from_config({"code_path": "fail"}))
    assert not strict.passed and strict.origin.kind is OriginKind.CODE_PATH


def _barrier_after_cos(*, sin_max: float = 0.5) -> dict:
    """5.23.0's :func:`rope` with a call that returns nothing inserted after the cos (a second changed block, apart
    from the replaced matmul), and its sin's Max at ``sin_max`` (the golden's: 0.5)."""
    data = list(rope(new=True)["data"].items())
    data.insert(4, ("Distributed.barrier.0.forward", api([], [])))
    data[5][1]["output"][0]["Max"] = sin_max
    return {"data": dict(data)}


def _summary(out) -> str:
    [line] = [x for x in PrecisionReport(mode="check", records=[_record(out)]).lines if "changed the code path" in x]
    return line


def test_the_summary_of_an_undecided_block_counts_it_and_never_reads_as_a_match(tmp_path: Path) -> None:
    alone = check(tmp_path, rope(new=True), _no_tensor_leaves())
    assert alone.passed
    assert _summary(alone).endswith(
        "(nothing) -> Distributed.barrier (1 changed block(s) in 1 stage dump(s) undecided: no tensor leaves them, "
        "only the paired values after them were compared; re-record to refresh)"
    ), _summary(alone)
    assert "match" not in _summary(alone) and _record(alone).code_path["undecided"] == 1
    mixed = check(tmp_path, rope(new=False), _barrier_after_cos())
    assert mixed.passed and {c.leaving for c in mixed.verdict.code_paths} == {Leaving.MATCH, Leaving.NONE}
    assert _summary(mixed).endswith(
        "(1 changed block(s) in 1 stage dump(s) undecided: no tensor leaves them, only the paired values after them "
        "were compared; the values leaving the other changed calls match the golden's; re-record to refresh)"
    ), _summary(mixed)
    drifted = check(tmp_path, rope(new=False), _barrier_after_cos(sin_max=0.7))
    assert not drifted.passed and drifted.origin.kind is OriginKind.API and drifted.origin.api == "Tensor.sin.0.forward"
    assert "1 other changed block(s) whose values match: Tensor.__matmul__ -> Tensor.__mul__" in drifted.text
    assert "1 other changed block(s) undecided, no tensor leaves them: (nothing) -> Distributed.barrier" in drifted.text


def _fused(result: dict) -> dict:
    """``rope(new=False)`` with its ``Tensor.__matmul__`` followed by a scaling ``torch.mul`` (the golden's
    block: two calls), against a run whose one fused call returns ``result``."""
    golden = rope(new=False)
    data = list(golden["data"].items())
    scaled = tensor(shape=(4, 4, 18), Max=28.0, Min=0.0, Mean=3.24, Norm=128.0)
    product = data[1][1]["output"][0]
    data.insert(2, ("Torch.mul.0.forward", api([product], [scaled])))
    run = copy.deepcopy(data)
    run[1:3] = [("Functional.fused_rope.0.forward", api(data[1][1]["input_args"], [result]))]
    return {"data": dict(data)}, {"data": dict(run)}


def test_a_leaving_value_equal_to_another_places_output_is_not_acquitted(tmp_path: Path) -> None:
    """The fused call returns the golden block's intermediate (the unscaled product), not its result: a match
    with any output of the golden's block would have passed it."""
    golden, target = _fused(rope(new=False)["data"]["Tensor.__matmul__.0.forward"]["output"][0])
    out = check(tmp_path, golden, target)
    assert not out.passed
    [change] = out.verdict.code_paths
    assert change.leaving is Leaving.DIFFER and change.match == "Torch.mul.0.forward.output.0"
    assert out.origin.kind is OriginKind.CODE_PATH
    golden, target = _fused(golden["data"]["Torch.mul.0.forward"]["output"][0])
    assert check(tmp_path, golden, target).passed  # the block's result in its place: a match
