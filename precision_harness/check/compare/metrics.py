"""Compare a run's metrics.jsonl against its golden's, every step, and return a typed verdict; no file I/O.

Every metric is gated with ``policy.for_metric`` (``|t - g| <= atol + rtol |g|``); a step or a metric on one
side only, and a value turned null, are problems.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.coverage import NOT_IN_RUN, Ledger
from precision_harness.check.tolerance.policy import TolerancePolicy, tolerance_ratio
from precision_harness.dumps.rows import to_float
from precision_harness.dumps.statistics import relative_change


@dataclass(frozen=True)
class MetricDrift:
    step: int
    name: str
    golden: float | None
    target: float | None
    ratio: float
    rel: float


@dataclass
class MetricsVerdict:
    """Outcome of comparing a run's metrics.jsonl against the golden's, every step."""

    scenario: str
    checked: int = 0  #: values compared
    drifts: list[MetricDrift] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  #: a step or a metric on one side only, a value turned null
    worst_ratio: float = 0.0  #: largest ``|t - g| / (atol + rtol |g|)`` over the compared values (0: identical)
    #: the golden's metric values (a number at a step): compared, or why not (:mod:`~precision_harness.check.coverage`)
    coverage: Ledger = field(default_factory=Ledger, repr=False)

    @property
    def ledger(self) -> Ledger:
        return self.coverage

    @property
    def passed(self) -> bool:
        """Nothing beyond tolerance and no problem."""
        return not self.drifts and not self.problems


def _by_step(rows_: Iterable[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(r.get("training/global_step", i + 1)): r for i, r in enumerate(rows_)}


def compare_metrics(
    target: Iterable[dict[str, Any]], golden: Iterable[dict[str, Any]], settings: CheckSettings
) -> MetricsVerdict:
    """Gate every metric of every step (parsed ``metrics.jsonl`` rows) with ``policy.for_metric``
    (``|t - g| <= atol + rtol |g|``)."""
    verdict = MetricsVerdict(scenario=settings.scenario)
    t_rows, g_rows = _by_step(target), _by_step(golden)
    for step in sorted(set(g_rows) - set(t_rows)):
        verdict.problems.append(f"step {step}: in the golden metrics but missing from this run")
        verdict.coverage["metrics"].miss(NOT_IN_RUN, _values(g_rows[step], g_rows[step]), held=True)
    for step in sorted(set(t_rows) - set(g_rows)):
        verdict.problems.append(f"step {step}: not in the golden metrics")
    for step in sorted(set(t_rows) & set(g_rows)):
        _compare_step(verdict, step, t_rows[step], g_rows[step], settings.policy)
    return verdict


def _values(row: dict[str, Any], names: Iterable[str]) -> int:
    """The metrics of ``names`` that hold a number in ``row`` (a null holds nothing to compare)."""
    return sum(to_float(row[name]) is not None for name in names)


def _compare_step(
    verdict: MetricsVerdict, step: int, t: dict[str, Any], g: dict[str, Any], policy: TolerancePolicy
) -> None:
    for name in sorted(set(g) - set(t)):
        verdict.problems.append(f"step {step}: metric {name} missing from this run")
    metrics = verdict.coverage["metrics"]
    metrics.miss(NOT_IN_RUN, _values(g, set(g) - set(t)), held=True)
    for name in sorted(set(t) - set(g)):
        verdict.problems.append(f"step {step}: metric {name} not in the golden")
    for name in sorted(set(t) & set(g)):
        tv, gv = to_float(t[name]), to_float(g[name])
        if tv is None and gv is None:
            continue
        if tv is None or gv is None:  # a number became null (or the reverse): not a drift, a change
            verdict.problems.append(f"step {step}: metric {name}: {g[name]!r} -> {t[name]!r}")
            metrics.miss(NOT_IN_RUN, int(gv is not None), held=True)
            continue
        verdict.checked += 1
        metrics.hold()
        ratio = tolerance_ratio(tv, gv, policy.for_metric(name))
        verdict.worst_ratio = max(verdict.worst_ratio, ratio)
        if ratio > 1.0:
            verdict.drifts.append(MetricDrift(step, name, gv, tv, ratio, relative_change(tv, gv)))
