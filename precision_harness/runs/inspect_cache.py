"""inspect's file-to-module cache, seeded for the frames a process runs from no file, so that msprobe's per-call
``inspect.stack()`` costs what it costs over files: the one place that reaches into the standard library's
``inspect`` internals, behind a version guard.

Why: mindstudio-probe before 26.1 (8.3.3's ``DataProcessor`` in ``core/data_dump/data_processor/base.py``, 26.0.0's
``analyze_api_call_stack`` in ``core/dump/data_dump/data_processor/pytorch_processor.py``) takes each API call's
stack with ``inspect.stack()``; 26.1 walks ``sys._getframe`` instead. For each frame, ``inspect.getframeinfo`` asks
``inspect.getmodule`` for the frame's module (``getsourcefile``, then ``findsource``). A frame whose code names no
file (``<string>``: ``python -c``, as multiprocessing's forkserver starts the warm workers; ``<frozen runpy>``:
``python -m``) is never in ``inspect.modulesbyfile``, so each such lookup walks the whole of ``sys.modules`` (about
3,800 modules once torch and transformers are imported). Measured on a 2-core AMD EPYC, Python 3.11: 45 ms a stack
from a ``python -c`` process against 0.08 ms from a file, and a scenario's first step under msprobe 8.3.3 took
306 s against 17 s under 26.2.0.

What: :func:`seed` enters each such frame of the current stack in ``inspect.modulesbyfile`` under the module its
code runs as (``frame.f_globals["__name__"]``), keyed as ``getmodule`` looks it up: the name itself (what
``getsourcefile`` and ``findsource`` pass it, whatever the working directory) and ``inspect.getabsfile``'s path. The
frames below a worker's entry point are those of every stack msprobe takes in it. ``inspect.stack()`` returns the
same records either way (the file name, line, function and no source lines: neither a ``-c`` module's nor a frozen
module's loader gives source), only without the walk.

The guard: ``modulesbyfile`` and ``getmodule``'s walk read the same in CPython 3.10 to 3.13 (``Lib/inspect.py``).
Another release, or a cache of another shape, is left alone: stacks are then only slower.
"""

from __future__ import annotations

import inspect
import sys

#: the CPython releases whose ``inspect.getmodule`` was read for :func:`seed`
CHECKED_PYTHON = ((3, 10), (3, 11), (3, 12), (3, 13))


def _no_file(name: str) -> bool:
    return name.startswith("<") and name.endswith(">")


def seed() -> list[str]:
    """Enter the current stack's frames that name no file (``<string>``, ``<frozen ...>``) in
    ``inspect.modulesbyfile``; the pseudo file names entered (none outside :data:`CHECKED_PYTHON`)."""
    cache = getattr(inspect, "modulesbyfile", None)
    if sys.version_info[:2] not in CHECKED_PYTHON or not isinstance(cache, dict):
        return []
    entered = []
    frame = sys._getframe(1)
    while frame is not None:
        name, module = frame.f_code.co_filename, frame.f_globals.get("__name__")
        if _no_file(name) and name not in entered and isinstance(module, str) and module in sys.modules:
            cache[name] = cache[inspect.getabsfile(frame, name)] = module
            entered.append(name)
        frame = frame.f_back
    return entered
