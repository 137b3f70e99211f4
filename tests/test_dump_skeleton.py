"""One parse for both dumps of a rank where they share a skeleton (:mod:`precision_harness.dumps.skeleton`).

- On every committed golden's dumps, the run's statistics moved in its bytes (the skeleton kept): the columns of
  both sides equal the columns of each side parsed on its own, field for field, and the rank's verdict equals
  :func:`~precision_harness.check.compare.rank.compare_rank`'s on both dumps parsed;
- every plant of the compare's failure modes gets that verdict too, by whichever way it is read;
- each case the fast read declines (another skeleton, a stage_outputs.json, a number a marker could be mistaken
  for, a statistic held by msprobe's item, a literal that overflows, bytes that do not parse) falls back to the
  row-by-row read, with its verdict;
- a skeleton seen again is not parsed again.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness_testing import base_data, tensor, write_dump
from test_compare_at_scale import GOLDENS, POLICIES, assert_same_verdict, plants
from test_plain_columns import assert_same_columns

from precision_harness.check.compare import rank as compare
from precision_harness.dumps import skeleton
from precision_harness.dumps.columns import Layouts, columns
from precision_harness.dumps.files import STAGE_OUTPUTS, parse_dump_raw
from precision_harness.dumps.stage import DirStage
from precision_harness.goldens.golden import Golden

LITERAL = re.compile(rb'("(?:Max|Min|Mean|Norm)": )(-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+))(?=[\s,}\]])')


def moved(content: bytes, factor: float) -> bytes:
    """``content`` with every floating-point statistic's literal times ``1 + factor`` or ``1 - factor``, alternating,
    written as Python writes a float: the bytes around them kept."""
    count = [0]

    def scale(match: re.Match) -> bytes:
        count[0] += 1
        value = float(match.group(2)) * (1 + factor if count[0] % 2 else 1 - factor)
        return match.group(1) + repr(value).encode()

    return LITERAL.sub(scale, content)


def stages(tmp_path: Path, run: dict[str, bytes], golden: dict[str, bytes]) -> tuple[DirStage, DirStage]:
    """A run's and a golden's ``step_1/actor_update`` holding these dump.json bytes, by rank."""
    for side, dumps in (("run", run), ("golden", golden)):
        for rank, content in dumps.items():
            write_dump(tmp_path / side / "step_1" / "actor_update", {}, rank).write_bytes(content)
    return DirStage(tmp_path / "run" / "step_1" / "actor_update"), DirStage(
        tmp_path / "golden" / "step_1" / "actor_update"
    )


def reference(run: bytes, golden: bytes, policy: str = "default") -> compare.RankVerdict:
    """The verdict of both dumps parsed, each on its own."""
    args = {"policy": POLICIES[policy], "stage": "actor_update", "rank": "rank0"}
    return compare.compare_rank(parse_dump_raw(run, shown="run"), parse_dump_raw(golden, shown="golden"), **args)


def dump_bytes(data: dict) -> bytes:
    return json.dumps({"task": "statistics", "level": "L1", "data": data}, indent=1).encode()


def golden_dumps(golden: Golden) -> Iterator[tuple[str, bytes]]:
    """``(rank, dump.json bytes)`` of every rank of ``golden``, at every step."""
    for step, stage in sorted(golden.stages()):
        source = golden.stage(step, stage)
        for rank in source.ranks():
            content = source.content(rank)
            assert content is not None  # an L1 golden: no stage_outputs.json
            yield rank, content


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_every_committed_golden_moved_reads_as_each_side_parsed_alone(path: Path, built: list[str]) -> None:
    golden = Golden.from_dir(path)
    for rank, content in golden_dumps(golden):
        run = moved(content, 5e-4)
        assert run != content
        fast = _FixedStage(run), _FixedStage(content)
        t, g, layouts = skeleton.same_skeleton_columns(*fast, rank)
        slow_layouts = Layouts()
        t_slow = columns(parse_dump_raw(run, shown="run"), slow_layouts)
        g_slow = columns(parse_dump_raw(content, shown="golden"), slow_layouts)
        assert_same_columns(t, t_slow, layouts, slow_layouts)
        assert_same_columns(g, g_slow, layouts, slow_layouts)
        verdict = compare.read_and_compare_rank(*fast, POLICIES["default"], "rank0")
        assert_same_verdict(verdict, reference(run, content))
    assert built  # a template for each skeleton, and no more
    assert len(built) <= sum(len(golden.stage(*s).ranks()) for s in golden.stages())


class _FixedStage:
    """A StageSource of one rank's bytes (only what the skeleton read and the compare of one rank use)."""

    name, step = "actor_update", 1

    def __init__(self, content: bytes) -> None:
        self._content = content

    def __str__(self) -> str:
        return "fixed"

    def content(self, rank: str) -> bytes | None:
        return self._content

    def index(self, rank: str) -> None:
        return None

    def load(self, rank: str, *, raw: bool = False) -> dict:
        return parse_dump_raw(self._content, shown="fixed")


@pytest.mark.parametrize("plant", list(plants()))
def test_every_plant_gets_the_verdict_of_both_parsed(plant: str, tmp_path: Path, built: list[str]) -> None:
    """The plants that move values only share the golden's skeleton (one parse); the others are read row by row."""
    run, golden = (dump_bytes(d) for d in plants()[plant])
    run_stage, golden_stage = stages(tmp_path, {"rank0": run}, {"rank0": golden})
    verdict = compare.read_and_compare_rank(run_stage, golden_stage, POLICIES["default"], "rank0")
    assert_same_verdict(verdict, reference(run, golden))
    values_only = plant in ("identical", "beyond", "within", "mean_near_zero", "null_argument_both")
    assert bool(built) == values_only, built


def test_ranks_of_one_skeleton_are_parsed_once_and_each_gets_its_own_values(tmp_path: Path, built: list[str]) -> None:
    golden = dump_bytes(base_data())
    ranks = {f"rank{r}": moved(golden, factor) for r, factor in enumerate((1e-2, 1e-3, 1e-9))}
    run_stage, golden_stage = stages(tmp_path, ranks, dict.fromkeys(ranks, golden))
    verdicts = [compare.read_and_compare_rank(run_stage, golden_stage, POLICIES["default"], rank) for rank in ranks]
    assert len(built) == 1
    for verdict, run in zip(verdicts, ranks.values(), strict=True):
        expected = reference(run, golden)
        assert [(d.tensor, d.statistic, d.target) for d in verdict.drifts] == [
            (d.tensor, d.statistic, d.target) for d in expected.drifts
        ]
        assert (verdict.checked, verdict.passed, verdict.profile) == (
            expected.checked,
            expected.passed,
            [(verdict.rank, *p[1:]) for p in expected.profile],
        )
    assert [v.passed for v in verdicts] == [False, False, True]  # 1e-2 and 1e-3 move beyond tolerance; 1e-9 within


def _declines(tmp_path: Path, run: bytes, golden: bytes) -> None:
    run_stage, golden_stage = stages(tmp_path, {"rank0": run}, {"rank0": golden})
    assert skeleton.same_skeleton_columns(run_stage, golden_stage, "rank0") is None
    assert_same_verdict(
        compare.read_and_compare_rank(run_stage, golden_stage, POLICIES["default"], "rank0"), reference(run, golden)
    )


def test_another_skeleton_is_read_row_by_row_without_a_template(tmp_path: Path, built: list[str]) -> None:
    data = base_data()
    changed = copy.deepcopy(data)
    changed["Functional.softmax.0.forward"]["output"][0]["dtype"] = "torch.bfloat16"
    _declines(tmp_path, dump_bytes(changed), dump_bytes(data))
    assert not built  # nothing parsed for a template where the skeletons differ


def test_a_rank_with_stage_outputs_is_read_row_by_row(tmp_path: Path, built: list[str]) -> None:
    golden = dump_bytes(base_data())
    run_stage, golden_stage = stages(tmp_path, {"rank0": moved(golden, 1e-3)}, {"rank0": golden})
    outputs = {"data": {"Stage.advantages.0.forward": {"input_args": [tensor()]}}}
    for stage in (run_stage, golden_stage):
        (stage.path / "step0" / "rank0" / STAGE_OUTPUTS).write_text(json.dumps(outputs))
    assert run_stage.content("rank0") is None
    assert skeleton.same_skeleton_columns(run_stage, golden_stage, "rank0") is None
    assert not built


@pytest.mark.parametrize("literal", ["1e+290", "-3.1e+291", "2E+300", "5e1000"])
def test_a_golden_holding_a_number_a_marker_could_be_is_read_row_by_row(
    literal: str, tmp_path: Path, built: list[str]
) -> None:
    data = base_data()
    data["Functional.softmax.0.forward"]["input_kwargs"] = {"scale": {"type": "float", "value": 0.5}}
    golden = dump_bytes(data).replace(b'"value": 0.5', b'"value": ' + literal.encode())
    _declines(tmp_path, moved(golden, 1e-3), golden)
    assert len(built) == 1  # refused before its parse, and not tried again


def test_a_statistic_the_parsers_walk_holds_declines_and_keeps_the_verdict(tmp_path: Path, built: list[str]) -> None:
    """A tensor entry with msprobe's md5 (``summary_mode: md5``) is msprobe's own item, which holds its statistics."""
    data = base_data()
    data["Functional.softmax.0.forward"]["output"][0]["md5"] = "0a1b2c3d"
    golden = dump_bytes(data)
    _declines(tmp_path, moved(golden, 1e-3), golden)
    assert len(built) == 1  # parsed with markers, refused, and not parsed again for the verdict


def test_a_row_with_a_non_finite_statistic_keeps_each_sides_numbers(tmp_path: Path, built: list[str]) -> None:
    """A causal mask's row (finite Max and Min, -inf Mean and Norm) keeps its four statistics in its entry."""
    data = base_data()
    data["Functional.softmax.0.forward"]["input_args"][0].update(Mean=float("-inf"), Norm=float("inf"))
    golden = dump_bytes(data)
    run = moved(golden, 1e-3)
    run_stage, golden_stage = stages(tmp_path, {"rank0": run}, {"rank0": golden})
    t, g, _ = skeleton.same_skeleton_columns(run_stage, golden_stage, "rank0")
    row = t.names.index("Functional.softmax.0.forward.input.0")
    assert t.entry(row)["Max"] == pytest.approx(3.0 * (1 + 1e-3)) and g.entry(row)["Max"] == 3.0
    assert_same_verdict(
        compare.read_and_compare_rank(run_stage, golden_stage, POLICIES["default"], "rank0"), reference(run, golden)
    )


def test_a_literal_that_overflows_is_left_to_the_parse(tmp_path: Path, built: list[str]) -> None:
    golden = dump_bytes(base_data())
    run = golden.replace(b'"Max": 0.9', b'"Max": 9.9e999', 1)
    run_stage, golden_stage = stages(tmp_path, {"rank0": run}, {"rank0": golden})
    assert skeleton.same_skeleton_columns(run_stage, golden_stage, "rank0") is None
    assert not built


def test_dumps_that_do_not_parse_fail_the_rank_naming_the_run_file_and_offset(tmp_path: Path, built: list[str]) -> None:
    """Both cut short alike share a skeleton; the row-by-row read names the run's file and the byte offset."""
    cut = dump_bytes(base_data())[:700]
    run_stage, golden_stage = stages(tmp_path, {"rank0": cut}, {"rank0": cut})
    verdict = compare.read_and_compare_rank(run_stage, golden_stage, POLICIES["default"], "rank0")
    (problem,) = verdict.problems
    assert str(run_stage.path / "step0" / "rank0" / "dump.json") in problem.text
    assert re.search(r"not JSON at byte \d+ of 700 \(", problem.text) and "\n" not in problem.text


@pytest.mark.parametrize(
    ("head", "level"),
    [
        (b'{\n "task": "statistics",\n "level": "L1",\n "framework": "pytorch",\n "data": {}}', "L1"),
        (b'{"task": "tensor", "dump_data_dir": null, "level": "mix", "data": {}}', "mix"),
        (b'{"data": {}, "level": "L0"}', "L0"),  # after data: the whole file is parsed
        (b'{"task": "a \\"level\\": \\"L0\\"", "level": "L1", "data": {}}', "L1"),  # a level inside a string
    ],
)
def test_a_run_directorys_level_is_read_from_the_head_of_its_first_dump(
    head: bytes, level: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 7B rank's dump.json is 50 MB: its level is read from the first kilobytes where msprobe put it, else from
    the whole file, with the same answer."""
    from precision_harness.goldens import manifest

    (tmp_path / "step_1" / "actor_update" / "step0" / "rank0").mkdir(parents=True)
    (tmp_path / "step_1" / "actor_update" / "step0" / "rank0" / "dump.json").write_bytes(head)
    parsed: list[Path] = []
    load = manifest.load_dump
    monkeypatch.setattr(manifest, "load_dump", lambda path, raw=False: parsed.append(path) or load(path, raw=raw))
    assert manifest.dump_level(tmp_path, ["step_1/actor_update/step0/rank0/dump.json"]) == level
    assert bool(parsed) == (head.startswith(b'{"data"') or b"\\" in head)


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_the_level_read_from_the_head_is_the_parsed_level_on_every_committed_golden(path: Path, tmp_path: Path) -> None:
    from precision_harness.goldens import manifest

    golden = Golden.from_dir(path)
    step, stage = min(golden.stages())
    name = f"step_{step}/{stage}/step0/rank0/dump.json"
    golden.export(tmp_path, [name])
    assert manifest._LEVEL.match((tmp_path / name).read_bytes()[:4096])
    assert manifest.dump_level(tmp_path, [name]) == json.loads((tmp_path / name).read_bytes())["level"]
