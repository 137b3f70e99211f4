"""The tolerance ratios of one rank's paired rows, every statistic at once (numpy), for the compare.

:func:`~precision_harness.check.compare.rank.compare_rank` judges each statistic with
:func:`~precision_harness.check.tolerance.policy.tolerance_ratio`, ``|t - g| / (atol + rtol * scale)``; at 65,000
calls a rank (a 7B model at L1) that is a quarter of a million rows and a million Python calls. A
:class:`StatTable` holds the rows that need nothing but that formula, the *regular* rows (same dtype and
shape, four statistics, each present on both sides or on neither), as ``(rows, 4)`` float64 arrays, and
computes every ratio in one pass with the same IEEE operations in the same order, so each ratio is the
float ``tolerance_ratio`` returns. The compare then touches in Python only the rows whose verdict says
something: a drift or a value turned non-finite. Every other row (a dtype or shape change, a scalar's
``value``, a statistic on one side only) goes to the compare's row-by-row path, whose statistics
:func:`judge_statistics` judges, as it does a row of a changed code path (``code_path.py``).

So a row is judged by one rule in two forms: this module's, the table's arrays and :func:`judge_statistics`'s floats,
each tolerance from the policy (``tolerance_arrays`` for the table, ``for_tensor`` for a row, sharing their
formulas) and each ratio ``tolerance_ratio``'s. The arrays exist for speed alone (a 7B-shaped compare of 3.1 M calls
in under a minute, benchmarks/scale.py); ``tests/test_stat_table.py`` checks that both forms give the same floats on
the cells where they could part (zero tolerance, NaN, infinities, Mean against the RMS, calibrated noise).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from precision_harness.check.tolerance.policy import Tol, TolerancePolicy, tolerance_ratio
from precision_harness.dumps.rows import rms, to_float
from precision_harness.dumps.statistics import STATISTICS

#: the column of Mean, judged against the golden's RMS rather than its own magnitude (docs/tolerance.md)
MEAN = STATISTICS.index("Mean")


def four(item: dict[str, Any]) -> list[float | None] | None:
    """Max/Min/Mean/Norm of a row as :func:`~precision_harness.dumps.rows.row_statistics` reads them; None for a
    scalar argument's row (``row_statistics`` gives ``{"value": v}``)."""
    if item.get("Max") is None:
        value = item.get("value")
        if value is not None and not isinstance(value, (list, dict, str)):
            return None
    return [to_float(item.get(s)) for s in STATISTICS]


def dtype_of(item: dict[str, Any]) -> Any:
    """The dtype a row is judged by: ``dtype``, else msprobe's ``type``."""
    return item.get("dtype") or item.get("type")


@dataclass
class Cells:
    """The rows a :class:`StatTable` judges, as arrays.

    Attributes:
        target, golden: ``(rows, 4)`` float64 Max/Min/Mean/Norm (NaN where absent).
        present: ``(rows, 4)`` bool: the statistic is on both sides.
        regular: ``(rows,)`` bool: the row is judged by the table.
        scale: ``(rows,)`` float64 Mean's scale, the golden's RMS (NaN: none).
        codes: ``(rows,)`` int index into ``dtypes`` of each row's dtype (:meth:`StatTable.of_cells`).
        dtypes: the dtype names the codes stand for.
        names: ``(rows,)`` the row names (API globs and calibrated noise are looked up by them).
    """

    target: np.ndarray
    golden: np.ndarray
    present: np.ndarray
    regular: np.ndarray
    scale: np.ndarray
    codes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    dtypes: Sequence[str] = ()
    names: Sequence[str] = ()


class StatTable:
    """The rows of one rank both sides hold, their statistics as arrays and their ratios.

    Attributes:
        regular: ``(rows,)`` bool: the row is judged here; False rows go row by row.
        target, golden: ``(rows, 4)`` float64 statistics (NaN where absent or irregular).
        present: ``(rows, 4)`` bool: the statistic is on both sides (regular rows).
        rtol, atol: ``(rows, 4)`` float64 tolerances of each cell (the policy's, per row: atol scales with the
            row's RMS and calibrated noise is the row's own).
        ratio: ``(rows, 4)`` float64 tolerance ratios (0 where absent); ``worst``: their row maximum.
        nonfinite: ``(rows,)`` bool: a regular row with a value non-finite where the golden's is finite.
    """

    def __init__(
        self, pairs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]], policy: TolerancePolicy, stage: str
    ):
        n = len(pairs)
        self._policy, self._stage = policy, stage
        regular = np.zeros(n, dtype=bool)
        values = np.full((2, n, 4), np.nan)
        present = np.zeros((n, 4), dtype=bool)
        scale = np.full(n, np.nan)
        dtypes = [""] * n
        for i, (_, t_item, g_item) in enumerate(pairs):
            found = self._read(t_item, g_item)
            if found is None:
                continue
            t_stats, g_stats, mean_scale = found
            regular[i], dtypes[i] = True, str(dtype_of(t_item))
            values[0, i], values[1, i] = _nan_for_none(t_stats), _nan_for_none(g_stats)
            present[i] = [v is not None for v in t_stats]
            scale[i] = np.nan if mean_scale is None else mean_scale
        codes = np.arange(n, dtype=np.int64)  # a dtype per row: the pairs path is the small one
        self._judge(Cells(values[0], values[1], present, regular, scale, codes, dtypes, [p[0] for p in pairs]))

    @classmethod
    def of_cells(cls, cells: Cells, policy: TolerancePolicy, stage: str) -> StatTable:
        """The table of rows already read into arrays (the columnar compare)."""
        table = cls([], policy, stage)
        table._judge(cells)
        return table

    def _judge(self, cells: Cells) -> None:
        """Each regular row's tolerances from ``policy.tolerance_arrays`` (atol scaled to its RMS, its own
        calibrated noise), then every ratio at once."""
        n = len(cells.regular)
        self.regular, self.present = cells.regular, cells.present
        self.target, self.golden = cells.target, cells.golden
        self.rtol, self.atol = np.zeros((n, 4)), np.zeros((n, 4))
        judged = np.flatnonzero(cells.regular)
        if len(judged):
            self.rtol[judged], self.atol[judged] = self._policy.tolerance_arrays(
                stage=self._stage,
                dtypes=cells.dtypes,
                codes=cells.codes[judged],
                names=[cells.names[i] for i in judged.tolist()],
                rms=cells.scale[judged],
            )
        tols = np.stack([self.rtol, self.atol])
        self.ratio = np.where(self.present, _ratios(self.target, self.golden, tols, cells.scale), 0.0)
        self.worst = self.ratio.max(axis=1, initial=0.0)
        nonfinite = ~np.isfinite(self.target) & np.isfinite(self.golden) & self.present
        self.nonfinite = self.regular & nonfinite.any(axis=1)

    def _read(self, t_item: dict[str, Any], g_item: dict[str, Any]) -> tuple | None:
        """``(target stats, golden stats, the golden's RMS)`` of a regular row; None otherwise."""
        t_dtype = dtype_of(t_item)
        if t_dtype != dtype_of(g_item) or t_item.get("shape") != g_item.get("shape"):
            return None
        t_stats, g_stats = four(t_item), four(g_item)
        if (
            t_stats is None
            or g_stats is None
            or any((t is None) != (g is None) for t, g in zip(t_stats, g_stats, strict=True))
            or all(t is None for t in t_stats)  # compared by nothing: the row-by-row path says so
        ):
            return None
        return t_stats, g_stats, rms(g_stats[3], t_item.get("shape"))

    def tol(self, i: int, k: int) -> Tol:
        """The tolerance regular row ``i``'s statistic ``k`` was judged by (``policy.tolerance_arrays``)."""
        return Tol(float(self.rtol[i, k]), float(self.atol[i, k]))


def _nan_for_none(stats: list[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in stats]


def _ratios(t: np.ndarray, g: np.ndarray, tols: np.ndarray, mean_scale: np.ndarray) -> np.ndarray:
    """:func:`~precision_harness.check.tolerance.policy.tolerance_ratio` of every cell, with its operations in its
    order."""
    scale = np.abs(g)
    has_rms = ~np.isnan(mean_scale)
    scale[has_rms, MEAN] = np.abs(mean_scale[has_rms])
    with np.errstate(all="ignore"):
        allowed = tols[1] + tols[0] * scale
        ratio = np.abs(t - g) / allowed
    ratio = np.where(allowed > 0, ratio, np.inf)
    ratio = np.where(np.isfinite(t) & np.isfinite(g), ratio, np.inf)
    same = (t == g) | (np.isnan(t) & np.isnan(g))
    return np.where(same, 0.0, ratio)


@dataclass(frozen=True)
class RowRule:
    """What one row outside a :class:`StatTable` is judged by.

    Attributes:
        policy, stage: the check's tolerance policy and the verl stage.
        dtype: the msprobe dtype string the tolerance is looked up by (``"torch.bfloat16"``).
        api: the row's name (API globs and calibrated noise are looked up by it).
        scale: the golden tensor's RMS, ``Norm / sqrt(numel)`` (None: unknown): Mean's scale and Max's and Min's atol.
    """

    policy: TolerancePolicy
    stage: str
    dtype: str
    api: str
    scale: float | None


@dataclass(frozen=True)
class Judged:
    """One statistic of a row: ``run`` against ``golden``; ``tol`` and ``ratio`` are None where one side has none."""

    statistic: str
    run: float | None
    golden: float | None
    tol: Tol | None = None
    ratio: float | None = None


def judge_statistics(run: dict[str, Any], golden: dict[str, Any], rule: RowRule) -> Iterator[Judged]:
    """Each statistic of the golden's row (``row_statistics``: Max/Min/Mean/Norm, or a scalar's ``value``) against the
    run's, in the golden's order: ``policy.for_tensor``'s tolerance and ``tolerance_ratio`` (Mean against
    ``rule.scale``). A statistic neither side holds is left out; one that one side holds only has no ratio."""
    for stat, g_val in golden.items():
        t_val = run.get(stat)
        if t_val is None and g_val is None:
            continue
        if t_val is None or g_val is None:
            yield Judged(stat, t_val, g_val)
            continue
        tol = rule.policy.for_tensor(dtype=rule.dtype, stage=rule.stage, statistic=stat, api=rule.api, rms=rule.scale)
        ratio = tolerance_ratio(t_val, g_val, tol, scale=rule.scale if stat == "Mean" else None)
        yield Judged(stat, t_val, g_val, tol, ratio)
