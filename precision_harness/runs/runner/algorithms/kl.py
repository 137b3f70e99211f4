"""KL between the policy and the reference: the estimators (k1, abs, k2, k3 and their straight-through
forms), the KL coefficient controllers and the KL-in-reward penalty (``verl.trainer.ppo.core_algos``'s
KL section and ``ray_trainer.apply_kl_penalty``).
"""

from __future__ import annotations

import torch

from precision_harness.runs.runner.algorithms.torch_functional import masked_mean

# Names accepted by kl_penalty (a trailing "+" selects the k2 straight-through gradient).
KL_PENALTY_TYPES: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


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
