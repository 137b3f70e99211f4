"""PPO / GRPO math on plain torch tensors, following verl 0.9.1 definition by definition.

Every function here mirrors one function of verl (``verl/trainer/ppo/core_algos.py``,
``verl/utils/torch_functional.py`` or ``verl/trainer/ppo/ray_trainer.py``) with the same
formula, the same epsilons (``1e-8`` in masked means / whitening, ``1e-6`` in GRPO), the same
masking and the same clamps, so that a scenario run through this module is comparable
number-for-number with a verl run (``tests/test_verl_parity.py`` checks that).

Conventions used throughout:

* ``bs`` is the number of responses in the batch, ``response_length`` the padded number of
  response tokens; token tensors are ``(bs, response_length)``.
* ``response_mask`` is ``1`` (or ``True``) for real response tokens and ``0`` after EOS /
  for padding, shape ``(bs, response_length)``.
* Log-probabilities are natural-log probabilities (nats) of the sampled token.

Differences from verl, all deliberate:

* No ``DataProto`` and no config objects: plain tensors and keyword arguments.
* Single-process semantics for loss aggregation: verl's ``dp_size`` is fixed to 1
  (``batch_num_tokens`` / ``global_batch_size`` / ``loss_scale_factor`` are kept).
* :func:`compute_policy_loss_vanilla` takes the clip settings as arguments (verl reads them
  from ``ActorConfig``) and returns the metrics as 0-d tensors instead of a dict of floats.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "ADV_ESTIMATORS",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "clip_by_value",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss_vanilla",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

# verl's loss_agg_mode names (verl.workers.config.ActorConfig validates against the same list).
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

# Names accepted by kl_penalty (a trailing "+" selects the k2 straight-through gradient).
KL_PENALTY_TYPES: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


# --------------------------------------------------------------------------------------------
# verl.utils.torch_functional
# --------------------------------------------------------------------------------------------
def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero.

    Args:
        values: any shape, typically ``(bs, response_length)``.
        mask: same shape as ``values``; bool or 0/1. NaN/inf in ``values`` outside the mask is
            replaced by 0 before multiplying, so padding garbage never leaks into the sum.
        axis: dimension(s) to reduce; ``None`` reduces everything to a 0-d tensor.

    Returns:
        ``values`` reduced over ``axis``; same units as ``values``.

    verl counterpart: ``verl.utils.torch_functional.masked_sum``.
    """
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Mean of ``values`` over the elements selected by ``mask``.

    ``masked_sum(values, mask, axis) / (mask.sum(axis) + 1e-8)``: an all-zero mask gives 0
    rather than NaN.

    Args:
        values: any shape, typically ``(bs, response_length)``.
        mask: same shape as ``values``; bool or 0/1.
        axis: dimension(s) to reduce (``-1`` gives one mean per sequence, shape ``(bs,)``);
            ``None`` gives a 0-d tensor.

    verl counterpart: ``verl.utils.torch_functional.masked_mean``.
    """
    s = masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the elements selected by ``mask`` (all elements pooled).

    Args:
        values: any shape, typically ``(bs, response_length)``.
        mask: same shape as ``values``.
        unbiased: apply Bessel's correction ``n / (n - 1)`` with ``n = mask.sum()``.

    Raises:
        ValueError: with ``unbiased=True`` when the mask selects 0 or 1 element (as verl).

    Returns:
        0-d tensor, units of ``values`` squared.

    verl counterpart: ``verl.utils.torch_functional.masked_var``.
    """
    mean = masked_mean(values, mask)
    centered_values = values - mean
    variance = masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        if mask_sum == 0:
            raise ValueError("At least one element in the mask has to be 1.")
        if mask_sum == 1:
            raise ValueError("The sum of the mask is one, which can cause a division by zero.")
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Whiten ``values`` with the masked mean and (unbiased) masked variance.

    ``(values - mean) * rsqrt(var + 1e-8)``; with ``shift_mean=False`` the mean is added back.
    Positions outside the mask are transformed too (they are not zeroed).

    Args:
        values: ``(bs, response_length)`` (any shape works).
        mask: same shape as ``values``; needs at least 2 selected elements.

    verl counterpart: ``verl.utils.torch_functional.masked_whiten``.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Element-wise clamp with tensor bounds: ``max(min(x, tensor_max), tensor_min)``.

    verl counterpart: ``verl.utils.torch_functional.clip_by_value``.
    """
    return torch.max(torch.min(x, tensor_max), tensor_min)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability (nats) of ``labels`` under ``softmax(logits)``.

    For float32/float64 logits this is ``logits[label] - logsumexp(logits)`` computed in the
    logits' own dtype (exact ``log_softmax`` + gather, no overflow for large logits). For
    lower precisions (bf16/fp16) it falls back to ``log_softmax`` in that dtype, exactly as
    verl's CPU path does (no silent upcast, so the precision gate sees what verl sees).

    Args:
        logits: ``(bs, response_length, vocab_size)`` or ``(N, vocab_size)``.
        labels: integer token ids, ``logits.shape[:-1]``.

    Returns:
        ``logits.shape[:-1]``, dtype of ``logits``.

    verl counterpart: ``verl.utils.torch_functional.logprobs_from_logits`` (its non-flash-attn,
    non-NPU branch ``logprobs_from_logits_v2``).
    """
    if logits.dtype in (torch.float32, torch.float64):
        logits_labels = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        logsumexp_values = torch.logsumexp(logits, dim=-1)
        return logits_labels - logsumexp_values
    logprobs = F.log_softmax(logits, dim=-1)
    return logprobs.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` along the last dimension.

    ``logsumexp(logits) - sum(softmax(logits) * logits)``.

    Args:
        logits: ``(bs, response_length, vocab_size)`` (any ``(..., vocab_size)``).

    Returns:
        ``logits.shape[:-1]``, e.g. ``(bs, response_length)``.

    verl counterpart: ``verl.utils.torch_functional.entropy_from_logits``.
    """
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


# --------------------------------------------------------------------------------------------
# KL controllers (verl.trainer.ppo.core_algos)
# --------------------------------------------------------------------------------------------
class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019 ("Fine-Tuning Language Models from
    Human Preferences", arXiv:1909.08593).

    ``value *= 1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon``.

    verl counterpart: ``verl.trainer.ppo.core_algos.AdaptiveKLController``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Update ``value`` from the measured KL (nats/token) after ``n_steps`` samples."""
        proportional_error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


class FixedKLController:
    """Constant KL coefficient; ``update`` is a no-op.

    verl counterpart: ``verl.trainer.ppo.core_algos.FixedKLController``.
    """

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for interface parity with :class:`AdaptiveKLController`)."""


# --------------------------------------------------------------------------------------------
# Advantage estimators
# --------------------------------------------------------------------------------------------
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous
    Control Using Generalized Advantage Estimation", arXiv:1506.02438).

    Backward recursion over the response, with ``delta_t = r_t + gamma * V_{t+1} - V_t`` and
    ``A_t = delta_t + gamma * lam * A_{t+1}``; ``V`` after the last token is 0. Masked-out
    positions (``response_mask == 0``) are skipped: they carry the next valid value/advantage
    through unchanged. ``returns = A + V`` uses the *raw* advantages; the advantages returned
    are then whitened with :func:`masked_whiten` over ``response_mask`` (verl does this).

    Args:
        token_level_rewards: ``(bs, response_length)``, reward per token (after KL penalty).
        values: ``(bs, response_length)``, critic values ``V(s_t)``.
        response_mask: ``(bs, response_length)``, 1 for response tokens.
        gamma: discount factor.
        lam: GAE lambda.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``, computed under no_grad.

    verl counterpart: ``verl.trainer.ppo.core_algos.compute_gae_advantage_return``.
    """
    with torch.no_grad():
        nextvalues = 0
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]

        for t in reversed(range(gen_len)):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam_ = delta + gamma * lam * lastgaelam

            # skip values and TD-error on masked-out (observation / padding) tokens
            nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
            lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam

            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)

        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300).

    Each response's score is ``token_level_rewards.sum(-1)``. Responses are grouped by
    ``index`` (the prompt id); within a group ``A = (score - mean) / (std + epsilon)`` with the
    *unbiased* std (``torch.std``). A group of one response uses mean 0 and std 1. With
    ``norm_adv_by_std_in_grpo=False`` the std division is skipped (Dr.GRPO, arXiv:2503.20783).
    The scalar advantage is broadcast over the response and multiplied by ``response_mask``.

    Args:
        token_level_rewards: ``(bs, response_length)``; outcome reward usually on the last token.
        response_mask: ``(bs, response_length)``.
        index: length-``bs`` sequence (list / numpy array) of hashable group ids.
        epsilon: added to the group std.
        norm_adv_by_std_in_grpo: divide by the group std (original GRPO) or not (Dr.GRPO).

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_length)`` tensor twice (as verl).

    verl counterpart: ``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage``.
    """
    scores = token_level_rewards.sum(dim=-1)

    id2score: dict[Any, list[torch.Tensor]] = defaultdict(list)
    id2mean: dict[Any, torch.Tensor] = {}
    id2std: dict[Any, torch.Tensor] = {}

    with torch.no_grad():
        bsz = scores.shape[0]
        if len(index) != bsz:
            raise ValueError(f"index has {len(index)} entries, expected one per row ({bsz})")
        for i in range(bsz):
            id2score[index[i]].append(scores[i])
        for idx, group in id2score.items():
            if len(group) == 1:
                id2mean[idx] = torch.tensor(0.0)
                id2std[idx] = torch.tensor(1.0)
            else:
                scores_tensor = torch.stack(group)
                id2mean[idx] = torch.mean(scores_tensor)
                id2std[idx] = torch.std(scores_tensor)
        for i in range(bsz):
            if norm_adv_by_std_in_grpo:
                scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
            else:
                scores[i] = scores[i] - id2mean[index[i]]
        scores = scores.unsqueeze(-1) * response_mask

    return scores, scores


# Registry by verl's ``algorithm.adv_estimator`` config names.
ADV_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": compute_gae_advantage_return,
    "grpo": compute_grpo_outcome_advantage,
}


def get_adv_estimator_fn(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """Advantage estimator registered under the verl config name ``name``.

    Raises:
        ValueError: unknown name; the message lists the known names.

    verl counterpart: ``verl.trainer.ppo.core_algos.get_adv_estimator_fn``.
    """
    name = getattr(name, "value", name)  # accept verl's AdvantageEstimator enum too
    try:
        return ADV_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"Unknown advantage estimator {name!r}; known: {', '.join(sorted(ADV_ESTIMATORS))}") from None


# --------------------------------------------------------------------------------------------
# KL penalty
# --------------------------------------------------------------------------------------------
def _kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)  # numerical stability of exp
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    if kl_penalty == "full":
        raise NotImplementedError("kl_penalty='full' needs full-vocabulary logits; not supported")
    raise NotImplementedError(f"Unknown kl_penalty {kl_penalty!r}; known: {', '.join(KL_PENALTY_TYPES)}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference policy (nats).

    With ``d = logprob - ref_logprob`` (Schulman, "Approximating KL Divergence", 2020,
    http://joschu.net/blog/kl-approx.html):

    * ``"kl"`` / ``"k1"``: ``d``
    * ``"abs"``: ``|d|``
    * ``"mse"`` / ``"k2"``: ``0.5 * d**2``
    * ``"low_var_kl"`` / ``"k3"``: ``exp(-d) + d - 1`` with ``-d`` clamped to ``[-20, 20]``
      before ``exp`` and the result clamped to ``[-10, 10]``
    * ``"full"``: raises ``NotImplementedError`` (as verl).

    A trailing ``"+"`` (e.g. ``"k3+"``) keeps the forward value but routes the gradient
    through k2 (straight-through), as verl does.

    Args:
        logprob: ``(bs, response_length)``, log-probs of the current / old policy.
        ref_logprob: ``(bs, response_length)``, log-probs of the reference policy.
        kl_penalty: estimator name, see above.

    Returns:
        ``(bs, response_length)``, unmasked.

    verl counterpart: ``verl.trainer.ppo.core_algos.kl_penalty`` (+ ``kl_penalty_forward``).
    """
    base = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = _kl_penalty_forward(logprob, ref_logprob, base)
    if not kl_penalty.endswith("+") or kl_penalty in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


_kl_penalty_fn = kl_penalty  # apply_kl_penalty's ``kl_penalty`` argument shadows the function


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-in-reward: ``token_level_rewards = token_level_scores - beta * kl * response_mask``.

    ``beta = kl_ctrl.value`` is read *before* the controller is updated with the batch KL
    (mean over sequences of the per-sequence masked-mean KL) and ``n_steps = bs``.

    Args:
        token_level_scores: ``(bs, response_length)``, reward-model / rule scores.
        old_log_probs: ``(bs, response_length)``, log-probs of the rollout (actor) policy.
        ref_log_prob: ``(bs, response_length)``, log-probs of the reference policy.
        response_mask: ``(bs, response_length)``.
        kl_ctrl: KL controller; updated in place.
        kl_penalty: estimator name for :func:`kl_penalty`.

    Returns:
        ``(token_level_rewards (bs, response_length), metrics)`` with metrics
        ``"actor/reward_kl_penalty"`` (nats/token, float) and ``"actor/reward_kl_penalty_coeff"``
        (beta used).

    verl counterpart: ``verl.trainer.ppo.ray_trainer.apply_kl_penalty`` (DataProto removed).
    """
    batch_size = token_level_scores.shape[0]
    kld = _kl_penalty_fn(old_log_probs, ref_log_prob, kl_penalty=kl_penalty)
    kld = kld * response_mask
    beta = kl_ctrl.value

    token_level_rewards = token_level_scores - beta * kld

    current_kl = masked_mean(kld, mask=response_mask, axis=-1)  # average over sequence
    current_kl = torch.mean(current_kl, dim=0).item()

    kl_ctrl.update(current_kl=current_kl, n_steps=batch_size)
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
    return token_level_rewards, metrics


# --------------------------------------------------------------------------------------------
# Loss aggregation and losses
# --------------------------------------------------------------------------------------------
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


def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
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
        loss_agg_mode: see :func:`agg_loss`.
        clip_ratio: symmetric PPO clip epsilon; default for the two bounds below.
        clip_ratio_low / clip_ratio_high: asymmetric bounds (DAPO "clip-higher").
        clip_ratio_c: dual-clip constant, must be > 1.
        rollout_is_weights: optional ``(bs, response_length)`` detached IS weights.

    Returns:
        ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``, all 0-d tensors:
        the aggregated loss, the masked fraction of tokens where the clipped term was taken,
        the masked mean of ``old_log_prob - log_prob`` (k1 estimate, nats), and the masked
        fraction of tokens where the dual clip was active.

    verl counterpart: ``verl.trainer.ppo.core_algos.compute_policy_loss_vanilla``
    (``get_policy_loss_fn("vanilla")``); verl reads the clip settings from ``ActorConfig``
    and returns the three metrics as floats in a dict.
    """
    if clip_ratio_low is None:
        clip_ratio_low = clip_ratio
    if clip_ratio_high is None:
        clip_ratio_high = clip_ratio
    if not clip_ratio_c > 1.0:
        raise ValueError(
            "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0,"
            f" but get the value: {clip_ratio_c}."
        )

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

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


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
