"""Start the replay worker (``python -m precision_harness.runs.api_replay``) and read its answer; torch-free.

The worker runs with the CPU determinism environment of one thread
(:func:`~precision_harness.runs.numerics.devices.determinism_env`) and pins one thread itself, so the
baseline's reduction order is the same wherever the gate runs; the calling process never imports
torch.

Its float64 replay is the reference the run's output is judged against, so it loads none of the run's
start-up code (:mod:`precision_harness.runs.isolated`): it is a fresh ``python -I`` interpreter, without the
run's ``PYTHONPATH`` (where a ``sitecustomize.py`` may patch torch) or the user's site-packages. Only where the
session's warm server loaded none of that either (:func:`precision_harness.runs.warm.workers.started`) is the worker
forked from it, with torch and msprobe's acc_check already imported.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from precision_harness.errors import RunFailedError
from precision_harness.paths import display_path
from precision_harness.runs import isolated
from precision_harness.runs.numerics.devices import determinism_env
from precision_harness.runs.warm import workers as warm_mod

REQUEST, ANSWER, LOG = "replay_request.json", "replay.json", "replay.log"
#: the worker's entry point
MODULE = "precision_harness.runs.api_replay.__main__"


def replay_calls(
    rank_dir: Path, calls: list[dict[str, str]], *, out_dir: Path, timeout: float | None, warm: bool = False
) -> list[dict]:
    """Replay ``calls`` (``{"api", "output"}``) of the capture in ``rank_dir``; one result per call, in order.

    Request, answer and log go to ``out_dir``; ``warm``: fork the worker from the warm server when it is up and
    loaded no start-up code of the run (module docstring).

    Raises:
        RunFailedError: the worker exited non-zero or passed ``timeout`` seconds.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    request, answer, log = out_dir / REQUEST, out_dir / ANSWER, out_dir / LOG
    request.write_text(json.dumps({"rank_dir": str(rank_dir), "calls": calls}, indent=1), encoding="utf-8")
    answer.unlink(missing_ok=True)
    env = isolated.environment({**os.environ, **determinism_env("cpu", 1)})
    argv = [str(request), str(answer)]
    context = warm_mod.started() if warm else None
    if context is not None:  # a server that loaded no start-up code of the run: this checkout first, as a run's
        code = _forked(context, argv, {**env, "PYTHONPATH": isolated.SRC}, log, timeout)
    else:
        code = _fresh(argv, env, log, timeout)
    if code != 0 or not answer.is_file():
        raise RunFailedError(f"the replay worker exited with {code} (log: {display_path(log)})")
    results: list[dict[str, Any]] = json.loads(answer.read_text(encoding="utf-8"))["calls"]
    return results


def _timed_out(timeout: float | None, log: Path) -> RunFailedError:
    return RunFailedError(f"the replay worker timed out after {timeout:g} s (log: {display_path(log)})")


def _fresh(argv: list[str], env: dict[str, str], log: Path, timeout: float | None) -> int:
    command = isolated.command(MODULE.removesuffix(".__main__"), argv)
    with open(log, "wb") as fh:
        try:
            proc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise _timed_out(timeout, log) from None
    return proc.returncode


def _forked(context: Any, argv: list[str], env: dict[str, str], log: Path, timeout: float | None) -> int:
    process = warm_mod.start(context, argv, env, str(log), module=MODULE)
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        raise _timed_out(timeout, log)
    return int(process.exitcode or 0)
