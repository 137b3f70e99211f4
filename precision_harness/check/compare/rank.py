"""Compare one rank's dump.json against the golden's, statistic by statistic (:func:`compare_rank`, row by row where
the calls differ; :func:`read_and_compare_rank`, as columns where both dumps hold the same calls), into a
:class:`~precision_harness.check.compare.stage_verdict.RankVerdict`; the stage around it is
:mod:`precision_harness.check.compare.stage`. How rows are read, paired and judged is that module's docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from precision_harness.check.compare import unfilled
from precision_harness.check.compare.code_path import BlockRows, by_call, evaluate
from precision_harness.check.compare.drift_set import Drift, table_drifts
from precision_harness.check.compare.stage_verdict import Problem, RankVerdict
from precision_harness.check.compare.stat_table import Cells, RowRule, StatTable, judge_statistics
from precision_harness.check.coverage import (
    CHANGED_CODE_PATH,
    NOT_IN_RUN,
    NOT_RECORDED,
    OTHER_MSPROBE,
    STRUCTURAL,
    UNALIGNED,
    held_by_columns,
    held_by_row,
)
from precision_harness.check.recording import RecordingDiff, drop_one_sided_calls
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.dumps.columns import NO_LAYOUT, Columns, Layouts, columns
from precision_harness.dumps.files import collector_paused, restore_non_finite
from precision_harness.dumps.pairing import Pairing, aligned_golden_columns, aligned_rows, blank_rows, pair_calls
from precision_harness.dumps.rows import is_tensor, rms, row_statistics, rows
from precision_harness.dumps.skeleton import same_skeleton_columns
from precision_harness.dumps.stage import StageSource
from precision_harness.dumps.statistics import STATISTICS, relative_change
from precision_harness.errors import GoldenCorruptError


def compare_rank(
    t_dump: dict[str, Any],
    g_dump: dict[str, Any],
    *,
    policy: TolerancePolicy,
    stage: str,
    rank: str,
    skip: frozenset[str] = frozenset(),
) -> RankVerdict:
    """Compare one rank's parsed dump pair: key sets, then every statistic of every row.

    msprobe drops golden-only rows silently, so API and row key sets are checked here. The statistics of
    the regular rows are judged at once (:class:`~precision_harness.check.compare.stat_table.StatTable`), the others
    row by row; drifts, problems and the profile come out in row order either way, the drifts bounded
    (:meth:`RankVerdict.bound`). Where both dumps hold the same calls (the common case), both are read as
    :func:`~precision_harness.dumps.columns.columns` and a row's object is built only where its verdict needs it.
    The dumps may be parsed by ``parse_dump`` or ``parse_dump_raw`` (restored in place for the row-by-row way).
    The rows of the run's calls ``skip`` are left out (:mod:`~precision_harness.check.compare.unfilled`).

    Raises:
        ProbeUnavailableError: msprobe (its row parser) is not installed.
    """
    one_sided = RecordingDiff()
    taken = drop_one_sided_calls(one_sided, (t_dump, g_dump), rank)
    dumps = [t_dump, g_dump]
    del t_dump, g_dump  # _compared holds the only references, so it frees each dump once its rows are named
    verdict = _compared(dumps, policy=policy, stage=stage, rank=rank, skip=skip)
    verdict.recording.merge(one_sided)
    if taken is not None:  # the golden's calls this run's msprobe leaves out: held, not compared
        _held(verdict, (taken_rows := rows(restore_non_finite(taken))).values())
        _missed(verdict, OTHER_MSPROBE, taken_rows.values())
    verdict.bound()
    return verdict


def _compared(
    dumps: list[dict[str, Any]], *, policy: TolerancePolicy, stage: str, rank: str, skip: frozenset[str]
) -> RankVerdict:
    t_dump, g_dump = dumps
    dumps.clear()
    verdict = RankVerdict(rank)
    pairing = pair_calls(t_dump, g_dump)
    if not pairing.alignable:
        verdict.problem(_too_different(pairing))
        g_unaligned = list(rows(restore_non_finite(g_dump)).values())
        _held(verdict, g_unaligned)
        _missed(verdict, UNALIGNED, g_unaligned)
        return verdict
    if not pairing.blocks and all(t == g for t, g in pairing.pairs):  # the same calls: every row read as columns
        layouts = Layouts()
        _judge_columns(verdict, (columns(t_dump, layouts), columns(g_dump, layouts)), layouts, policy, (stage, skip))
        return verdict
    t_rows, g_all = rows(restore_non_finite(t_dump)), rows(restore_non_finite(g_dump))
    g_rows = aligned_rows(g_all, pairing)
    del t_dump, g_dump  # the rows are copies: at 65,000 calls a dump, its objects are half a rank's memory
    _held(verdict, g_all.values())
    in_golden_blocks = {api for block in pairing.blocks for api in block.golden}
    _missed(verdict, CHANGED_CODE_PATH, (row for row in g_all.values() if row["api"] in in_golden_blocks))
    in_blocks = {api for block in pairing.blocks for api in block.target}
    first_row: dict[str, int] = {}
    plan: list[_Row | str] = []  # in row order: a row both sides hold, or a problem's text
    for order, (name, t_item) in enumerate(t_rows.items()):
        first_row.setdefault(str(t_item["api"]), order)
        if t_item["api"] in in_blocks:
            continue
        g_item = g_rows.get(name)
        if g_item is not None and t_item["api"] in skip:
            unfilled.skip_row(verdict, name, g_item)
            continue
        # a paired call with other tensors: a structural change
        plan.append(f"{name}: not in the golden" if g_item is None else _Row(name, order, t_item, g_item))
    _judge(verdict, plan, policy=policy, stage=stage)
    for name in g_rows:
        if name not in t_rows:
            verdict.problem(f"{name}: in the golden but missing from this run")
            _missed(verdict, NOT_IN_RUN, [g_rows[name]])
    if not pairing.blocks:
        return verdict
    block_rows = BlockRows(by_call(t_rows), by_call(g_all), policy, stage)
    for block in pairing.blocks:
        at = block.target[0] if block.target else (block.after[0] if block.after else None)
        order = first_row.get(at, len(t_rows)) if at is not None else len(t_rows)
        verdict.code_paths.append(evaluate(block, block_rows, rank=rank, order=order))
    return verdict


def _judge(v: RankVerdict, plan: list[_Row | str], *, policy: TolerancePolicy, stage: str) -> None:
    """Every row of ``plan`` into ``v``, in order: regular rows from one :class:`StatTable`, the rest row by row."""
    compared = [step for step in plan if isinstance(step, _Row)]
    table = StatTable([(r.name, r.target, r.golden) for r in compared], policy, stage)
    v._table_kept += table_drifts(table, ([r.name for r in compared], [r.order for r in compared]), v.rank, v.drift_set)
    checked = table.present.sum(axis=1).tolist()
    regular, nonfinite, worst = table.regular.tolist(), table.nonfinite.tolist(), table.worst.tolist()
    i = 0
    for step in plan:
        if isinstance(step, str):
            v.problem(step)
            continue
        if not regular[i]:
            _compare_row(v, step, policy=policy, stage=stage)
        else:
            v.checked += checked[i]
            if nonfinite[i]:
                _nonfinite_row(v, step.name, table, i)
            v.profile.append((v.rank, step.order, step.name, worst[i]))
        i += 1


def _judge_columns(
    v: RankVerdict, sides: tuple[Columns, Columns], layouts: Layouts, policy: TolerancePolicy, at: tuple[str, frozenset]
) -> None:
    """:func:`_judge` for two dumps of the same calls read as :class:`~precision_harness.dumps.columns.Columns`:
    the regular rows judged at once, a row object built only for a row that is not regular, and a drift only
    for one the verdict keeps (:func:`~precision_harness.check.compare.drift_set.table_drifts`). ``at``: the stage, and
    the run's calls whose rows are left out (:mod:`~precision_harness.check.compare.unfilled`)."""
    (t, g), (stage, skip) = sides, at
    v.calls = t.calls
    g_at, golden = aligned_golden_columns(t, g)
    paired = g_at >= 0
    _held_columns(v, g, None)
    if t.names != g.names:  # the golden's rows no run row is named as
        unread = np.ones(len(g.names), dtype=bool)
        unread[g_at[paired]] = False
        _held_columns(v, g, unread)
    left_out = unfilled.skip_columns(v, t, golden, paired, skip) if skip else np.zeros(len(t.names), dtype=bool)
    regular = paired & (t.layout == golden.layout) & (t.layout != NO_LAYOUT) & ~t.scalar & ~golden.scalar
    regular &= (t.present == golden.present).all(axis=1) & t.present.any(axis=1) & ~left_out
    numels = np.array([*layouts.numels, 1], dtype=np.float64)[t.layout]  # NO_LAYOUT (-1) reads the 1 added
    norm = golden.stats[:, STATISTICS.index("Norm")]
    with np.errstate(all="ignore"):
        scale = np.where(regular & np.isfinite(norm), norm / np.sqrt(np.maximum(numels, 1.0)), np.nan)
    present = t.present & regular[:, None]
    cells = Cells(t.stats, golden.stats, present, regular, scale, t.layout, layouts.dtypes, t.names)
    table = StatTable.of_cells(cells, policy, stage)
    v.checked += int(present.sum())
    v._table_kept += table_drifts(table, (t.names, range(len(t.names))), v.rank, v.drift_set)
    names, worst, order = t.names, table.worst, 0
    # a row neither side gives anything to compare: its 0.0 point comes with the columns, as _compare_row gives it
    said = ~regular & ~blank_rows(t, golden, paired, layouts) & ~left_out
    said[np.flatnonzero(table.nonfinite)[:1]] = True  # only a rank's first non-finite value is a problem
    for i in np.flatnonzero(said).tolist():
        v.profile.extend_columns(v.rank, (order, i), names, worst)
        order = i + 1
        if not paired[i]:  # a paired call with other tensors: a structural change
            v.problem(f"{names[i]}: not in the golden")
        elif not regular[i]:
            _compare_row(v, _Row(names[i], i, t.item(i), g.item(int(g_at[i]))), policy=policy, stage=stage)
        else:
            _nonfinite_row(v, names[i], table, i)
            v.profile.append((v.rank, i, names[i], float(worst[i])))
    v.profile.extend_columns(v.rank, (order, len(names)), names, worst)
    if t.names != g.names:
        mine = set(names)
        v.problems += [
            Problem(f"{n}: in the golden but missing from this run", v.rank) for n in g.names if n not in mine
        ]


def _held_columns(v: RankVerdict, g: Columns, unread: np.ndarray | None) -> None:
    """The golden's tensor rows and statistics into ``v``'s ledger: every one held (``unread`` None), or those of
    the rows ``unread`` (``(rows,)`` bool) not compared, as :data:`~precision_harness.check.coverage.NOT_IN_RUN`."""
    found = held_by_columns(g.present, g.scalar, unread)
    for unit, n in zip(("rows", "statistics"), found, strict=True):
        if unread is None:
            v.coverage[unit].hold(n)
        else:
            v.coverage[unit].miss(NOT_IN_RUN, n)


def _held(v: RankVerdict, golden_rows: Any) -> None:
    """The tensor rows and statistics of the golden's rows (msprobe's row dicts) into ``v``'s ledger, as held."""
    found = [held_by_row(row) for row in golden_rows]
    v.coverage["rows"].hold(sum(r for r, _ in found))
    v.coverage["statistics"].hold(sum(n for _, n in found))


def _missed(v: RankVerdict, reason: str, golden_rows: Any) -> None:
    """The tensor rows and statistics of the golden's rows (held already) not compared, for ``reason``."""
    found = [held_by_row(row) for row in golden_rows]
    v.coverage["rows"].miss(reason, sum(r for r, _ in found))
    v.coverage["statistics"].miss(reason, sum(n for _, n in found))


def _reshaped(t: Columns, g: Columns, layouts: Layouts) -> bool:
    """A row of the same calls whose dtype is the golden's and whose shape is not
    (:func:`~precision_harness.dumps.pairing.reshaped`: its call is a changed code path, not a pair)."""
    if t.names != g.names:
        return False
    moved = np.flatnonzero((t.layout != g.layout) & (t.layout != NO_LAYOUT) & (g.layout != NO_LAYOUT)).tolist()
    return any(layouts.dtypes[t.layout[i]] == layouts.dtypes[g.layout[i]] for i in moved)


def _nonfinite_row(v: RankVerdict, name: str, table: StatTable, i: int) -> None:
    """The first value of regular row ``i`` of ``table`` (named ``name``) that is non-finite where the golden's is
    finite, as :func:`_compare_row` reports it: once a rank."""
    for k, stat in enumerate(STATISTICS):
        if table.present[i, k]:
            _nonfinite(v, name, stat, (float(table.target[i, k]), float(table.golden[i, k])))


def _nonfinite(v: RankVerdict, name: str, stat: str, values: tuple[float, float]) -> None:
    """A statistic non-finite in the run where the golden's is finite, as a problem of ``v``: once a rank."""
    t_val, g_val = values
    if not math.isfinite(t_val) and math.isfinite(g_val) and not v._nan_reported:
        v.problem(f"{name} {stat}: {t_val} where the golden is finite ({g_val:.7g})")
        v._nan_reported = True


def _too_different(pairing: Pairing) -> str:
    larger = max(pairing.golden_calls, pairing.target_calls)
    return (
        f"stale: only {len(pairing.pairs)} of {larger} API calls pair with the golden's, too different to align "
        "(another model, level or scenario, not a changed code path); re-record the golden"
    )


@dataclass(frozen=True)
class _Row:
    """One tensor row present on both sides."""

    name: str
    order: int
    target: dict[str, Any]
    golden: dict[str, Any]


def _compare_row(v: RankVerdict, row: _Row, *, policy: TolerancePolicy, stage: str) -> None:
    """Check one tensor row (dtype, shape, each statistic) into ``v``; add its worst ratio to the profile.

    Mean is judged against the golden's RMS (:func:`~precision_harness.dumps.rows.rms`).
    """
    t_item, g_item = row.target, row.golden
    t_dtype, g_dtype = t_item.get("dtype") or t_item.get("type"), g_item.get("dtype") or g_item.get("type")
    if t_dtype != g_dtype or t_item.get("shape") != g_item.get("shape"):
        v.problem(f"{row.name}: dtype/shape {g_dtype} {g_item.get('shape')} -> {t_dtype} {t_item.get('shape')}")
        # it differs, whatever its statistics: where a change entered (check.localize.drift_origin) must see it
        v.profile.append((v.rank, row.order, row.name, math.inf))
        v.structural.add((v.rank, row.name))
        _missed(v, STRUCTURAL, [g_item])
        return
    t_stats, g_stats = row_statistics(t_item), row_statistics(g_item)
    four = t_stats.keys() == g_stats.keys() == set(STATISTICS)  # a tensor's Max/Min/Mean/Norm on both sides
    if four:
        _one_sided(v, row, (t_stats, g_stats), str(t_dtype))
    if is_tensor(t_item) and four and not any(t_stats[s] is not None and g_stats[s] is not None for s in STATISTICS):
        v.unchecked.append(row.name)  # msprobe recorded no statistics (FRACTAL_NZ, fp8 on NPU): compared by nothing
        v.coverage["rows"].miss(NOT_RECORDED, held=True)
        v.profile.append((v.rank, row.order, row.name, 0.0))
        return
    rule = RowRule(policy, stage, str(t_dtype), row.name, rms(g_stats.get("Norm"), t_item.get("shape")))
    row_worst = 0.0
    for judged in judge_statistics(t_stats, g_stats, rule):
        stat, t_val, g_val = judged.statistic, judged.run, judged.golden
        if judged.ratio is None:
            if not four:  # a scalar's value against a tensor's statistics: a structural change
                v.checked += 1
                v.problem(f"{row.name} {stat}: {g_val} -> {t_val}")
            # recorded by one side's msprobe only (_one_sided): not compared; the golden's, where it held one, lost
            v.coverage["statistics"].miss(NOT_IN_RUN if not four else OTHER_MSPROBE, int(t_val is None))
            continue
        v.checked += 1
        _nonfinite(v, row.name, stat, (t_val, g_val))
        row_worst = max(row_worst, judged.ratio)
        if judged.ratio > 1.0:
            rel = relative_change(t_val, g_val)
            v.drifts.append(Drift(row.name, stat, g_val, t_val, judged.ratio, rel, judged.tol, row.order, v.rank))
    v.profile.append((v.rank, row.order, row.name, row_worst))


def _one_sided(v: RankVerdict, row: _Row, stats: tuple[dict, dict], dtype: str) -> None:
    """Each statistic of a tensor row that one side's msprobe records and the other's does not, into ``v.recording``:
    not a numeric change: counted by statistic and dtype, never compared (:mod:`~precision_harness.check.recording`)."""
    t_stats, g_stats = stats
    for stat in STATISTICS:
        if (t_stats[stat] is None) != (g_stats[stat] is None):
            v.recording.note(stat, dtype, lost=t_stats[stat] is None, where=(v.rank, row.name))


def read_and_compare_rank(
    target: StageSource, golden: StageSource, policy: TolerancePolicy, rank: str, left_out: bool = False
) -> RankVerdict:
    """One rank of a stage, read and compared (in a pool's worker where the stage is large), one parsed dump at a
    time: the run's is read as columns and freed before the golden's is parsed. Where the calls differ (a changed
    code path), the run's is parsed again for the row-by-row way (:func:`compare_rank`).

    Where the run's dump.json has the golden's skeleton (the same bytes but for the floating-point statistics), one
    parse serves both (:func:`~precision_harness.dumps.skeleton.same_skeleton_columns`).

    A run's dump.json that does not parse fails its rank with the parser's one line (file, byte offset); the
    other ranks are compared. A golden's raises: it was verified against its sha256, so it is the store's fault.

    With ``left_out``, the rows of the run's calls in FSDP2's unfilled all-gather buffer are not compared
    (:func:`~precision_harness.check.compare.unfilled.calls`).
    """
    skip = unfilled.calls(target, rank) if left_out else frozenset()
    sides = same_skeleton_columns(target, golden, rank)
    if sides is not None:
        verdict = RankVerdict(rank)
        _judge_columns(verdict, sides[:2], sides[2], policy, (golden.name, skip))
        verdict.bound()
        return verdict
    try:
        t_dump = target.load(rank, raw=True)
    except GoldenCorruptError as exc:
        verdict = RankVerdict(rank)
        verdict.problem(str(exc))
        return verdict
    with collector_paused():  # millions of acyclic objects: the collections they set off cost more than the compare
        layouts = Layouts()
        t_calls, t_columns = list(t_dump["data"]), columns(t_dump, layouts)
        del t_dump  # the columns keep none of it
        g_dump = golden.load(rank, raw=True)
        # other calls, or a call that computed another intermediate (pair_calls' changed block): row by row
        if list(g_dump["data"]) != t_calls or _reshaped(*(sides := (t_columns, columns(g_dump, layouts))), layouts):
            return compare_rank(
                target.load(rank, raw=True), g_dump, policy=policy, stage=golden.name, rank=rank, skip=skip
            )
        del g_dump, t_columns
        verdict = RankVerdict(rank)
        _judge_columns(verdict, sides, layouts, policy, (golden.name, skip))
        verdict.bound()
        return verdict
