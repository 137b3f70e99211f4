"""A verl scenario's ``verl.fresh_steps``: steps past the pinned ones, where the rollout engine samples.

docs/consistency.md, "Fresh steps", says what a user sees.

With rollouts pinned, a check loads the golden's rollouts for the profiled steps and the rollout engine samples
nothing. ``verl.fresh_steps: N`` runs ``N`` more steps after the last profiled one, outside verl's rollout cache
(``skip.rollout_tq.steps`` lists the pinned steps only, and verl 0.9.1's ``SkipManager`` hands every other step to
the real rollout). Their sampled tokens have no golden, so nothing of them is compared with one. What is gated is the
rollout-training mismatch verl logs there (:data:`MISMATCH_METRICS`), against the bounds ``precision-harness
calibrate`` measured on the recording host (:mod:`precision_harness.check.tolerance.fresh_bounds`): one item per
fresh step, :data:`FRESH_CHECK`.

What every layer shares: the item's name, the metrics, the run's file and the scenario key's checks. Imports neither
torch nor verl.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from precision_harness.errors import ScenarioError

#: the item of one fresh step: ``fresh_rollout_mismatch[step_<n>]``
FRESH_CHECK = "fresh_rollout_mismatch"
#: the run's file of the fresh steps' ``metrics.jsonl`` rows, apart from the rows the golden compares
FRESH_METRICS = "fresh_metrics.jsonl"
KEY = "verl.fresh_steps"
#: verl's ``rollout.calculate_log_probs``: without it the server returns no log-probs and verl logs no mismatch
LOG_PROBS_KEY = "actor_rollout_ref.rollout.calculate_log_probs"

#: the mismatch metrics a fresh step is gated on, each larger when rollout and training agree less: verl 0.9.1's
#: ``calculate_debug_metrics`` (``verl/utils/debug/metrics.py``: ``|p_rollout - p_train|`` per response token, as
#: probabilities) and, where ``algorithm.rollout_correction`` is on, ``compute_offpolicy_metrics``
#: (``verl/trainer/ppo/rollout_corr_helper.py``: k3 KL, the mean |log PPL difference| per sequence, the chi-squared
#: divergence of the token and sequence IS ratios). Signed or two-sided ones (``kl``, ``ppl_ratio``, the Pearson
#: correlation) are not: a bound above them would not say "worse".
MISMATCH_METRICS = (
    "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_std",
    "rollout_corr/k3_kl",
    "rollout_corr/log_ppl_abs_diff",
    "rollout_corr/chi2_token",
    "rollout_corr/chi2_seq",
)


def mismatch_values(row: dict[str, Any]) -> dict[str, float]:
    """The :data:`MISMATCH_METRICS` of one ``metrics.jsonl`` row that hold a finite number, by name."""
    out = {}
    for name in MISMATCH_METRICS:
        value = row.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


def count(config: dict[str, Any]) -> int:
    """``verl.fresh_steps`` (0 where absent)."""
    return int((config.get("verl") or {}).get("fresh_steps") or 0)


def check(path: Path, config: dict[str, Any]) -> None:
    """``verl.fresh_steps`` needs pinned rollouts: without them every step samples afresh and is compared with the
    golden already.

    Raises:
        ScenarioError: one line naming ``path`` and the key.
    """
    if count(config) and not (config.get("verl") or {}).get("pin_rollouts"):
        raise ScenarioError(
            f"{path}: {KEY}: fresh steps follow the pinned ones, and verl.pin_rollouts is false (every step samples "
            "and is compared with the golden); set verl.pin_rollouts: true or remove verl.fresh_steps"
        )


def check_log_probs(path: Path, overrides: dict[str, Any]) -> None:
    """Fresh steps are gated on the mismatch verl logs from the rollout's log-probs, which its server returns only
    with ``calculate_log_probs: true``: in the run's overrides, the scenario's and those the gate adds on the device
    (on the CPU the gate's server always returns them).

    Raises:
        ScenarioError: one line naming ``path`` and the key.
    """
    if overrides.get(LOG_PROBS_KEY) is not True:
        raise ScenarioError(
            f"{path}: {KEY}: a fresh step is gated on the rollout-training mismatch verl logs from the rollout's "
            f"log-probs, which it returns only with {LOG_PROBS_KEY}: true; set it in verl.overrides"
        )
