"""The tolerance ratios of one rank's paired rows, every statistic at once (numpy), for the compare.

:func:`~precision_harness.check.compare.compare_rank` judges each statistic with
:func:`~precision_harness.check.tolerance.tolerance_ratio`, ``|t - g| / (atol + rtol * scale)``; at 65,000
calls a rank (a 7B model at L1) that is a quarter of a million rows and a million Python calls. A
:class:`StatTable` holds the rows that need nothing but that formula, the *regular* rows (same dtype and
shape, four statistics, each present on both sides or on neither), as ``(rows, 4)`` float64 arrays, and
computes every ratio in one pass with the same IEEE operations in the same order, so each ratio is the
float ``tolerance_ratio`` returns. The compare then touches in Python only the rows whose verdict says
something: a drift or a value turned non-finite. Every other row (a dtype or shape change, a scalar's
``value``, a statistic on one side only) goes to the compare's row-by-row path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from precision_harness.check.tolerance import Tol, TolerancePolicy
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
        names: ``(rows,)`` the row names (read where the policy has API globs).
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
        ratio: ``(rows, 4)`` float64 tolerance ratios (0 where absent); ``worst``: their row maximum.
        notable: ``(rows,)`` bool: a regular row with a ratio above 1 or a value non-finite where the
            golden's is finite.
    """

    def __init__(
        self, pairs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]], policy: TolerancePolicy, stage: str
    ):
        n = len(pairs)
        self._policy, self._stage = policy, stage
        self._tols: dict[tuple[str, str, str], Tol] = {}
        self._bounds: dict[tuple[str, str], tuple[list[float], list[float]]] = {}  # (rtols, atols) of a row
        regular = np.zeros(n, dtype=bool)
        values = np.full((2, n, 4), np.nan)
        present = np.zeros((n, 4), dtype=bool)
        tols = np.zeros((2, n, 4))  # rtol, atol
        scale = np.full(n, np.nan)
        for i, (name, t_item, g_item) in enumerate(pairs):
            found = self._read(name, t_item, g_item)
            if found is None:
                continue
            t_stats, g_stats, (rtol, atol), mean_scale = found
            regular[i] = True
            values[0, i], values[1, i] = _nan_for_none(t_stats), _nan_for_none(g_stats)
            present[i] = [v is not None for v in t_stats]
            tols[0, i], tols[1, i] = rtol, atol
            scale[i] = np.nan if mean_scale is None else mean_scale
        self._judge(Cells(values[0], values[1], present, regular, scale), tols)

    @classmethod
    def of_cells(cls, cells: Cells, policy: TolerancePolicy, stage: str) -> StatTable:
        """The table of rows already read into arrays (the columnar compare), each regular row's tolerance asked of
        :meth:`bounds` (once per dtype where no API glob can tell rows apart)."""
        table = cls([], policy, stage)
        tols = np.zeros((2, len(cells.regular), 4))
        regular = np.flatnonzero(cells.regular)
        if not policy.apis:
            for code in np.unique(cells.codes[regular]).tolist():
                rows = regular[cells.codes[regular] == code]
                tols[0, rows], tols[1, rows] = table.bounds(cells.dtypes[code], "")
        else:
            for i in regular.tolist():
                tols[0, i], tols[1, i] = table.bounds(cells.dtypes[cells.codes[i]], cells.names[i])
        table._judge(cells, tols)
        return table

    def _judge(self, cells: Cells, tols: np.ndarray) -> None:
        self.regular, self.present = cells.regular, cells.present
        self.target, self.golden = cells.target, cells.golden
        self.ratio = np.where(self.present, _ratios(self.target, self.golden, tols, cells.scale), 0.0)
        self.worst = self.ratio.max(axis=1, initial=0.0)
        nonfinite = ~np.isfinite(self.target) & np.isfinite(self.golden) & self.present
        self.notable = self.regular & ((self.ratio > 1.0).any(axis=1) | nonfinite.any(axis=1))

    def bounds(self, dtype: str, name: str) -> tuple[list[float], list[float]]:
        """``(rtols, atols)`` of Max/Min/Mean/Norm for a row of ``dtype`` named ``name`` (:meth:`tol`)."""
        key = (dtype, name if self._policy.apis else "")
        found = self._bounds.get(key)
        if found is None:
            tols = [self.tol(dtype, s, name) for s in STATISTICS]
            found = self._bounds[key] = ([t.rtol for t in tols], [t.atol for t in tols])
        return found

    def _read(self, name: str, t_item: dict[str, Any], g_item: dict[str, Any]) -> tuple | None:
        """``(target stats, golden stats, (rtols, atols), Mean's scale)`` of a regular row; None otherwise."""
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
        return t_stats, g_stats, self.bounds(str(t_dtype), name), rms(g_stats[3], t_item.get("shape"))

    def tol(self, dtype: str, statistic: str, name: str) -> Tol:
        """``policy.for_tensor`` (cached per dtype and statistic where no API glob can tell rows apart)."""
        key = (dtype, statistic, name if self._policy.apis else "")
        found = self._tols.get(key)
        if found is None:
            found = self._tols[key] = self._policy.for_tensor(
                dtype=dtype, stage=self._stage, statistic=statistic, api=name
            )
        return found


def _nan_for_none(stats: list[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in stats]


def _ratios(t: np.ndarray, g: np.ndarray, tols: np.ndarray, mean_scale: np.ndarray) -> np.ndarray:
    """:func:`~precision_harness.check.tolerance.tolerance_ratio` of every cell, with its operations in its order."""
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
