"""The ranks of one stage compared side by side, or two stages side by side: worker processes, one per core, where
they pay.

A rank's compare is CPU-bound Python (parsing its dump.json, naming its rows), so threads would share one
core; processes do not. Each worker reads and compares one rank pair at a time and sends back only its
:class:`~precision_harness.check.compare.stage_verdict.RankVerdict`, so memory stays near one rank's dumps per worker.

The workers are started once per process, on first need, with the ``spawn`` method (the pytest process holds
threads; a fork could copy a held lock), and are only used where they pay for their start-up (about a second,
importing msprobe's row parser):

- the run's dumps of the stage are at least :data:`MIN_POOL_BYTES` (4 times as many where the golden is indexed,
  :data:`INDEXED_SHARE`), and the stage has two ranks or more;
- this machine gives the process two cores or more;
- the process is not a pytest-xdist worker (``PYTEST_XDIST_WORKER``): xdist already fills the cores.

Otherwise the ranks are compared here, one after the other, each rank's dumps freed before the next.

Each worker is a lane of its own (a one-process executor), so a caller chooses where a job runs. A lone stage's
ranks go to the lanes in turn. Where a check has more stages to come (:func:`ahead`), each stage goes whole to one
lane and the next stage to another: a worker keeps what the ranks of one stage share (the parse of their dumps'
skeleton, :mod:`~precision_harness.dumps.skeleton`, about 4 s at 65,000 calls a rank), so stages side by side parse
each skeleton once, where one stage's ranks spread over the workers parse it once a worker.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from precision_harness.dumps.files import DUMP

T = TypeVar("T")

#: the smallest stage (bytes of the run's dump.json files) whose ranks go to the workers
MIN_POOL_BYTES = 32 << 20
#: a rank whose golden is indexed (:mod:`~precision_harness.dumps.dump_index`) costs about a quarter of one whose golden
#: is parsed too (a 30,000-call rank: 0.8 s against 3.2 s, its skeleton's parse included): its bytes count that much
#: toward :data:`MIN_POOL_BYTES`
INDEXED_SHARE = 4

#: a stage's jobs as :func:`ahead` takes them: its key, its jobs (one argument tuple per rank) and :func:`dump_bytes`
Stage = tuple[Hashable, Sequence[tuple[Any, ...]], int]

_lanes: list[ProcessPoolExecutor] = []
#: each lane's jobs that are running, waiting, or done but not yet asked for (with their stage's key), and the futures
#: of the stages started ahead, by key
_queued: list[list[tuple[Hashable, Future]]] = []
_ahead: dict[Hashable, list[Future]] = {}


def cores() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def map_ranks(fn: Callable[..., T], jobs: Sequence[tuple[Any, ...]], *, size: int, key: Hashable = None) -> Iterator[T]:
    """``fn(*job)`` of every job, in order: in the workers where they pay (module docstring), else here, lazily.

    Args:
        fn: a module-level function (the workers pickle it by name).
        jobs: its arguments, one tuple per rank; each must pickle.
        size: bytes of the run's dumps of the stage (:func:`dump_bytes`), over :data:`INDEXED_SHARE` where every rank's
            golden is indexed.
        key: the stage's key where it may have gone :func:`ahead` (then its jobs must be those ``ahead`` took).
    """
    submitted = _ahead.pop(key, None) if key is not None else None
    if submitted is not None:
        return (future.result() for future in submitted)
    workers = min(cores(), len(jobs))
    if not _pays(workers, size):
        return (fn(*job) for job in jobs)
    _started(workers)
    futures = [_submit(i % workers, fn, job) for i, job in enumerate(jobs)]
    return (future.result() for future in futures)


def ahead(fn: Callable[..., Any], stages: Sequence[Stage]) -> None:
    """Start the stages a caller will ask :func:`map_ranks` for next (with their keys), each stage whole on the lane
    with the fewest jobs left: a check's next stages side by side (module docstring). Nothing is started unless the
    workers pay for two stages or more of them (a lone stage's ranks are spread by :func:`map_ranks`); a stage already
    started is left as it is."""
    paying = [stage for stage in stages if _pays(cores(), stage[2])]
    if len(paying) < 2:
        return
    lanes = _started(cores())
    for key, jobs, _ in paying:
        if key in _ahead:
            continue
        lane = min(range(len(lanes)), key=lambda i: len(_left(i)))
        futures = _ahead[key] = []  # the key first: the stage's jobs done already still count on its lane
        futures += [_submit(lane, fn, job, key) for job in jobs]


def started(key: Hashable) -> bool:
    """The stage of ``key`` was started :func:`ahead` and not yet asked for."""
    return key in _ahead


def forget() -> None:
    """Drop the stages started :func:`ahead` and not asked for (a check that stopped early): those not yet running
    are cancelled."""
    for futures in _ahead.values():
        for future in futures:
            future.cancel()
    _ahead.clear()


def dump_bytes(target: Any, ranks: list[str]) -> int:
    """Bytes of the dump.json files of ``ranks`` in ``target`` (a StageSource; 0 for one that is not a folder on
    disk), the ``size`` :func:`map_ranks` is given."""
    folder = getattr(target, "path", None)
    if folder is None:
        return 0
    files = [Path(folder) / "step0" / rank / DUMP for rank in ranks]
    return sum(f.stat().st_size for f in files if f.is_file())


def _pays(workers: int, size: int) -> bool:
    return workers >= 2 and size >= MIN_POOL_BYTES and not os.environ.get("PYTEST_XDIST_WORKER")


def _submit(at: int, fn: Callable[..., Any], job: tuple[Any, ...], key: Hashable = None) -> Future:
    future = _lanes[at].submit(fn, *job)
    _queued[at] = [*_left(at), (key, future)]
    return future


def _left(at: int) -> list[tuple[Hashable, Future]]:
    """Lane ``at``'s jobs still to run, or run for a stage started ahead and not yet asked for."""
    return [(key, f) for key, f in _queued[at] if not f.done() or (key is not None and key in _ahead)]


def _started(workers: int) -> list[ProcessPoolExecutor]:
    """The lanes, at least ``workers`` of them (more are started where a larger stage needs them)."""
    while len(_lanes) < workers:
        _lanes.append(ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")))
        _queued.append([])
    return _lanes
