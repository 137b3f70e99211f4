"""The ranks of one stage compared side by side: a process pool sized to the CPU count, where it pays.

A rank's compare is CPU-bound Python (parsing its dump.json, naming its rows), so threads would share one
core; processes do not. Each worker reads and compares one rank pair at a time and sends back only its
:class:`~precision_harness.check.compare.RankVerdict`, so memory stays near one rank's dumps per worker.

The pool is started once per process, on first need, with the ``spawn`` method (the pytest process holds
threads; a fork could copy a held lock), and is only used where it pays for its start-up (about a second,
importing msprobe's row parser):

- the run's dumps of the stage are at least :data:`MIN_POOL_BYTES`, and the stage has two ranks or more;
- this machine gives the process two cores or more;
- the process is not a pytest-xdist worker (``PYTEST_XDIST_WORKER``): xdist already fills the cores.

Otherwise the ranks are compared here, one after the other, each rank's dumps freed before the next.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from precision_harness.dumps.files import DUMP

T = TypeVar("T")

#: the smallest stage (bytes of the run's dump.json files) whose ranks go to the pool
MIN_POOL_BYTES = 32 << 20

_pool: ProcessPoolExecutor | None = None
_pool_size = 0


def cores() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def map_ranks(fn: Callable[..., T], jobs: Sequence[tuple[Any, ...]], *, size: int) -> Iterator[T]:
    """``fn(*job)`` of every job, in order: in the pool where it pays (module docstring), else here, lazily.

    Args:
        fn: a module-level function (the pool pickles it by name).
        jobs: its arguments, one tuple per rank; each must pickle.
        size: bytes of the run's dumps of the stage.
    """
    workers = min(cores(), len(jobs))
    if workers < 2 or size < MIN_POOL_BYTES or os.environ.get("PYTEST_XDIST_WORKER"):
        return (fn(*job) for job in jobs)
    return _executor(workers).map(fn, *zip(*jobs, strict=True))


def dump_bytes(target: Any, ranks: list[str]) -> int:
    """Bytes of the dump.json files of ``ranks`` in ``target`` (a StageSource; 0 for one that is not a folder on
    disk), the ``size`` :func:`map_ranks` is given."""
    folder = getattr(target, "path", None)
    if folder is None:
        return 0
    files = [Path(folder) / "step0" / rank / DUMP for rank in ranks]
    return sum(f.stat().st_size for f in files if f.is_file())


def _executor(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_size
    if _pool is None or _pool_size < workers:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
        _pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        _pool_size = workers
    return _pool
