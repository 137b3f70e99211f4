"""The example's reward: 1.0 when the last number in the response equals the answer, else 0.0.

verl calls it as ``reward.custom_reward_function`` (``name: compute_score``) with the signature of
verl's rule-based scores (``verl/utils/reward_score``).
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the last integer in ``solution_str`` is ``ground_truth``, else 0.0."""
    numbers = _NUMBER.findall(solution_str)
    return 1.0 if numbers and numbers[-1] == str(ground_truth).strip() else 0.0
