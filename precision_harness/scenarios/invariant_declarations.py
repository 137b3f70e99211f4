"""A scenario's ``invariants:`` key (docs/consistency.md): the checks it may name, their bounds, and its parsing.

What the key declares, per kind of scenario; :mod:`precision_harness.check.tolerance.consistency` gives each
declared check its per-step verdict over a run's own files. Parsing is part of loading a scenario
(:attr:`~precision_harness.scenarios.scenario.Scenario.invariants`), so a bad key is a one-line
error at load time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_harness.errors import ScenarioError

WEIGHT_SYNC = "weight_sync"
LOG_PROB_PARITY = "rollout_log_prob_parity"
#: the checks an ``invariants:`` key may name, in the order their items are collected
INVARIANTS = (WEIGHT_SYNC, LOG_PROB_PARITY)
#: bounds measured over ``log_probs.json``'s response tokens, with ``d = |rollout_log_prob - old_log_prob|``
LOG_PROB_BOUNDS = ("max_abs", "mean_abs", "token_mult_prob_error", "token_mult_prob_error_median")
#: metrics.jsonl keys a bound may name (verl's ``calculate_debug_metrics``, rollout-IS ``mismatch/*``)
METRIC_PREFIXES = ("training/rollout_probs_diff_", "mismatch/")


@dataclass(frozen=True)
class Bound:
    """``low <= measured <= high`` for one quantity (None: that side is open)."""

    name: str
    low: float | None
    high: float | None

    def holds(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def describe(self, value: float) -> str:
        """``max_abs 3.1e-03 <= 0.01``, or with ``>`` / ``<`` when the bound is broken."""
        if self.high is not None and not value <= self.high:
            return f"{self.name} {value:.6g} > {self.high:g}"
        if self.low is not None and not value >= self.low:
            return f"{self.name} {value:.6g} < {self.low:g}"
        sides = [
            f">= {self.low:g}" if self.low is not None else "",
            f"<= {self.high:g}" if self.high is not None else "",
        ]
        return f"{self.name} {value:.6g} {' and '.join(s for s in sides if s)}"


@dataclass(frozen=True)
class Invariants:
    """A scenario's ``invariants:`` (:func:`parse`): which checks run, and the parity mode or bounds."""

    weight_sync: bool = False
    parity: str | None = None  #: "exact", "bounded", or None (not checked)
    bounds: tuple[Bound, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The checks that run, in :data:`INVARIANTS` order."""
        on = {WEIGHT_SYNC: self.weight_sync, LOG_PROB_PARITY: self.parity is not None}
        return tuple(n for n in INVARIANTS if on[n])


def parse(
    raw: Any, *, source: Path | str, kind: str, records_rollout: bool, records_weight_sync: bool | None = None
) -> Invariants:
    """Validate a scenario's ``invariants:`` value (None: no checks).

    ``records_rollout`` (the kind's :attr:`~precision_harness.scenarios.base.ScenarioBase.records_rollout`):
    its runs write per-token rollout log-probs, so ``exact`` and the log-prob bounds apply; otherwise
    only ``metrics.jsonl`` bounds do. ``records_weight_sync`` (default: ``records_rollout``): its runs
    write per-parameter digests of each weight sync, so ``weight_sync`` applies. ``kind`` names the
    scenario's kind in messages.

    Raises:
        ScenarioError: one line naming ``source`` and the key: an unknown check, a mode other than
            ``exact`` or a mapping of bounds, an unknown bound, a bound that is not a number, or a
            check a ``kind`` (command, verl) scenario cannot run.
    """
    if raw is None:
        return Invariants()
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: invariants: expected a mapping of checks ({', '.join(INVARIANTS)})")
    for key in raw:
        if key not in INVARIANTS:
            raise ScenarioError(f"{source}: invariants.{key}: unknown check; expected one of {', '.join(INVARIANTS)}")
    digests = records_rollout if records_weight_sync is None else records_weight_sync
    weight_sync = _weight_sync(raw.get(WEIGHT_SYNC), source=source, kind=kind, records_digests=digests)
    if LOG_PROB_PARITY not in raw:
        return Invariants(weight_sync=weight_sync)
    value = raw[LOG_PROB_PARITY]
    key = f"invariants.{LOG_PROB_PARITY}"
    if value == "exact":
        if not records_rollout:
            raise ScenarioError(
                f"{source}: {key}: exact needs the per-token log-probs only the built-in loop writes; a {kind} "
                "scenario bounds its metrics.jsonl instead, e.g. {training/rollout_probs_diff_max: 1.0e-2}"
            )
        return Invariants(weight_sync=weight_sync, parity="exact")
    if not isinstance(value, dict) or not value:
        raise ScenarioError(
            f"{source}: {key}: expected exact or a mapping of bounds, e.g. "
            "{max_abs: 1.0e-2, token_mult_prob_error_median: 1.1}"
        )
    bounds = tuple(
        _bound(name, v, key=f"{key}.{name}", source=source, records_rollout=records_rollout)
        for name, v in value.items()
    )
    return Invariants(weight_sync=weight_sync, parity="bounded", bounds=bounds)


def _weight_sync(value: Any, *, source: Path | str, kind: str, records_digests: bool) -> bool:
    if value is None:
        return False
    if value != "exact":
        raise ScenarioError(f"{source}: invariants.{WEIGHT_SYNC}: expected exact, got {value!r}")
    if not records_digests:
        raise ScenarioError(
            f"{source}: invariants.{WEIGHT_SYNC}: a {kind} scenario's weight sync happens in its own code, which "
            "records no per-parameter digests; weight_sync runs on built-in scenarios and verl scenarios on cpu"
        )
    return True


def _bound(name: Any, value: Any, *, key: str, source: Path | str, records_rollout: bool) -> Bound:
    is_metric = isinstance(name, str) and name.startswith(METRIC_PREFIXES)
    if not is_metric and (name not in LOG_PROB_BOUNDS or not records_rollout):
        allowed = ", ".join((*LOG_PROB_BOUNDS, "mismatch/<metric>", "training/rollout_probs_diff_<max|mean|std>"))
        if not records_rollout:
            allowed = "mismatch/<metric>, training/rollout_probs_diff_<max|mean|std> (metrics.jsonl)"
        raise ScenarioError(f"{source}: {key}: unknown bound; expected one of {allowed}")
    if isinstance(value, dict):
        unknown = [k for k in value if k not in ("min", "max")]
        if unknown or not value:
            raise ScenarioError(f"{source}: {key}: expected a number or {{min: ..., max: ...}}, got {value!r}")
        return Bound(
            name,
            _number(value.get("min"), key=f"{key}.min", source=source),
            _number(value.get("max"), key=f"{key}.max", source=source),
        )
    return Bound(name, None, _number(value, key=key, source=source, required=True))


def _number(value: Any, *, key: str, source: Path | str, required: bool = False) -> float | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        hint = " (YAML reads 1e-2 as text: write 1.0e-2)" if isinstance(value, str) else ""
        raise ScenarioError(f"{source}: {key}: expected a finite number, got {value!r}{hint}")
    return float(value)
