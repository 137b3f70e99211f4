"""What each verl process records for the gate's start-up profile: when it started and was ready, each dumped stage.

Appended as JSON lines to ``$PRECISION_DUMP_DIR/verl_timeline.jsonl``
(:data:`precision_harness.runs.verl.profile.TIMELINE`; the gate reads it after the run,
:func:`precision_harness.runs.verl.profile.profile`). Times are seconds since the epoch (``time.time()``),
so lines from every process of the machine share one clock:

- ``{"event": "process", "pid", "started", "ready"}``: the process's start (from ``/proc``: its age
  subtracted from now, 10 ms resolution) and the moment the CPU support
  (:mod:`precision_harness.runs.verl.cpu.extension`) finished, that is, once ``import verl`` and the CPU
  support's own imports were done (:func:`process_ready`; on the CPU only);
- ``{"event": "stage", "pid", "rank", "step", "stage", "start", "end", "dump_s"}``: a profiled stage on
  one rank, from before the debugger starts to after it stopped (on the CPU, and at ``level: auto`` on a
  device: wherever :mod:`.debugger` is applied); ``dump_s`` is the time spent inside
  msprobe: the debugger's start and stop (which writes ``dump.json``) and its data collector, the
  statistics every hook computes (:class:`StageClock`).

Nothing is recorded when ``PRECISION_DUMP_DIR`` is unset (verl run outside the gate). Recording never
raises: a profile is not worth a failed run.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from precision_harness.runs.verl.profile import TIMELINE

_LOCK = threading.Lock()


def _path() -> Path | None:
    root = os.environ.get("PRECISION_DUMP_DIR")
    return Path(root) / TIMELINE if root else None


def record(**event: Any) -> None:
    """Append one event line (with this process's pid) to the run's timeline; never raises."""
    path = _path()
    if path is None:
        return
    line = json.dumps({"pid": os.getpid(), **event}, sort_keys=True) + "\n"
    with contextlib.suppress(OSError), _LOCK, open(path, "a", encoding="utf-8") as fh:
        fh.write(line)


def process_started() -> float | None:
    """This process's start, seconds since the epoch (Linux ``/proc``; None elsewhere)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: starttime
    return time.time() - (uptime - started_after_boot)


def process_ready() -> None:
    """Record this process's start and now (its imports done)."""
    record(event="process", started=process_started(), ready=time.time())


class StageClock:
    """Times one profiled stage on one rank and the share of it spent inside msprobe (see the module)."""

    #: seconds spent inside msprobe since the process started (the patched debugger and data collector add to it)
    inside_msprobe = 0.0

    def __init__(self, stage: str, step: Any, rank: int) -> None:
        self.stage, self.step, self.rank = stage, step, rank
        self.start = time.time()
        self.msprobe_at_start = StageClock.inside_msprobe

    def finish(self) -> None:
        record(
            event="stage",
            rank=self.rank,
            step=self.step,
            stage=self.stage,
            start=self.start,
            end=time.time(),
            dump_s=round(StageClock.inside_msprobe - self.msprobe_at_start, 6),
        )


def timed_in_msprobe(func: Any) -> Any:
    """``func`` (a method of msprobe's debugger or data collector), adding its time to
    :attr:`StageClock.inside_msprobe`."""
    import functools

    @functools.wraps(func)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            StageClock.inside_msprobe += time.perf_counter() - t0

    timed.__precision_patched__ = True
    return timed
