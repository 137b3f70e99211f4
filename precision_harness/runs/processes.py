"""The processes of a command or verl run: marked, tracked, and killed so that none outlives the run or the session.

Every command run starts in a session of its own with ``PRECISION_RUN_ID`` in its environment; the
processes it starts inherit the mark (Ray's GCS, raylet and workers too), so :func:`reap` finds them,
and their descendants (Ray's agents, which Ray starts with an environment of their own), by id.
Running commands are tracked (:func:`track`), so a session that ends mid-run (Ctrl-C) kills them
(:func:`stop_running`): they are in sessions of their own, out of reach of the terminal's SIGINT. A CI cancel or a
job timeout (SIGTERM), or a closed terminal (SIGHUP), ends the gate as Ctrl-C does (:func:`stop_on_signals`), so
the same clean-up runs. Linux ``/proc`` only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path

#: marks every process a command run starts, so that none outlives it (:func:`reap`)
ENV_RUN_ID = "PRECISION_RUN_ID"


def track(proc: subprocess.Popen, run_id: str) -> None:
    """Note a command running now (its run id: what :func:`stop_running` reaps)."""
    with _RUNNING_LOCK:
        _RUNNING[proc.pid] = (proc, run_id)


def untrack(proc: subprocess.Popen) -> None:
    with _RUNNING_LOCK:
        _RUNNING.pop(proc.pid, None)


#: the commands running now, by pid, with their run ids (:func:`stop_running`)
_RUNNING: dict[int, tuple[subprocess.Popen, str]] = {}
_RUNNING_LOCK = threading.Lock()


def stop_running() -> None:
    """Kill every command this process is running, and all its processes (a session ended mid-run, e.g. by Ctrl-C:
    the commands sit in sessions of their own, which the terminal's SIGINT does not reach). Each one's
    :func:`run_command` then fails as an exited command does."""
    with _RUNNING_LOCK:
        running = list(_RUNNING.values())
    for proc, run_id in running:
        kill_group(proc)
        reap(run_id)


#: the signals that end a gate process as Ctrl-C does (:func:`stop_on_signals`)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stop_on_signals() -> None:
    """Make SIGTERM and SIGHUP raise KeyboardInterrupt in this process, as SIGINT does, where they still have their
    default action (one the caller installed, or SIGHUP ignored under ``nohup``, is kept); only from the main thread.

    By default both end the process at once: no ``finally`` runs, so the commands it started (each in a session of
    its own) and their processes would be left to their own watchers. As an interrupt, pytest and the CLI unwind:
    each run kills its command and reaps its mark (:func:`run_command`'s clean-up, :func:`stop_running`). Once one
    arrives, further ones are ignored, so a second SIGTERM (CI repeats it) does not cut that clean-up short.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _interrupt)


def _interrupt(signum: int, _frame: object) -> None:
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == _interrupt:
            signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"{signal.Signals(signum).name}: stopping every run of this process")


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the command's session (it was started in one of its own) and wait for the command."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _parents() -> dict[int, int]:
    """``{pid: parent pid}`` of every live process (Linux /proc; zombies left out)."""
    out = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            out[int(entry.name)] = int(fields[1])
    return out


def with_variable(name: str, value: str, pids: Iterable[int] | None = None) -> set[int]:
    """The ids of live processes (``pids``, default all; never this one) whose environment holds ``name=value``
    (Linux /proc)."""
    wanted = f"{name}={value}".encode()
    if pids is None:
        pids = (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()) if Path("/proc").is_dir() else ()
    found = set()
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            found.add(pid)
    return found


def marked_processes(run_id: str) -> list[int]:
    """The ids of live processes whose environment holds ``PRECISION_RUN_ID=run_id`` (Linux /proc), and of their
    descendants: Ray's raylet starts its agents with an environment of their own, without the mark."""
    parents = _parents()
    found = with_variable(ENV_RUN_ID, run_id, parents)
    grown = True
    while grown:  # children of marked processes, then theirs
        more = {pid for pid, parent in parents.items() if parent in found and pid != os.getpid()} - found
        grown = bool(more)
        found |= more
    return sorted(found)


def reap(run_id: str, *, grace_s: float = 5.0) -> list[int]:
    """Terminate, then kill, every process marked with ``run_id`` and their descendants; return those left.

    Ray's GCS and raylet, started by a command's ``ray.init()``, sit in sessions of their own and
    survive a killed driver; they and Ray's workers inherit the command's environment, so the mark
    finds them, and their descendants are found from them before they go (Ray's agents).
    """
    targets = set(marked_processes(run_id))
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        if not targets:
            break
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            live = _parents()
            targets = {pid for pid in targets if pid in live} | set(marked_processes(run_id))
            if not targets:
                break
            time.sleep(0.1)
    return sorted(targets)
