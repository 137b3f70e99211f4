"""Starting msprobe's debugger on a given rank, as each mindstudio-probe release takes it: the stage API's version
guard (:class:`~precision_harness.runs.stage_api.StageProbe`), in one place.

Why a guard: the stage API passes the rank explicitly, so a stage's folder is always ``rank<r>`` (verl's layout),
never msprobe's ``rank`` (no process group) or ``proc<pid>``. Read against each release's source:

- 26.0.0 to 26.2.0 (``msprobe/pytorch/dump/debugger/precision_debugger.py``, ``msprobe/core/dump/service.py``):
  ``PrecisionDebugger.start(model=None, token_range=None, rank_id=None, scheduled_tokens=None)``; the service's
  first ``start`` takes ``rank_id`` as its ``current_rank`` (which names the folder) instead of asking
  ``torch.distributed``.
- the 8.x line (8.3.3, the release CANN images ship: ``msprobe/pytorch/debugger/precision_debugger.py``,
  ``msprobe/core/service.py``): ``PrecisionDebugger.start(model=None, token_range=None)``, no ``rank_id`` (passed
  one, every run raised ``TypeError: PrecisionDebugger.start() got an unexpected keyword argument 'rank_id'``). Its
  service's first ``start`` sets ``current_rank`` from ``self._get_current_rank()`` (a static method of
  ``PytorchService``: ``torch.distributed``'s rank, or ``DistributedNotInitializedError`` and then the folder
  ``rank``). :func:`start` sets that method on the service instance to return the rank given, then calls
  ``start(model)``: the same ``current_rank`` as 26.x's ``rank_id``, read at the same point. The rest of the stage's
  calls (``stop``, ``service.reset_status``, ``service.config.dump_path``) are the same in both lines.

Before each start, :func:`~precision_harness.runs.inspect_cache.seed`: the releases before 26.1 take every API call's
stack with ``inspect.stack()``, which is 500 times slower from a worker started by ``python -c`` without it.

A release without ``rank_id`` and not of the 8.x line (older than 8, or a newer one that drops it) is refused in one
line (:class:`~precision_harness.errors.ProbeUnavailableError`) rather than guessed at.
"""

from __future__ import annotations

import inspect
from typing import Any

from precision_harness.errors import ProbeUnavailableError
from precision_harness.runs import inspect_cache
from precision_harness.runs.host.msprobe_release import DISTRIBUTION, MSPROBE_FLOOR, WANTED
from precision_harness.runs.host.package_versions import installed, release

#: the mindstudio-probe line whose debugger takes no ``rank_id`` and was read for :func:`start`
NO_RANK_ID_LINE = 8


def takes_rank_id(debugger: Any) -> bool:
    """Whether ``debugger.start`` (msprobe's ``PrecisionDebugger``) takes ``rank_id`` (26.x) or not (8.x)."""
    return "rank_id" in inspect.signature(debugger.start).parameters


def start(debugger: Any, model: Any, rank: int) -> None:
    """``debugger.start(model)`` (msprobe's ``PrecisionDebugger`` instance, a process-wide singleton) with its dump
    on rank ``rank``.

    Raises:
        ProbeUnavailableError: the release takes no ``rank_id`` and is not of the 8.x line read above.
    """
    inspect_cache.seed()
    if takes_rank_id(debugger):
        debugger.start(model, rank_id=rank)
        return
    version = installed(DISTRIBUTION) or "unknown"
    if release(version, parts=1) != (NO_RANK_ID_LINE,):
        raise ProbeUnavailableError(
            f"mindstudio-probe {version}: its PrecisionDebugger.start() takes no rank_id and the stage API was read "
            f"against the {NO_RANK_ID_LINE}.x line and mindstudio-probe>={MSPROBE_FLOOR} only: pip install {WANTED}"
        )
    # 8.x's PytorchService.start reads the rank from this static method once, at its first start
    debugger.service._get_current_rank = lambda: rank
    debugger.start(model)
