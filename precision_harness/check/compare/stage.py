"""Compare one stage (or a metrics.jsonl) against its golden and return a typed verdict; no file I/O.

The rows are msprobe's (:func:`precision_harness.dumps.rows.rows`, the parser behind ``msprobe
compare``); the tolerance is ours. The run's calls are paired with the golden's by aligning the two
call streams (:func:`precision_harness.dumps.pairing.pair_calls`), not by msprobe's per-type call
index: a call inserted, removed or replaced by an upgrade forms a changed block
(:class:`~precision_harness.check.compare.code_path.CodePathChange`) and shifts no other pairing.

msprobe's Result column only looks at Norm and lets a 5 % output change pass, so it is not the gate:
every Max/Min/Mean/Norm is checked with :class:`~precision_harness.check.tolerance.policy.TolerancePolicy`,
and the checks msprobe misses are added: the row key sets of each paired call (msprobe silently drops
golden-only rows), dtype/shape changes, NaN/Inf where the golden is finite, a rank missing on either
side, dumps too different to align.

A rank whose digest equals the golden's is identical statistic for statistic; a stage whose every
rank is identical passes without the table (``StageVerdict.identical``), which keeps the common,
unchanged case fast. Both sides are read through :class:`~precision_harness.dumps.stage.StageSource`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare import rank_pool
from precision_harness.check.compare.code_path import placed
from precision_harness.check.compare.rank import read_and_compare_rank
from precision_harness.check.compare.stage_verdict import Problem, StageVerdict
from precision_harness.check.coverage import (
    NOT_IN_RUN,
    NOT_RECORDED,
    held_by_columns,
)
from precision_harness.dumps.columns import NO_LAYOUT, Layouts, columns
from precision_harness.dumps.rows import is_tensor
from precision_harness.dumps.stage import StageSource
from precision_harness.progress import RankProgress


def compare_stage(
    target: StageSource,
    golden: StageSource,
    settings: CheckSettings,
    *,
    failing: Callable[[int, int], None] | None = None,
) -> StageVerdict:
    """Compare every rank of ``target`` against ``golden`` (the same ``step_<n>/<stage>``).

    The stage's name and step come from ``golden``. Where every shared rank's digest equals the
    golden's, the verdict is ``identical`` and its count is the golden's recorded one. Either way its
    :attr:`~StageVerdict.coverage` counts what the golden's ranks hold (read as columns where identical: the rows
    msprobe recorded no statistic of are found so) and what was compared (:mod:`~precision_harness.check.coverage`).
    ``failing`` is called with ``(size, left)`` when a rank fails: the run's dump bytes of the stage and the ranks still
    to be compared (the check starts msprobe's worker so, while the other ranks are compared).

    Raises:
        GoldenCorruptError: a dump on either side is unreadable.
        ProbeUnavailableError: msprobe (its row parser) is not installed and the dumps differ, or a golden dump
            holds an entry that is not in msprobe's plain layout (:func:`~precision_harness.dumps.columns.columns`).
    """
    policy = settings.policy
    verdict = StageVerdict(settings.scenario, golden.step, golden.name, tolerance=policy.describe())
    verdict.strict_code_path = policy.strict_code_path
    verdict.allow_unchecked = policy.unchecked
    verdict.unfilled_reason = settings.unfilled or ""
    t_ranks, g_ranks = set(target.ranks()), set(golden.ranks())
    verdict.ranks = sorted(t_ranks | g_ranks)
    _stage_held(verdict, golden, t_ranks)
    if not t_ranks:
        verdict.problems.append(Problem(f"no dump.json under {target}: the stage did not run or was not profiled"))
        return verdict
    verdict.problems += [Problem("in the golden but missing from this run", r) for r in sorted(g_ranks - t_ranks)]
    verdict.problems += [Problem("in this run but not in the golden", r) for r in sorted(t_ranks - g_ranks)]
    shared = sorted(t_ranks & g_ranks)
    if shared and all(target.digest(r) == golden.digest(r) for r in shared):
        verdict.identical = not verdict.problems
        _identical_held(verdict, golden, shared)
        recorded = golden.statistics()
        verdict.checked = recorded if recorded is not None else verdict.coverage["statistics"].compared
        verdict.identical = verdict.identical and not verdict.failing_unchecked
        return verdict
    key, jobs, size = _stage_jobs(target, golden, settings, shared)
    ticker = RankProgress(f"step_{golden.step}/{golden.name}", len(shared), settings.progress)
    for done, rank_verdict in enumerate(rank_pool.map_ranks(read_and_compare_rank, jobs, size=size, key=key), 1):
        verdict.add(rank_verdict)
        ticker.rank_done(rank_verdict.rank)
        if failing is not None and not rank_verdict.passed:
            failing(size, len(jobs) - done)
    verdict.drifts.sort(key=lambda d: (d.rank, d.order))
    verdict.code_paths = placed(verdict.code_paths, target)
    verdict.settle()
    return verdict


def _stage_held(verdict: StageVerdict, golden: StageSource, t_ranks: set[str]) -> None:
    """The stage and its ranks into the ledger, and what a golden rank the run lacks holds (read here: a failing
    stage's)."""
    cov, g_ranks = verdict.coverage, golden.ranks()
    cov["stages"].hold()
    if not t_ranks:
        cov["stages"].miss(NOT_IN_RUN)
    cov["ranks"].hold(len(t_ranks.intersection(g_ranks)))
    for rank in g_ranks:
        if rank not in t_ranks:
            held, statistics, bare = _golden_rank(golden, rank)
            cov["ranks"].miss(NOT_IN_RUN, held=True)
            cov["rows"].miss(NOT_IN_RUN, held + len(bare), held=True)
            cov["statistics"].miss(NOT_IN_RUN, statistics, held=True)


def _golden_rank(golden: StageSource, rank: str) -> tuple[int, int, list[str]]:
    """``(rows, statistics, unsummarised)`` of a golden rank read as columns: the rows and statistics it holds
    (:func:`~precision_harness.check.coverage.held_by_columns`), and the names of its tensor rows msprobe recorded no
    statistic of, as the compare names them."""
    layouts = Layouts()
    g = columns(golden.load(rank, raw=True), layouts)
    rows_, statistics = held_by_columns(g.present, g.scalar)
    no_value = np.flatnonzero(~g.present.any(axis=1) & ~g.scalar & (g.layout != NO_LAYOUT)).tolist()
    bare = [g.names[i] for i in no_value if is_tensor(g.item(i))]
    return rows_, statistics, bare


def _identical_held(verdict: StageVerdict, golden: StageSource, shared: list[str]) -> None:
    """The ledger of ranks identical to the golden's, and the tensor rows msprobe recorded no statistic of
    (:attr:`StageVerdict.unchecked`): equal bytes say nothing of them."""
    for rank in shared:
        held, statistics, bare = _golden_rank(golden, rank)
        verdict.coverage["rows"].hold(held)
        verdict.coverage["rows"].miss(NOT_RECORDED, len(bare), held=True)
        verdict.coverage["statistics"].hold(statistics)
        verdict.unchecked += [(rank, name) for name in bare]


def compare_ahead(stages: list[tuple[StageSource, StageSource]], settings: CheckSettings) -> None:
    """Start the rank compares of the ``(target, golden)`` stages a check compares next (two or more), each on a worker
    of its own (:func:`~precision_harness.check.compare.rank_pool.ahead`), for :func:`compare_stage` to collect; not a
    stage whose ranks are not the golden's, or whose first rank is the golden's byte for byte (it may be identical)."""
    found = []
    for target, golden in stages:
        ranks = target.ranks()
        stage = _stage_jobs(target, golden, settings, ranks)
        if rank_pool.started(stage[0]) or (
            ranks and ranks == golden.ranks() and target.digest(ranks[0]) != golden.digest(ranks[0])
        ):
            found.append(stage)
    rank_pool.ahead(read_and_compare_rank, found)


def _stage_jobs(target: StageSource, golden: StageSource, settings: CheckSettings, ranks: list[str]) -> rank_pool.Stage:
    """A stage compare in the rank pool: its key (its folders, its policy, the object its jobs hold, and its ranks), a
    job per rank and the run's dump bytes; :func:`compare_stage` and :func:`compare_ahead` build it alike."""
    policy, left_out = settings.policy, settings.unfilled is not None
    key = str(target), str(golden), id(policy), tuple(ranks)
    size = rank_pool.dump_bytes(target, ranks)
    if ranks and all(golden.indexed(rank) for rank in ranks):  # only the run's dump is read
        size //= rank_pool.INDEXED_SHARE
    return key, [(target, golden, policy, rank, left_out) for rank in ranks], size
