"""Rollout importance sampling (IS): correct the rollout/training policy mismatch.

Spec: verl pull request #3694, "Rollout Importance Sampling Framework"
(https://github.com/verl-project/verl/pull/3694): the module ``verl/trainer/ppo/mismatch_helper.py``
it added, functions ``compute_rollout_importance_weights``, ``compute_is_metrics`` and
``compute_mismatch_metrics``. Background: Liu, Li, Fu, Wang, Liu, Shen 2025, "When Speed Kills
Stability: Demystifying RL Collapse from the Inference-Training Mismatch"
(https://yingru.notion.site/When-Speed-Kills-Stability-271211a558b7808d8b12d403fd15edda). The
follow-up PR #3750 renamed the ``clip`` mode to ``mask``; this module keeps #3694's name.

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

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import torch

from precision_harness.runs.runner.algorithms import masked_mean, masked_sum

__all__ = [
    "IS_LEVELS",
    "IS_MODES",
    "SAFETY_BOUND",
    "RolloutISConfig",
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


@dataclass(frozen=True)
class RolloutISConfig:
    """Rollout IS settings, by verl's ``algorithm.rollout_is_*`` key names (the PR's keyword arguments).

    Attributes:
        rollout_is_level: ``"token"``, ``"sequence"`` or ``"geometric"``.
        rollout_is_mode: ``"truncate"`` or ``"clip"``.
        rollout_is_threshold: upper bound; ``None`` disables IS entirely.
        rollout_is_threshold_lower: lower bound (clip mode; also floors the std/ESS metrics); None: ``1 / upper``.
        rollout_is_veto_threshold: per-token catastrophic-ratio threshold, ``None`` = no veto.
    """

    rollout_is_level: str = "token"
    rollout_is_mode: str = "truncate"
    rollout_is_threshold: float | None = 2.0
    rollout_is_threshold_lower: float | None = None
    rollout_is_veto_threshold: float | None = None

    @classmethod
    def from_algorithm(cls, algorithm: Mapping[str, Any]) -> RolloutISConfig:
        """The settings of a scenario's ``algorithm`` section."""
        return cls(**{f.name: algorithm[f.name] for f in fields(cls)})


class _Veto(NamedTuple):
    """The veto's verdict: catastrophic tokens ``(bs, R)``, sequences holding one ``(bs, 1)``, keep mask ``(bs, 1)``."""

    tokens: torch.Tensor
    sequences: torch.Tensor
    keep: torch.Tensor


def compute_rollout_importance_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutISConfig | None = None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """IS weights ``pi_train / pi_rollout`` with bounding, veto, and diagnostics.

    Levels (``rollout_is_level``), with ``lr_t = old_log_prob - rollout_log_prob``:
    * ``"token"``: ``w_t = exp(clamp(lr_t, -20, 20))`` (biased, low variance).
    * ``"sequence"``: ``w = exp(clamp(sum_t mask * lr_t, -20, 20))`` broadcast over the row.
    * ``"geometric"``: ``w = exp(clamp(masked_mean_t(lr_t), -20, 20))`` broadcast over the row.

    Modes (``rollout_is_mode``):
    * ``"truncate"`` (TIS): ``w = min(w, upper)``.
    * ``"clip"`` (CIS): ``w = 0`` where ``w < lower`` or ``w > upper``; kept as is otherwise.

    ``lower`` defaults to ``1 / upper``. Veto: if ``rollout_is_veto_threshold`` is set, any sequence containing a
    valid token with ``rho_t < veto`` (tested in log space) gets weight 0 on every token, in both modes. Finally
    weights are multiplied by ``response_mask`` and detached. The IS metrics are computed on the weights *before*
    truncation/clipping (so ``rollout_is_max`` shows the true maximum), as in the PR.

    Args:
        old_log_prob: ``(bs, response_length)``, log-probs of the training policy (nats).
        rollout_log_prob: ``(bs, response_length)``, log-probs reported by the rollout engine.
        response_mask: ``(bs, response_length)``, 1 for response tokens.
        config: level, mode and thresholds (:class:`RolloutISConfig`; default: its defaults). A
            ``rollout_is_threshold`` of ``None`` disables IS entirely (returns ``(None, {})``).

    Returns:
        ``(weights, metrics)``: ``weights`` is ``(bs, response_length)``, detached, zero on
        padding. ``metrics`` maps ``"mismatch/<name>"`` to python floats: the IS metrics
        (:func:`_compute_is_metrics` names them), the thresholds ``rollout_is_threshold_upper/lower``,
        plus :func:`compute_mismatch_metrics`.

    Raises:
        ValueError: unknown level or mode.

    Source: ``verl.trainer.ppo.mismatch_helper.compute_rollout_importance_weights`` of the PR #3694 (the PR's
    trainer adds the ``mismatch/`` prefix and merges the mismatch metrics; the PR's non-numeric config entries
    ``rollout_is_level/mode/veto_threshold`` are omitted so that every value is a float).
    """
    config = config or RolloutISConfig()
    level = config.rollout_is_level
    if config.rollout_is_threshold is None:
        return None, {}
    lower, upper = _thresholds(config)
    log_ratio = old_log_prob - rollout_log_prob
    weights, log_ratio_for_metrics = _raw_weights(log_ratio, response_mask, level)
    veto = _veto(log_ratio, response_mask, config.rollout_is_veto_threshold)
    # metrics on the pre-bounding weights, so rollout_is_max shows the true maximum
    metrics = _compute_is_metrics(weights, log_ratio_for_metrics, response_mask, level, (lower, upper), veto)
    weights = _bound(weights, response_mask, metrics, mode=config.rollout_is_mode, level=level, bounds=(lower, upper))
    # zero whole sequences with a catastrophic token, then the padding
    weights = (weights * veto.keep * response_mask).detach()

    metrics.update(rollout_is_threshold_upper=upper, rollout_is_threshold_lower=lower)
    out = {f"{_PREFIX}{k}": _to_float(v) for k, v in metrics.items()}
    out.update(compute_mismatch_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, out


def _thresholds(config: RolloutISConfig) -> tuple[float, float]:
    """``(lower, upper)``: ``rollout_is_threshold`` and its lower bound (default ``1 / upper``).

    Raises:
        ValueError: unknown level or mode (the PR's messages).
    """
    if config.rollout_is_level not in IS_LEVELS:
        raise ValueError(
            f"Invalid rollout_is_level: {config.rollout_is_level}. Must be 'token', 'sequence', or 'geometric'."
        )
    if config.rollout_is_mode not in IS_MODES:
        raise ValueError(f"Invalid rollout_is_mode: {config.rollout_is_mode}. Must be 'truncate' or 'clip'.")
    upper = float(config.rollout_is_threshold)
    lower = float(config.rollout_is_threshold_lower) if config.rollout_is_threshold_lower is not None else 1.0 / upper
    return lower, upper


def _raw_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights (bs, R), log ratio kept for the metrics)`` before bounding, at ``level``.

    token: ``exp(clamp(lr_t))``; sequence: ``exp(clamp(sum_t lr_t))`` and geometric:
    ``exp(clamp(mean_t lr_t))``, each broadcast over the row. The metrics get the unclamped log value.
    """
    if level == "token":
        return torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)), log_ratio
    reduce = masked_sum if level == "sequence" else masked_mean
    per_seq = reduce(log_ratio, mask, axis=-1).unsqueeze(-1)
    weights = torch.exp(torch.clamp(per_seq, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    return weights, per_seq


def _veto(log_ratio: torch.Tensor, mask: torch.Tensor, veto_threshold: float | None) -> _Veto:
    """Catastrophic tokens, the sequences holding one and the keep mask, tested in log space."""
    device = log_ratio.device
    if veto_threshold is None:
        none = torch.zeros((log_ratio.size(0), 1), dtype=torch.bool, device=device)
        keep = torch.ones((log_ratio.size(0), 1), dtype=torch.float32, device=device)
        return _Veto(torch.zeros_like(mask, dtype=torch.bool), none, keep)
    log_veto_threshold = torch.log(torch.tensor(veto_threshold, device=device))
    catastrophic_tokens = (log_ratio < log_veto_threshold) & mask.bool()
    has_catastrophic = catastrophic_tokens.any(dim=-1, keepdim=True)
    return _Veto(catastrophic_tokens, has_catastrophic, (~has_catastrophic).float())


def _bound(
    weights: torch.Tensor,
    mask: torch.Tensor,
    metrics: dict[str, Any],
    *,
    mode: str,
    level: str,
    bounds: tuple[float, float],
) -> torch.Tensor:
    """truncate (TIS): ``min(w, upper)``; clip (CIS): 0 outside ``bounds = (lower, upper)`` (adds the clipped
    fractions)."""
    lower, upper = bounds
    if mode == "truncate":
        return weights.clamp(max=upper)
    clip_mask = ((weights >= lower) & (weights <= upper)).float()
    metrics["rollout_is_clipped_fraction"] = masked_mean(1 - clip_mask, mask)
    if level in ("sequence", "geometric"):
        seq_weights = weights[:, 0]
        metrics["rollout_is_seq_clipped_fraction"] = ((seq_weights < lower) | (seq_weights > upper)).float().mean()
    else:
        seq_has_clipped = masked_sum(1 - clip_mask, mask, axis=-1) > 0
        metrics["rollout_is_seq_clipped_fraction"] = seq_has_clipped.float().mean()
    return weights * clip_mask


def _compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is_level: str,
    bounds: tuple[float, float],
    veto: _Veto,
) -> dict[str, Any]:
    """IS statistics (unprefixed keys, tensor or float values); PR's ``compute_is_metrics``: ``rollout_is_mean``,
    ``rollout_is_std``, ``rollout_is_max``, ``rollout_is_min``, ``rollout_is_eff_sample_size``,
    ``rollout_is_veto_fraction``, ``rollout_is_catastrophic_token_fraction``, ``rollout_is_ratio_fraction_high/low``,
    ``rollout_is_p25/p50/p75/p95/p99``, ``rollout_is_seq_mean/std/max/min``, ``rollout_is_seq_max_deviation``,
    ``rollout_is_seq_fraction_high/low`` (and, added by the bounding in clip mode, ``rollout_is_clipped_fraction`` and
    ``rollout_is_seq_clipped_fraction``).

    Sequence/geometric max/min/fractions come from the unclamped log values; mean, std and ESS
    use the safety-clamped weights, std/ESS additionally clamped to ``bounds = (lower, upper)``.
    """
    w, mask = rollout_is_weights, response_mask
    lower, upper = bounds
    metrics: dict[str, Any] = {
        "rollout_is_veto_fraction": veto.sequences.float().mean(),
        "rollout_is_catastrophic_token_fraction": masked_mean(veto.tokens.float(), mask),
    }
    if rollout_is_level in ("sequence", "geometric"):
        metrics.update(_sequence_ratio_metrics(w, log_ratio_for_metrics, mask, rollout_is_level, lower, upper))
    else:
        metrics.update(_token_ratio_metrics(w, mask, lower, upper))
    metrics.update(_spread_metrics(w, mask, metrics["rollout_is_mean"], lower, upper))
    if w.dim() > 1 and bool(mask.any()):
        metrics.update(_per_sequence_metrics(w, mask, lower, upper))
    if bool(mask.any()):
        flat_weights = w[mask.bool()]
        if flat_weights.numel() > 0:
            for name, q in (("p25", 0.25), ("p50", 0.50), ("p75", 0.75), ("p95", 0.95), ("p99", 0.99)):
                metrics[f"rollout_is_{name}"] = torch.quantile(flat_weights, q)
    return metrics


def _sequence_ratio_metrics(
    w: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, level: str, lower: float, upper: float
) -> dict[str, Any]:
    """max/min/mean and the fractions beyond the thresholds, from each sequence's log ratio ``(bs, 1)``."""
    device = w.device
    log_threshold_upper = torch.log(torch.tensor(upper, device=device))
    log_threshold_lower = torch.log(torch.tensor(lower, device=device))
    metrics = {
        "rollout_is_max": torch.exp(torch.clamp(log_ratio.max(), max=SAFETY_BOUND)),
        "rollout_is_min": torch.exp(log_ratio.min()),
        "rollout_is_mean": masked_mean(w, mask),
    }
    exceeds_upper, below_lower = log_ratio > log_threshold_upper, log_ratio < log_threshold_lower
    if level == "sequence":
        metrics["rollout_is_ratio_fraction_high"] = exceeds_upper.float().mean()
        metrics["rollout_is_ratio_fraction_low"] = below_lower.float().mean()
    else:  # geometric: each sequence's verdict counts once per token
        metrics["rollout_is_ratio_fraction_high"] = masked_mean(exceeds_upper.expand_as(mask).float(), mask)
        metrics["rollout_is_ratio_fraction_low"] = masked_mean(below_lower.expand_as(mask).float(), mask)
    return metrics


def _token_ratio_metrics(w: torch.Tensor, mask: torch.Tensor, lower: float, upper: float) -> dict[str, Any]:
    """mean, the fractions beyond the thresholds and max/min over valid tokens."""
    metrics = {
        "rollout_is_mean": masked_mean(w, mask),
        "rollout_is_ratio_fraction_high": masked_mean((w > upper).float(), mask),
        "rollout_is_ratio_fraction_low": masked_mean((w < lower).float(), mask),
    }
    if bool(mask.any()):
        mask_bool = mask.bool()
        metrics["rollout_is_max"] = w.masked_fill(~mask_bool, float("-inf")).max()
        metrics["rollout_is_min"] = w.masked_fill(~mask_bool, float("inf")).min()
    else:
        metrics["rollout_is_max"] = torch.tensor(0.0, device=w.device)
        metrics["rollout_is_min"] = torch.tensor(0.0, device=w.device)
    return metrics


def _spread_metrics(
    w: torch.Tensor, mask: torch.Tensor, mean: torch.Tensor, lower: float, upper: float
) -> dict[str, Any]:
    """Standard deviation and effective sample size, on weights clamped to ``[lower, upper]``."""
    device, any_valid = w.device, bool(mask.any())
    metrics: dict[str, Any] = {}
    if any_valid and mask.sum() > 1:
        var = masked_mean(w.clamp(min=lower, max=upper).square(), mask) - mean.square()
        metrics["rollout_is_std"] = torch.sqrt(torch.clamp(var, min=0.0))
    else:
        metrics["rollout_is_std"] = torch.tensor(0.0, device=device)
    if any_valid:
        normalized = w.clamp(min=lower, max=upper) / (mean + 1e-8)
        metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalized.square(), mask)
    else:
        metrics["rollout_is_eff_sample_size"] = torch.tensor(1.0, device=device)
    return metrics


def _per_sequence_metrics(w: torch.Tensor, mask: torch.Tensor, lower: float, upper: float) -> dict[str, Any]:
    """Statistics of each sequence's mean weight ``(bs,)``."""
    seq = masked_mean(w, mask, axis=-1)
    return {
        "rollout_is_seq_mean": seq.mean(),
        "rollout_is_seq_std": seq.std() if seq.numel() > 1 else torch.tensor(0.0, device=w.device),
        "rollout_is_seq_max": seq.max(),
        "rollout_is_seq_min": seq.min(),
        "rollout_is_seq_max_deviation": (seq - 1.0).abs().max(),
        "rollout_is_seq_fraction_high": (seq > upper).float().mean(),
        "rollout_is_seq_fraction_low": (seq < lower).float().mean(),
    }


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

    Source: ``verl.trainer.ppo.mismatch_helper.compute_mismatch_metrics`` of PR #3694
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
