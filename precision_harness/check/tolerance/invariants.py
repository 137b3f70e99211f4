"""Invariant checks over a scenario run's files: properties every correct PPO run has, no golden needed.

Each check reads plain JSON written by the worker (msprobe ``dump.json``, ``metrics.jsonl``,
``step_<n>/log_probs.json``) and raises :class:`InvariantViolation` (an ``AssertionError``) with
one line saying what broke, where, and by how much. This module imports neither torch nor msprobe,
so ``precision_tests/`` can use it from the pytest process.

The checks:

* :func:`check_same_weights` -- at step 1 ``actor_compute_log_prob`` and ``ref_compute_log_prob``
  run the same weights (the reference is a frozen copy of the initial actor): every API both stages
  call equally often has bit-identical statistics.
* :func:`check_on_policy` -- the first PPO mini-batch of ``actor_update`` recomputes exactly the
  ``old_log_prob`` of ``actor_compute_log_prob``, whatever the two micro-batch sizes (the ratio
  ``exp(log_prob - old_log_prob)`` is 1 before the first optimizer step; verl issue #2996).
* :func:`check_micro_batch_invariance` -- ``actor_compute_log_prob`` of two runs that differ only in
  ``log_prob_micro_batch_size_per_gpu`` agree within the fp32 tolerance of ``torch.testing.assert_close``.
* :func:`check_mismatch_health` -- the rollout/training mismatch stays in verl PR #3694's healthy
  ranges (``mismatch/rollout_is_eff_sample_size``, ``_veto_fraction``, ``_mean``; the PR's
  "Monitor metrics").
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from precision_harness.check.tolerance.policy import DTYPE_DEFAULTS, Tol
from precision_harness.dumps.files import load_dump, read_metrics
from precision_harness.dumps.rows import tensors
from precision_harness.dumps.statistics import STATISTICS
from precision_harness.runs.kind_runners import load_scenario
from precision_harness.scenarios.scenario import Scenario

__all__ = [
    "HEALTH_RANGES",
    "InvariantViolation",
    "applies_mismatch_health",
    "applies_same_weights",
    "check_micro_batch_invariance",
    "check_mismatch_health",
    "check_on_policy",
    "check_same_weights",
    "dump_of",
    "load_suite",
    "log_probs_of",
    "metrics_of",
]

#: verl PR #3694's "Monitor metrics" ranges: ESS > 80 % of the batch, veto < 5 %, mean weight ~ 1.0
#: (taken as within 10 %). ``(low, high)``, inclusive; None = unbounded.
HEALTH_RANGES: dict[str, tuple[float | None, float | None]] = {
    "mismatch/rollout_is_eff_sample_size": (0.8, None),
    "mismatch/rollout_is_veto_fraction": (None, 0.05),
    "mismatch/rollout_is_mean": (0.9, 1.1),
}

#: The families a forward pass of the model always runs: a same-weights check that compared none
#: of them would prove nothing.
_MODEL_FAMILIES = ("Functional.linear.forward", "Functional.embedding.forward")
_API_RE = re.compile(r"^(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")


class InvariantViolation(AssertionError):
    """A run breaks an invariant; ``str()`` is the one-line explanation."""


# ------------------------------------------------------------------------- which scenarios
def load_suite(directory: Path) -> list[Scenario]:
    """Every ``*.yaml`` scenario of ``directory``, loaded and validated (YAML + schema, no torch)."""
    return [load_scenario(p) for p in sorted(Path(directory).glob("*.yaml"))]


def applies_same_weights(scenario: Scenario) -> bool:
    """:func:`check_same_weights` applies: a reference runs, both log-prob stages are dumped at step 1
    with the same micro-batch size (the reference is a frozen copy of the initial actor)."""
    ar = scenario.config["actor_rollout_ref"]
    return (
        scenario.use_reference
        and 1 in scenario.steps
        and {"actor_compute_log_prob", "ref_compute_log_prob"} <= set(scenario.stages)
        and ar["rollout"]["log_prob_micro_batch_size_per_gpu"] == ar["ref"]["log_prob_micro_batch_size_per_gpu"]
    )


def applies_mismatch_health(scenario: Scenario) -> bool:
    """:func:`check_mismatch_health` applies: rollout IS is on (``rollout_is_threshold`` set) and the
    rollout engine runs another dtype than training (e.g. bf16 rollout, fp32 actor): a real mismatch."""
    ar = scenario.config["actor_rollout_ref"]
    return (
        scenario.config["algorithm"]["rollout_is_threshold"] is not None
        and ar["rollout"]["dtype"] != ar["actor"]["dtype"]
    )


# ----------------------------------------------------------------------------------- reading
def dump_of(run_dir: Path, step: int, stage: str, rank: str = "rank0") -> dict[str, Any]:
    """The parsed ``step_<step>/<stage>/step0/<rank>/dump.json`` of a run directory."""
    return load_dump(Path(run_dir) / f"step_{step}" / stage / "step0" / rank / "dump.json")


def log_probs_of(run_dir: Path, step: int) -> dict[str, Any]:
    """The parsed ``step_<step>/log_probs.json`` (see ``Trainer._write_log_probs`` for its keys)."""
    path = Path(run_dir) / f"step_{step}" / "log_probs.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvariantViolation(
            f"{path}: unreadable log_probs.json ({exc}); the worker writes it every step"
        ) from None


def metrics_of(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl``, one per step."""
    return read_metrics(Path(run_dir) / "metrics.jsonl")


# ---------------------------------------------------------------------------- same weights
def _families(dump: Mapping[str, Any]) -> dict[str, list[tuple[str, Any]]]:
    """``{"Functional.linear.forward": [(full name, entry), ...]}`` in execution order."""
    out: dict[str, list[tuple[str, Any]]] = defaultdict(list)
    for name, entry in dump["data"].items():
        m = _API_RE.match(name)
        out[f"{m['api']}.{m['dir']}" if m else name].append((name, entry))
    return out


def check_same_weights(actor_dump: Mapping[str, Any], ref_dump: Mapping[str, Any], *, where: str = "") -> int:
    """Raise unless two log-prob stages ran bit-identical computations on identical weights.

    Both dumps are msprobe L1 statistics of a ``compute_log_prob`` stage with the same micro-batch
    size. The actor's stage also computes the entropy (extra softmax/logsumexp/sum/sub/mul calls),
    so API families (name without the call counter) that the two stages call a different number of
    times are skipped, provided the actor calls them more often; every other call is compared tensor
    by tensor: dtype, shape and Max/Min/Mean/Norm must be equal (``requires_grad`` is not compared:
    the reference is frozen). The model's own families (linear, embedding) must be among those compared.

    Returns:
        The number of statistics compared.

    Raises:
        InvariantViolation: a statistic, dtype or shape differs; the reference calls an API more often
            than the actor; or no linear/embedding call could be compared.
    """
    fa, fr = _families(actor_dump), _families(ref_dump)
    prefix = f"{where}: " if where else ""
    extra = sorted(f for f in fr if len(fr[f]) > len(fa.get(f, [])))
    if extra:
        raise InvariantViolation(
            f"{prefix}ref_compute_log_prob calls {extra[0]} {len(fr[extra[0]])} times, actor_compute_log_prob "
            f"{len(fa.get(extra[0], []))}: the two stages do not run the same computation"
        )
    compared = [f for f in fa if len(fa[f]) == len(fr.get(f, []))]
    missing = [f for f in _MODEL_FAMILIES if f not in compared]
    if missing:
        raise InvariantViolation(
            f"{prefix}no {missing[0]} call to compare between the actor's and the reference's log-prob stages"
        )
    checked, diffs = 0, []
    for family in compared:
        for (name, a_entry), (_, r_entry) in zip(fa[family], fr[family], strict=False):
            a_t, r_t = dict(tensors(a_entry)), dict(tensors(r_entry))
            for path in sorted(set(a_t) | set(r_t)):
                a, r = a_t.get(path), r_t.get(path)
                if a is None or r is None or a["dtype"] != r["dtype"] or a["shape"] != r["shape"]:
                    ours = None if a is None else (a["dtype"], a["shape"])
                    ref = None if r is None else (r["dtype"], r["shape"])
                    diffs.append(f"{name}.{path} dtype/shape {ours} vs {ref}")
                    continue
                for stat in STATISTICS:
                    checked += 1
                    if a.get(stat) != r.get(stat) and not _both_nan(a.get(stat), r.get(stat)):
                        diffs.append(f"{name}.{path} {stat} {a.get(stat)!r} (actor) vs {r.get(stat)!r} (ref)")
    if diffs:
        raise InvariantViolation(
            f"{prefix}actor and reference log-prob stages differ in {len(diffs)} of {checked} statistics "
            f"(identical weights give identical statistics); first: {diffs[0]}"
        )
    return checked


def _both_nan(a: Any, b: Any) -> bool:
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)


# -------------------------------------------------------------------------------- log-probs
def _max_diff(
    a: list[list[float]], b: list[list[float]], mask: list[list[float]], tol: Tol | None
) -> tuple[int, int, float, tuple[int, int]]:
    """(tokens compared, tokens beyond ``tol`` (any difference if None), max |a - b|, its (row, token))."""
    count = bad = 0
    worst, at = 0.0, (0, 0)
    for i, (ra, rb, rm) in enumerate(zip(a, b, mask, strict=False)):
        for j, (x, y, m) in enumerate(zip(ra, rb, rm, strict=False)):
            if not m:
                continue
            count += 1
            d = abs(x - y)
            if (d > tol.atol + tol.rtol * abs(y)) if tol is not None else d != 0.0:
                bad += 1
            if d > worst:
                worst, at = d, (i, j)
    return count, bad, worst, at


def check_on_policy(log_probs: Mapping[str, Any], *, where: str = "") -> int:
    """Raise unless ``actor_update``'s first mini-batch recomputed ``old_log_prob`` bit for bit.

    ``log_probs`` is a ``step_<n>/log_probs.json``: ``actor_update_first_mini_batch`` ``(m, R)``
    must equal the first ``m`` rows of ``old_log_probs`` ``(B, R)`` on every response token, whatever
    ``micro_batch_sizes`` says (verl issue #2996: ``pg_clipfrac`` > 0 on an on-policy step).

    Returns:
        The number of tokens compared.
    """
    first = log_probs["actor_update_first_mini_batch"]
    mask = log_probs["response_mask"][: len(first)]
    count, bad, worst, (i, j) = _max_diff(first, log_probs["old_log_probs"][: len(first)], mask, None)
    if count == 0:
        raise InvariantViolation(f"{where}: no response token in actor_update's first mini-batch to compare")
    if bad:
        mbs = log_probs.get("micro_batch_sizes", {})
        raise InvariantViolation(
            f"{where}: actor_update's first mini-batch recomputes log-probs that differ from old_log_prob at {bad} of "
            f"{count} tokens (max |diff| {worst:.3g} at row {i}, token {j}; micro-batches: actor_compute_log_prob "
            f"{mbs.get('actor_compute_log_prob')}, actor_update {mbs.get('actor_update')}): "
            "the on-policy PPO ratio is not 1"
        )
    return count


def check_micro_batch_invariance(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    key: str = "old_log_probs",
    tol: Tol = DTYPE_DEFAULTS["float32"],
    where: str = "",
) -> int:
    """Raise unless ``a[key]`` and ``b[key]`` agree within ``tol`` on every response token.

    ``a`` and ``b`` are the ``log_probs.json`` of the same step of two runs that differ only in
    micro-batch size; the check is ``|a - b| <= atol + rtol * |b|`` (``torch.testing.assert_close``'s
    fp32 defaults: rtol 1.3e-6, atol 1e-5).

    Raises:
        InvariantViolation: the response masks differ (the runs sampled different tokens) or a token
            is beyond tolerance.
    """
    if a.get("responses") != b.get("responses") or a["response_mask"] != b["response_mask"]:
        raise InvariantViolation(
            f"{where}: the two runs sampled different responses; compare runs that differ only in micro-batch size"
        )
    mbs_a, mbs_b = a.get("micro_batch_sizes", {}), b.get("micro_batch_sizes", {})
    count, bad, worst, (i, j) = _max_diff(a[key], b[key], a["response_mask"], tol)
    if bad:
        raise InvariantViolation(
            f"{where}: {key} of actor_compute_log_prob differs between micro-batch sizes "
            f"{mbs_a.get('actor_compute_log_prob')} and {mbs_b.get('actor_compute_log_prob')} at {bad} of {count} "
            f"tokens beyond {tol} (max |diff| {worst:.3g} at row {i}, token {j})"
        )
    return count


# -------------------------------------------------------------------------------- mismatch
def check_mismatch_health(
    rows: Iterable[Mapping[str, Any]],
    *,
    ranges: Mapping[str, tuple[float | None, float | None]] = HEALTH_RANGES,
    where: str = "",
) -> int:
    """Raise unless every step's rollout IS health metrics lie in ``ranges`` (default :data:`HEALTH_RANGES`).

    Returns:
        The number of values checked.

    Raises:
        InvariantViolation: a metric is missing (rollout IS off: ``algorithm.rollout_is_threshold`` is
            null) or out of range; the message names the step, metric, value and range.
    """
    checked, problems = 0, []
    for index, row in enumerate(rows, 1):
        step = row.get("training/global_step", index)
        for name, (low, high) in ranges.items():
            value = row.get(name)
            if value is None:
                problems.append(f"step {step}: {name} missing (is algorithm.rollout_is_threshold set?)")
                continue
            checked += 1
            if (low is not None and not value >= low) or (high is not None and not value <= high):
                bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
                problems.append(f"step {step}: {name} = {value:.6g} outside {bounds}")
    if problems:
        raise InvariantViolation(
            f"{where}: rollout/training mismatch unhealthy: {problems[0]}"
            + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        )
    if not checked:
        raise InvariantViolation(f"{where}: no metrics rows to check")
    return checked
