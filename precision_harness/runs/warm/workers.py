"""Warm workers: scenario runs forked from a server that already imported torch, transformers and msprobe.

Importing torch, transformers' Qwen2 and msprobe is over half of a small scenario's run. The
standard library's ``multiprocessing`` *forkserver* imports them once (:data:`PRELOAD`) in a
server process; each run is a child forked from it, so it starts with the modules loaded and still
is a fresh process: msprobe's debugger is a process-wide singleton and is first built in the child.

Why this is safe for determinism:

- The server is started with the run's determinism environment (:func:`devices.determinism_env`),
  because torch fixes its CPU dispatch (``ATEN_CPU_CAPABILITY``) and the OpenMP/MKL settings are
  read when torch loads. A run whose environment differs from the server's in those variables
  (another device or thread count) gets a fresh process instead (:func:`context_for`).
- Importing builds no torch thread pool, no CUDA/NPU context and no msprobe debugger; the child
  seeds, pins threads and picks the device itself (``numerics.devices.setup``), as a fresh process does.
- ``PYTHONHASHSEED`` is fixed at the server's start and inherited.

The child re-applies the caller's whole environment, sends stdout/stderr to the run's
``worker.log`` and runs the same ``precision_harness.runs.runner`` entry point as a fresh worker; its
exit code is that entry point's. Ray and command scenarios never come here.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import sys
import threading
from multiprocessing.context import BaseContext
from typing import Any

from precision_harness.runs import isolated
from precision_harness.runs.warm import shared as warm_shared

#: what the server imports once (the worker's heavy imports; nothing here builds a device context)
PRELOAD = (
    "precision_harness.runs.runner.lean_imports",  # first: transformers must not find scikit-learn or SciPy
    "torch",
    "numpy",
    "transformers.models.qwen2.modeling_qwen2",
    "msprobe.pytorch",
    "precision_harness.runs.runner.__main__",
    "precision_harness.runs.runner.trainer",
    "precision_harness.runs.stage_api",
    # the replay worker of a failing stage's judgement (precision_harness.runs.api_replay): msprobe's acc_check
    "precision_harness.runs.api_replay.__main__",
    "precision_harness.runs.api_replay.replay",
    "msprobe.pytorch.api_accuracy_checker.acc_check.data_generate",
    "msprobe.pytorch.api_accuracy_checker.compare.api_precision_compare",
)
#: the module the forkserver preloads: it imports :data:`PRELOAD` through :func:`preload`
GUARDED_PRELOAD = "precision_harness.runs.warm.preload"
#: the entry point a child runs by default: one scenario run (``python -m precision_harness.runs.runner``)
RUNNER = "precision_harness.runs.runner.__main__"

_lock = threading.Lock()
_server_env: dict[str, str] | None = None
#: what the server's interpreter may have loaded at start-up that an isolated one does not
#: (:func:`~precision_harness.runs.isolated.start_up_code`), read from this process's environment when it started
_server_start_up: str | None = None


def preload() -> None:
    """Import :data:`PRELOAD`, each module that raises left out.

    The forkserver's own preload skips only ``ImportError``: any other error (mindstudio-probe 8.3.3 under numpy 2
    raises ``AttributeError``) ends the server, and every run then fails with ``EOFError: unexpected EOF``. A
    module left out here is imported by the run itself, which says in one line why it cannot
    (:mod:`precision_harness.runs.host.msprobe_release`).

    What was imported is then frozen (``gc.freeze``, as Python's ``gc`` documentation advises before a server
    forks): a child's collections no longer walk the million objects torch, transformers and msprobe made, which
    was a fifth of a small scenario's CPU time in the child, and the pages holding them stay shared.
    """
    import gc
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # the run's own import reports it
            continue
    gc.collect()
    gc.freeze()


def context_for(determinism: dict[str, str]) -> BaseContext | warm_shared.SharedServers | None:
    """The forkserver context whose server was started with ``determinism`` (None: use a fresh process).

    The first call starts the server with ``determinism`` in its environment; a later call with
    other values gets None, because what torch read at import cannot change in a child.
    Where ``PRECISION_WARM_DIR`` is set, the shared servers instead (:mod:`precision_harness.runs.warm.shared`):
    there each run environment has its own server.
    """
    global _server_env
    shared = warm_shared.configured()
    if shared is not None:
        return shared
    with _lock:
        if _server_env is None:
            _start_server(determinism)
            _server_env = dict(determinism)
        if _server_env != determinism:
            return None
    return multiprocessing.get_context("forkserver")


def _start_server(determinism: dict[str, str]) -> None:
    """Start the forkserver with ``determinism`` in its environment; the caller's environment is restored.

    The forkserver takes this process's environment (it has no ``env`` argument), so the variables
    are set around its start. Only those keys change, and only to the values every run of this
    environment gets anyway, so another thread starting a process meanwhile sees a whole environment.
    """
    global _server_start_up
    multiprocessing.get_context("forkserver").set_forkserver_preload([GUARDED_PRELOAD])
    _server_start_up = isolated.start_up_code(os.environ)
    saved = {key: os.environ.get(key) for key in determinism}
    os.environ.update(determinism)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def started() -> BaseContext | warm_shared.SharedServers | None:
    """The forkserver context if this process started the warm server already (whatever its determinism environment)
    and it loaded no start-up code an isolated interpreter leaves out, else None.

    The replay worker takes it where it exists: its figures do not depend on the server's thread settings
    (it pins one thread itself), and starting a server for it alone would cost what a fresh process does.
    A server that imported a ``sitecustomize`` from ``PYTHONPATH`` or the user's site-packages
    (:func:`~precision_harness.runs.isolated.start_up_code`) may have patched what the replay is the reference
    for, so it is never taken. Where ``PRECISION_WARM_DIR`` is set, the shared servers, when this process's
    environment carries no such code (a server for the replay's environment is started with it).
    """
    shared = warm_shared.configured()
    if shared is not None:
        return shared if isolated.start_up_code(os.environ) is None else None
    with _lock:
        if _server_env is None or _server_start_up is not None:
            return None
        return multiprocessing.get_context("forkserver")


def run_child(argv: list[str], env: dict[str, str], log_path: str, module: str = RUNNER) -> None:
    """The forked child: the caller's environment, output to ``log_path``, then ``module``'s ``main(argv)``.

    Exits with its exit code (the runner: 0 ok, 1 failed with ``error.txt`` written).
    """
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    import importlib
    import time

    worker = importlib.import_module(module)
    if module == RUNNER:
        worker._T0 = time.perf_counter()  # import_s is what this run imported, not the server's preload
        worker.WARM = True
    code = worker.main(argv)
    # a fresh interpreter runs its atexit handlers at exit; multiprocessing's child would skip them
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def start(
    context: BaseContext | warm_shared.SharedServers,
    argv: list[str],
    env: dict[str, str],
    log_path: str,
    module: str = RUNNER,
) -> Any:
    """Fork a child of the warm server running :func:`run_child` (``module``'s ``main``); returns the ``Process``
    (a :class:`~precision_harness.runs.warm.shared.SharedChild` from a shared server)."""
    if isinstance(context, warm_shared.SharedServers):
        return context.start(argv, env, log_path, module)
    process = context.Process(
        target=run_child, args=(argv, env, log_path, module), name="precision-worker", daemon=False
    )
    process.start()
    return process
