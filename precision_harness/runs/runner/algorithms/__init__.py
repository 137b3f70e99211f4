"""PPO / GRPO math on plain torch tensors, following verl 0.9.1 definition by definition.

Every function here mirrors one function of verl (``verl/trainer/ppo/core_algos.py``,
``verl/utils/torch_functional.py`` or ``verl/trainer/ppo/ray_trainer.py``) with the same
formula, the same epsilons (``1e-8`` in masked means / whitening, ``1e-6`` in GRPO), the same
masking and the same clamps, so that a scenario run through this module is comparable
number-for-number with a verl run (``tests/test_verl_parity.py`` checks that).

The package groups them as verl's ``core_algos`` does, and is their one namespace (imported as
``core_algos`` by the stages and the trainer): :mod:`.torch_functional` (masked reductions,
log-probs, entropy), :mod:`.advantages` (GAE, GRPO and their registry), :mod:`.kl` (the estimators,
the KL controllers, KL in the reward) and :mod:`.losses` (aggregation, policy, value and entropy
losses).

Conventions used throughout:

* ``bs`` is the number of responses in the batch, ``response_length`` the padded number of
  response tokens; token tensors are ``(bs, response_length)``.
* ``response_mask`` is ``1`` (or ``True``) for real response tokens and ``0`` after EOS /
  for padding, shape ``(bs, response_length)``.
* Log-probabilities are natural-log probabilities (nats) of the sampled token.

Differences from verl, all deliberate:

* No ``DataProto``: plain tensors, keyword arguments, and for the policy loss a small
  :class:`~.losses.PolicyLossConfig` holding ``ActorConfig``'s clip settings and aggregation mode.
* Single-process semantics for loss aggregation: verl's ``dp_size`` is fixed to 1
  (``batch_num_tokens`` / ``global_batch_size`` / ``loss_scale_factor`` are kept).
* :func:`compute_policy_loss_vanilla` returns the metrics as 0-d tensors instead of a dict of floats.
"""

from __future__ import annotations

from precision_harness.runs.runner.algorithms.advantages import (
    ADV_ESTIMATORS,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    get_adv_estimator_fn,
)
from precision_harness.runs.runner.algorithms.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
)
from precision_harness.runs.runner.algorithms.losses import (
    LOSS_AGG_MODES,
    PolicyLossConfig,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss_vanilla,
    compute_value_loss,
)
from precision_harness.runs.runner.algorithms.torch_functional import (
    clip_by_value,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "ADV_ESTIMATORS",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "PolicyLossConfig",
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
