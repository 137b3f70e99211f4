"""What ``import verl`` runs in each verl process of a run with pinned rollouts (``VERL_USE_EXTERNAL_MODULES``):
the loaded rollouts' reward computed again by the scenario's reward function (:mod:`.rescore`), nothing else.

Raises:
    RuntimeError: the installed verl is not one :mod:`.rescore` was checked against (one line).
"""

from __future__ import annotations

import importlib.metadata

from precision_harness.runs.verl import rescore

rescore.apply(importlib.metadata.version("verl"))
