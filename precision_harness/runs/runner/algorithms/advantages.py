"""Advantage estimators, registered by verl's ``algorithm.adv_estimator`` names: GAE and GRPO
(``verl.trainer.ppo.core_algos``'s advantage section).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from precision_harness.runs.runner.algorithms.torch_functional import masked_whiten


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
