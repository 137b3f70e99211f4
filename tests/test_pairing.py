"""Pairing a run's API calls with the golden's by aligning the two call streams (precision_harness.dumps.pairing)."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from harness_testing import api, tensor

from precision_harness.dumps.pairing import aligned_golden, call_name, pair_calls, short_name
from precision_harness.dumps.rows import rows


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("Tensor.__mul__.23.forward", "Tensor.__mul__.forward"),
        ("Functional.linear.0.backward", "Functional.linear.backward"),
        ("Module.model.layers.0.mlp.Qwen2MLP.forward.3", "Module.model.layers.0.mlp.Qwen2MLP.forward"),
        ("Distributed.all_reduce.12.forward", "Distributed.all_reduce.forward"),
        ("Stage.advantages.0.forward", "Stage.advantages.forward"),
    ],
)
def test_call_name_drops_msprobes_call_index(key: str, name: str) -> None:
    assert call_name(key) == name


def test_short_name() -> None:
    assert short_name("Tensor.__matmul__.4.forward") == "Tensor.__matmul__"
    assert short_name("Functional.linear.0.backward") == "Functional.linear.backward"


def dump(calls: list[tuple[str, dict]]) -> dict:
    return {"task": "statistics", "level": "L1", "data": dict(calls)}


def _t(shape, **stats) -> dict:
    return tensor(shape=shape, **stats)


def rope(new: bool) -> dict:
    """A forward's start as transformers 5.10.4 (matmul) and 5.23.0 (mul) record it: msprobe renumbers every mul."""
    freqs = [_t((4, 18, 4) if new else (4, 4, 18), Max=14.0, Min=0.0, Mean=1.62, Norm=64.0)]
    first = ("Tensor.__mul__.0.forward", api([_t((4, 4, 1)), _t((4, 1, 18))], freqs)) if new else None
    golden_first = ("Tensor.__matmul__.0.forward", api([_t((4, 4, 1)), _t((4, 1, 18))], freqs))
    offset = 1 if new else 0
    calls = [
        ("Torch.where.0.forward", api([_t((4, 18))], [_t((4, 18))])),
        first or golden_first,
        ("Tensor.cos.0.forward", api([_t((4, 18, 8))], [_t((4, 18, 8), Max=1.0)])),
        (f"Tensor.__mul__.{offset}.forward", api([_t((4, 18, 8))], [_t((4, 18, 8), Max=2.0)])),
        ("Tensor.sin.0.forward", api([_t((4, 18, 8))], [_t((4, 18, 8), Max=0.5)])),
        (f"Tensor.__mul__.{offset + 1}.forward", api([_t((4, 18, 8))], [_t((4, 18, 8), Max=3.0)])),
    ]
    return dump(calls)


def test_a_replaced_call_forms_one_block_and_shifts_no_other_pairing() -> None:
    golden, target = rope(new=False), rope(new=True)
    pairing = pair_calls(target, golden)
    assert dict(pairing.pairs) == {
        "Torch.where.0.forward": "Torch.where.0.forward",
        "Tensor.cos.0.forward": "Tensor.cos.0.forward",
        "Tensor.__mul__.1.forward": "Tensor.__mul__.0.forward",
        "Tensor.sin.0.forward": "Tensor.sin.0.forward",
        "Tensor.__mul__.2.forward": "Tensor.__mul__.1.forward",
    }
    [block] = pairing.blocks
    assert block.golden == ("Tensor.__matmul__.0.forward",) and block.target == ("Tensor.__mul__.0.forward",)
    assert block.before == ("Torch.where.0.forward", "Torch.where.0.forward")
    assert block.after == ("Tensor.cos.0.forward", "Tensor.cos.0.forward")
    assert block.what == "Tensor.__matmul__ -> Tensor.__mul__"
    assert pairing.alignable


def test_the_aligned_golden_answers_for_the_runs_names() -> None:
    golden, target = rope(new=False), rope(new=True)
    renamed = rows(aligned_golden(golden, pair_calls(target, golden)))
    # the run's Tensor.__mul__.2 is the golden's Tensor.__mul__.1 (Max 3.0), not the golden's Tensor.__mul__.2
    assert renamed["Tensor.__mul__.2.forward.output.0"]["Max"] == 3.0
    assert "Tensor.__matmul__.0.forward.output.0" not in renamed and "Tensor.__mul__.0.forward.output.0" not in renamed


def test_same_names_in_the_same_order_pair_by_name_without_aligning() -> None:
    golden = rope(new=False)
    pairing = pair_calls(golden, golden)
    assert [t for t, _ in pairing.pairs] == list(golden["data"]) and not pairing.blocks


def test_an_inserted_call_among_namesakes_is_told_apart_by_its_shapes() -> None:
    mul = [("Tensor.__mul__.0.forward", api([_t((2, 3))], [_t((2, 3))]))]
    golden = dump([*mul, ("Tensor.__mul__.1.forward", api([_t((5, 5))], [_t((5, 5), Max=7.0)]))])
    target = dump(
        [
            *mul,
            ("Tensor.__mul__.1.forward", api([_t((9,))], [_t((9,))])),  # inserted, another shape
            ("Tensor.__mul__.2.forward", api([_t((5, 5))], [_t((5, 5), Max=7.0)])),
        ]
    )
    pairing = pair_calls(target, golden)
    assert dict(pairing.pairs)["Tensor.__mul__.2.forward"] == "Tensor.__mul__.1.forward"
    assert [(b.golden, b.target) for b in pairing.blocks] == [((), ("Tensor.__mul__.1.forward",))]


def test_a_call_whose_dtype_changed_stays_paired() -> None:
    """Its dtype is compared as a structural change of a paired call (the softmax that lost its upcast)."""
    golden = rope(new=False)
    target = rope(new=False)
    target["data"]["Tensor.cos.0.forward"]["output"][0]["dtype"] = "torch.bfloat16"
    pairing = pair_calls(target, golden)
    assert ("Tensor.cos.0.forward", "Tensor.cos.0.forward") in pairing.pairs and not pairing.blocks


def test_dumps_of_another_program_are_too_different_to_align() -> None:
    golden = dump([(f"Functional.linear.{i}.forward", api([_t((2, 2))], [_t((2, 2))])) for i in range(10)])
    target = dump([(f"Functional.conv2d.{i}.forward", api([_t((2, 2))], [_t((2, 2))])) for i in range(10)])
    pairing = pair_calls(target, golden)
    assert not pairing.alignable and pairing.paired_share == 0


def test_scattered_changes_in_a_long_stream_each_form_their_own_block() -> None:
    """10,000 calls with 25 replaced at random places: 25 blocks of one call each, every other call paired."""
    rng = random.Random(0)
    names = ["Functional.linear", "Tensor.__mul__", "Tensor.__add__", "Torch.rsqrt", "Functional.softmax"]
    picks = [rng.choice(names) for _ in range(10_000)]
    changed = sorted(rng.sample(range(1, 9_999), 25))
    while any(b - a < 2 for a, b in pairwise(changed)):  # keep the blocks apart
        changed = sorted(rng.sample(range(1, 9_999), 25))

    def stream(replace: bool) -> dict:
        counts: dict[str, int] = {}
        calls = []
        for i, name in enumerate(picks):
            name = "Torch.fused_op" if replace and i in changed else name
            calls.append((f"{name}.{counts.setdefault(name, 0)}.forward", api([_t((2, 2))], [_t((2, 2))])))
            counts[name] += 1
        return dump(calls)

    pairing = pair_calls(stream(True), stream(False))
    assert len(pairing.blocks) == 25 and len(pairing.pairs) == 10_000 - 25
    assert all(len(b.golden) == len(b.target) == 1 for b in pairing.blocks)
