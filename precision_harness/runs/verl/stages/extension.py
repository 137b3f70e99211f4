"""What ``import verl`` runs in each verl process of a gate run on the CPU, and at ``level: auto`` on any device
(``VERL_USE_EXTERNAL_MODULES``): the precision debugger's stage window (:mod:`.debugger`), nothing else.

It needs no platform of the gate's: on ``cuda`` and ``npu`` verl's own platform, engines and rollout run.

Raises:
    RuntimeError: the installed verl is not one the patches were checked against (one line).
"""

from __future__ import annotations

import importlib.metadata

from precision_harness.runs.verl.stages import debugger

debugger.apply(importlib.metadata.version("verl"))
