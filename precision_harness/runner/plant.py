"""Test hook: plant a small numeric change at one site the gate must catch (``PRECISION_TEST_PLANT=<site>``).

The harness's own tests use it to show that a change outside every module (which an L0 dump
cannot see) is caught at the same stage and step at ``level: auto`` as at L1. Each site scales
an operand by :data:`PLANT_SCALE` inside an op that runs anyway, so the dump's API structure
is unchanged and only numbers move; unset, the factor is exactly 1.0 and every run is bitwise
what it was:

* ``log_prob``: the temperature that divides the logits before ``logsumexp``/``gather``
  (``stages.forward_log_prob``; first seen by ``actor_compute_log_prob``);
* ``loss``: the gradient-accumulation scale of each micro-batch's policy loss (``stages.actor_update``);
* ``advantages``: the advantages, scaled between ``compute_advantage`` and the updates (outside
  every stage, as verl's driver computes them).
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
