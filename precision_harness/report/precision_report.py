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
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from precision_harness import progress
from precision_harness.check.compare.drift_set import Drift
from precision_harness.check.compare.metrics import MetricsVerdict
from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.check.environment import EnvironmentDiff, grouped
from precision_harness.check.verdicts.items import Outcome, OutcomeKind
from precision_harness.goldens.churn import ChurnRow, churn_table, creep_line
from precision_harness.report.code_paths import code_path_json, code_path_lines
from precision_harness.report.coverage_report import coverage_lines, coverage_property, scenario_coverage
from precision_harness.report.report_md import judgement_line
from precision_harness.scenarios.profiling import LOCALIZE_LEVEL, STAGES

REPORT_FORMAT = 1
#: execution-order points kept per failing stage's drift profile (the plot); longer ones are thinned
MAX_PROFILE_POINTS = 4000
#: problems kept per record
MAX_RECORD_PROBLEMS = 20
#: the (API, statistic) entries of a failing stage's drift profile a record keeps, the most drifts first
MAX_BY_API = 20
#: scenarios named in a summary line about an environment difference before "and N more"
MAX_NAMED_SCENARIOS = 3


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _drift_json(d: Drift | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "rank": d.rank,
        "tensor": d.tensor,
        "statistic": d.statistic,
        "golden": _finite(d.golden),
        "target": _finite(d.target),
        "ratio": _finite(d.ratio),
        "order": d.order,
    }


def _plain(value: Any) -> Any:
    """``value`` with every non-finite float as None (report.json is strict JSON)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _localized_json(local: Outcome | None) -> dict[str, Any] | None:
    """The report's view of a level-auto localisation (None when the item was not localised)."""
    if local is None or not isinstance(local.verdict, StageVerdict):
        return None
    return {
        "level": LOCALIZE_LEVEL,
        "passed": bool(local.passed),
        "first_divergence": _drift_json(local.verdict.first_divergence),
        "msprobe_first_diff": dict(local.msprobe.first_diff) if local.msprobe is not None else {},
    }


def run_info(run_json: dict[str, Any], *, wall_s: float, profiled: set[str], run_dir: str) -> dict[str, Any]:
    """A record's ``run``: the scenario run's wall time, timings, its terminal timing line and its folder."""
    timing = progress.timing_line(run_json, profiled=profiled)
    return {"wall_s": round(wall_s, 3), "timings": run_json.get("timings", {}), "timing": timing, "run_dir": run_dir}


@dataclass
class ItemRecord:
    """One item's result as the report keeps it (schema ``report``, ``items``).

    ``run`` (the scenario run's device, wall time, per-stage timings and folder) is the same on every
    record of a scenario, so a summary line per run can be made from any of them.
    """

    nodeid: str
    scenario: str
    step: int | None
    stage: str | None
    kind: OutcomeKind
    passed: bool
    text: str
    worst_ratio: float | None = None  #: None: infinite, structural, or not compared
    checked: int = 0
    beyond: int = 0
    #: ``{"api", "statistic", "count", "worst_ratio"}`` of the APIs with the most drifts (check.compare.drift_set)
    beyond_by_api: list[dict[str, Any]] = field(default_factory=list)
    first_divergence: dict[str, Any] | None = None
    largest: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    msprobe_first_diff: dict[str, str] = field(default_factory=dict)
    graphs: list[str] = field(default_factory=list)
    msprobe_errors: list[str] = field(default_factory=list)
    artifacts: str | None = None
    compare_s: float = 0.0
    profile: list[list[Any]] = field(default_factory=list)  #: ``[rank, order, tensor, ratio]`` of a failing stage
    churn: list[dict[str, Any]] = field(default_factory=list)  #: :meth:`ChurnRow.to_json` rows
    run: dict[str, Any] | None = None
    #: level auto: ``{"level", "passed", "first_divergence", "msprobe_first_diff"}`` of the L1 rerun
    localized: dict[str, Any] | None = None
    #: the run's environment against the golden's: :meth:`EnvironmentDiff.to_json` rows (empty: same, or unknown)
    environment_diff: list[dict[str, Any]] = field(default_factory=list)
    #: a failing stage: where its change entered (:meth:`DriftOrigin.to_json`; level auto: the L1 localisation's)
    origin: dict[str, Any] | None = None
    #: a failing stage whose change entered at an API: ``{"verdict", "api", "reason", "figures"}``
    #: (check.verdicts.judgement)
    judgement: dict[str, Any] | None = None
    #: the stage's changed code paths: ``{"line", "count", "failing", "what", "cause", "changes"}``
    #: (check.compare.code_path)
    code_path: dict[str, Any] | None = None
    #: tensor rows compared by nothing (msprobe recorded no statistics on either side), allowed or not
    unchecked: int = 0
    #: what of the golden the item compared, by unit, and why not the rest (:meth:`Ledger.to_json`); None: nothing
    coverage: dict[str, Any] | None = None

    @classmethod
    def from_outcome(
        cls,
        outcome: Outcome,
        *,
        nodeid: str,
        scenario: str,
        step: int | None,
        stage: str | None,
        run: dict[str, Any] | None = None,
    ) -> ItemRecord:
        """The record of one item's :class:`~precision_harness.check.verdicts.items.Outcome`."""
        rec = cls(
            nodeid=nodeid,
            scenario=scenario,
            step=step,
            stage=stage,
            kind=outcome.kind,
            passed=bool(outcome.passed),
            text=outcome.text,
            artifacts=str(outcome.artifacts) if outcome.artifacts else None,
            compare_s=round(outcome.seconds, 4),
            churn=[r.to_json() for r in outcome.churn],
            run=run,
        )
        rec._add_verdict(outcome.verdict)
        rec.coverage = outcome.ledger.to_json() if outcome.ledger is not None else None
        if outcome.kind is OutcomeKind.ERROR:
            rec.problems = [outcome.text]
        if outcome.msprobe is not None:
            rec.msprobe_first_diff = dict(outcome.msprobe.first_diff)
            rec.graphs = [str(p) for p in outcome.msprobe.graphs]
            rec.msprobe_errors = list(outcome.msprobe.errors)
        rec.localized = _localized_json(outcome.localized)
        rec.environment_diff = outcome.environment.to_json()
        local = outcome.localized
        origin = local.origin if local is not None and local.origin is not None else outcome.origin
        rec.origin = origin.to_json() if origin is not None else None
        rec.judgement = _plain(outcome.judgement.to_json()) if outcome.judgement is not None else None
        if isinstance(outcome.verdict, StageVerdict):
            rec.code_path = code_path_json(outcome.verdict, outcome.environment)
        return rec

    def _add_verdict(self, v: StageVerdict | MetricsVerdict | None) -> None:
        if v is None:
            return
        self.checked, self.beyond = v.checked, len(v.drifts)
        self.problems = [str(p) for p in v.problems[:MAX_RECORD_PROBLEMS]]
        if isinstance(v, MetricsVerdict):
            self.worst_ratio = None if v.problems else _finite(max((d.ratio for d in v.drifts), default=0.0))
            return
        self.beyond = v.beyond  # every drift counted, only the first and the largest kept (check.compare.drift_set)
        most = sorted(v.drift_set.by_api.items(), key=lambda kv: (-kv[1][0], kv[0]))[:MAX_BY_API]
        self.beyond_by_api = [
            {"api": api, "statistic": stat, "count": n, "worst_ratio": _finite(worst)}
            for (api, stat), (n, worst) in most
        ]
        self.worst_ratio = _finite(v.worst_ratio)
        self.unchecked = len(v.unchecked)
        self.first_divergence, self.largest = _drift_json(v.first_divergence), _drift_json(v.largest)
        if not v.passed and v.profile:
            every = math.ceil(len(v.profile) / MAX_PROFILE_POINTS)
            self.profile = [[rank, order, name, _finite(ratio)] for rank, order, name, ratio in v.profile[::every]]

    def __post_init__(self) -> None:
        self.kind = OutcomeKind(self.kind)  # a record made from JSON, or by hand, names its kind by value

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ItemRecord:
        """The record :meth:`to_json` wrote."""
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (the kind as its value): how a record travels to the xdist controller and into report.json."""
        return {**asdict(self), "kind": self.kind.value}

    def user_properties(self) -> list[tuple[str, str]]:
        """The JUnit XML properties of the item: verdict kind, worst ratio, first divergence, environment diff."""
        props = [("precision_verdict", self.kind.value)]
        if self.stage is not None and self.kind in (OutcomeKind.COMPARED, OutcomeKind.IDENTICAL):
            ratio = self.worst_ratio if self.worst_ratio is not None else math.inf
            props.append(("precision_worst_ratio", f"{ratio:.6g}"))
        first = self.first_divergence
        if first is not None:
            props.append(("precision_first_divergence", f"{first['tensor']} {first['statistic']}"))
        elif self.problems and not self.passed:
            props.append(("precision_first_divergence", self.problems[0]))
        local = (self.localized or {}).get("first_divergence")
        if local is not None:
            props.append(("precision_localized", f"{self.localized['level']} {local['tensor']} {local['statistic']}"))
        if self.environment_diff:
            props.append(("precision_environment_diff", EnvironmentDiff.from_json(self.environment_diff).summary))
        if self.origin is not None:
            props.append(("precision_origin", f"{self.origin['kind']} {self.origin['row']}"))
        if self.judgement is not None:
            props.append(("precision_judgement", judgement_line(self.judgement)))
        if self.code_path is not None:
            props.append(("precision_code_path", self.code_path["line"]))
        return props + coverage_property(self.coverage)


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


#: the rollout engines a golden's stack records (precision_harness.runs.host.stack.PACKAGES)
ROLLOUT_ENGINES = ("vllm", "vllm-ascend", "sglang")


def not_exercised(env: EnvironmentDiff, runs: list[dict[str, Any]]) -> str | None:
    """What of the stack a passing check did not exercise, or None (every part it ran was checked).

    ``runs`` are the records' ``run`` maps (``device``, ``rollouts_pinned``). With rollouts pinned the
    check loads the golden's rollouts, so the rollout engine never ran: a change to it is named as
    unseen, visible only through the log-prob parity metrics where verl computes them
    (docs/consistency.md). Off the CPU, ``rollout_generate`` and ``weight_sync`` are refused, so
    the sampled tokens and the weight sync went unchecked too (docs/triage.md, "What a device check
    sees").
    """
    parts = []
    if any(run.get("rollouts_pinned") for run in runs):
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
