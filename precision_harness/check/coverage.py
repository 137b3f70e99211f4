"""The coverage ledger of a check: what the golden holds, what was compared, and why the rest was not.

A green gate must mean every value of the golden was compared. Each item's compare fills a :class:`Ledger` from the
counts it already has (the golden's arrays, its manifest's statistics count, the verdict's lists): for each unit
(:data:`UNITS`) a :class:`Coverage` of ``held`` (what the golden's part of the item holds), ``compared`` and
``not_compared`` by reason (the ``*`` constants below, plain text, so report.json and the terminal read them as
they are). ``held == compared + sum(not_compared)`` always.

The units: ``steps`` and ``stages`` of the golden, the ``ranks`` of its stages, their ``rows`` (msprobe's rows that
hold a value, a tensor's statistics or a scalar argument's, and the tensors msprobe recorded no statistic of), the
``statistics`` the gate checks (Max/Min/Mean/Norm values and scalar arguments' values, as
:func:`~precision_harness.dumps.rows.count_statistics` counts them and the golden's manifest records them), and the
``metrics`` values of its metrics.jsonl (a ``(step, metric)`` with a number; a null holds nothing).

A scenario's ledger is the sum of its selected items' ledgers: a ``pytest -k`` selection narrows what is held, not
what is compared. A reason is either declared (:data:`DECLARED`: the scenario says so, or another rule judges that
part) or dropped: a check whose ledger holds a dropped part fails with one line naming it (:meth:`Ledger.dropped_line`),
unless ``--precision-allow-uncompared`` accepts it. Most dropped parts fail already for their own verdict line (a
rank missing from the run); the ledger says how much of the golden they left unread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from precision_harness.dumps.rows import row_statistics

#: the ledger's units, in the order a line names them
UNITS = ("steps", "stages", "ranks", "rows", "statistics", "metrics")

#: the golden holds it and the run does not: a rank, a row, a statistic, a metric or a step of the metrics
NOT_IN_RUN = "not in this run"
#: a tensor msprobe recorded no statistic of on either side (a FRACTAL_NZ or fp8 tensor on NPU), not declared
NOT_RECORDED = "msprobe did not record it"
#: such a tensor, named by the scenario's ``tolerance.unchecked``
DECLARED_UNCHECKED = "declared unchecked"
#: inside a changed block of the call stream: judged by the values leaving the block (``tolerance.code_path``)
CHANGED_CODE_PATH = "changed code path"
#: a paired row whose dtype or shape changed: its statistics describe another tensor
STRUCTURAL = "dtype or shape changed"
#: a statistic the golden's msprobe recorded and this run's did not (check.recording: fails as coverage lost)
OTHER_MSPROBE = "this run's msprobe does not record it"
#: dumps whose calls pair below half of the larger side's: another program, a stale golden
UNALIGNED = "too different to align"
#: a row of FSDP2's all-gather buffer where the run or the golden's ran without its zero-fill (a torch the fill does
#: not know): uninitialised memory on that side, so no numeric change (:mod:`~precision_harness.check.compare.unfilled`)
UNFILLED = "FSDP2 all-gather buffer not zero-filled"

#: the reasons a scenario declares, or another rule judges: shown, never a drop
DECLARED = frozenset({DECLARED_UNCHECKED, CHANGED_CODE_PATH, UNFILLED})


@dataclass
class Coverage:
    """One unit of a ledger: ``held`` by the golden, ``compared``, and ``not_compared`` by reason."""

    held: int = 0
    compared: int = 0
    not_compared: dict[str, int] = field(default_factory=dict)

    def hold(self, n: int = 1) -> None:
        """``n`` more held by the golden, and compared."""
        self.held += n
        self.compared += n

    def miss(self, reason: str, n: int = 1, *, held: bool = False) -> None:
        """``n`` of what is held not compared, for ``reason``; with ``held``, ``n`` more held too (else moved out of
        :attr:`compared`)."""
        if n <= 0:
            return
        if held:
            self.held += n
        else:
            self.compared -= n
        self.not_compared[reason] = self.not_compared.get(reason, 0) + n

    def reclass(self, old: str, new: str, n: int) -> None:
        """Move ``n`` not compared for ``old`` to ``new`` (a tensor msprobe did not record, found declared)."""
        n = min(n, self.not_compared.get(old, 0))
        if n > 0:
            self.not_compared[old] -= n
            self.not_compared = {k: v for k, v in self.not_compared.items() if v}
            self.not_compared[new] = self.not_compared.get(new, 0) + n

    def add(self, other: Coverage) -> None:
        self.held += other.held
        self.compared += other.compared
        for reason, n in other.not_compared.items():
            self.not_compared[reason] = self.not_compared.get(reason, 0) + n

    @property
    def dropped(self) -> dict[str, int]:
        """What is not compared for a reason that is not :data:`DECLARED`."""
        return {r: n for r, n in self.not_compared.items() if n and r not in DECLARED}

    def to_json(self) -> dict[str, Any]:
        return {"held": self.held, "compared": self.compared, "not_compared": dict(sorted(self.not_compared.items()))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Coverage:
        return cls(int(data["held"]), int(data["compared"]), {str(k): int(v) for k, v in data["not_compared"].items()})


@dataclass
class Ledger:
    """Every unit's :class:`Coverage` of one item, or of a scenario (:meth:`of`)."""

    units: dict[str, Coverage] = field(default_factory=dict)

    def __getitem__(self, unit: str) -> Coverage:
        """The unit's coverage, added empty on first use (``unit`` one of :data:`UNITS`)."""
        if unit not in UNITS:
            raise KeyError(f"coverage unit {unit!r}: expected one of {', '.join(UNITS)}")
        return self.units.setdefault(unit, Coverage())

    def add(self, other: Ledger) -> Ledger:
        for unit, cov in other.units.items():
            self[unit].add(cov)
        return self

    @classmethod
    def of(cls, ledgers: Iterable[Ledger]) -> Ledger:
        """The sum of ``ledgers`` (a scenario's items)."""
        total = cls()
        for ledger in ledgers:
            total.add(ledger)
        return total

    @property
    def complete(self) -> bool:
        """Everything held was compared."""
        return not any(cov.not_compared for cov in self.units.values())

    @property
    def dropped(self) -> dict[str, dict[str, int]]:
        """``{unit: {reason: count}}`` of the parts not compared for a reason that is not :data:`DECLARED`."""
        return {unit: cov.dropped for unit, cov in self._ordered() if cov.dropped}

    def _ordered(self) -> list[tuple[str, Coverage]]:
        return [(unit, self.units[unit]) for unit in UNITS if unit in self.units]

    def headline(self) -> str:
        """``"4,010 of 4,022 statistics compared (99.7 %)"``: the finest unit held (statistics, else metrics...)."""
        for unit in ("statistics", "metrics", "rows", "ranks", "stages"):
            cov = self.units.get(unit)
            if cov is not None and cov.held:
                return f"{cov.compared:,} of {cov.held:,} golden {unit} compared ({_percent(cov)})"
        return "the golden holds nothing to compare"

    def missing_text(self, *, only_dropped: bool = False) -> str:
        """``"statistics: 12 msprobe did not record it; rows: 3 msprobe did not record it"``, unit by unit."""
        parts = []
        for unit, cov in self._ordered():
            reasons = cov.dropped if only_dropped else cov.not_compared
            if reasons:
                parts.append(f"{unit}: " + ", ".join(f"{n:,} {r}" for r, n in sorted(reasons.items())))
        return "; ".join(parts)

    def line(self, scenario: str) -> str:
        """The terminal summary's line of a scenario whose ledger is not complete."""
        return f"coverage {scenario}: {self.headline()}; not compared: {self.missing_text()}"

    def dropped_line(self) -> str:
        """The one line a check with dropped parts fails with."""
        return (
            f"golden coverage dropped: {self.missing_text(only_dropped=True)} of what the golden holds was not "
            "compared; re-record the golden if that is intended, or accept it with --precision-allow-uncompared"
        )

    def property_value(self) -> str:
        """The JUnit property ``precision_coverage``: the headline, and what was not compared."""
        missing = self.missing_text()
        return self.headline() + (f"; not compared: {missing}" if missing else "")

    def to_json(self) -> dict[str, Any]:
        return {unit: cov.to_json() for unit, cov in self._ordered()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ledger:
        return cls({unit: Coverage.from_json(cov) for unit, cov in data.items()})


def held_by_columns(present: np.ndarray, scalar: np.ndarray, among: np.ndarray | None = None) -> tuple[int, int]:
    """``(rows, statistics)`` a dump's columns hold (``present`` ``(rows, 4)`` bool, ``scalar`` ``(rows,)`` bool, as
    :class:`~precision_harness.dumps.columns.Columns` has them), of the rows ``among`` (``(rows,)`` bool) where
    given: a row holding a value, each statistic a tensor's row holds, and a scalar argument's value as one (as
    :func:`~precision_harness.dumps.rows.count_statistics` counts them)."""
    has = present.any(axis=1)
    if among is not None:
        has &= among
    tensor = has & ~scalar
    return int(has.sum()), int((present & tensor[:, None]).sum()) + int((has & scalar).sum())


def held_by_row(item: dict[str, Any]) -> tuple[int, int]:
    """``(rows, statistics)`` one of msprobe's rows holds (:func:`held_by_columns` for a row's dict)."""
    n = sum(v is not None for v in row_statistics(item).values())
    return int(n > 0), n


def _percent(cov: Coverage) -> str:
    share = 100.0 * cov.compared / cov.held if cov.held else 100.0
    text = f"{share:.1f}" if cov.compared != cov.held else "100"
    return f"{'99.9' if text == '100.0' else text} %"
