"""A few calls cut from a dump's bytes (:func:`~precision_harness.dumps.files.cut_calls`), where the run and the golden
hold the same calls: msprobe's window and where a change entered read them, with what the whole parse gives, or
parse where the bytes do not cut.

- :func:`cut_calls` equals :func:`~precision_harness.dumps.files.restored_calls` of the whole parse at the start, in the
  middle and at the end of a dump, written as msprobe writes it or compact, non-finite values and a call without a
  row included; it declines a dump whose ``data`` is not its last key, a call spelt another way, a cut that does not
  read as the calls asked for;
- a failing stage's window written from the cut is byte for byte the window written from the parse, and a rank that
  passes keeps no call list;
- where a change entered is the same read from the calls cut up to it as from the parse, on every plant.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from harness_testing import tensor, write_dump
from test_compare_at_scale import POLICIES, plants

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare import stage as compare
from precision_harness.check.localize import drift_origin
from precision_harness.check.localize.msprobe_window import write_window
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.dumps import stage
from precision_harness.dumps.files import cut_calls, parse_dump_raw, restored_calls
from precision_harness.dumps.stage import DirStage


def calls(n: int, *, moved_from: int | None = None, factor: float = 1.1) -> dict:
    """``n`` linear calls (a dropout without rows at call 5, a non-finite Mean at call 7); outputs times ``factor``
    from call ``moved_from`` on."""
    data = {}
    for i in range(n):
        scale = factor if moved_from is not None and i >= moved_from else 1.0
        out = tensor(Max=(2.0 + i) * scale, Mean=math.nan if i == 7 else 0.01)
        data[f"Functional.linear.{i}.forward"] = {"input_args": [tensor(Max=1.0 + i)], "output": [out]}
        if i == 5:
            data["Functional.dropout.0.forward"] = {}
    return data


def dump_text(data: dict, *, indent: int | None = 1, last: bool = True) -> bytes:
    head = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None}
    dump = {**head, "data": data} if last else {"data": data, **head}
    separators = None if indent is not None else (",", ":")
    return json.dumps(dump, indent=indent, separators=separators).encode()


@pytest.mark.parametrize("indent", [1, None], ids=["msprobe", "compact"])
@pytest.mark.parametrize("span", [(0, 3), (4, 9), (15, 21), (0, 21)], ids=["start", "middle", "end", "whole"])
def test_a_cut_is_the_whole_parse_cut(indent: int | None, span: tuple[int, int]) -> None:
    content = dump_text(calls(20), indent=indent)
    keys = list(json.loads(content)["data"])
    cut = cut_calls(content, keys, span)
    whole = restored_calls(parse_dump_raw(content, shown="dump"), keys[span[0] : span[1]])
    assert cut is not None and list(cut["data"]) == keys[span[0] : span[1]]
    assert json.dumps(cut) == json.dumps(whole)  # NaN included, key for key, in order


def test_a_cut_declines_what_it_cannot_read_as_asked() -> None:
    content = dump_text(calls(20))
    keys = list(json.loads(content)["data"])
    first_data = dump_text(calls(20), last=False)
    assert cut_calls(first_data, keys, (2, 4)) is None and cut_calls(first_data, keys, (19, 21)) is None
    assert cut_calls(content, [*keys[:3], "Functional.linear.99.forward", *keys[3:]], (2, 4)) is None  # not held
    assert cut_calls(content, [*keys[:4], *keys[5:]], (2, 4)) is None  # the bytes hold a call more than asked for
    assert cut_calls(content, keys[:-1], (2, 4)) is None  # its last call is not the last
    assert cut_calls(content, [keys[1], keys[0], *keys[2:]], (0, 2)) is None  # not in that order
    assert cut_calls(content, keys, (3, 3)) is None and cut_calls(content, keys, (0, 22)) is None
    assert cut_calls(content.replace(b'"data"', b'"dat\\u0061"'), keys, (2, 4)) is None  # spelt otherwise


def stages(tmp_path: Path, n: int, at: int, factor: float = 1.1) -> tuple[DirStage, DirStage]:
    for side, moved in (("golden", None), ("run", at)):
        write_dump(tmp_path / side / "step_1" / "actor_update", calls(n, moved_from=moved, factor=factor))
    return DirStage(tmp_path / "run" / "step_1" / "actor_update"), DirStage(
        tmp_path / "golden" / "step_1" / "actor_update"
    )


@pytest.mark.parametrize("n, at", [(600, 300), (600, 580), (30, 10)], ids=["middle", "end", "whole"])
def test_the_window_cut_from_the_bytes_is_the_window_of_the_parse(
    tmp_path: Path, n: int, at: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[dict | None] = []
    monkeypatch.setattr(stage, "cut_calls", lambda *a: read.append(cut_calls(*a)) or read[-1])
    run, golden = stages(tmp_path, n, at)
    verdict = compare.compare_stage(run, golden, CheckSettings(scenario="s", policy=TolerancePolicy()))
    assert not verdict.passed and list(verdict.calls) == ["rank0"]
    assert verdict.calls["rank0"] == list(json.loads((run.path / "step0/rank0/dump.json").read_text())["data"])
    cut = write_window(run, golden, verdict, tmp_path / "cut")
    assert len(read) == 2 and all(r is not None for r in read)  # both sides cut
    verdict.calls = {}  # the parse's way
    parsed = write_window(run, golden, verdict, tmp_path / "parsed")
    assert len(read) == 2
    assert (cut.rank, cut.start, cut.end, cut.calls, cut.line) == (
        parsed.rank,
        parsed.start,
        parsed.end,
        parsed.calls,
        parsed.line,
    )
    for side in ("run", "golden"):
        files = sorted(p.relative_to(tmp_path / "cut") for p in (tmp_path / "cut").rglob(f"{side}/**/*.json"))
        assert files
        for name in files:
            assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "parsed" / name).read_bytes()


def test_a_passing_rank_keeps_no_call_list(tmp_path: Path) -> None:
    run, golden = stages(tmp_path, 30, 10, factor=1 + 1e-12)  # moved, within tolerance
    verdict = compare.compare_stage(run, golden, CheckSettings(scenario="s", policy=TolerancePolicy()))
    assert verdict.passed and not verdict.identical and verdict.calls == {}


@pytest.mark.parametrize("plant", [p for p in plants() if p != "too_different"])
def test_where_the_change_entered_is_the_same_from_the_cut_as_from_the_parse(
    plant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[dict | None] = []
    monkeypatch.setattr(stage, "cut_calls", lambda *a: read.append(cut_calls(*a)) or read[-1])
    sides = {}
    for side, data in zip(("run", "golden"), plants()[plant], strict=True):
        write_dump(tmp_path / side / "step_1" / "actor_update", {**data, **calls(3)})
        sides[side] = DirStage(tmp_path / side / "step_1" / "actor_update")
    verdict = compare.compare_stage(
        sides["run"], sides["golden"], CheckSettings(scenario="s", policy=POLICIES["default"])
    )
    cut = drift_origin.classify(verdict, sides["run"], sides["golden"])
    kept_calls, verdict.calls = verdict.calls, {}
    assert cut == drift_origin.classify(verdict, sides["run"], sides["golden"])
    if plant in ("beyond", "nan", "dtype"):  # failing, the same calls both sides: the cut was read
        assert kept_calls and cut is not None and read and all(r is not None for r in read)
    if plant == "shape":  # a call of another shape is a changed code path: paired, not cut
        assert verdict.code_paths and cut is not None and cut.kind is drift_origin.OriginKind.CODE_PATH
