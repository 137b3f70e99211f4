"""One Ray instance shared by the verl runs of one gate process (a pytest session, a ``precision-harness`` command).

verl's ``main_ppo`` starts a local Ray instance when it finds none, and takes it down when it exits:
5-12 s each way on a 2-core machine, for every verl run. On the CPU the gate instead starts one
instance (:class:`SharedRay`) the first time a verl scenario runs, and each run joins it: ``RAY_ADDRESS``
(verl's ``ray.init`` connects), with Ray's own resources (8 CPUs for TransferQueue's storage and
verl's actors, one ``GPU`` per CPU core for the ranks, no dashboard) given at start. A run's
variables (the ``PRECISION_*`` ones, the CPU extension's, the determinism settings, the run's mark)
reach its Ray workers as the job's runtime environment (``RAY_JOB_CONFIG_JSON_ENV_VAR``); where verl's
own ``ray.init`` sets a variable too (``PYTHONHASHSEED``), verl's value wins, as it does in a run with
its own Ray (``RAY_OVERRIDE_JOB_RUNTIME_ENV``). The instance starts while the first driver imports
verl: the driver waits for it in the CPU extension (:func:`precision_harness.runs.verl.ray_head.wait_ready`).

Runs take the instance one at a time (:meth:`SharedRay.lease`): TransferQueue names its controller
actor in a fixed namespace, so two verl jobs on one instance would share it. After each run every
process of the run is reaped, as before, and the instance stays up.

The instance ends with its owner: :meth:`SharedRay.close` (a pytest session's end, ``atexit``), or its
watcher (:mod:`precision_harness.runs.verl.ray_head`) when the owner dies any other way (Ctrl-C, a kill).
An instance that died is noticed at the next lease (a fresh one starts) and by the run it killed
(:meth:`SharedRay.failure`). Other devices keep verl's own Ray per run (not tried here).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from precision_harness.runs.processes import ENV_RUN_ID
from precision_harness.runs.ray_cluster import HEAD_ENV, job_env
from precision_harness.runs.verl.ray_head import ENV_READY, FAILED, READY, take_down

#: Ray's CPUs: TransferQueue's storage unit and verl's actors each take one (verl_engine.cpu_overrides)
NUM_CPUS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Lease:
    """A run's use of the shared instance: its address and what the run's driver needs in its environment."""

    address: str
    ready: Path
    token: str  #: the instance's authentication token (Ray's token mode, as verl's own local Ray uses)

    def driver_env(self, env: dict[str, str], *, cwd: Path) -> dict[str, str]:
        """What a verl driver started in ``cwd`` adds to ``env`` (the run's variables, its mark included) to join the
        instance, its Ray workers getting the same variables and working directory
        (:func:`precision_harness.runs.ray_cluster.job_env`: Ray's workers start in the instance's folder, and the CPU
        extension moves them to the driver's, as a Ray of the run's own would have started them there)."""
        return {
            "RAY_ADDRESS": self.address,
            ENV_READY: str(self.ready),
            **job_env(env, cwd=cwd),
            **auth_env(self.token),
        }


def auth_env(token: str) -> dict[str, str]:
    """Ray's token authentication with the instance's own token (never the user's ``~/.ray/auth_token``)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


class SharedRay:
    """The gate process's Ray instance for verl runs on the CPU (see the module docstring). Thread-safe."""

    def __init__(self, *, num_gpus: int | None = None) -> None:
        self.num_gpus = num_gpus or os.cpu_count() or 1
        self._lock = threading.Lock()
        self._watcher: subprocess.Popen | None = None
        self._dir: Path | None = None
        self._mark = ""
        self._port = 0
        self._token = ""

    @contextlib.contextmanager
    def lease(self) -> Iterator[Lease]:
        """The instance for one run, started (or restarted, if it died) first; one run at a time."""
        with self._lock:
            if not self.alive():
                self._stop()
                self._start()
            assert self._dir is not None
            yield Lease(address=f"127.0.0.1:{self._port}", ready=self._dir / "ready", token=self._token)

    def _start(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="prray-", dir="/tmp"))  # Ray's socket paths must stay short
        self._mark = f"ray-{uuid.uuid4().hex}"
        self._port = _free_port()
        self._token = uuid.uuid4().hex + uuid.uuid4().hex
        ray = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={self._port}"]
        ray += [f"--num-cpus={NUM_CPUS}", f"--num-gpus={self.num_gpus}", "--include-dashboard=false"]
        ray += ["--disable-usage-stats", f"--temp-dir={self._dir}"]
        watcher = [sys.executable, "-m", "precision_harness.runs.verl.ray_head", f"--owner={os.getpid()}"]
        watcher += [f"--ready={self._dir / 'ready'}", f"--mark={self._mark}", "--", *ray]
        with open(self._dir / "ray_head.log", "wb") as log:
            self._watcher = subprocess.Popen(
                watcher,
                env={
                    **HEAD_ENV,  # what the user's environment sets of Ray's own wins
                    **os.environ,
                    ENV_RUN_ID: self._mark,
                    "RAY_USAGE_STATS_ENABLED": "0",
                    **auth_env(self._token),
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the gate, which takes Ray down in order
            )

    def alive(self) -> bool:
        """Whether the instance is starting or up: its watcher runs and, once ready, its GCS answers."""
        if self._watcher is None or self._watcher.poll() is not None or self._dir is None:
            return False
        state = self._state()
        if state.startswith(FAILED):
            return False
        if state != READY:
            return True
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self._port), timeout=2):
            return True
        return False

    def _state(self) -> str:
        try:
            return (self._dir / "ready").read_text(encoding="utf-8") if self._dir else ""
        except OSError:
            return ""

    def failure(self) -> str | None:
        """Why the instance a run just used is gone (None: it is up): for the run's one-line error."""
        if self.alive():
            return None
        state = self._state()
        why = state[len(FAILED) :] if state.startswith(FAILED) else "it stopped"
        return f"the session's shared Ray instance (127.0.0.1:{self._port}) failed during the run: {why}"

    def _stop(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                watcher.send_signal(signal.SIGTERM)
            try:
                watcher.wait(timeout=15)
            except subprocess.TimeoutExpired:
                watcher.kill()
                watcher.wait()
        if self._mark and self._dir is not None:
            take_down(self._mark, self._dir)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def close(self) -> None:
        """Take the instance down, every process of it; idempotent."""
        with self._lock:
            self._stop()


_SHARED: SharedRay | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> SharedRay:
    """This process's instance (created on first use; taken down at exit if :func:`shutdown` was not called)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = SharedRay()
            atexit.register(shutdown)
        return _SHARED


def shutdown() -> None:
    """Take this process's instance down, if one was started (a gate session's end)."""
    with _SHARED_LOCK:
        instance = _SHARED
    if instance is not None:
        instance.close()
