"""Test hook kept for ``verl_cpu/patches.py`` alone: ``PRECISION_TEST_PLANT=advantages`` in a verl run.

The built-in runner's planted changes live in the tests (``tests/hooks/``, docs/architecture.md#test-hooks),
patched in from outside; this module remains only because ``precision_harness.verl_cpu.patches``
(issue 19's area) still reads it, and goes once that plant moves to ``tests/hooks/`` too.
"""

from __future__ import annotations

import os

PLANT_ENV = "PRECISION_TEST_PLANT"
PLANT_SCALE = 1.0 + 1e-4
SITES = ("log_prob", "loss", "advantages")


def factor(site: str) -> float:
    """:data:`PLANT_SCALE` when ``$PRECISION_TEST_PLANT`` names ``site``, else 1.0.

    Raises:
        ValueError: the variable names no known site (a typo would otherwise plant nothing).
    """
    planted = os.environ.get(PLANT_ENV)
    if not planted:
        return 1.0
    if planted not in SITES:
        raise ValueError(f"{PLANT_ENV}={planted!r}: expected one of {', '.join(SITES)}")
    return PLANT_SCALE if planted == site else 1.0
