"""Built-in deterministic prompts (arithmetic questions) and the rule reward."""

from __future__ import annotations

import random
from dataclasses import dataclass

SOURCES = ("arithmetic",)


@dataclass(frozen=True)
class Prompt:
    text: str
    answer: str
    uid: int


def arithmetic_prompts(*, seed: int, step: int, batch_size: int) -> list[Prompt]:
    """``batch_size`` questions like ``"37+5="`` for a 1-based training ``step``.

    The stream is a pure function of (seed, step), so a step's prompts do not depend on how many
    earlier steps ran or were profiled.
    """
    rng = random.Random(seed * 1_000_003 + step)
    prompts = []
    for i in range(batch_size):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice("+-*")
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        prompts.append(Prompt(text=f"{a}{op}{b}=", answer=str(value), uid=(step - 1) * batch_size + i))
    return prompts


def rule_reward(response: str, answer: str) -> float:
    """Partial-credit score in [0, 1] for a decoded response.

    ``0.1`` for putting any digit (or a leading minus sign) in the response, plus ``0.9 x`` the
    fraction of the answer's characters matched position by position, starting at the first digit or
    minus sign. An untrained model earns the format credit often enough that rewards vary inside a
    GRPO group, so group-normalised advantages are not all zero.
    """
    start = next((i for i, c in enumerate(response) if c.isdigit() or c == "-"), None)
    if start is None:
        return 0.0
    candidate = response[start : start + len(answer)]
    matched = sum(1 for x, y in zip(candidate, answer, strict=False) if x == y)
    return 0.1 + 0.9 * matched / len(answer)
