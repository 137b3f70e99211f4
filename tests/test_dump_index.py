"""A golden rank's ``dump.index`` (:mod:`precision_harness.dumps.dump_index`): written at record time, read at compare.

- On every committed golden's dumps, a run whose statistics moved reads the same columns and gets the same verdict
  against the indexed golden as against the golden parsed, and no template is parsed;
- a golden recorded by the store lists an index per rank, a compare reads it instead of parsing the golden, and
  msprobe's folder of the stage holds no index;
- an index of another dump or version is ignored (the golden is parsed), one that is not an index fails naming its
  file, and a dump the skeleton read declines gets none;
- the literals are read as ``float`` reads them, or not at all.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from harness_testing import TINY, base_data
from test_compare_at_scale import GOLDENS, POLICIES, assert_same_verdict
from test_dump_skeleton import dump_bytes, golden_dumps, moved, reference, stages
from test_golden import fake_run
from test_plain_columns import assert_same_columns

from precision_harness.check.compare import rank as compare
from precision_harness.dumps import dump_index, skeleton
from precision_harness.dumps.dump_index import INDEX, DumpIndex
from precision_harness.dumps.files import parse_dump_raw
from precision_harness.errors import GoldenCorruptError
from precision_harness.goldens.golden import Golden
from precision_harness.goldens.store import GoldenStore
from precision_harness.scenarios.scenario import Scenario


class _IndexedStage:
    """A golden's StageSource of one rank's bytes and their index (only what the compare of one rank uses)."""

    name, step = "actor_update", 1

    def __init__(self, content: bytes, index: bytes | None) -> None:
        self._content, self._index = content, index

    def __str__(self) -> str:
        return "indexed"

    def content(self, rank: str) -> bytes | None:
        return self._content

    def index(self, rank: str) -> DumpIndex | None:
        sha = hashlib.sha256(self._content).hexdigest()
        return None if self._index is None else DumpIndex.of(self._index, dump_sha256=sha, shown="indexed")

    def load(self, rank: str, *, raw: bool = False) -> dict:
        self.parsed += 1
        return parse_dump_raw(self._content, shown=str(self))

    parsed = 0  #: how many times the compare parsed this side


class _RunStage(_IndexedStage):
    def __init__(self, content: bytes) -> None:
        super().__init__(content, None)


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_every_committed_golden_indexed_reads_and_judges_as_parsed(
    path: Path, built: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    indexed = 0
    for rank, content in golden_dumps(Golden.from_dir(path)):
        data = dump_index.build(content, shown="golden")
        assert data == dump_index.build(content, shown="golden")  # its bytes depend on the dump's alone
        run = moved(content, 5e-4)
        parsed = skeleton.same_skeleton_columns(_RunStage(run), _IndexedStage(content, None), rank)
        if data is None:  # declined by the skeleton read: the golden is parsed as before
            assert parsed is None
            continue
        indexed += 1
        monkeypatch.setattr(skeleton, "_last", None)
        before = len(built)
        t, g, layouts = skeleton.same_skeleton_columns(_RunStage(run), _IndexedStage(content, data), rank)
        assert len(built) == before  # no template parsed: the index's
        assert_same_columns(t, parsed[0], layouts, parsed[2])
        assert_same_columns(g, parsed[1], layouts, parsed[2])
        sides = _RunStage(run), _IndexedStage(content, data)
        verdict = compare.read_and_compare_rank(*sides, POLICIES["default"], "rank0")
        assert_same_verdict(verdict, reference(run, content))
        assert (sides[0].parsed, sides[1].parsed) == (0, 0)
    assert indexed  # every committed golden is L1: its dumps are indexed


@pytest.fixture
def recorded(tmp_path: Path) -> Golden:
    scenario = Scenario.load(TINY)
    store = GoldenStore(tmp_path / "golden")
    store.promote(fake_run(tmp_path / "run", scenario), scenario, "cpu")
    return store.load(scenario, "cpu")


def test_a_recorded_golden_lists_an_index_per_rank_and_the_compare_reads_it(
    recorded: Golden, tmp_path: Path, built: list[str]
) -> None:
    dumps = [n for n in recorded.contents if n.endswith("/dump.json")]
    assert sorted(n.removesuffix("dump.json") + INDEX for n in dumps) == sorted(
        n for n in recorded.contents if n.endswith(f"/{INDEX}")
    )
    stage = recorded.stage(1, "actor_update")
    content = stage.content("rank0")
    run = moved(content, 1e-2)
    run_stage, _ = stages(tmp_path, {"rank0": run}, {"rank0": content})
    verdict = compare.read_and_compare_rank(run_stage, stage, POLICIES["default"], "rank0")
    assert not built  # the golden's template came from its index
    assert not verdict.passed
    assert_same_verdict(verdict, reference(run, content))
    msprobe_folder = stage.plain_dir(tmp_path / "export")
    assert (msprobe_folder / "step0/rank0/dump.json").is_file()
    assert not list(msprobe_folder.rglob(INDEX))  # msprobe's tools get its own files only
    exported = recorded.export(tmp_path / "golden_export")
    assert (exported / "step_1/actor_update/step0/rank0/dump.json").is_file() and not list(exported.rglob(INDEX))


def test_an_index_of_another_dump_or_version_is_ignored(tmp_path: Path, built: list[str]) -> None:
    golden = dump_bytes(base_data())
    data = dump_index.build(golden, shown="golden")
    sha = hashlib.sha256(golden).hexdigest()
    assert DumpIndex.of(data, dump_sha256=sha, shown="x") is not None
    assert DumpIndex.of(data, dump_sha256="0" * 64, shown="x") is None
    older = data.replace(f'"version": {dump_index.VERSION}'.encode(), b'"version": 0', 1)
    assert older != data and DumpIndex.of(older, dump_sha256=sha, shown="x") is None
    assert _IndexedStage(dump_bytes({}), data).index("rank0") is None  # the index of another dump.json
    # a run of another skeleton: the index is not used, the golden is parsed, and the verdict is the parse's
    run = moved(
        dump_bytes({**base_data(), "Functional.softmax.9.forward": base_data()["Functional.softmax.0.forward"]}), 0.1
    )
    sides, before = (_RunStage(run), _IndexedStage(golden, data)), len(built)  # build() parsed the golden once
    assert skeleton.same_skeleton_columns(*sides, "rank0") is None
    assert_same_verdict(compare.read_and_compare_rank(*sides, POLICIES["default"], "rank0"), reference(run, golden))
    assert sides[1].parsed == 1 and len(built) == before


def test_a_file_that_is_not_an_index_fails_naming_it(recorded: Golden) -> None:
    sha = "0" * 64
    for data in (b"", b"{}", b"precision-harness dump.index\n{}\n", b"precision-harness dump.index\nnot json\n"):
        with pytest.raises(GoldenCorruptError, match=r"^golden/x/dump\.index: not a dump\.index file; re-record"):
            DumpIndex.of(data, dump_sha256=sha, shown="golden/x/dump.index")
    good = recorded.read(f"step_1/actor_update/step0/rank0/{INDEX}")
    with pytest.raises(GoldenCorruptError, match=r"not a dump\.index file"):
        DumpIndex.of(good + b"\x00", dump_sha256=sha, shown="golden/x/dump.index")  # sizes that do not add up


def test_an_edited_index_fails_its_golden_as_any_edited_payload(recorded: Golden) -> None:
    name = f"step_1/actor_update/step0/rank0/{INDEX}"
    stored = recorded.path / recorded.contents[name]
    stored.write_bytes(stored.read_bytes()[:-1])
    with pytest.raises(GoldenCorruptError, match=r"dump.index.zst: sha256 differs"):
        recorded.stage(1, "actor_update").index("rank0")


@pytest.mark.parametrize(
    "case",
    ["nul", "overflow", "marker_sized"],
)
def test_a_dump_the_skeleton_read_declines_gets_no_index(case: str) -> None:
    data = base_data()
    entry = data["Functional.linear.0.forward"]["output"][0]
    if case == "overflow":
        content = dump_bytes(data).replace(json.dumps(entry["Max"]).encode(), b"1.5e999", 1)
    elif case == "marker_sized":
        data["Functional.linear.0.forward"]["input_args"].append({"type": "float", "value": 3.0e300})
        content = dump_bytes(data)  # a number of the skeleton a marker could be taken for
    else:
        content = dump_bytes(data).replace(b'"task"', b'"ta\x00sk"', 1)
    assert dump_index.build(content, shown="golden") is None


@pytest.mark.parametrize(
    "literal",
    [
        b"0.1",
        b"-0.0",
        b"1e-320",
        b"2.2250738585072014e-308",
        b"1.7976931348623157e308",
        b"9007199254740993.0",
        b"0.30000000000000004",
        b"1E5",
        b"-3.14159265358979323846264338327950288",
    ],
)
def test_the_literals_read_as_float_reads_them(literal: bytes) -> None:
    values = skeleton.floats([literal, b"1.0"])
    assert values is not None
    assert values[0].tobytes() == np.float64(float(literal)).tobytes()


@pytest.mark.parametrize("literal", [b"1e999", b"-1.0e400", b"01.5"])
def test_a_literal_json_or_float64_cannot_hold_is_left_to_the_parse(literal: bytes) -> None:
    assert skeleton.floats([b"1.0", literal]) is None


def test_migrate_indexes_a_golden_recorded_before_indexes_and_nothing_else(recorded: Golden) -> None:
    store, scenario = GoldenStore(recorded.path.parents[1]), Scenario.load(TINY)
    names = [n for n in recorded.contents if n.endswith(f"/{INDEX}")]
    indexes = {n: recorded.read(n) for n in names}
    manifest = json.loads((recorded.path / "manifest.json").read_text())
    for name in names:  # as recorded before indexes existed
        (recorded.path / recorded.contents[name]).unlink()
        del manifest["files"][recorded.contents[name]]
    (recorded.path / "manifest.json").write_text(json.dumps(manifest))
    older = store.load(scenario, "cpu")
    assert not older.stage(1, "actor_update").indexed("rank0")
    assert store.migrate("tiny_ppo", "cpu") is True
    migrated = store.load(scenario, "cpu")
    assert {n: migrated.read(n) for n in names} == indexes  # the very index an update writes
    assert all(migrated.read(n) == older.read(n) for n in older.contents)  # every payload as it was
    assert migrated.stage(1, "actor_update").index("rank0") is not None
    assert store.migrate("tiny_ppo", "cpu") is False  # compressed and indexed: nothing to do
