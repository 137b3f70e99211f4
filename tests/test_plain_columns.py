"""The columns' fast read of the plain layout (:func:`~precision_harness.dumps.columns.columns`) gives exactly the
parser's walk (:func:`~precision_harness.dumps.columns.walked_columns`): the same names in the same order, the
same sources, states, layout codes and statistics, on every committed golden's dumps and on every plant the
row-by-row equivalence tests use; and the walk runs only for the API entries that are not plain."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from harness_testing import base_data, tensor
from test_compare_at_scale import GOLDENS, plants

from precision_harness.dumps import columns as columns_module
from precision_harness.dumps.columns import Columns, Layouts, columns, walked_columns
from precision_harness.dumps.files import parse_dump, parse_dump_raw
from precision_harness.dumps.rows import IO_NAME_MAPPING, none_item
from precision_harness.goldens.golden import Golden


def assert_same_columns(fast: Columns, walked: Columns, fast_layouts: Layouts, walked_layouts: Layouts) -> None:
    assert fast.names == walked.names
    assert fast.apis == walked.apis
    assert fast.states == walked.states
    for i in range(len(fast.names)):  # key for key, in the dump's order (NaN equals NaN as text)
        assert json.dumps(fast.entry(i)) == json.dumps(walked.entry(i)), fast.names[i]
    assert np.array_equal(fast.layout, walked.layout) and fast_layouts == walked_layouts
    assert np.array_equal(fast.stats, walked.stats, equal_nan=True)
    assert np.array_equal(fast.present, walked.present) and np.array_equal(fast.scalar, walked.scalar)
    for i in range(len(fast.names)):
        assert json.dumps(fast.item(i), sort_keys=True) == json.dumps(walked.item(i), sort_keys=True), fast.names[i]


def assert_fast_is_walk(content: bytes) -> None:
    for parse in (parse_dump, parse_dump_raw):
        fast_layouts, walked_layouts = Layouts(), Layouts()
        fast = columns(parse(content, shown="dump.json"), fast_layouts)
        walked = walked_columns(parse(content, shown="dump.json"), walked_layouts)
        assert_same_columns(fast, walked, fast_layouts, walked_layouts)


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_the_fast_read_is_the_walk_on_every_committed_golden(path: Path) -> None:
    golden = Golden.from_dir(path)
    for step, stage in sorted(golden.stages()):
        for rank in golden.stage(step, stage).ranks():
            assert_fast_is_walk(golden.read(f"step_{step}/{stage}/step0/{rank}/dump.json"))


@pytest.mark.parametrize("plant", list(plants()))
def test_the_fast_read_is_the_walk_on_every_plant(plant: str) -> None:
    for data in plants()[plant]:
        assert_fast_is_walk(json.dumps({"data": data}).encode())


def counting_parser(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The APIs the parser's walk reads, in order, while :func:`columns` runs."""
    read: list[str] = []
    make = columns_module.msprobe_parser

    def parser(**kwargs):
        found = make(**kwargs)
        walk = found.read
        found.read = lambda op_data, api: read.append(api) or walk(op_data, api)
        return found

    monkeypatch.setattr(columns_module, "msprobe_parser", parser)
    return read


def test_only_the_entries_that_are_not_plain_go_through_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    data = base_data()
    data["Functional.softmax.0.forward"]["input_kwargs"] = {"dim": {"type": "int", "value": -1}, "x": None}
    data["Tensor.view.0.forward"] = {"input_args": [{"type": "torch.Size", "value": [2, 4]}], "output": [tensor()]}
    data["Tensor.__and__.0.forward"] = {"input_args": [tensor("torch.bool", (2,), True, False, None, None)]}
    read = counting_parser(monkeypatch)
    fast = columns(parse_dump(json.dumps({"data": data}).encode(), shown="dump.json"), Layouts())
    assert read == ["Tensor.view.0.forward", "Tensor.__and__.0.forward"]
    assert fast.names == walked_columns(parse_dump(json.dumps({"data": data}).encode(), shown="d"), Layouts()).names
    assert "Functional.softmax.0.forward.input.x" in fast.names


def test_a_dump_with_every_entry_plain_never_builds_the_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    read = counting_parser(monkeypatch)
    monkeypatch.setattr(columns_module, "msprobe_parser", lambda **kw: pytest.fail("the parser was built"))
    found = columns(parse_dump(json.dumps({"data": base_data()}).encode(), shown="dump.json"), Layouts())
    assert len(found.names) == 8 and not read


def test_a_row_name_met_twice_keeps_the_walks_row_in_place() -> None:
    """``input_args`` [t] and ``input_kwargs`` {"0": t} both name ``<api>.input.0``: rows() keeps the last row at the
    first's place, and so does the fast read (it hands such a dump to the walk)."""
    data = base_data()
    data["Functional.linear.0.forward"]["input_kwargs"] = {"0": tensor(Max=7.0)}
    content = json.dumps({"data": data}).encode()
    fast = columns(parse_dump(content, shown="dump.json"), Layouts())
    assert fast.names.count("Functional.linear.0.forward.input.0") == 1
    assert float(fast.stats[fast.names.index("Functional.linear.0.forward.input.0"), 0]) == 7.0
    assert_fast_is_walk(content)


def test_the_constants_held_for_msprobe_are_msprobes() -> None:
    from msprobe.core.common.const import CompareConst
    from msprobe.core.compare.utils import op_item_parse

    assert dict(CompareConst.IO_NAME_MAPPING) == IO_NAME_MAPPING
    assert list(IO_NAME_MAPPING) == list(CompareConst.IO_NAME_MAPPING)
    for state in ("input", "output", "input_args", "input_kwargs"):
        expected = op_item_parse(None, "Functional.linear.0.forward.input.1", state)
        assert none_item("Functional.linear.0.forward.input.1", expected[0]["state"]) == expected[0]


def test_statistics_of_every_kind_read_as_the_walk_reads_them() -> None:
    """ints, bools, None, msprobe's "N/A" and non-finite values (bare and as the raw parse's strings): each
    statistic read as the walk reads it."""
    data = {
        "Functional.a.0.forward": {
            "input_args": [
                tensor("torch.int64", (3,), 9, -2, None, None),
                tensor(Max=float("nan"), Min=float("-inf"), Mean="N/A", Norm=float("inf")),
                {"type": "float", "value": float("inf")},
                {"type": "bool", "value": True},
            ],
            "output": [tensor(Max=1, Min=True, Mean=0.5, Norm=None)],
        }
    }
    assert_fast_is_walk(json.dumps({"data": data}).encode())
