"""The patches of verl's precision debugger that every device shares, for verl 0.9.1 only (the CPU's own
patches of verl, 1 to 5, are in :mod:`precision_harness.runs.verl.cpu.patches`; these keep its numbers).

Reaching into verl: its ``PrecisionDebuggerProfiler`` (``verl.utils.profiler.precision_debugger_profile``) has
no hook before the debugger starts or after it stops, and the stage's batch and return value exist only
inside the wrapper its ``annotate`` returns. The wrapper calls the private ``_resolve_global_step``,
``_should_collect``, ``_normalize_stage`` and reads ``_dump_root`` (:func:`.stage_window.observe`), so
:func:`apply` refuses any verl but :data:`precision_harness.runs.verl.release.SUPPORTED_VERSIONS`, and the
gate refuses ``level: auto`` under another verl before the run starts
(:func:`precision_harness.runs.verl.engine.check_stage_window_version`). verl 0.9.1 calls ``impl.annotate``
when the stage runs (``DistProfiler.annotate`` in ``verl/utils/profiler/profile.py``), on every device and
engine, so patching the class before the first stage is enough.

7. ``PrecisionDebuggerProfiler.annotate``: the wrapper it returns (start the debugger, run the stage, stop it)
   runs inside :func:`.stage_window.observe`, which times the stage for the run's profile and, at ``level:
   auto``, records what the stage read from verl's batch and produced (``stage_outputs.json``), before the
   debugger starts and after it stopped. What the stage computes and dumps is unchanged.
8. msprobe's own time, for the profile's dump share (timing only; nothing msprobe computes or writes
   changes): ``PrecisionDebuggerProfiler.start`` and ``.stop`` (the debugger's set-up, and the writing of
   ``dump.json``) and the collecting methods of msprobe's ``DataCollector``
   (``msprobe.core.dump.data_dump.data_collector``: the statistics each hook computes) add their time to
   :attr:`.timeline.StageClock.inside_msprobe`. Another msprobe layout leaves them untimed.

Both are applied when their module is first imported (:func:`.on_import.when_imported`).
"""

from __future__ import annotations

import functools
from typing import Any

from precision_harness.runs.verl.release import SUPPORTED_VERSIONS, stage_window_version_message
from precision_harness.runs.verl.stages import on_import, stage_window, timeline


def _observed_annotate(original: Any) -> Any:
    """Patch 7: ``PrecisionDebuggerProfiler.annotate`` whose stage wrapper runs inside :func:`.stage_window.observe`."""

    @functools.wraps(original)
    def annotate(self: Any, message: Any = None, color: Any = None, domain: Any = None, category: Any = None, **kw):
        decorator = original(self, message=message, color=color, domain=domain, category=category, **kw)
        stage = self._normalize_stage(kw.get("role"))
        if stage is None:
            return decorator

        def observed(func: Any) -> Any:
            wrapped = decorator(func)

            @functools.wraps(func)
            def wrapper(worker: Any, *args: Any, **kwargs: Any) -> Any:
                with stage_window.observe(self, stage, worker, args, kwargs) as window:
                    window["result"] = wrapped(worker, *args, **kwargs)
                return window["result"]

            return wrapper

        return observed

    annotate.__precision_patched__ = True
    return annotate


def _observe_stages(precision_profile: Any) -> None:
    """Patches 7 and 8 (the debugger's part): the stage wrapper, and the debugger's start and stop timed."""
    profiler = precision_profile.PrecisionDebuggerProfiler
    if getattr(profiler.annotate, "__precision_patched__", False):
        return
    profiler.annotate = _observed_annotate(profiler.annotate)
    profiler.start = timeline.timed_in_msprobe(profiler.start)
    profiler.stop = timeline.timed_in_msprobe(profiler.stop)


#: the collecting methods of msprobe's DataCollector (patch 8): where every hook computes its statistics
MSPROBE_COLLECTORS = (
    "forward_input_data_collect",
    "forward_output_data_collect",
    "forward_data_collect",
    "forward_data_collect_only_tensor",
    "backward_data_collect",
    "backward_data_collect_only_tensor",
    "backward_input_data_collect",
    "backward_output_data_collect",
    "params_data_collect",
)


def _time_msprobe_collector(data_collector: Any) -> None:
    """Patch 8 (the hooks' part): msprobe's data collector timed; another msprobe layout is left as it is."""
    collector = getattr(data_collector, "DataCollector", None)
    for name in MSPROBE_COLLECTORS if collector is not None else ():
        method = getattr(collector, name, None)
        if method is not None and not getattr(method, "__precision_patched__", False):
            setattr(collector, name, timeline.timed_in_msprobe(method))


#: each patch, keyed by the module whose import applies it
DEFERRED: tuple[tuple[str, Any], ...] = (
    ("verl.utils.profiler.precision_debugger_profile", _observe_stages),
    ("msprobe.core.dump.data_dump.data_collector", _time_msprobe_collector),
)


def apply(version: str) -> None:
    """Apply patches 7 and 8, each when its module is first imported (now if it already is); idempotent.

    Raises:
        RuntimeError: ``version`` is not one the patches were checked against (one line).
    """
    on_import.apply_checked(version, SUPPORTED_VERSIONS, stage_window_version_message(version), DEFERRED)
