"""The coverage ledger in a report: each item's (:mod:`precision_harness.check.coverage`), each scenario's as the sum
of its items', a terminal line per scenario that compared less than its golden holds (none where everything held
was compared), a row per scenario for report.md and report.html, and the JUnit property of an item."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from precision_harness.check.coverage import Ledger


class _Record(Protocol):
    """What of an :class:`~precision_harness.report.item_record.ItemRecord` the ledger reads."""

    scenario: str
    step: int | None
    stage: str | None
    coverage: dict[str, Any] | None


def scenario_ledger(records: Iterable[_Record]) -> Ledger | None:
    """The ledger of a scenario's items (selected ones only: ``-k`` narrows what is held, it drops nothing), with its
    ``steps``: a golden step of a compared stage counts as compared where every stage of it was, else under the
    reason its first stage not compared gives. None where no item compared anything (a recorded golden)."""
    ledgers = [(r, Ledger.from_json(r.coverage)) for r in records if r.coverage is not None]
    if not ledgers:
        return None
    total = Ledger.of(ledger for _, ledger in ledgers)
    steps: dict[int, str | None] = {}  # step -> the reason of its first stage not compared (None: all compared)
    for record, ledger in sorted(ledgers, key=lambda pair: (pair[0].step or 0, pair[0].stage or "")):
        stages = ledger.units.get("stages")
        if record.step is None or stages is None:
            continue
        missing = next(iter(sorted(stages.not_compared)), None)
        steps[record.step] = steps.get(record.step) or missing
    for reason in steps.values():
        total["steps"].hold()
        if reason is not None:
            total["steps"].miss(reason)
    return total


def scenario_coverage(records: Iterable[_Record]) -> dict[str, Any] | None:
    """A scenario's ledger as report.json keeps it (``scenarios[].coverage``)."""
    ledger = scenario_ledger(records)
    return ledger.to_json() if ledger is not None else None


def coverage_lines(by_scenario: dict[str, list[Any]]) -> Iterator[str]:
    """One terminal line per scenario whose items compared less than their golden parts hold, by scenario name."""
    for name, records in by_scenario.items():
        ledger = scenario_ledger(records)
        if ledger is not None and not ledger.complete:
            yield ledger.line(name)


def coverage_rows(scenarios: Iterable[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``(scenario, compared, not compared)`` of each of report.json's ``scenarios`` that compared something, as
    report.md and report.html show them: ``("grpo_tiny", "43,600 of 43,664 golden statistics compared (99.9 %)",
    "statistics: 64 changed code path; rows: 2 changed code path")``, ``"-"`` where everything held was compared."""
    rows = []
    for sc in scenarios:
        if sc.get("coverage") is not None:
            ledger = Ledger.from_json(sc["coverage"])
            rows.append((sc["name"], ledger.headline(), ledger.missing_text() or "-"))
    return rows


def coverage_property(coverage: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The item's JUnit property ``precision_coverage`` (none for an item that compared nothing)."""
    return [("precision_coverage", Ledger.from_json(coverage).property_value())] if coverage is not None else []
