"""Rollout importance sampling (IS): correct the rollout/training policy mismatch.

Spec: the verl PR "Rollout Importance Sampling Framework" (seed
``/work/shared/seeds/003_ee7923dfcebf6870.txt``; implementation
``verl/trainer/ppo/mismatch_helper.py`` of that PR, functions
``compute_rollout_importance_weights``, ``compute_is_metrics`` and
``compute_mismatch_metrics``). Background: Liu, Li et al. 2025, "When Speed Kills Stability:
Demystifying RL Collapse from the Inference-Training Mismatch".

The rollout engine (e.g. vLLM in bf16) samples with ``pi_rollout`` while the trainer computes
``pi_train`` (``old_log_prob``); the per-token IS ratio is
``rho_t = pi_train / pi_rollout = exp(old_log_prob - rollout_log_prob)``. Everything is computed
in log space; every ``exp`` argument is clamped to ``[-20, 20]`` (``SAFETY_BOUND``).

verl 0.9.1 later renamed this module to ``verl.trainer.ppo.rollout_corr_helper``
(``compute_rollout_correction_and_rejection_mask``: levels token|sequence, TIS or
"lower_upper" IcePop thresholds, ``rollout_corr/`` prefix, no veto, no geometric level).
The IS *weights* of the shared cases (token/sequence x truncate/clip) are identical; some
*metrics* are computed differently there (see ``tests/test_verl_parity.py``). This module
keeps the PR's semantics and metric names.
"""

from __future__ import annotations

from typing import Any

import torch

from precision_harness.runner.algorithms import masked_mean, masked_sum

__all__ = [
    "IS_LEVELS",
    "IS_MODES",
    "SAFETY_BOUND",
    "compute_mismatch_metrics",
    "compute_rollout_importance_weights",
]

IS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")
IS_MODES: tuple[str, ...] = ("truncate", "clip")

# exp(20) ~ 4.85e8: bound on any log-ratio before exponentiation.
SAFETY_BOUND = 20.0

_PREFIX = "mismatch/"


def _to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.item())
    return float(value)


def compute_rollout_importance_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_level: str = "token",
    rollout_is_mode: str = "truncate",
    rollout_is_threshold: float | None = 2.0,
    rollout_is_threshold_lower: float | None = None,
    rollout_is_veto_threshold: float | None = None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """IS weights ``pi_train / pi_rollout`` with bounding, veto, and diagnostics.

    Levels (``rollout_is_level``), with ``lr_t = old_log_prob - rollout_log_prob``:

    * ``"token"``: ``w_t = exp(clamp(lr_t, -20, 20))`` (biased, low variance).
    * ``"sequence"``: ``w = exp(clamp(sum_t mask * lr_t, -20, 20))`` broadcast over the row.
    * ``"geometric"``: ``w = exp(clamp(masked_mean_t(lr_t), -20, 20))`` broadcast over the row.

    Modes (``rollout_is_mode``):

    * ``"truncate"`` (TIS): ``w = min(w, upper)``.
    * ``"clip"`` (CIS): ``w = 0`` where ``w < lower`` or ``w > upper``; kept as is otherwise.

    ``lower`` defaults to ``1 / upper``. Veto: if ``rollout_is_veto_threshold`` is set, any
    sequence containing a valid token with ``rho_t < veto`` (tested in log space) gets weight 0
    on every token, in both modes. Finally weights are multiplied by ``response_mask`` and
    detached. The IS metrics are computed on the weights *before* truncation/clipping (so
    ``rollout_is_max`` shows the true maximum), as in the PR.

    Args:
        old_log_prob: ``(bs, response_length)``, log-probs of the training policy (nats).
        rollout_log_prob: ``(bs, response_length)``, log-probs reported by the rollout engine.
        response_mask: ``(bs, response_length)``, 1 for response tokens.
        rollout_is_level: ``"token"``, ``"sequence"`` or ``"geometric"``.
        rollout_is_mode: ``"truncate"`` or ``"clip"``.
        rollout_is_threshold: upper bound; ``None`` disables IS entirely (returns ``(None, {})``).
        rollout_is_threshold_lower: lower bound (clip mode; also floors the std/ESS metrics).
        rollout_is_veto_threshold: per-token catastrophic-ratio threshold, ``None`` = no veto.

    Returns:
        ``(weights, metrics)``: ``weights`` is ``(bs, response_length)``, detached, zero on
        padding. ``metrics`` maps ``"mismatch/<name>"`` to python floats: the IS metrics
        (``rollout_is_mean``, ``rollout_is_std``, ``rollout_is_max``, ``rollout_is_min``,
        ``rollout_is_eff_sample_size``, ``rollout_is_veto_fraction``,
        ``rollout_is_catastrophic_token_fraction``, ``rollout_is_ratio_fraction_high/low``,
        ``rollout_is_p25/p50/p75/p95/p99``, ``rollout_is_seq_mean/std/max/min``,
        ``rollout_is_seq_max_deviation``, ``rollout_is_seq_fraction_high/low``, in clip mode
        ``rollout_is_clipped_fraction`` and ``rollout_is_seq_clipped_fraction``, and the
        thresholds ``rollout_is_threshold_upper/lower``) plus
        :func:`compute_mismatch_metrics`.

    Raises:
        ValueError: unknown level or mode.

    Source: ``verl.trainer.ppo.mismatch_helper.compute_rollout_importance_weights`` of the
    seed PR (the PR's trainer adds the ``mismatch/`` prefix and merges the mismatch metrics;
    the PR's non-numeric config entries ``rollout_is_level/mode/veto_threshold`` are omitted
    so that every value is a float).
    """
    if rollout_is_threshold is None:
        return None, {}
    if rollout_is_level not in IS_LEVELS:
        raise ValueError(f"Invalid rollout_is_level: {rollout_is_level}. Must be 'token', 'sequence', or 'geometric'.")
    if rollout_is_mode not in IS_MODES:
        raise ValueError(f"Invalid rollout_is_mode: {rollout_is_mode}. Must be 'truncate' or 'clip'.")

    upper_threshold = float(rollout_is_threshold)
    lower_threshold = (
        float(rollout_is_threshold_lower) if rollout_is_threshold_lower is not None else 1.0 / upper_threshold
    )

    log_ratio = old_log_prob - rollout_log_prob
    device = old_log_prob.device
    log_threshold_upper = torch.log(torch.tensor(upper_threshold, device=device))
    log_threshold_lower = torch.log(torch.tensor(lower_threshold, device=device))

    # Step 1: raw weights; keep the unclamped log value for the metrics.
    if rollout_is_level == "token":
        log_ratio_for_metrics = log_ratio
        weights = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    elif rollout_is_level == "sequence":
        log_ratio_sum = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        log_ratio_for_metrics = log_ratio_sum
        weights = torch.exp(torch.clamp(log_ratio_sum, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(old_log_prob)
    else:  # geometric
        log_ratio_mean = masked_mean(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        log_ratio_for_metrics = log_ratio_mean
        weights = torch.exp(torch.clamp(log_ratio_mean, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(old_log_prob)

    # Step 1.5: per-token veto, in log space.
    if rollout_is_veto_threshold is not None:
        log_veto_threshold = torch.log(torch.tensor(rollout_is_veto_threshold, device=device))
        catastrophic_tokens = (log_ratio < log_veto_threshold) & response_mask.bool()
        has_catastrophic = catastrophic_tokens.any(dim=-1, keepdim=True)
        veto_mask = (~has_catastrophic).float()
    else:
        catastrophic_tokens = torch.zeros_like(response_mask, dtype=torch.bool)
        has_catastrophic = torch.zeros((old_log_prob.size(0), 1), dtype=torch.bool, device=device)
        veto_mask = torch.ones((old_log_prob.size(0), 1), dtype=torch.float32, device=device)

    # Step 2: metrics on the pre-bounding weights.
    metrics = _compute_is_metrics(
        rollout_is_weights=weights,
        log_ratio_for_metrics=log_ratio_for_metrics,
        response_mask=response_mask,
        rollout_is_level=rollout_is_level,
        rollout_is_threshold=upper_threshold,
        rollout_is_threshold_lower=lower_threshold,
        log_threshold_upper=log_threshold_upper,
        log_threshold_lower=log_threshold_lower,
        has_catastrophic=has_catastrophic,
        catastrophic_tokens=catastrophic_tokens,
    )

    # Step 3: bounding.
    if rollout_is_mode == "truncate":
        weights = weights.clamp(max=upper_threshold)
    else:  # clip
        clip_mask = ((weights >= lower_threshold) & (weights <= upper_threshold)).float()
        metrics["rollout_is_clipped_fraction"] = masked_mean(1 - clip_mask, response_mask)
        if rollout_is_level in ("sequence", "geometric"):
            seq_weights = weights[:, 0]
            seq_clipped = ((seq_weights < lower_threshold) | (seq_weights > upper_threshold)).float()
            metrics["rollout_is_seq_clipped_fraction"] = seq_clipped.mean()
        else:
            seq_has_clipped = masked_sum(1 - clip_mask, response_mask, axis=-1) > 0
            metrics["rollout_is_seq_clipped_fraction"] = seq_has_clipped.float().mean()
        weights = weights * clip_mask

    weights = weights * veto_mask  # zero whole sequences with a catastrophic token
    weights = weights * response_mask  # zero padding
    weights = weights.detach()

    metrics["rollout_is_threshold_upper"] = upper_threshold
    metrics["rollout_is_threshold_lower"] = lower_threshold

    out = {f"{_PREFIX}{k}": _to_float(v) for k, v in metrics.items()}
    out.update(compute_mismatch_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, out


def _compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_level: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: float,
    log_threshold_upper: torch.Tensor,
    log_threshold_lower: torch.Tensor,
    has_catastrophic: torch.Tensor,
    catastrophic_tokens: torch.Tensor,
) -> dict[str, Any]:
    """IS statistics (unprefixed keys, tensor or float values); PR's ``compute_is_metrics``.

    Sequence/geometric max/min/fractions come from the unclamped log values; mean, std and ESS
    use the safety-clamped weights, std/ESS additionally clamped to ``[lower, upper]``.
    """
    metrics: dict[str, Any] = {}
    device = rollout_is_weights.device
    any_valid = bool(response_mask.any())

    metrics["rollout_is_veto_fraction"] = has_catastrophic.float().mean()
    metrics["rollout_is_catastrophic_token_fraction"] = masked_mean(catastrophic_tokens.float(), response_mask)

    if rollout_is_level in ("sequence", "geometric"):
        log_max = log_ratio_for_metrics.max()
        log_min = log_ratio_for_metrics.min()
        metrics["rollout_is_max"] = torch.exp(torch.clamp(log_max, max=SAFETY_BOUND))
        metrics["rollout_is_min"] = torch.exp(log_min)
        metrics["rollout_is_mean"] = masked_mean(rollout_is_weights, response_mask)

        exceeds_upper = log_ratio_for_metrics > log_threshold_upper
        below_lower = log_ratio_for_metrics < log_threshold_lower
        if rollout_is_level == "sequence":
            metrics["rollout_is_ratio_fraction_high"] = exceeds_upper.float().mean()
            metrics["rollout_is_ratio_fraction_low"] = below_lower.float().mean()
        else:
            metrics["rollout_is_ratio_fraction_high"] = masked_mean(
                exceeds_upper.expand_as(response_mask).float(), response_mask
            )
            metrics["rollout_is_ratio_fraction_low"] = masked_mean(
                below_lower.expand_as(response_mask).float(), response_mask
            )
    else:
        metrics["rollout_is_mean"] = masked_mean(rollout_is_weights, response_mask)
        metrics["rollout_is_ratio_fraction_high"] = masked_mean(
            (rollout_is_weights > rollout_is_threshold).float(), response_mask
        )
        metrics["rollout_is_ratio_fraction_low"] = masked_mean(
            (rollout_is_weights < rollout_is_threshold_lower).float(), response_mask
        )
        if any_valid:
            mask_bool = response_mask.bool()
            metrics["rollout_is_max"] = rollout_is_weights.masked_fill(~mask_bool, float("-inf")).max()
            metrics["rollout_is_min"] = rollout_is_weights.masked_fill(~mask_bool, float("inf")).min()
        else:
            metrics["rollout_is_max"] = torch.tensor(0.0, device=device)
            metrics["rollout_is_min"] = torch.tensor(0.0, device=device)

    # Standard deviation and effective sample size on [lower, upper]-clamped weights.
    if any_valid and response_mask.sum() > 1:
        weights_for_std = rollout_is_weights.clamp(min=rollout_is_threshold_lower, max=rollout_is_threshold)
        var = masked_mean(weights_for_std.square(), response_mask) - metrics["rollout_is_mean"].square()
        metrics["rollout_is_std"] = torch.sqrt(torch.clamp(var, min=0.0))
    else:
        metrics["rollout_is_std"] = torch.tensor(0.0, device=device)

    if any_valid:
        weights_for_ess = rollout_is_weights.clamp(min=rollout_is_threshold_lower, max=rollout_is_threshold)
        normalized = weights_for_ess / (metrics["rollout_is_mean"] + 1e-8)
        metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalized.square(), response_mask)
    else:
        metrics["rollout_is_eff_sample_size"] = torch.tensor(1.0, device=device)

    if rollout_is_weights.dim() > 1 and any_valid:
        seq_mean_weights = masked_mean(rollout_is_weights, response_mask, axis=-1)
        metrics["rollout_is_seq_mean"] = seq_mean_weights.mean()
        metrics["rollout_is_seq_std"] = (
            seq_mean_weights.std() if seq_mean_weights.numel() > 1 else torch.tensor(0.0, device=device)
        )
        metrics["rollout_is_seq_max"] = seq_mean_weights.max()
        metrics["rollout_is_seq_min"] = seq_mean_weights.min()
        metrics["rollout_is_seq_max_deviation"] = (seq_mean_weights - 1.0).abs().max()
        metrics["rollout_is_seq_fraction_high"] = (seq_mean_weights > rollout_is_threshold).float().mean()
        metrics["rollout_is_seq_fraction_low"] = (seq_mean_weights < rollout_is_threshold_lower).float().mean()

    if any_valid:
        flat_weights = rollout_is_weights[response_mask.bool()]
        if flat_weights.numel() > 0:
            for name, q in (("p25", 0.25), ("p50", 0.50), ("p75", 0.75), ("p95", 0.95), ("p99", 0.99)):
                metrics[f"rollout_is_{name}"] = torch.quantile(flat_weights, q)

    return metrics


def compute_mismatch_metrics(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor | None,
    response_mask: torch.Tensor,
) -> dict[str, float]:
    """Training/rollout mismatch diagnostics (python floats, ``mismatch/`` prefix).

    With per-sequence masked means ``m_train = masked_mean(old_log_prob)`` and
    ``m_roll = masked_mean(rollout_log_prob)`` (shape ``(bs,)``) and
    ``lr = old_log_prob - rollout_log_prob``:

    * ``mismatch_training_ppl`` = batch mean of ``exp(-m_train)``;
      ``mismatch_training_log_ppl`` = batch mean of ``-m_train``
    * ``mismatch_kl`` = masked mean over tokens of ``rollout_log_prob - old_log_prob``
      (k1 estimate of KL(pi_rollout || pi_train), nats/token)
    * ``mismatch_k3_kl`` = masked mean of ``exp(lr) - lr - 1`` (no clamp, as the PR)
    * ``mismatch_rollout_ppl`` / ``mismatch_rollout_log_ppl`` as for training
    * ``mismatch_log_ppl_diff`` (+ ``_abs_diff``, ``_diff_max``, ``_diff_min``) from
      ``m_roll - m_train`` per sequence
    * ``mismatch_ppl_ratio`` = batch mean of ``exp(m_roll - m_train)``

    Only the two training keys are produced when ``rollout_log_prob`` is ``None``.

    Args:
        old_log_prob: ``(bs, response_length)``.
        rollout_log_prob: ``(bs, response_length)`` or ``None``.
        response_mask: ``(bs, response_length)``.

    Source: ``verl.trainer.ppo.mismatch_helper.compute_mismatch_metrics`` of the seed PR
    (verl 0.9.1: ``rollout_corr_helper.compute_offpolicy_metrics``, keys without ``mismatch_``).
    """
    metrics: dict[str, torch.Tensor] = {}
    mean_log_prob_training = masked_mean(old_log_prob, response_mask, axis=-1)  # (bs,)
    metrics["mismatch_training_ppl"] = torch.exp(-mean_log_prob_training).mean()
    metrics["mismatch_training_log_ppl"] = (-mean_log_prob_training).mean()

    if rollout_log_prob is not None:
        metrics["mismatch_kl"] = masked_mean(rollout_log_prob - old_log_prob, response_mask)
        log_ratio = old_log_prob - rollout_log_prob
        metrics["mismatch_k3_kl"] = masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask)

        mean_log_prob_rollout = masked_mean(rollout_log_prob, response_mask, axis=-1)  # (bs,)
        metrics["mismatch_rollout_ppl"] = torch.exp(-mean_log_prob_rollout).mean()
        metrics["mismatch_rollout_log_ppl"] = (-mean_log_prob_rollout).mean()

        log_ppl_diff = mean_log_prob_rollout - mean_log_prob_training
        metrics["mismatch_log_ppl_diff"] = log_ppl_diff.mean()
        metrics["mismatch_log_ppl_abs_diff"] = log_ppl_diff.abs().mean()
        metrics["mismatch_log_ppl_diff_max"] = log_ppl_diff.max()
        metrics["mismatch_log_ppl_diff_min"] = log_ppl_diff.min()
        metrics["mismatch_ppl_ratio"] = torch.exp(log_ppl_diff).mean()

    return {f"{_PREFIX}{k}": _to_float(v.detach()) for k, v in metrics.items()}
