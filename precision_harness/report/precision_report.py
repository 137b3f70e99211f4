"""The run's report: one :class:`ItemRecord` per item, summed up by :class:`PrecisionReport`.

Records are plain data (:meth:`ItemRecord.to_json`), so a report can be assembled wherever the
items' results arrive: the pytest process, the xdist controller (records travel on the
TestReport), or ``precision-harness compare``. :class:`PrecisionReport` (modelled on syrupy's
``SnapshotReport``) gives the counts as properties, the terminal summary as one :attr:`lines`
generator, and the ``--precision-report`` files (report.json against schema ``report``, report.md,
report.html).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness.check.environment import ROLLOUT_ENGINES, EnvironmentDiff, grouped
from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.goldens.churn import ChurnRow, churn_table, creep_line
from precision_harness.report.code_paths import code_path_lines
from precision_harness.report.coverage_report import coverage_lines, scenario_coverage
from precision_harness.report.item_record import ItemRecord
from precision_harness.scenarios.profiling import STAGES

REPORT_FORMAT = 1
#: scenarios named in a summary line about an environment difference before "and N more"
MAX_NAMED_SCENARIOS = 3


@dataclass
class PrecisionReport:
    """The summary of one gate run (or one ``precision-harness compare``), from its item records."""

    mode: str
    records: list[ItemRecord] = field(default_factory=list)
    unused: list[dict[str, str]] = field(default_factory=list)  #: ``{"scenario", "device", "path"}``
    pruned: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)  #: why the run is not full (nothing is called unused)
    notes: list[str] = field(default_factory=list)  #: lines shown last (report paths, prune refusals)

    # ---------------------------------------------------------------------------------- counts
    @property
    def num_items(self) -> int:
        return len(self.records)

    @property
    def num_failed(self) -> int:
        return sum(not r.passed and r.kind is not OutcomeKind.SKIPPED for r in self.records)

    @property
    def num_skipped(self) -> int:
        """Items whose scenario cannot run here, skipped under ``--precision-allow-skip``."""
        return self._count(OutcomeKind.SKIPPED)

    @property
    def num_identical(self) -> int:
        return self._count(OutcomeKind.IDENTICAL)

    @property
    def num_compared(self) -> int:
        """Items compared statistic by statistic, within tolerance or not."""
        return self._count(OutcomeKind.COMPARED)

    @property
    def num_recorded(self) -> int:
        return self._count(OutcomeKind.RECORDED)

    def _count(self, kind: OutcomeKind) -> int:
        return sum(r.kind is kind for r in self.records)

    # ---------------------------------------------------------------------------------- terminal
    @property
    def lines(self) -> Iterator[str]:
        """The terminal summary: goldens recorded (with churn), item counts, runs, unused goldens, notes."""
        yield from self._recorded_lines()
        if self.records:
            counts = (
                [f"{self.num_recorded} recorded"]
                if self.num_recorded
                else [f"{self.num_identical} identical to golden", f"{self.num_compared} within tolerance or compared"]
            )
            skipped = f", {self.num_skipped} skipped" if self.num_skipped else ""
            yield f"{self.num_items} precision items: {', '.join(counts)}, {self.num_failed} failed{skipped}"
        yield from self._skipped_lines()
        yield from self._environment_lines()
        yield from code_path_lines(self.records)
        yield from coverage_lines(self._by_scenario())
        yield from self._run_lines()
        for u in self.unused:
            yield f"golden unused: {u['path']} (no collected scenario {u['scenario']}; remove with --precision-prune)"
        for path in self.pruned:
            yield f"golden pruned: {path}"
        yield from self.notes

    def _by_scenario(self) -> dict[str, list[ItemRecord]]:
        out: dict[str, list[ItemRecord]] = {}
        for r in sorted(self.records, key=lambda r: r.scenario):
            out.setdefault(r.scenario, []).append(r)
        return out

    def _recorded_lines(self) -> Iterator[str]:
        unavailable = None  # said once for the run, not once per scenario
        for records in self._by_scenario().values():
            recorded = [r for r in records if r.kind is OutcomeKind.RECORDED]
            if recorded:
                rows = [ChurnRow.from_json(c) for r in recorded for c in r.churn]
                yield recorded[0].text
                yield from churn_lines(rows)
                unavailable = unavailable or next((r.creep["unavailable"] for r in rows if _unavailable(r)), None)
        if unavailable:
            yield unavailable

    def _skipped_lines(self) -> Iterator[str]:
        """One line per reason a scenario could not run (``--precision-allow-skip``): how many items it skipped."""
        reasons: dict[str, int] = {}
        for r in self.records:
            if r.kind is OutcomeKind.SKIPPED:
                reasons[r.text] = reasons.get(r.text, 0) + 1
        for reason, count in sorted(reasons.items()):
            yield f"skipped (--precision-allow-skip): {count} item{'s' if count != 1 else ''}, not checked: {reason}"

    def _environment_lines(self) -> Iterator[str]:
        """One line per distinct environment difference (usually one for the whole run), never one per item."""
        by_scenario = self._by_scenario()
        rows = [(n, next((r.environment_diff for r in rs if r.environment_diff), [])) for n, rs in by_scenario.items()]
        checked = [n for n, rs in by_scenario.items() if any(r.kind is not OutcomeKind.RECORDED for r in rs)]
        for env, names in grouped(rows):
            failed = sum(not r.passed for n in names for r in by_scenario[n])
            runs = [r.run for n in names for r in by_scenario[n] if r.run]
            unseen = not_exercised(env, runs) if not failed else None
            yield environment_line(env, scenarios=names if names != checked else None, failed=failed, unseen=unseen)

    def note_undeclared(self, scenario: str, undeclared: list[str]) -> None:
        """A stage a command dumped but did not declare is named in the summary, never silently ignored."""
        if undeclared:
            stages = ", ".join(undeclared)
            self.notes.append(f"{scenario}: dumped but not declared in precision_debugger.stages (not gated): {stages}")

    def add_notes(self, notes: Iterable[str]) -> None:
        """Add the notes another process wrote (an xdist worker's), each once: workers plan the same scenarios."""
        self.notes += [note for note in dict.fromkeys(notes) if note not in self.notes]

    def _run_lines(self) -> Iterator[str]:
        for name, records in self._by_scenario().items():
            run = next((r.run for r in records if r.run), None)
            if run is not None:
                compare_s = sum(r.compare_s for r in records)
                timing = f" ({run['timing']})" if run["timing"] else ""
                yield (
                    f"{name} on {run['device']}: run {run['wall_s']:.1f} s{timing}, "
                    f"compare {compare_s:.1f} s -> {run['run_dir']}"
                )

    # ---------------------------------------------------------------------------------- files
    def to_document(self) -> dict[str, Any]:
        """The report.json document: summary, items, per-scenario heatmaps, churn, unused goldens."""
        records = sorted(self.records, key=lambda r: (r.scenario, r.step is None, r.step or 0, r.stage or ""))
        items = [r.to_json() for r in records]
        return {
            "format": REPORT_FORMAT,
            "mode": self.mode,
            "summary": {
                "items": self.num_items,
                "passed": self.num_items - self.num_failed - self.num_skipped,
                "failed": self.num_failed,
                "skipped": self.num_skipped,
                "identical": self.num_identical,
                "recorded": self.num_recorded,
            },
            "scenarios": [_scenario_cells(name, rs) for name, rs in self._by_scenario().items()],
            "items": items,
            "churn": [c for r in records for c in r.churn],
            "unused_goldens": list(self.unused),
            "pruned": list(self.pruned),
            "partial_run": list(self.partial),
        }

    def write(self, directory: Path) -> list[Path]:
        """Write ``report.json`` (schema-validated), ``report.md`` and ``report.html`` into ``directory``.

        Raises:
            SchemaError: the document fails the ``report`` schema (a bug, reported in one line).
        """
        from precision_harness.report.report_html import html_report
        from precision_harness.report.report_md import markdown_report
        from precision_harness.schemas import validate

        document = self.to_document()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        validate(document, "report", source=directory / "report.json")
        paths = [directory / "report.json", directory / "report.md", directory / "report.html"]
        paths[0].write_text(json.dumps(document, indent=1, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
        paths[1].write_text(markdown_report(document), encoding="utf-8")
        paths[2].write_text(html_report(document), encoding="utf-8")
        return paths


def _scenario_cells(name: str, records: list[ItemRecord]) -> dict[str, Any]:
    """One scenario's heatmap (stage x step worst ratio), its run and its compare time."""
    stage_records = sorted((r for r in records if r.stage is not None and r.step is not None), key=lambda r: r.step)
    order = {s: i for i, s in enumerate(STAGES)}
    cells = [
        {
            "step": r.step,
            "stage": r.stage,
            "ratio": r.worst_ratio,
            "passed": r.passed,
            "kind": r.kind.value,
            "structural": bool(r.problems),
        }
        for r in stage_records
    ]
    return {
        "name": name,
        "steps": sorted({r.step for r in stage_records}),
        "stages": sorted({r.stage for r in stage_records}, key=lambda s: order.get(s, len(order))),
        "cells": cells,
        "run": next((r.run for r in records if r.run), None),
        "compare_s": round(sum(r.compare_s for r in records), 4),
        "environment_diff": next((r.environment_diff for r in records if r.environment_diff), []),
        "coverage": scenario_coverage(records),
    }


def not_exercised(env: EnvironmentDiff, runs: list[dict[str, Any]]) -> str | None:
    """What of the stack a passing check did not exercise, or None (every part it ran was checked).

    ``runs`` are the records' ``run`` maps (``device``, ``rollouts_pinned``, ``engine_scored``, ``engine_sampled``).
    With rollouts pinned the check loads the golden's rollouts, so the rollout engine sampled nothing: unless it
    scored the pinned responses (``engine_scored``: the scenario's ``rollout_compute_log_prob``) or sampled fresh
    steps whose mismatch was gated (``engine_sampled``: ``verl.fresh_steps``), a change to it is named as unseen,
    visible only through the log-prob parity metrics where verl computes them (docs/consistency.md). Off the CPU,
    ``rollout_generate`` and ``weight_sync`` are refused, so the sampled tokens and the weight sync went unchecked
    too (docs/triage.md, "What a device check sees").
    """
    parts = []
    if any(run.get("rollouts_pinned") and not (run.get("engine_scored") or run.get("engine_sampled")) for run in runs):
        engines = [str(c) for c in env.changes if c.what in ROLLOUT_ENGINES]
        changed = f": {'; '.join(engines)} unseen" if engines else ""
        parts.append(f"the rollout engine (rollouts pinned{changed}; only log-prob parity metrics reach it)")
    if any(run.get("device", "cpu") != "cpu" for run in runs):
        parts.append("rollout_generate and weight_sync (refused off the CPU)")
    return ", ".join(parts) or None


def environment_line(
    env: EnvironmentDiff, *, scenarios: list[str] | None, failed: int, unseen: str | None = None
) -> str:
    """The terminal summary's line about an environment difference.

    ``scenarios`` names the scenarios it concerns (None: every checked scenario). A difference made
    only of fields the golden does not record (an older golden) is a plain note, not a warning.
    ``unseen`` (:func:`not_exercised`) names, on a passing check, the parts of the stack it did not run.
    """
    whom = ""
    if scenarios:
        more = len(scenarios) - MAX_NAMED_SCENARIOS
        whom = " for " + ", ".join(scenarios[:MAX_NAMED_SCENARIOS]) + (f" and {more} more" if more > 0 else "")
    if not env.differs:
        return f"environment not fully recorded{whom} (older goldens record less; a re-record adds it): {env.summary}"
    verdict = "checked, the goldens held" if not failed else f"{failed} failed item(s) name it"
    if unseen and not failed:
        verdict += f"; not exercised: {unseen}"
    if env.model_line is not None:  # another accelerator model: said first, once, even when every item passed
        rest = env.besides_model
        also = f"; environment also {'differs' if rest.differs else 'not fully recorded'} ({rest.summary})"
        also = also if rest.changes else ""
        return f"{env.model_line}{whom}{also}: {verdict}"
    return f"environment differs from the golden's{whom} ({env.summary}): {verdict}"


def _unavailable(row: ChurnRow) -> bool:
    return bool(row.creep) and "unavailable" in row.creep


def churn_lines(rows: list[ChurnRow]) -> list[str]:
    """Terminal lines of a scenario's churn table (only changed stages; a count of unchanged ones),
    then its creep alarms (:func:`~precision_harness.goldens.churn.creep_line`)."""
    if not rows:
        return []
    creep = [f"  creep: {line}" for line in map(creep_line, rows) if line]
    if all(r.status == "new" for r in rows):
        return [f"  new golden: {len(rows)} stage dumps", *creep]
    changed = [r for r in rows if r.status != "unchanged"]
    lines = [f"  churn against the previous golden: {len(changed)} of {len(rows)} stage dumps changed"]
    return (lines + ["    " + line for line in churn_table(changed)] if changed else lines) + creep
