"""What ``import verl`` runs in each verl process of a run with pinned rollouts (``VERL_USE_EXTERNAL_MODULES``):
the loaded rollouts' reward computed again by the scenario's reward function (:mod:`.rescore`), and, when the
scenario declares ``rollout_compute_log_prob``, the rollout engine scoring the pinned responses
(:mod:`.engine_scoring`; nothing happens at a step the stage is not declared for). Nothing else.

Raises:
    RuntimeError: the installed verl is not one :mod:`.rescore` and :mod:`.engine_scoring` were checked against
        (one line).
"""

from __future__ import annotations

import importlib.metadata

from precision_harness.runs.verl import engine_scoring, rescore

rescore.apply(importlib.metadata.version("verl"))
engine_scoring.apply(importlib.metadata.version("verl"))
