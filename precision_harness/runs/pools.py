"""The thread pools a gate session starts its scenario runs on, sized per device.

``--precision-jobs N`` set: one pool of N runs, whatever their devices. Unset: one pool per device,
of :meth:`~precision_harness.options.PrecisionOptions.jobs_for` runs (the CPU count on cpu, 1 on npu
and cuda), so CPU runs overlap and device runs, which take the host's accelerators, go one at a time.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from precision_harness.options import PrecisionOptions


class RunPools:
    """Thread-safe; :meth:`close` waits for the runs in flight and cancels the queued ones."""

    def __init__(self, options: PrecisionOptions) -> None:
        self._options = options
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def pool(self, device: str) -> ThreadPoolExecutor:
        """The pool a run on ``device`` starts on (made on first use)."""
        key = "all" if self._options.jobs is not None else device
        with self._lock:
            if key not in self._pools:
                workers = self._options.jobs_for(device)
                self._pools[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"precision-run-{key}")
            return self._pools[key]

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
