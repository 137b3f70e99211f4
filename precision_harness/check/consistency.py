"""Training against rollout: a scenario's ``invariants:`` and their per-step verdicts, no golden needed.

Two checks, each an item per training step (docs/consistency.md):

* ``weight_sync: exact`` -- the rollout model holds exactly the actor's weights cast to the rollout
  dtype after each sync: per parameter, by name, the sha256 the worker recorded in
  ``step_<n>/weight_sync.json`` (:mod:`precision_harness.runs.runner.weight_sync`). A mismatch names the
  first parameter that differs. Built-in scenarios only.
* ``rollout_log_prob_parity`` -- ``exact``: ``rollout_log_probs == old_log_prob`` bit for bit on every
  response token of ``step_<n>/log_probs.json`` (built-in only; a mismatch names the first token).
  A mapping of bounds, e.g. ``{max_abs: 1.0e-2, token_mult_prob_error_median: 1.1}``: each measured
  value must be at most its bound (a ``{min: ..., max: ...}`` mapping bounds both sides). Bounds on
  ``log_probs.json`` are :data:`LOG_PROB_BOUNDS`; any ``mismatch/...`` or
  ``training/rollout_probs_diff_...`` key bounds that metric's value in ``metrics.jsonl``, which is
  what a command or verl scenario has (verl's ``calculate_debug_metrics`` and rollout-IS metrics).

This module imports neither torch nor msprobe: the pytest process runs it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precision_harness.dumps.files import read_metrics
from precision_harness.errors import ScenarioError

if TYPE_CHECKING:  # scenario.py parses ``invariants:`` with this module
    from precision_harness.scenarios.scenario import Scenario

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


def parse(raw: Any, *, source: Path | str, kind: str, records_rollout: bool) -> Invariants:
    """Validate a scenario's ``invariants:`` value (None: no checks).

    ``records_rollout`` (the scenario kind's :attr:`~precision_harness.scenarios.scenario.Scenario.records_rollout`):
    its runs write per-token rollout log-probs and per-parameter weight digests, so ``exact``,
    ``weight_sync`` and the log-prob bounds apply; otherwise only ``metrics.jsonl`` bounds do.
    ``kind`` names the scenario's kind in messages.

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
    weight_sync = _weight_sync(raw.get(WEIGHT_SYNC), source=source, kind=kind, records_rollout=records_rollout)
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


def _weight_sync(value: Any, *, source: Path | str, kind: str, records_rollout: bool) -> bool:
    if value is None:
        return False
    if value != "exact":
        raise ScenarioError(f"{source}: invariants.{WEIGHT_SYNC}: expected exact, got {value!r}")
    if not records_rollout:
        raise ScenarioError(
            f"{source}: invariants.{WEIGHT_SYNC}: a {kind} scenario's weight sync happens inside verl, which "
            "records no per-parameter digests; weight_sync runs on built-in scenarios"
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


# ------------------------------------------------------------------------------------ verdicts
@dataclass(frozen=True)
class Verdict:
    """One invariant item's result: passed or not, and its one-line text."""

    passed: bool
    text: str


def log_prob_mode(config: dict[str, Any]) -> str:
    """A scenario config's ``actor_rollout_ref.rollout.log_prob_mode`` (``sample`` when unset)."""
    return config.get("actor_rollout_ref", {}).get("rollout", {}).get("log_prob_mode", "sample")


def run_verdicts(scenario: Scenario, run_dir: Path) -> Iterator[tuple[int, str, Verdict]]:
    """``(step, check, verdict)`` of each of ``scenario``'s invariant items over its run in ``run_dir``
    (:attr:`~precision_harness.scenarios.scenario.Scenario.invariant_items`; what ``precision-harness run``
    and ``compare --scenario`` report, item by item as the gate's ``InvariantItem`` does)."""
    mode = log_prob_mode(scenario.config)
    for step, name in scenario.invariant_items:
        yield step, name, check(run_dir, step, name, scenario.invariants, log_prob_mode=mode)


def check(run_dir: Path, step: int, name: str, invariants: Invariants, *, log_prob_mode: str = "sample") -> Verdict:
    """The verdict of invariant ``name`` at ``step`` of the run in ``run_dir``.

    Raises:
        ValueError: ``name`` is not one of :data:`INVARIANTS`.
    """
    where = f"{name} @ step_{step}"
    if name == WEIGHT_SYNC:
        return _check_weight_sync(run_dir, step, where)
    if name != LOG_PROB_PARITY:
        raise ValueError(f"unknown invariant {name!r}")
    if invariants.parity == "exact":
        return _check_exact(run_dir, step, where, log_prob_mode)
    return _check_bounds(run_dir, step, where, invariants.bounds)


def _read_json(path: Path, where: str) -> Any | Verdict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Verdict(False, f"{where}: the run wrote no {path.parent.name}/{path.name}")
    except (OSError, ValueError) as exc:
        return Verdict(False, f"{where}: cannot read {path}: {exc}")


def _check_weight_sync(run_dir: Path, step: int, where: str) -> Verdict:
    record = _read_json(Path(run_dir) / f"step_{step}" / "weight_sync.json", where)
    if isinstance(record, Verdict):
        return record
    params, dtype = record["parameters"], record["rollout_dtype"]
    bad = [p for p in params if p["actor"] is None or p["rollout"] is None or p["actor"] != p["rollout"]]
    if not bad:
        return Verdict(True, f"{where}: {len(params)} parameters bit-identical to the actor's cast to {dtype} (sha256)")
    first = bad[0]
    if first["rollout"] is None:
        why = "the rollout model has no such parameter"
    elif first["actor"] is None:
        why = "the actor has no such parameter"
    elif first["rollout_tensor_dtype"] != dtype:
        why = f"the rollout holds it in {first['rollout_tensor_dtype']}, not {dtype}"
    else:
        why = f"the rollout holds other values than the actor's cast to {dtype}"
    digests = f"sha256 {str(first['rollout'])[:8]} != {str(first['actor'])[:8]}"
    return Verdict(
        False, f"{where}: {first['name']}: {why} ({digests}; first of {len(bad)} of {len(params)} parameters)"
    )


def _response_tokens(log_probs: dict[str, Any]) -> list[tuple[int, int, float, float]]:
    """``(sample, position, rollout_log_prob, old_log_prob)`` of every response token, row-major."""
    out = []
    rows = zip(log_probs["response_mask"], log_probs["rollout_log_probs"], log_probs["old_log_probs"], strict=True)
    for i, (mask, rollout, old) in enumerate(rows):
        out.extend((i, t, rollout[t], old[t]) for t, m in enumerate(mask) if m)
    return out


def _check_exact(run_dir: Path, step: int, where: str, mode: str) -> Verdict:
    log_probs = _read_json(Path(run_dir) / f"step_{step}" / "log_probs.json", where)
    if isinstance(log_probs, Verdict):
        return log_probs
    tokens = _response_tokens(log_probs)
    differ = [tok for tok in tokens if tok[2] != tok[3]]
    if not differ:
        return Verdict(
            True,
            f"{where}: rollout_log_probs == old_log_prob bit for bit on {len(tokens)} tokens (log_prob_mode: {mode})",
        )
    i, t, rollout, old = differ[0]
    return Verdict(
        False,
        f"{where}: sample {i} position {t}: rollout_log_prob {rollout!r} != old_log_prob {old!r} "
        f"(first of {len(differ)} of {len(tokens)} tokens; log_prob_mode: {mode})",
    )


def log_prob_measures(log_probs: dict[str, Any]) -> dict[str, float]:
    """:data:`LOG_PROB_BOUNDS` over the response tokens of a ``log_probs.json``.

    With ``d = |rollout_log_prob - old_log_prob|`` per token: ``max_abs``, ``mean_abs``,
    ``token_mult_prob_error`` = mean over tokens of ``exp(d)`` (NeMo-RL's multiplicative probability
    error, docs/adding-new-models.md), ``token_mult_prob_error_median`` = the median over sequences
    of each sequence's mean ``exp(d)`` (one long bad sequence does not hide among many good ones).

    Raises:
        ValueError: the step has no response token.
    """
    tokens = _response_tokens(log_probs)
    if not tokens:
        raise ValueError("no response token")
    diffs = [abs(r - o) for _, _, r, o in tokens]
    per_seq: dict[int, list[float]] = {}
    for (i, _, _, _), d in zip(tokens, diffs, strict=True):
        per_seq.setdefault(i, []).append(math.exp(d))
    return {
        "max_abs": max(diffs),
        "mean_abs": sum(diffs) / len(diffs),
        "token_mult_prob_error": sum(math.exp(d) for d in diffs) / len(diffs),
        "token_mult_prob_error_median": statistics.median(sum(v) / len(v) for v in per_seq.values()),
    }


def _metrics_row(rows: list[dict[str, Any]], step: int) -> dict[str, Any] | None:
    for row in rows:
        if row.get("training/global_step", row.get("step")) == step:
            return row
    return rows[step - 1] if 0 < step <= len(rows) else None


def _check_bounds(run_dir: Path, step: int, where: str, bounds: tuple[Bound, ...]) -> Verdict:
    run_dir = Path(run_dir)
    measured: dict[str, float] = {}
    sources: list[Callable[[], dict[str, float] | Verdict]] = []
    if any(b.name in LOG_PROB_BOUNDS for b in bounds):
        sources.append(lambda: _log_prob_source(run_dir, step, where))
    if any(b.name not in LOG_PROB_BOUNDS for b in bounds):
        sources.append(lambda: _metrics_source(run_dir, step, where))
    for source in sources:
        got = source()
        if isinstance(got, Verdict):
            return got
        measured.update(got)
    missing = [b.name for b in bounds if not isinstance(measured.get(b.name), (int, float))]
    if missing:
        return Verdict(False, f"{where}: metrics.jsonl has no number for {missing[0]} at this step")
    broken = [b for b in bounds if not b.holds(measured[b.name])]
    shown = ", ".join(b.describe(measured[b.name]) for b in (broken or bounds))
    return Verdict(not broken, f"{where}: {shown}")


def _log_prob_source(run_dir: Path, step: int, where: str) -> dict[str, float] | Verdict:
    log_probs = _read_json(run_dir / f"step_{step}" / "log_probs.json", where)
    if isinstance(log_probs, Verdict):
        return log_probs
    try:
        return log_prob_measures(log_probs)
    except ValueError as exc:
        return Verdict(False, f"{where}: {exc}")


def _metrics_source(run_dir: Path, step: int, where: str) -> dict[str, float] | Verdict:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return Verdict(False, f"{where}: the run wrote no metrics.jsonl")
    row = _metrics_row(read_metrics(path), step)
    if row is None:
        return Verdict(False, f"{where}: metrics.jsonl has no row for step {step}")
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
