"""Start one scenario run in its own worker process (``python -m precision_harness.runs.runner``).

msprobe's debugger is a process-wide singleton, so every run gets a fresh interpreter; the
calling process (pytest, the CLI) never imports torch. The worker's stdout/stderr go to
``RUN_DIR/worker.log``; multi-rank and cluster runs go through a Ray driver process
(``ray_launch``) instead, with the same contract. A failure is raised as :class:`RunFailedError`
with the worker's one-line reason and the log's path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_harness.errors import RunFailedError
from precision_harness.paths import display_path
from precision_harness.runs.numerics.devices import determinism_env
from precision_harness.runs.warm import workers as warm_mod
from precision_harness.scenarios.scenario import BuiltinScenario, Scenario


@dataclass(frozen=True)
class RunResult:
    """A finished run: its directory (verl layout), ``run.json`` contents and wall time (s)."""

    scenario: str
    run_dir: Path
    run_json: dict[str, Any]  #: the run's ``run.json`` (schema ``run_manifest``)
    wall_s: float

    def stage_dir(self, step: int, stage: str) -> Path:
        return self.run_dir / f"step_{step}" / stage


def worker_argv(scenario: Scenario, *, out_dir: Path, device: str, dump: bool = True) -> list[str]:
    """The arguments of ``python -m precision_harness.runs.runner`` (absolute: a warm child keeps the server's cwd)."""
    argv = [str(Path(scenario.path).resolve()), "--out", str(Path(out_dir).resolve()), "--device", device]
    return argv + ([] if dump else ["--no-dump"])


def worker_command(scenario: Scenario, *, out_dir: Path, device: str, dump: bool = True) -> list[str]:
    """A fresh worker's command line."""
    return [
        sys.executable,
        "-m",
        "precision_harness.runs.runner",
        *worker_argv(scenario, out_dir=out_dir, device=device, dump=dump),
    ]


def uses_ray(scenario: Scenario, ray_address: str | None) -> bool:
    """Multi-rank scenarios always run on Ray (a local instance without an address); others only with an address."""
    return bool(ray_address) or scenario.world_size > 1


@dataclass(frozen=True)
class RunOptions:
    """How a scenario run is started, besides its device and folder (defaults: as the gate runs it, fresh)."""

    dump: bool = True  #: False: no msprobe (the overhead benchmark's baseline); built-in scenarios only
    timeout: float | None = None  #: seconds the run may take (None: no limit)
    #: a Ray cluster to run on: every built-in scenario's ranks go there; a command gets it as ``RAY_ADDRESS``
    ray_address: str | None = None
    pinned: Any | None = None  #: the golden whose recorded rollouts a verl check run loads
    #: fork a single-rank built-in run from the warm server (:mod:`precision_harness.runs.warm.workers`) when its
    #: determinism environment matches the server's
    warm: bool = False
    #: variables laid over the determinism environment (the portability check's CPU dispatch
    #: settings, :mod:`precision_harness.portability`); such a run is always fresh
    dispatch_env: dict[str, str] | None = None
    #: a verl run's lease of this process's shared Ray instance (:mod:`precision_harness.runs.verl.shared_ray`): the
    #: command joins it, with the run's variables given to its Ray workers (set by the verl runner on the CPU)
    shared_ray: Any | None = None


def run_worker(scenario: BuiltinScenario, *, out_dir: Path, device: str, options: RunOptions) -> RunResult:
    """Run a built-in scenario in ``python -m precision_harness.runs.runner`` (or forked from the warm server).

    Multi-rank scenarios, and every scenario when ``options.ray_address`` is given, run in a Ray
    driver process (``precision_harness.runs.runner.ray_launch``) whose rank actors' dumps are fetched back into
    ``out_dir``.

    Raises:
        RunFailedError: the worker exited non-zero or timed out, or Ray is needed and not installed.
    """
    on_ray = uses_ray(scenario, options.ray_address)
    command = _command(scenario, out_dir=out_dir, device=device, options=options, on_ray=on_ray)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    determinism = determinism_env(device, scenario.config["trainer"]["num_threads"])
    env = {**os.environ, **determinism, **(options.dispatch_env or {})}
    # the worker must import this same checkout of precision_harness
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    log, timeout = out_dir / "worker.log", options.timeout
    warm = options.warm and not on_ray and not options.dispatch_env
    context = warm_mod.context_for(determinism) if warm else None
    if context is not None:
        argv = worker_argv(scenario, out_dir=out_dir, device=device, dump=options.dump)
        returncode = _run_warm(context, scenario, argv, env=env, log=log, timeout=timeout)
    else:
        returncode = _run_fresh(scenario, command, env=env, log=log, timeout=timeout)
    wall = time.perf_counter() - t0
    if returncode != 0:
        error = out_dir / "error.txt"
        reason = error.read_text(encoding="utf-8").strip() if error.is_file() else exit_reason(returncode, log)
        raise RunFailedError(f"{display_path(scenario.path)}: scenario run failed: {reason} (log: {display_path(log)})")
    run_json = json.loads((out_dir / "run.json").read_text(encoding="utf-8"))
    return RunResult(scenario=scenario.name, run_dir=out_dir, run_json=run_json, wall_s=wall)


def exit_reason(returncode: int, log: Path) -> str:
    """Why a worker that wrote no ``error.txt`` failed, in one line: its exit code, the signal that ended it
    (a negative code: a crash such as SIGSEGV, or a kill from outside), and the last line of its log, so the
    reason survives a CI job whose artifacts are gone."""
    why = f"exit code {returncode}"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            why = f"killed by {signal.Signals(-returncode).name} (exit code {returncode})"
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        lines = []
    last = next((line for line in reversed(lines) if line), "")
    return f"{why}; last log line: {last[:300]}" if last else why


def _command(scenario: Scenario, *, out_dir: Path, device: str, options: RunOptions, on_ray: bool) -> list[str]:
    """A fresh worker's command line, or the Ray driver's.

    Raises:
        RunFailedError: Ray is needed and not installed.
    """
    if not on_ray:
        return worker_command(scenario, out_dir=out_dir, device=device, dump=options.dump)
    from precision_harness.runs.runner import ray_launch

    if not ray_launch.ray_available():
        why = (
            f"trainer.world_size: {scenario.world_size} runs ranks as Ray actors"
            if not options.ray_address
            else f"--precision-ray-address {options.ray_address}"
        )
        raise RunFailedError(
            f"{display_path(scenario.path)}: {why}, but ray is not installed; {ray_launch.RAY_INSTALL_HINT}"
        )
    return ray_launch.driver_command(
        scenario.path, out_dir=out_dir, device=device, address=options.ray_address, dump=options.dump
    )


def _timed_out(scenario: Scenario, timeout: float | None, log: Path) -> RunFailedError:
    return RunFailedError(
        f"{display_path(scenario.path)}: worker timed out after {timeout:g} s (log: {display_path(log)})"
    )


def _run_fresh(scenario: Scenario, command: list[str], *, env: dict[str, str], log: Path, timeout: float | None) -> int:
    """Run ``command`` in a new interpreter; its exit code. Raises RunFailedError on timeout."""
    with open(log, "wb") as fh:
        try:
            proc = subprocess.run(command, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise _timed_out(scenario, timeout, log) from None
    return proc.returncode


def _run_warm(
    context: Any, scenario: Scenario, argv: list[str], *, env: dict[str, str], log: Path, timeout: float | None
) -> int:
    """Run the worker's ``main(argv)`` in a child of the warm server; its exit code.

    Raises:
        RunFailedError: the run passed ``timeout`` (the child is killed).
    """
    process = warm_mod.start(context, argv, env, str(log))
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        raise _timed_out(scenario, timeout, log)
    return process.exitcode
