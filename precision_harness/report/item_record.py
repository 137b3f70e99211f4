"""One item's result as a report keeps it: :class:`ItemRecord`, plain data that travels from an xdist worker to
the controller (on the TestReport) and into report.json (schema ``report``, ``items``), and :func:`run_info`, its
scenario run's timings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from precision_harness import progress
from precision_harness.check.compare.drift_set import Drift
from precision_harness.check.compare.metrics import MetricsVerdict
from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.verdicts.items import Outcome, OutcomeKind
from precision_harness.report.code_paths import code_path_json
from precision_harness.report.coverage_report import coverage_property
from precision_harness.report.report_md import judgement_line
from precision_harness.scenarios.profiling import LOCALIZE_LEVEL

#: execution-order points kept per failing stage's drift profile (the plot); longer ones are thinned
MAX_PROFILE_POINTS = 4000
#: problems kept per record
MAX_RECORD_PROBLEMS = 20
#: the (API, statistic) entries of a failing stage's drift profile a record keeps, the most drifts first
MAX_BY_API = 20


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
    #: ``{"api", "statistic", "count", "worst_ratio"}`` of the APIs with the most drifts (check.drift_set)
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
    #: a failing stage whose change entered at an API: ``{"verdict", "api", "reason", "figures"}`` (check.judgement)
    judgement: dict[str, Any] | None = None
    #: the stage's changed code paths: ``{"line", "count", "failing", "what", "cause", "changes"}`` (check.code_path)
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
        self.beyond = v.beyond  # every drift counted, only the first and the largest kept (check.drift_set)
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
