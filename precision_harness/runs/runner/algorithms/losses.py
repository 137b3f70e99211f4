"""The losses: aggregation over tokens and sequences (``agg_loss``), the clipped PPO policy loss with dual
clip, the clipped value loss and the entropy bonus (``verl.trainer.ppo.core_algos``'s loss section).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from precision_harness.runs.runner.algorithms.torch_functional import (
    clip_by_value,
    entropy_from_logits,
    masked_mean,
    masked_sum,
)

# verl's loss_agg_mode names (verl.workers.config.ActorConfig validates against the same list).
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: int | float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar.

    * ``"token-mean"``: ``sum(loss * mask) / batch_num_tokens`` (default ``mask.sum()``).
    * ``"token-sum"``: ``sum(loss * mask)``.
    * ``"seq-mean-token-sum"``: per-sequence token sum, averaged over the sequences that have
      at least one valid token (or divided by ``global_batch_size`` when given).
    * ``"seq-mean-token-sum-norm"``: the above divided by ``loss_scale_factor`` (default the
      padded ``response_length``, ``loss_mask.shape[-1]``; Dr.GRPO's constant normaliser).
    * ``"seq-mean-token-mean"``: per-sequence masked token mean (``/(count + 1e-8)``),
      averaged over non-empty sequences (or divided by ``global_batch_size``).

    Single-process semantics: verl's extra ``dp_size`` argument is fixed to 1 here.
    ``batch_num_tokens`` / ``global_batch_size`` (verl's global-batch normalisers) default to
    this micro-batch's own counts; pass them to reproduce gradient accumulation over
    micro-batches.

    Args:
        loss_mat: ``(bs, response_length)`` per-token loss.
        loss_mask: ``(bs, response_length)``.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.

    Returns:
        0-d tensor.

    verl counterpart: ``verl.trainer.ppo.core_algos.agg_loss`` (with ``dp_size=1``).
    """
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        loss = masked_sum(loss_mat, loss_mask) / batch_num_tokens
    elif loss_agg_mode == "token-sum":
        loss = masked_sum(loss_mat, loss_mask)
    elif loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)  # token-sum
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size  # seq-mean
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None:
                loss_scale_factor = loss_mask.shape[-1]
            loss = loss / loss_scale_factor
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_count = torch.sum(loss_mask, dim=-1)  # per-sequence token count
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_count + 1e-8)  # token-mean
        seq_mask = (seq_count > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size  # seq-mean
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode!r}; known: {', '.join(LOSS_AGG_MODES)}")
    return loss


@dataclass(frozen=True)
class PolicyLossConfig:
    """The policy loss's settings, by verl's ``actor_rollout_ref.actor`` key names (verl: ``ActorConfig``).

    Attributes:
        loss_agg_mode: see :func:`agg_loss`.
        clip_ratio: symmetric PPO clip epsilon; the default of the two bounds below.
        clip_ratio_low / clip_ratio_high: asymmetric bounds (DAPO "clip-higher"); None: ``clip_ratio``.
        clip_ratio_c: dual-clip constant, must be > 1.
    """

    loss_agg_mode: str = "token-mean"
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0

    @classmethod
    def from_actor(cls, actor: Mapping[str, Any]) -> PolicyLossConfig:
        """The settings of a scenario's ``actor_rollout_ref.actor`` section."""
        return cls(**{f.name: actor[f.name] for f in fields(cls)})


def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped PPO surrogate (Schulman et al. 2017, "Proximal Policy Optimization
    Algorithms", arXiv:1707.06347) with dual clip (Ye et al. 2020, "Mastering Complex Control
    in MOBA Games with Deep RL", arXiv:1912.09729).

    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``L1 = max(-A * ratio, -A * clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))``;
    for ``A < 0`` the loss is further capped at ``-A * clip_ratio_c`` (dual clip), i.e.
    ``min(L1, -A * clip_ratio_c)``. If ``rollout_is_weights`` is given the per-token loss is
    multiplied by it before :func:`agg_loss` (rollout importance sampling correction).

    Args:
        old_log_prob: ``(bs, response_length)``, log-probs under the behaviour (old) policy.
        log_prob: ``(bs, response_length)``, log-probs under the current policy.
        advantages: ``(bs, response_length)``.
        response_mask: ``(bs, response_length)``.
        config: the aggregation mode and clip settings (:class:`PolicyLossConfig`; default: its defaults).
        rollout_is_weights: optional ``(bs, response_length)`` detached IS weights.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``, all 0-d tensors: the aggregated loss, the masked
        fraction of tokens where the clipped term was taken, the masked mean of ``old_log_prob - log_prob`` (k1
        estimate, nats), and the masked fraction of tokens where the dual clip was active.

    Raises:
        ValueError: ``clip_ratio_c`` is not above 1.

    verl counterpart: ``verl.trainer.ppo.core_algos.compute_policy_loss_vanilla``
    (``get_policy_loss_fn("vanilla")``); verl reads the clip settings from ``ActorConfig``, takes
    ``loss_agg_mode`` beside it and returns the three metrics as floats in a dict.
    """
    config = config or PolicyLossConfig()
    clip_ratio_low, clip_ratio_high, clip_ratio_c = _clip_ratios(config)
    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)  # stability
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def _clip_ratios(config: PolicyLossConfig) -> tuple[float, float, float]:
    """``(clip_ratio_low, clip_ratio_high, clip_ratio_c)``, the first two defaulting to ``clip_ratio``.

    Raises:
        ValueError: ``clip_ratio_c`` is not above 1 (verl's message).
    """
    low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    if not config.clip_ratio_c > 1.0:
        raise ValueError(
            "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0,"
            f" but get the value: {config.clip_ratio_c}."
        )
    return low, high, config.clip_ratio_c


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss of PPO (Schulman et al. 2017; as in TRL / verl).

    ``vpredclipped = clip(vpreds, values - cliprange_value, values + cliprange_value)``;
    ``vf_loss = 0.5 * agg_loss(max((vpreds - returns)^2, (vpredclipped - returns)^2))``.

    Args:
        vpreds: ``(bs, response_length)``, current critic predictions.
        returns: ``(bs, response_length)``, GAE returns (targets).
        values: ``(bs, response_length)``, critic values at rollout time.
        response_mask: ``(bs, response_length)``.
        cliprange_value: absolute clip range (units of the value head).
        loss_agg_mode: see :func:`agg_loss`.

    Returns:
        ``(vf_loss, vf_clipfrac)`` 0-d tensors; ``vf_clipfrac`` is the masked fraction of
        tokens where the clipped error was larger.

    verl counterpart: ``verl.trainer.ppo.core_algos.compute_value_loss`` (``dp_size=1``).
    """
    vpredclipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped_vf_losses = torch.max(vf_losses1, vf_losses2)
    vf_loss = 0.5 * agg_loss(loss_mat=clipped_vf_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Aggregated categorical entropy (nats) of the policy over response tokens.

    Args:
        logits: ``(bs, response_length, vocab_size)``.
        response_mask: ``(bs, response_length)``.
        loss_agg_mode: see :func:`agg_loss`.

    Returns:
        0-d tensor (the trainer subtracts ``entropy_coeff *`` this from the policy loss).

    verl counterpart: ``verl.trainer.ppo.core_algos.compute_entropy_loss``.
    """
    token_entropy = entropy_from_logits(logits)  # (bs, response_length)
    return agg_loss(loss_mat=token_entropy, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
