"""The watcher of a gate process's shared Ray instance: ``python -m precision_harness.runs.verl.ray_head``.

Started by :class:`precision_harness.runs.verl.shared_ray.SharedRay` (the gate's process is its owner), it runs
``ray start --head`` and writes its ready file (``ready`` or ``failed: <why>``), then waits. When the
owner ends (any way: a finished session, Ctrl-C, a kill) or the watcher is told to stop (SIGTERM,
SIGINT, SIGHUP), it kills every process of that Ray instance: each carries the instance's
``PRECISION_RUN_ID`` mark in its environment (GCS, raylet, agents and workers inherit it), and the
mark finds them (:func:`precision_harness.runs.processes.reap`); it kills the verl drivers still
running on it too (a gate killed mid-run cannot), found by the ready file in their environment;
then it removes the instance's temp folder (``/tmp/prray-*``: sockets, logs, the ready file). So no
Ray process, no verl driver of it, and no file of it outlives the gate process that started it, even
one killed before it could tear Ray down itself.

:func:`wait_ready` is what a verl driver does before ``ray.init`` (the CPU extension calls it): the
driver's imports and Ray's start-up overlap.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

#: the variable naming the ready file a verl driver waits for (:func:`wait_ready`)
ENV_READY = "PRECISION_RAY_READY"
READY, FAILED = "ready", "failed: "
#: how long a driver waits for the shared Ray to be up (s); ``ray start`` takes 5-12 s on 2 loaded cores
READY_TIMEOUT_S = 180.0


def write_state(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def wait_ready(path: str | None = None, *, timeout: float = READY_TIMEOUT_S) -> None:
    """Wait until the shared Ray named by ``$PRECISION_RAY_READY`` (or ``path``) is up; nothing to wait for without one.

    Raises:
        RuntimeError: it failed to start, or is not up after ``timeout`` s (one line).
    """
    path = path or os.environ.get(ENV_READY)
    if not path:
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(path).read_text(encoding="utf-8")
        except OSError:
            state = ""
        if state == READY:
            return
        if state.startswith(FAILED):
            raise RuntimeError(f"precision gate: the shared Ray instance did not start: {state[len(FAILED) :]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"precision gate: the shared Ray instance was not up after {timeout:g} s ({path})")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owner", type=int, required=True, help="the gate process; Ray goes when it goes")
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--mark", required=True, help="the PRECISION_RUN_ID every process of this Ray carries")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ray start --head ...")
    args = parser.parse_args(argv)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.append(True))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    sys.stdout.write(proc.stdout)
    sys.stdout.flush()
    if proc.returncode != 0:
        last = " | ".join(line.strip() for line in proc.stdout.splitlines()[-3:] if line.strip())
        write_state(args.ready, f"{FAILED}ray start exited with {proc.returncode}: {last}")
    else:
        write_state(args.ready, READY)
        while not stop and os.getppid() == args.owner:
            time.sleep(0.2)
    take_down(args.mark, args.ready.parent)
    # the owner removes the folder when it stops Ray itself; killed, or interrupted mid-teardown, it cannot
    shutil.rmtree(args.ready.parent, ignore_errors=True)
    return 0


def holders(folder: Path) -> list[int]:
    """Live processes with a file open under ``folder`` (or working in it): every process of a Ray instance keeps
    its log files in the instance's folder, its agents too, which Ray starts without the mark."""
    prefix, found = str(folder), []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith(prefix) for link in links):
            found.append(int(entry.name))
    return found


def drivers(ready: Path) -> set[int]:
    """Live processes that were handed this instance (``$PRECISION_RAY_READY`` is ``ready``): the verl drivers of
    the gate's runs. They carry their run's mark, not the instance's, and a gate killed mid-run cannot reap them."""
    from precision_harness.runs.processes import with_variable

    return with_variable(ENV_READY, str(ready))


def take_down(mark: str, folder: Path) -> list[int]:
    """Kill every process of the Ray instance marked ``mark`` whose files are in ``folder``, and the drivers it was
    handed to; return those left."""
    from precision_harness.runs.processes import reap

    left = reap(mark, grace_s=3.0)
    # an agent whose raylet died first is no one's descendant any more; a driver is its run's, not Ray's
    for pid in {*holders(folder), *drivers(folder / "ready")}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


if __name__ == "__main__":
    sys.exit(main())
