"""The example's reward: a rule over the response's characters, so the seeded replica's trajectories are graded.

``compute_score`` has the signature of verl's ``reward.custom_reward_function``. The score is the share
of the response's characters that occur in the prompt's words (``ground_truth``), in [0, 1]: random
responses of a few letters score differently within each GRPO group, so the advantages, the policy
loss and the gradient are not 0.
"""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    letters = set(str(ground_truth).replace(" ", ""))
    text = [ch for ch in str(solution_str) if not ch.isspace()]
    if not text:
        return 0.0
    return sum(ch in letters for ch in text) / len(text)
