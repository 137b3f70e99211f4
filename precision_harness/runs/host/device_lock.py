"""One run at a time on a host's set of accelerators, across processes: pytest-xdist's workers (``-n auto`` on a
device host) and two gate sessions of one CI runner.

In one gate process, runs on npu or cuda already go one at a time (``PrecisionOptions.jobs_for``). Each xdist
worker is a process of its own, though, with its own pools: two verl scenarios would start on the same devices at
once, each asking for every accelerator its ``trainer.n_gpus_per_node`` names, and race for their memory (or, on
Ascend, fail to open HCCL). So a run on npu or cuda takes a lock file per device set first, and a run that finds the
set taken says so in one line and waits.

The device set is what the run's process would see: ``ASCEND_RT_VISIBLE_DEVICES`` on npu, ``CUDA_VISIBLE_DEVICES``
on cuda, ``all`` where it is unset. Runs given different sets run side by side (a runner that splits its
accelerators between workers); runs given the same set, as xdist's workers inherit it, go one at a time. Sets that
overlap without being equal (``0,1`` and ``1,2``) are not told apart: give each worker a disjoint set. A run on an
existing Ray cluster (``--precision-ray-address``) takes no lock: the cluster's scheduler places it.

The locks are files (``filelock``) in ``<tmp>/precision-device-locks/``, released by the operating system when the
process holding them dies, so a killed gate never leaves a set taken.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

#: the variable that names a device type's visible accelerators
VISIBLE = {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES"}


def device_set(device: str, env: Mapping[str, str] | None = None) -> str:
    """The accelerators a run on ``device`` sees: its visible-devices variable, normalised (``"0,1"``), or ``all``."""
    raw = (env if env is not None else os.environ).get(VISIBLE[device], "").strip()
    indices = [part.strip() for part in raw.split(",") if part.strip()]
    return ",".join(indices) if indices else "all"


def lock_path(device: str, env: Mapping[str, str] | None = None) -> Path:
    """The lock file of ``device``'s set (its characters other than digits, letters and commas made ``_``)."""
    name = re.sub(r"[^0-9A-Za-z,]", "_", device_set(device, env)).replace(",", "-")
    return Path(tempfile.gettempdir()) / "precision-device-locks" / f"{device}-{name}.lock"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def taken(device: str, *, ray_address: str | None = None, say: Callable[[str], None] = _say) -> Iterator[None]:
    """Hold ``device``'s set for the body: at once where it is free, else after ``say`` told the wait in one line.
    Nothing is held on the CPU or on an existing Ray cluster."""
    if device not in VISIBLE or ray_address:
        yield
        return
    path = lock_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say(
            f"[precision] {device} devices {device_set(device)}: another gate process is running on them "
            f"(pytest-xdist worker or another session); this run waits for them ({path})"
        )
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
