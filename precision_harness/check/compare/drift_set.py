"""The drifts a failing verdict keeps: exact counts, the first and the largest as objects, a bounded profile.

A stage whose every statistic moved (a changed kernel, a changed input) drifts on most of its cells: 473,000
of 711,000 statistics at 30,000 calls a rank (``benchmarks/scale.py``, 60k failing), millions at a 7B model's
65,000 calls a rank, stage and step. Building a :class:`Drift` per cell, and keeping them, cost more than the
compare. What the verdict reads of them is bounded:

- its headline count (exact: :attr:`DriftSet.dropped` counts the drifts not kept as objects);
- the first divergence, in call order across ranks, and where the change entered
  (:mod:`~precision_harness.check.localize.drift_origin`), the window msprobe reads
  (:mod:`~precision_harness.check.localize.msprobe_window`): a rank's first drifts;
- the largest drift: a rank's largest drifts.

So each rank keeps its first :data:`KEPT` drifts in call order and its :data:`KEPT` largest, and a profile of
every drift by API and statistic (:attr:`DriftSet.by_api`: count and largest ratio; one entry per API name
with its call indices dropped, so bounded by the model's code, not its calls). Drifts judged at once by a
:class:`~precision_harness.check.compare.stat_table.StatTable` are selected from its arrays (mask, indices, the first
and the largest), and an object is built for a kept cell only (:func:`table_drifts`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from precision_harness.check.compare.stat_table import StatTable
from precision_harness.check.tolerance.policy import Tol
from precision_harness.dumps.statistics import STATISTICS, relative_change

#: drifts a rank keeps as objects from each end: its first in call order and its largest ratios
KEPT = 16

#: a call index in msprobe's API or module name (``Functional.linear.7.forward``): dropped in :func:`api_kind`
_INDEX = re.compile(r"\.\d+(?=\.|$)")
#: :data:`_INDEX` in names joined by newlines
_INDEX_JOINED = re.compile(r"\.\d+(?=[.\n]|\Z)")


@dataclass(frozen=True)
class Drift:
    """One statistic of one tensor beyond tolerance."""

    tensor: str  #: msprobe tensor name, e.g. ``Functional.linear.7.forward.output.0``
    statistic: str  #: Max, Min, Mean or Norm
    golden: float
    target: float
    ratio: float  #: |target - golden| / allowance; > 1 fails
    rel: float  #: |target - golden| / |golden|
    tol: Tol
    order: int  #: row index in execution order
    rank: str = "rank0"


#: ``{(API name without call indices, statistic): [drifts, largest ratio]}``
ByApi = dict[tuple[str, str], list]


@dataclass
class DriftSet:
    """The drifts of one rank or stage as a verdict keeps them (module docstring).

    Attributes:
        dropped: drifts beyond tolerance not kept as objects; ``len(drifts) + dropped`` is the exact count.
        by_api: every drift counted by API and statistic, with the largest ratio of each.
    """

    dropped: int = 0
    by_api: ByApi = field(default_factory=dict)

    def count(self, drifts: Sequence[Drift]) -> None:
        """Add ``drifts`` (built one by one) to :attr:`by_api`."""
        for d in drifts:
            entry = self.by_api.setdefault((api_kind(d.tensor), d.statistic), [0, 0.0])
            entry[0] += 1
            entry[1] = max(entry[1], d.ratio)

    def merge(self, other: DriftSet) -> None:
        """Take in another rank's set."""
        self.dropped += other.dropped
        for key, (n, worst) in other.by_api.items():
            entry = self.by_api.setdefault(key, [0, 0.0])
            entry[0] += n
            entry[1] = max(entry[1], worst)


def api_kind(name: str) -> str:
    """msprobe's API or module name of a row with its call indices dropped:
    ``Functional.linear.7.forward.output.0`` -> ``Functional.linear.forward.output``."""
    return _INDEX.sub("", name)


def api_kinds(names: list[str]) -> list[str]:
    """:func:`api_kind` of each of ``names``, in one pass over them joined by newlines (no row name holds one; a
    failing 65,000-call rank has about 130,000 drifting rows)."""
    joined = "\n".join(names)
    if joined.count("\n") != max(len(names) - 1, 0):
        return [api_kind(name) for name in names]
    return _INDEX_JOINED.sub("", joined).split("\n") if names else []


def kept(drifts: list[Drift]) -> list[Drift]:
    """The first :data:`KEPT` of ``drifts`` (one rank's, in call order) and the :data:`KEPT` largest, in call order.

    The largest are ranked by ratio, then by call order, then by their place in ``drifts`` (the statistic's), as
    :attr:`~precision_harness.check.compare.stage_verdict.StageVerdict.largest` picks one.
    """
    if len(drifts) <= 2 * KEPT:
        return drifts
    at = {id(d): i for i, d in enumerate(drifts)}
    largest = sorted(drifts, key=lambda d: (-d.ratio, d.order, at[id(d)]))[:KEPT]
    chosen = {id(d) for d in drifts[:KEPT]} | {id(d) for d in largest}
    return [d for d in drifts if id(d) in chosen]


def table_drifts(table: StatTable, rows: tuple[Sequence[str], Sequence[int]], rank: str, into: DriftSet) -> list[Drift]:
    """The kept drifts of ``table``'s regular rows (its cells with a ratio above 1), built from its arrays.

    Args:
        table: the rank's table; its rows are in call order.
        rows: each table row's name and order (row index in execution order).
        rank: the rank they belong to.
        into: takes the count of the drifts not kept and every drift's :attr:`DriftSet.by_api` entry.
    """
    cells = np.flatnonzero(table.ratio > 1.0)  # row-major: call order, then Max/Min/Mean/Norm
    if not len(cells):
        return []
    ratios = table.ratio.reshape(-1)[cells]
    _count_by_api(cells, ratios, rows[0], into)
    chosen = cells[:KEPT]
    if len(cells) > KEPT:
        nth = np.partition(ratios, len(ratios) - KEPT)[len(ratios) - KEPT]
        top = np.flatnonzero(ratios >= nth)
        by_rank = np.lexsort((cells[top], -ratios[top]))[:KEPT]  # largest ratio, then earliest cell
        chosen = np.union1d(chosen, cells[top[by_rank]])
    into.dropped += len(cells) - len(chosen)
    return [_drift(table, rows, rank, int(c)) for c in chosen.tolist()]


def _count_by_api(cells: np.ndarray, ratios: np.ndarray, names: Sequence[str], into: DriftSet) -> None:
    """Every drift cell of a table (``cells`` ascending, their ``ratios`` above 1) into ``into.by_api``: a Python step
    per drifting row, not per cell; counted and maxed per (API, statistic) by ``bincount`` and ``maximum.at``."""
    row_of, stat_of = np.divmod(cells, len(STATISTICS))
    starts = np.empty(len(row_of), dtype=bool)  # each row's first cell (the cells are in row order: no sort)
    starts[0] = True
    np.not_equal(row_of[1:], row_of[:-1], out=starts[1:])
    kinds: dict[str, int] = {}
    found = api_kinds([names[i] for i in row_of[starts].tolist()])
    row_kind = np.array([kinds.setdefault(kind, len(kinds)) for kind in found], dtype=np.int64)
    key = row_kind[np.cumsum(starts) - 1] * len(STATISTICS) + stat_of
    counts = np.bincount(key)
    worst = np.zeros(len(counts))
    np.maximum.at(worst, key, ratios)
    keys = np.flatnonzero(counts)
    names_of = list(kinds)
    for k, n, w in zip(keys.tolist(), counts[keys].tolist(), worst[keys].tolist(), strict=True):
        kind, stat = divmod(k, len(STATISTICS))
        entry = into.by_api.setdefault((names_of[kind], STATISTICS[stat]), [0, 0.0])
        entry[0] += n
        entry[1] = max(entry[1], w)


def _drift(table: StatTable, rows: tuple[Sequence[str], Sequence[int]], rank: str, cell: int) -> Drift:
    i, k = divmod(cell, len(STATISTICS))
    t_val, g_val = float(table.target[i, k]), float(table.golden[i, k])
    ratio = float(table.ratio[i, k])
    return Drift(rows[0][i], STATISTICS[k], g_val, t_val, ratio, relative_change(t_val, g_val), table.tol(i, k),
                 int(rows[1][i]), rank)  # fmt: skip
