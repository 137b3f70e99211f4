"""The compare at the limit (issue 38) gives the verdicts the row-by-row compare gave, row for row.

- msprobe's row names: :func:`rows` equals ``read_op``'s items, key for key, on every committed golden;
- the orjson parse equals ``json.loads`` on every committed golden payload (non-finite values included);
- the columns (:func:`~precision_harness.dumps.columns.columns`) name the rows as :func:`rows` does and read
  their statistics as ``stat_table.four`` does, from a dump parsed with its non-finite values restored or not;
- every kept Drift (a rank's first and largest), Problem, profile entry, count (drifts not kept, drifts by API and
  statistic) and changed code path of the vectorised :func:`compare_rank`
  (columnar where both dumps hold the same calls) equals the row-by-row reference's (the compare as b9eb971
  ran it, below) on every committed golden stage, perturbed, and on synthetic plants of each failure mode,
  the dumps parsed as ``json.loads`` does and as :func:`parse_dump_raw` does;
- a truncated dump.json fails its rank with one line naming the file and the byte offset; the other ranks
  and stages still get their verdicts.
"""

from __future__ import annotations

import copy
import json
import math
import weakref
from pathlib import Path

import pytest
from harness_testing import base_data, long_stage, tensor, write_dump

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare import rank as rank_compare
from precision_harness.check.compare import rank_pool
from precision_harness.check.compare import stage as compare
from precision_harness.check.compare.code_path import BlockRows, by_call, evaluate
from precision_harness.check.compare.stat_table import four
from precision_harness.check.item_key import ItemKey
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import check_items
from precision_harness.dumps.columns import Layouts, columns
from precision_harness.dumps.files import parse_dump, parse_dump_raw
from precision_harness.dumps.pairing import aligned_golden, pair_calls
from precision_harness.dumps.rows import rows
from precision_harness.dumps.stage import DirStage
from precision_harness.goldens.golden import Golden

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = sorted(p.parent for p in ROOT.glob("golden/*/*/manifest.json"))
POLICIES = {
    "default": TolerancePolicy(),
    "overrides": TolerancePolicy.from_config(
        {
            "dtypes": {"float32": {"rtol": 1e-3}},
            "statistics": {"Mean": {"atol": 1e-4}},
            "apis": {"*linear*": {"rtol": 0.5}},
        }
    ),
    "exact": TolerancePolicy(mode="exact"),
}


def read_op_rows(dump: dict) -> dict[str, dict]:
    """The rows as msprobe's ``read_op`` gives them (the parser rows() stood on before issue 38)."""
    from msprobe.core.compare.utils import read_op

    found = {}
    for api, op_data in dump["data"].items():
        kwargs = f"{api}.kwargs."
        for item in read_op(op_data, api):
            item["api"] = api
            name = item["full_op_name"]
            if name.startswith(kwargs):
                name = item["full_op_name"] = f"{api}.input.{name[len(kwargs) :]}"
            found[name] = item
    return found


def row_by_row(
    t_dump: dict, g_dump: dict, *, policy: TolerancePolicy, stage: str, rank: str
) -> rank_compare.RankVerdict:
    """The reference: compare_rank as it ran before issue 38, every row through ``_compare_row``."""
    verdict = rank_compare.RankVerdict(rank)
    pairing = pair_calls(t_dump, g_dump)
    if not pairing.alignable:
        verdict.problem(rank_compare._too_different(pairing))
        return verdict
    t_rows, g_rows = read_op_rows(t_dump), read_op_rows(aligned_golden(g_dump, pairing))
    in_blocks = {api for block in pairing.blocks for api in block.target}
    first_row: dict[str, int] = {}
    for order, (name, t_item) in enumerate(t_rows.items()):
        first_row.setdefault(str(t_item["api"]), order)
        if t_item["api"] in in_blocks:
            continue
        g_item = g_rows.get(name)
        if g_item is None:
            verdict.problem(f"{name}: not in the golden")
            continue
        rank_compare._compare_row(verdict, rank_compare._Row(name, order, t_item, g_item), policy=policy, stage=stage)
    for name in g_rows:
        if name not in t_rows:
            verdict.problem(f"{name}: in the golden but missing from this run")
    block_rows = BlockRows(by_call(t_rows), by_call(read_op_rows(g_dump)), policy, stage)
    for block in pairing.blocks:
        at = block.target[0] if block.target else (block.after[0] if block.after else None)
        order = first_row.get(at, len(t_rows)) if at is not None else len(t_rows)
        verdict.code_paths.append(evaluate(block, block_rows, rank=rank, order=order))
    verdict.bound()  # every drift built one by one, then kept as a verdict keeps them (check.compare.drift_set)
    return verdict


def same_floats(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def assert_same_verdict(new: rank_compare.RankVerdict, ref: rank_compare.RankVerdict) -> None:
    assert new.checked == ref.checked
    assert new.problems == ref.problems
    assert len(new.drifts) == len(ref.drifts)
    for a, b in zip(new.drifts, ref.drifts, strict=True):
        assert (a.tensor, a.statistic, a.tol, a.order, a.rank) == (b.tensor, b.statistic, b.tol, b.order, b.rank)
        assert all(same_floats(x, y) for x, y in ((a.golden, b.golden), (a.target, b.target), (a.rel, b.rel)))
        assert a.ratio == b.ratio
    assert new.drift_set == ref.drift_set  # the count of those not kept, every drift by API and statistic
    assert new.profile == ref.profile
    assert new.code_paths == ref.code_paths
    assert new.recording == ref.recording and new.unchecked == ref.unchecked


def scaled(node, factor: float, i: list[int]) -> None:
    """Every Max/Min/Mean/Norm below ``node`` times ``1 + factor`` or ``1 - factor``, alternating."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("Max", "Min", "Mean", "Norm") and isinstance(value, float):
                i[0] += 1
                node[key] = value * (1 + factor if i[0] % 2 else 1 - factor)
            else:
                scaled(value, factor, i)
    elif isinstance(node, list):
        for value in node:
            scaled(value, factor, i)


def golden_stages():
    """Every committed golden's stages, at every step."""
    for path in GOLDENS:
        golden = Golden.from_dir(path)
        for step, stage in sorted(golden.stages()):
            yield pytest.param(path, step, stage, id=f"{path.parent.name}-{path.name}-{step}-{stage}")


#: (factor, policy) a stage is perturbed by: all of them at step 1; at later steps, whose dumps hold step 1's calls
#: with other values, the one that also checks the raw parse (the policies read the same calls whatever the values)
PERTURBATIONS = ((5e-10, "default"), (5e-4, "default"), (5e-4, "overrides"))


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_rows_are_msprobes_read_op_and_the_parse_is_json_loads(path: Path) -> None:
    golden = Golden.from_dir(path)
    for step, stage in sorted(golden.stages()):
        source = golden.stage(step, stage)
        for rank in source.ranks():
            content = golden.read(f"step_{step}/{stage}/step0/{rank}/dump.json")
            dump = parse_dump(content, shown="dump.json")
            reference = json.loads(content)
            assert json.dumps(dump, sort_keys=True) == json.dumps(reference, sort_keys=True)
            assert list(rows(dump).items()) == list(read_op_rows(reference).items())
            assert_columns_are_rows(columns(parse_dump_raw(content, shown="dump.json"), Layouts()), rows(dump))


def assert_columns_are_rows(found, reference: dict[str, dict]) -> None:
    assert found.names == list(reference)
    for i, (name, item) in enumerate(reference.items()):
        assert json.dumps(found.item(i), sort_keys=True) == json.dumps(item, sort_keys=True), name
        stats = four(item)
        assert bool(found.scalar[i]) == (stats is None), name
        for k, value in enumerate(stats or []):
            assert bool(found.present[i, k]) == (value is not None), name
            assert value is None or same_floats(float(found.stats[i, k]), value), name


def raw(dump: dict) -> dict:
    """``dump`` as :func:`parse_dump_raw` reads its bytes: each non-finite statistic a sentinel string."""
    return parse_dump_raw(json.dumps(dump).encode(), shown="dump.json")


@pytest.mark.parametrize(("path", "step", "stage"), list(golden_stages()))
def test_every_golden_stage_perturbed_gets_the_row_by_row_verdict(path: Path, step: int, stage: str) -> None:
    source = Golden.from_dir(path).stage(step, stage)
    for rank in source.ranks():
        golden = source.load(rank)
        for factor, policy in PERTURBATIONS if step == 1 else PERTURBATIONS[1:2]:
            target = copy.deepcopy(golden)
            scaled(target["data"], factor, [0])
            args = {"policy": POLICIES[policy], "stage": stage, "rank": rank}
            reference = row_by_row(target, golden, **args)
            assert_same_verdict(rank_compare.compare_rank(target, golden, **args), reference)
            if (factor, policy) == (5e-4, "default"):  # once: the parse is the same whatever the policy
                assert_same_verdict(rank_compare.compare_rank(raw(target), raw(golden), **args), reference)


def plants() -> dict[str, tuple[dict, dict]]:
    """(target data, golden data) of each failure mode tests/test_compare.py and test_code_path.py plant."""
    golden = base_data()
    out: dict[str, tuple[dict, dict]] = {}

    def planted(name: str, edit) -> None:
        target = copy.deepcopy(golden)
        edit(target)
        out[name] = (target, golden)

    softmax, linear = "Functional.softmax.0.forward", "Functional.linear.0.forward"
    planted("identical", lambda d: None)
    planted("beyond", lambda d: d[softmax]["output"][0].update(Max=0.95))
    planted("within", lambda d: d[softmax]["output"][0].update(Max=0.9 * (1 + 1e-8)))
    planted("mean_near_zero", lambda d: d[linear]["output"][0].update(Mean=0.0100004))
    planted("nan", lambda d: d[softmax]["output"][0].update(Max=float("nan"), Min=float("-inf")))
    planted("inf_both", lambda d: [d[softmax]["output"][0].update(Max=float("inf"))])
    planted("dtype", lambda d: d[softmax]["output"][0].update(dtype="torch.bfloat16"))
    planted("shape", lambda d: d[softmax]["output"][0].update(shape=[2, 4, 9]))
    planted("stat_missing", lambda d: d[softmax]["output"][0].update(Norm=None))
    planted("stat_na", lambda d: d[softmax]["output"][0].update(Norm="N/A"))
    # an msprobe that records Mean and Norm of integer tensors (26.0.0) against one that does not (26.2.0), both ways
    embedding_ids = "Functional.embedding.0.forward"
    planted("int_stats_added", lambda d: d[embedding_ids]["input_args"][0].update(Mean=4.5, Norm=12.0))
    counted = copy.deepcopy(golden)
    counted[embedding_ids]["input_args"][0].update(Mean=4.5, Norm=12.0)
    out["int_stats_lost"] = (copy.deepcopy(golden), counted)
    planted("zero_allowance", lambda d: d["Functional.embedding.0.forward"]["input_args"][0].update(Max=10))
    planted("extra_output", lambda d: d[softmax]["output"].append(tensor()))
    planted("missing_output", lambda d: d[softmax]["output"].pop())
    planted("scalar", lambda d: d[softmax]["input_kwargs"].update(dim={"type": "int", "value": -1}))
    planted("extra_call", lambda d: d.update({"Functional.gelu.0.forward": d[softmax]}))
    planted("replaced_call", lambda d: d.update({"Tensor.__mul__.0.forward": d.pop(linear)}))
    out["scalar_changed"] = (
        {**golden, softmax: {**golden[softmax], "input_kwargs": {"dim": {"type": "int", "value": 2}}}},
        {**golden, softmax: {**golden[softmax], "input_kwargs": {"dim": {"type": "int", "value": 1}}}},
    )
    # an argument msprobe wrote as null (a linear without bias): compared by nothing where both sides hold it,
    # a structural change where a tensor takes its place or it takes a tensor's
    biased = copy.deepcopy(golden)
    biased[linear]["input_args"].append(tensor(shape=(8,)))
    unbiased = copy.deepcopy(golden)
    unbiased[linear]["input_args"].append(None)
    moved = copy.deepcopy(unbiased)
    moved[softmax]["output"][0].update(Max=0.95)
    out["null_argument_both"] = (moved, unbiased)
    out["null_argument_became_tensor"] = (biased, unbiased)
    out["tensor_became_null_argument"] = (unbiased, biased)
    unsummarised = copy.deepcopy(golden)  # a tensor msprobe recorded no statistic of (FRACTAL_NZ, fp8 on NPU)
    unsummarised[linear]["input_args"].append(tensor(shape=(8,), Max=None, Min=None, Mean=None, Norm=None))
    out["unsummarised_tensor_became_null_argument"] = (unbiased, unsummarised)
    out["too_different"] = ({"Functional.relu.0.forward": golden[softmax]}, golden)
    return out


@pytest.mark.parametrize("plant", list(plants()))
@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_plant_gets_the_row_by_row_verdict(plant: str, policy: str) -> None:
    target, golden = (json.loads(json.dumps({"data": d})) for d in plants()[plant])
    args = {"policy": POLICIES[policy], "stage": "actor_update", "rank": "rank0"}
    new, ref = rank_compare.compare_rank(target, golden, **args), row_by_row(target, golden, **args)
    assert_same_verdict(new, ref)
    assert_same_verdict(rank_compare.compare_rank(raw(target), raw(golden), **args), ref)
    if plant not in ("identical", "within", "inf_both", "mean_near_zero") and policy != "exact":
        assert not new.passed or new.code_paths or new.recording  # the plant is seen, not compared away


class _Freed(dict):
    """A parsed dump a weak reference can watch."""


@pytest.mark.parametrize("plant", list(plants()))
def test_a_rank_read_one_dump_at_a_time_gets_the_verdict_of_both_parsed(
    plant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_and_compare_rank, where it reads the dumps one by one (not by one parse, as for dumps of one skeleton),
    reads the run's as columns and frees it before the golden's is parsed: the verdict is compare_rank's on both dumps
    parsed at once (the plants with other calls go the row-by-row way)."""
    target, golden = plants()[plant]
    write_dump(tmp_path / "run", target)
    write_dump(tmp_path / "golden", golden)
    run_stage, golden_stage = DirStage(tmp_path / "run", step=1), DirStage(tmp_path / "golden", step=1)
    args = {"policy": POLICIES["default"], "stage": golden_stage.name, "rank": "rank0"}
    reference = rank_compare.compare_rank(
        run_stage.load("rank0", raw=True), golden_stage.load("rank0", raw=True), **args
    )
    watched: list[weakref.ref] = []
    load, golden_load = run_stage.load, golden_stage.load

    def run_load(rank: str, *, raw: bool = False) -> dict:
        dump = _Freed(load(rank, raw=raw))
        watched.append(weakref.ref(dump))
        return dump

    def golden_read(rank: str, *, raw: bool = False) -> dict:
        assert watched[0]() is None, "the run's parsed dump is still held"
        return golden_load(rank, raw=raw)

    monkeypatch.setattr(run_stage, "load", run_load)
    monkeypatch.setattr(golden_stage, "load", golden_read)
    monkeypatch.setattr(run_stage, "content", lambda rank: None)  # the row-by-row read (tests/test_dump_skeleton.py)
    assert_same_verdict(
        rank_compare.read_and_compare_rank(run_stage, golden_stage, POLICIES["default"], "rank0"), reference
    )


def test_the_columns_keep_no_tensor_entry_of_the_parsed_dump() -> None:
    """Every plain tensor row is kept as an Entry tuple, rebuilt key for key: the parsed dump can be freed."""
    dump = parse_dump(json.dumps({"data": base_data()}).encode(), shown="dump.json")
    found = columns(dump, Layouts())
    leaves = [leaf for call in dump["data"].values() for leaf in call["input_args"] + call["output"]]
    assert all(type(found.sources[i]) is tuple for i in range(len(found.names)))
    assert [json.dumps(found.entry(i)) for i in range(len(found.names))] == [json.dumps(leaf) for leaf in leaves]


def test_the_same_calls_are_compared_as_columns_without_a_row_object_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drifting golden stage with the same calls on both sides: no rows() dict, a row object only per drift."""
    source = Golden.from_dir(GOLDENS[0]).stage(*min(Golden.from_dir(GOLDENS[0]).stages()))
    golden = source.load(source.ranks()[0])
    target = copy.deepcopy(golden)
    scaled(target["data"], 5e-4, [0])
    args = {"policy": POLICIES["default"], "stage": source.name, "rank": "rank0"}
    reference = row_by_row(target, golden, **args)
    built: list[int] = []
    item = rank_compare.Columns.item
    monkeypatch.setattr(rank_compare, "rows", lambda dump: pytest.fail("rows() built every row"))
    monkeypatch.setattr(rank_compare.Columns, "item", lambda self, i: built.append(i) or item(self, i))
    assert_same_verdict(rank_compare.compare_rank(target, golden, **args), reference)
    assert reference.drifts and len(built) < len(reference.profile) / 2


def two_rank_stage(tmp_path: Path, *, truncate: bool) -> tuple[DirStage, DirStage]:
    """A golden and a run of two ranks; rank0 drifts, rank1's dump.json is cut short when ``truncate``."""
    for rank in ("rank0", "rank1"):
        write_dump(tmp_path / "golden" / "step_1" / "actor_update", base_data(), rank)
        drifted = base_data()
        drifted["Functional.softmax.0.forward"]["output"][0]["Max"] = 0.95
        path = write_dump(tmp_path / "run" / "step_1" / "actor_update", drifted, rank)
        if truncate and rank == "rank1":
            path.write_bytes(path.read_bytes()[:700])
    return DirStage(tmp_path / "run" / "step_1" / "actor_update"), DirStage(
        tmp_path / "golden" / "step_1" / "actor_update"
    )


def test_a_truncated_dump_fails_its_rank_naming_file_and_byte_offset_and_the_other_rank_is_compared(
    tmp_path: Path,
) -> None:
    run, golden = two_rank_stage(tmp_path, truncate=True)
    verdict = compare.compare_stage(run, golden, CheckSettings(scenario="s", policy=TolerancePolicy()))
    (problem,) = verdict.problems
    assert problem.rank == "rank1"
    assert str(run.path / "step0" / "rank1" / "dump.json") in problem.text
    content = (run.path / "step0" / "rank1" / "dump.json").read_text()
    with pytest.raises(json.JSONDecodeError) as stopped:
        json.loads(content)
    assert f"not JSON at byte {stopped.value.pos} of 700 (" in problem.text and "\n" not in problem.text
    assert [d.rank for d in verdict.drifts] == ["rank0"]  # the other rank still gets its verdict


def test_a_corrupt_stage_among_others_fails_alone(tmp_path: Path) -> None:
    """check_items over a run whose one stage is corrupt: that stage fails, the next one is still compared."""
    for stage in ("actor_update", "critic_update"):
        for side in ("golden", "run"):
            write_dump(tmp_path / side / "step_1" / stage, base_data())
    (tmp_path / "run" / "step_1" / "actor_update" / "step0" / "rank0" / "dump.json").write_bytes(b'{"data": {"x": [')
    golden = Golden.from_run_dir(tmp_path / "golden")
    keys = [ItemKey(1, "actor_update"), ItemKey(1, "critic_update")]
    outcomes = dict(check_items(tmp_path / "run", golden, keys, CheckSettings(scenario="s", policy=TolerancePolicy())))
    assert not outcomes[keys[0]].passed and "not JSON at byte 16 of 16" in outcomes[keys[0]].text
    assert outcomes[keys[1]].passed


def test_the_pool_gives_the_verdict_the_process_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if rank_pool.cores() < 2:
        pytest.skip("one core: the pool is never used")
    run, golden = two_rank_stage(tmp_path, truncate=False)
    settings = CheckSettings(scenario="s", policy=TolerancePolicy())
    here = compare.compare_stage(run, golden, settings)
    monkeypatch.setattr(rank_pool, "MIN_POOL_BYTES", 0)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    submitted: list[tuple] = []
    submit = rank_pool._submit
    monkeypatch.setattr(rank_pool, "_submit", lambda *args: submitted.append(args) or submit(*args))
    pooled = compare.compare_stage(run, golden, settings)
    assert len(submitted) == 2  # each rank ran in the workers
    assert (pooled.drifts, pooled.problems, pooled.profile, pooled.checked) == (
        here.drifts,
        here.problems,
        here.profile,
        here.checked,
    )


def test_stages_side_by_side_give_the_verdicts_of_one_stage_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_items starts its next stage beside the current one, a stage to a worker (rank_pool.ahead): each stage's
    verdict is the one it gets compared alone, here."""
    if rank_pool.cores() < 2:
        pytest.skip("one core: the pool is never used")
    stages = ("actor_compute_log_prob", "actor_update", "ref_compute_log_prob")
    for at, stage in enumerate(stages):
        for rank in ("rank0", "rank1"):
            write_dump(tmp_path / "golden" / "step_1" / stage, base_data(), rank)
            drifted = base_data()
            drifted["Functional.softmax.0.forward"]["output"][0]["Max"] = 0.9 * (1 + (5e-4 if at == 1 else 1e-9))
            write_dump(tmp_path / "run" / "step_1" / stage, drifted, rank)
    golden, keys = Golden.from_run_dir(tmp_path / "golden"), [ItemKey(1, stage) for stage in stages]
    settings = CheckSettings(scenario="s", policy=TolerancePolicy())
    here = dict(check_items(tmp_path / "run", golden, keys, settings))
    monkeypatch.setattr(rank_pool, "MIN_POOL_BYTES", 0)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    started: set[str] = set()  # the run's stage folders that went ahead, whole on a worker
    ahead = rank_pool.ahead

    def watched(fn, found) -> None:
        ahead(fn, found)
        started.update(Path(key[0]).name for key in rank_pool._ahead)

    monkeypatch.setattr(rank_pool, "ahead", watched)
    submitted: list[tuple] = []
    submit = rank_pool._submit
    monkeypatch.setattr(rank_pool, "_submit", lambda *args: submitted.append(args) or submit(*args))
    pooled = dict(check_items(tmp_path / "run", golden, keys, settings))
    assert started == set(stages) and not rank_pool._ahead
    assert len(submitted) == 2 * len(stages)  # each rank once: the stage's compare took what went ahead
    assert [here[k].passed for k in keys] == [pooled[k].passed for k in keys] == [True, False, True]
    for key in keys:
        mine, alone = pooled[key].verdict, here[key].verdict
        assert (mine.drifts, mine.problems, mine.profile, mine.checked) == (
            alone.drifts,
            alone.problems,
            alone.profile,
            alone.checked,
        )


def test_a_passing_stage_keeps_its_worst_point_and_a_failing_stage_its_whole_profile(tmp_path: Path) -> None:
    """A passing stage's profile (every row of every rank) is read only for its worst ratio: it keeps that point,
    the first of the largest; a failing stage keeps every row (where the change entered, the replay, the plot)."""
    for rank in ("rank0", "rank1"):
        write_dump(tmp_path / "golden" / "step_1" / "actor_update", base_data(), rank)
        within, beyond = base_data(), base_data()
        within["Functional.linear.0.forward"]["output"][0]["Max"] = 3.0 * (1 + 1e-7)
        within["Functional.softmax.0.forward"]["output"][0]["Max"] = 0.9 * (1 + 2e-7 if rank == "rank1" else 1)
        beyond["Functional.softmax.0.forward"]["output"][0]["Max"] = 0.95 if rank == "rank1" else 0.9
        write_dump(tmp_path / "passing" / "step_1" / "actor_update", within, rank)
        write_dump(tmp_path / "failing" / "step_1" / "actor_update", beyond, rank)
    stage = "step_1/actor_update"
    golden, settings = DirStage(tmp_path / "golden" / stage), CheckSettings(scenario="s", policy=TolerancePolicy())
    every = []
    for rank in ("rank0", "rank1"):
        pair = [
            json.loads((tmp_path / side / stage / "step0" / rank / "dump.json").read_text())
            for side in ("passing", "golden")
        ]
        every += rank_compare.compare_rank(*pair, policy=settings.policy, stage="actor_update", rank=rank).profile
    passing = compare.compare_stage(DirStage(tmp_path / "passing" / stage), golden, settings)
    assert passing.passed and len(every) == 16 and 0 < passing.worst_ratio < 1
    assert passing.profile == [max(every, key=lambda p: p[3])] and passing.profile[0][:3] == (
        "rank1",
        7,
        "Functional.softmax.0.forward.output.0",
    )
    failing = compare.compare_stage(DirStage(tmp_path / "failing" / stage), golden, settings)
    assert not failing.passed and len(failing.profile) == 16


def test_a_long_stage_compare_reports_each_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past COMPARE_QUIET_S a stage reports every rank it compared; before it, nothing (set to 0 and to 1 hour)."""
    from precision_harness import progress

    run, golden = two_rank_stage(tmp_path, truncate=False)
    lines: list[str] = []
    settings = CheckSettings(scenario="s", policy=TolerancePolicy(), progress=lines.append)
    monkeypatch.setattr(progress, "COMPARE_QUIET_S", 3600.0)
    compare.compare_stage(run, golden, settings)
    assert lines == []
    monkeypatch.setattr(progress, "COMPARE_QUIET_S", 0.0)
    compare.compare_stage(run, golden, settings)
    assert [line.split(" (")[0] for line in lines] == [
        "step_1/actor_update: rank0 compared",
        "step_1/actor_update: rank1 compared",
    ]
    assert lines[1].split(" (")[1].startswith("2/2 ranks, ")


def test_msprobe_reads_the_first_divergent_rank_around_its_first_divergence_and_says_so(tmp_path: Path) -> None:
    from precision_harness.check.localize.msprobe_window import WINDOW_CALLS
    from precision_harness.check.verdicts.items import check_stage

    run, golden = long_stage(tmp_path)
    artifacts = tmp_path / "art"
    out = check_stage(run, golden, CheckSettings(scenario="s", policy=TolerancePolicy(), artifacts=artifacts))
    stage_art = artifacts / "step_1" / "actor_update"
    assert sorted(p.name for p in stage_art.glob("compare_result_*.csv")) == ["compare_result_rank1.csv"]
    window = json.loads((stage_art / "msprobe_window" / "run" / "step0" / "rank1" / "dump.json").read_text())
    calls = list(window["data"])
    assert calls[0] == f"Functional.linear.{450 - WINDOW_CALLS}.forward" and len(calls) == 2 * WINDOW_CALLS + 1 - 51
    table = (stage_art / "compare_result_rank1.csv").read_text().splitlines()
    assert len(table) - 1 == 2 * len(calls)  # msprobe's rows: an input and an output per call of the window
    line = next(x for x in out.text.splitlines() if "msprobe read" in x)
    assert "rank1, calls 250-599 of 600 (around its first divergence); not analysed: rank0" in line
    assert "--precision-msprobe-full" in line


def test_msprobe_full_reads_every_failing_rank_whole(tmp_path: Path) -> None:
    from precision_harness.check.verdicts.items import check_stage

    run, golden = long_stage(tmp_path)
    artifacts = tmp_path / "art"
    settings = CheckSettings(scenario="s", policy=TolerancePolicy(), artifacts=artifacts, msprobe_full=True)
    out = check_stage(run, golden, settings)
    stage_art = artifacts / "step_1" / "actor_update"
    tables = sorted(stage_art.glob("compare_result_*.csv"))
    assert [p.name for p in tables] == ["compare_result_rank0.csv", "compare_result_rank1.csv"]
    assert all(len(p.read_text().splitlines()) - 1 == 2 * 600 for p in tables)
    assert "msprobe read" not in out.text and not (stage_art / "msprobe_window").exists()


def test_the_msprobe_window_holds_a_dumps_non_finite_values_as_msprobe_wrote_them(tmp_path: Path) -> None:
    """The window is cut from dumps read raw (check.localize.msprobe_window): its calls get their NaN/Infinity back."""
    from precision_harness.check.localize.msprobe_window import write_window

    for side, scale in (("golden", 1.0), ("run", 1.1)):
        data = base_data()
        data["Functional.softmax.0.forward"]["output"][0].update(Max=0.9 * scale, Min=-math.inf, Mean=math.nan)
        write_dump(tmp_path / side / "step_1" / "actor_update", data)
    run, golden = (DirStage(tmp_path / side / "step_1" / "actor_update") for side in ("run", "golden"))
    verdict = compare.compare_stage(run, golden, CheckSettings(scenario="s", policy=TolerancePolicy()))
    window = write_window(run, golden, verdict, tmp_path / "art")
    for side in (window.target_dir, window.golden_dir):
        text = (side / "step0" / "rank0" / "dump.json").read_text()
        assert "-Infinity" in text and "NaN" in text and "\\u0000" not in text
        assert math.isnan(json.loads(text)["data"]["Functional.softmax.0.forward"]["output"][0]["Mean"])


@pytest.mark.parametrize("plant", [p for p in plants() if p != "too_different"])
def test_where_the_change_entered_is_read_from_the_calls_up_to_it_as_from_every_call(
    plant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """drift_origin names the rows of the calls up to the earliest changed row only: the same origin as from all."""
    from precision_harness.check.localize import drift_origin

    sides = {}
    for side, data in zip(("run", "golden"), plants()[plant], strict=True):
        extra = {"Functional.relu.9.forward": {"input_args": [tensor()], "output": [tensor(Max=7.0)]}}
        write_dump(tmp_path / side / "step_1" / "actor_update", {**data, **extra})  # a call after every plant
        sides[side] = DirStage(tmp_path / side / "step_1" / "actor_update")
    verdict = compare.compare_stage(
        sides["run"], sides["golden"], CheckSettings(scenario="s", policy=POLICIES["default"])
    )
    calls_up_to, read = drift_origin._calls_up_to, []
    monkeypatch.setattr(
        drift_origin, "_calls_up_to", lambda keys, name: read.append(calls_up_to(keys, name)) or read[-1]
    )
    cut = drift_origin.classify(verdict, sides["run"], sides["golden"])
    assert all("Functional.relu.9.forward" not in calls for calls in read)  # the call after the plant: not read
    monkeypatch.setattr(drift_origin, "_calls_up_to", lambda keys, name: list(keys))
    assert cut == drift_origin.classify(verdict, sides["run"], sides["golden"])
