"""Training against rollout: a scenario's ``invariants:`` and their per-step verdicts, no golden needed.

Two checks, each an item per training step (docs/consistency.md):

* ``weight_sync: exact`` -- the rollout model holds exactly the actor's weights cast to the rollout
  dtype after each sync: per parameter, by name, the sha256 the worker recorded in
  ``step_<n>/weight_sync.json`` (:mod:`precision_harness.runs.numerics.weight_sync`). A mismatch names the
  first parameter that differs. Built-in scenarios only.
* ``rollout_log_prob_parity`` -- ``exact``: ``rollout_log_probs == old_log_prob`` bit for bit on every
  response token of ``step_<n>/log_probs.json`` (built-in only; a mismatch names the first token).
  A mapping of bounds, e.g. ``{max_abs: 1.0e-2, token_mult_prob_error_median: 1.1}``: each measured
  value must be at most its bound (a ``{min: ..., max: ...}`` mapping bounds both sides). Bounds on
  ``log_probs.json`` are
  :data:`~precision_harness.scenarios.invariant_declarations.LOG_PROB_BOUNDS`; any ``mismatch/...`` or
  ``training/rollout_probs_diff_...`` key bounds that metric's value in ``metrics.jsonl``, which is
  what a command or verl scenario has (verl's ``calculate_debug_metrics`` and rollout-IS metrics).

What a scenario may declare, and its parsing, is :mod:`precision_harness.scenarios.invariant_declarations`;
this module gives each declared check its verdict. It imports neither torch nor msprobe: the pytest
process runs it.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_harness.dumps.files import read_metrics
from precision_harness.scenarios.invariant_declarations import (
    LOG_PROB_BOUNDS,
    LOG_PROB_PARITY,
    WEIGHT_SYNC,
    Bound,
    Invariants,
)
from precision_harness.scenarios.scenario import Scenario


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
        ValueError: ``name`` is not one of
            :data:`~precision_harness.scenarios.invariant_declarations.INVARIANTS`.
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
    if not params:  # nothing compared is a finding, not a pass
        return Verdict(
            False,
            f"{where}: weight_sync.json lists 0 parameters: no weight was compared; the sync ran on a model without "
            "parameters, or recorded none (runs/numerics/weight_sync.py)",
        )
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
    if not tokens:  # nothing compared is a finding, not a pass (as the bounds mode's "no response token")
        return Verdict(
            False,
            f"{where}: log_probs.json has no response token (every response_mask entry is 0): no log-prob was "
            "compared; the rollout generated empty responses (check data.max_response_length and the rollout)",
        )
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
