"""Run a command scenario: any process that writes verl's dump layout under ``$PRECISION_DUMP_DIR``.

The gate gives the command (run with the scenario file's folder as its working directory):

==========================  ===============================================================
``PRECISION_DUMP_DIR``      where the verl layout must appear (verl's ``global_profiler.save_path``)
``PRECISION_MSPROBE_CONFIG`` an msprobe ``config.json`` written from the scenario's level/scope/list
``PRECISION_STEPS``         comma list of ``global_profiler.steps``
``PRECISION_STAGES``        comma list of ``precision_debugger.stages``
``PRECISION_METRICS``       where the run may write a ``metrics.jsonl``
``PRECISION_SCENARIO_DIR``  the scenario file's folder (verl overrides read it as ``${oc.env:...}``)
``PRECISION_DEVICE``        the device the run is for (each rank records its stack for it, :mod:`..host.rank_env`)
==========================  ===============================================================

plus the scenario's ``env`` and the same thread pinning as a built-in scenario. After the command
exits, the run directory holds its dumps (``step_<n>/<stage>/step0/rank<r>/dump.json``), the
metrics (lines in verl's ``FileLogger`` form, ``{"step": n, "data": {...}}``, are converted to one
object per step) and a ``run.json`` written here. A command that is not found, exits non-zero or
runs past the timeout is a one-line :class:`RunFailedError` with the last lines of its log (a
timeout also names the last stage that was dumped).

The command runs in a session of its own, marked by ``PRECISION_RUN_ID`` in its environment. When it
ends (exit, failure or timeout) every process that still carries the mark is killed, by id: Ray's
GCS, raylet and workers, which verl's trainer starts and a killed driver leaves behind.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness.errors import RunFailedError
from precision_harness.paths import display_path
from precision_harness.runs import processes, ray_cluster
from precision_harness.runs.host import rank_env
from precision_harness.runs.host.rank_env import ENV_DEVICE
from precision_harness.runs.launch import RunOptions, RunResult
from precision_harness.runs.processes import ENV_RUN_ID, kill_group, reap
from precision_harness.runs.stage_api import (
    ENV_DUMP_DIR,
    ENV_METRICS,
    ENV_MSPROBE_CONFIG,
    ENV_STAGES,
    ENV_STEPS,
    check_dump_path,
)
from precision_harness.scenarios.fresh_steps import FRESH_METRICS

#: lines of the command's log quoted in a failure
LOG_TAIL = 5
ENV_SCENARIO_DIR = "PRECISION_SCENARIO_DIR"
METRICS = "metrics.jsonl"


@dataclass(frozen=True)
class CommandSpec:
    """How a command or verl scenario's process is started.

    Attributes:
        argv: the command line.
        env: the ``PRECISION_*`` variables and what the kind adds (verl's file logger, its CPU platform).
        metrics_exclude: ``metrics.jsonl`` globs never gated (verl's timings).
        header: lines the run's log starts with: every gate-owned override and variable.
    """

    argv: list[str]
    env: dict[str, str]
    metrics_exclude: tuple[str, ...] = ()
    header: list[str] = field(default_factory=list)
    #: ``timings(run_dir, clock, metrics)``: what the kind adds to ``run.json``'s ``timings`` from the finished
    #: run (verl: its start-up profile, :func:`precision_harness.runs.verl.profile.timings`); ``metrics`` are the
    #: lines the command wrote, timings included
    timings: Callable[[Path, dict[str, float], list[dict[str, Any]]], dict[str, Any]] | None = None
    #: steps whose ``metrics.jsonl`` rows go to :data:`~precision_harness.scenarios.fresh_steps.FRESH_METRICS`
    #: instead: sampled afresh, no golden compares them (verl's ``verl.fresh_steps``)
    fresh_steps: tuple[int, ...] = ()
    #: the command line of a recording's pass 1 (:func:`_generate_rollouts`), where it differs from ``argv``
    generate_argv: list[str] | None = None


@dataclass
class CommandClock:
    """When a command ran, in seconds since the epoch: started, exited, and its processes reaped; its pid."""

    started: float
    pid: int = 0
    exited: float = 0.0
    reaped: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.reaped - self.started

    def as_dict(self) -> dict[str, float]:
        return {"started": self.started, "exited": self.exited, "reaped": self.reaped, "driver_pid": self.pid}


#: how a command or verl scenario's run starts in a run folder on a device: ``spec_of(scenario, run_dir,
#: device=..., joins_ray=...)`` (:func:`precision_harness.runs.kind_runners.command_spec`, by the scenario's kind;
#: ``joins_ray``: the command joins a running Ray instance rather than starting its own)
SpecOf = Callable[..., CommandSpec]


def command_env(scenario: Any, run_dir: Path) -> dict[str, str]:
    """The ``PRECISION_*`` variables (and the scenario's ``env``) the command runs with."""
    config_path = run_dir / "msprobe_config.json"
    config_path.write_text(json.dumps(scenario.msprobe_config(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    env = {str(k): str(v) for k, v in scenario.config["env"].items()}
    env.update(
        {
            ENV_DUMP_DIR: str(run_dir),
            ENV_MSPROBE_CONFIG: str(config_path),
            ENV_STEPS: ",".join(map(str, scenario.steps)),
            ENV_STAGES: ",".join(scenario.stages),
            ENV_METRICS: str(run_dir / METRICS),
            ENV_SCENARIO_DIR: str(Path(scenario.folder).resolve()),
        }
    )
    return env


def run_command(
    scenario: Any,
    argv: list[str],
    *,
    run_dir: Path,
    env: dict[str, str],
    timeout: float | None,
    header: list[str] | None = None,
) -> CommandClock:
    """Run ``argv`` in the scenario's folder with ``env`` added; return when it started, exited and was reaped.

    ``header``: lines written at the top of ``run_dir/worker.log`` before the command's output.
    Every process left with the run's ``PRECISION_RUN_ID`` is killed when the command ends (:func:`reap`).

    Raises:
        RunFailedError: the command is not found, exits non-zero or runs past ``timeout`` (the
            message quotes the last lines of ``run_dir/worker.log`` and names it; a timeout names
            the last stage dumped).
    """
    shown = display_path(scenario.path)
    log = run_dir / "worker.log"
    run_id = env.get(ENV_RUN_ID) or uuid.uuid4().hex
    clock = CommandClock(started=time.time())
    with open(log, "wb") as fh:
        if header:
            fh.write("".join(f"{line}\n" for line in header).encode())
            fh.flush()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=scenario.folder,
                env={**os.environ, **env, ENV_RUN_ID: run_id},
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise RunFailedError(f"{shown}: command: {argv[0]!r} not found (run from {scenario.folder})") from None
        clock.pid = proc.pid
        processes.track(proc, run_id)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            reap(run_id)
            raise RunFailedError(
                f"{shown}: command timed out after {timeout:g} s; {last_stage(run_dir)}{_tail(log)}"
            ) from None
        except BaseException:
            kill_group(proc)
            reap(run_id)
            raise
        finally:
            processes.untrack(proc)
    clock.exited = time.time()
    reap(run_id)
    clock.reaped = time.time()
    if returncode != 0:
        raise RunFailedError(f"{shown}: command exited with {returncode}{_tail(log)}")
    return clock


def last_stage(run_dir: Path) -> str:
    """``last stage reached: step_<n>/<stage>`` (the newest dump folder), or that none was reached."""
    stages = [d for d in run_dir.glob("step_*/*/step0") if d.is_dir()]
    if not stages:
        return "no stage was reached"
    newest = max(stages, key=lambda d: d.stat().st_mtime)
    return f"last stage reached: {newest.parent.parent.name}/{newest.parent.name}"


def _tail(log: Path) -> str:
    lines = deque((line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()), LOG_TAIL)
    quoted = " | ".join(lines) if lines else "no output"
    return f"; last lines: {quoted} (log: {display_path(log)})"


def read_command_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of ``metrics.jsonl`` as the command wrote them (none when it wrote none)."""
    path = run_dir / METRICS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def normalize_metrics(run_dir: Path, *, exclude: list[str], fresh_steps: tuple[int, ...] = ()) -> None:
    """Rewrite ``metrics.jsonl`` as one object per step with ``training/global_step``, keys in ``exclude`` dropped;
    the rows of ``fresh_steps`` go to :data:`~precision_harness.scenarios.fresh_steps.FRESH_METRICS` instead.

    verl's ``FileLogger`` writes ``{"step": n, "data": {...}}``; our runner and the stage API write
    the flat form. Timing and throughput metrics (``exclude`` globs) move from run to run and are
    never gated. A fresh step sampled its own rollouts, so its row has no golden to be compared with.
    """
    path = run_dir / METRICS
    if not path.is_file():
        return
    rows, fresh = [], []
    for row in read_command_metrics(run_dir):
        if isinstance(row, dict) and set(row) == {"step", "data"} and isinstance(row["data"], dict):
            row = {**row["data"], "training/global_step": row["step"]}
        kept = {k: v for k, v in row.items() if not any(fnmatch.fnmatchcase(k, g) for g in exclude)}
        (fresh if kept.get("training/global_step") in fresh_steps else rows).append(kept)
    path.write_text(_jsonl(rows), encoding="utf-8")
    if fresh_steps:
        (run_dir / FRESH_METRICS).write_text(_jsonl(fresh), encoding="utf-8")


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def dumped_stages(run_dir: Path) -> set[tuple[int, str]]:
    """Every ``(step, stage)`` with a ``step0/rank*/dump.json`` in ``run_dir``."""
    found = set()
    for dump in run_dir.glob("step_*/*/step0/rank*/dump.json"):
        step = dump.parents[3].name[5:]
        if step.isdigit():
            found.add((int(step), dump.parents[2].name))
    return found


def shown_command(argv: list[str], run_dir: Path) -> str:
    """``argv`` as a golden records it: this interpreter as ``python``, the run folder as ``$RUN_DIR`` and
    the harness's own files (verl's agent-loop registry on cpu) under ``$PRECISION_HARNESS``, so a
    committed manifest names no path of the machine that recorded it."""
    package = str(Path(__file__).resolve().parents[2])
    text = " ".join(argv).replace(sys.executable, "python").replace(str(run_dir), "$RUN_DIR")
    return text.replace(package, "$PRECISION_HARNESS")


def command_fingerprint(
    argv: list[str], *, run_dir: Path, device: str, num_threads: int, environ: dict[str, str]
) -> dict[str, Any]:
    """A command run's ``env``, as the gate reads it without importing torch: python, the command
    (:func:`shown_command`), the machine's CPU, threads, the determinism variables ``environ`` gave the
    command for ``device``, the host's accelerator stack (CANN, drivers, chips:
    :func:`precision_harness.runs.host.stack.accelerator_stack`), and the package versions when the command
    runs this interpreter (verl's trainer does). Each rank's own record is laid over it afterwards
    (:func:`precision_harness.runs.host.rank_env.merged`)."""
    from precision_harness.runs.host import machine, stack
    from precision_harness.runs.numerics.devices import determinism_settings

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "command": shown_command(argv, run_dir),
        "machine": platform.machine(),
        **machine.cpu_fingerprint(),
        "num_threads": num_threads,
        "determinism_env": determinism_settings(device, num_threads, environ),
        **stack.accelerator_stack(device, environ),
    }
    if _runs_this_interpreter(argv):
        env.update(stack.package_versions())
    return env


def _runs_this_interpreter(argv: list[str]) -> bool:
    first = shutil.which(argv[0]) if argv else None
    return first is not None and Path(first).resolve() == Path(sys.executable).resolve()


def write_run_json(
    scenario: Any, run_dir: Path, *, env: dict[str, Any], device: str, timings: dict[str, Any]
) -> dict[str, Any]:
    """``run.json`` for a command run (``env``: :func:`command_fingerprint`; ``timings``: ``total_s`` and what
    the kind adds, schema ``run_manifest``): what the golden manifest records, and what was dumped undeclared."""
    declared = {(s, st) for s in scenario.steps for st in scenario.stages}
    undeclared = sorted(f"step_{s}/{st}" for s, st in dumped_stages(run_dir) - declared)
    manifest = {
        "format": 1,
        "scenario": scenario.name,
        "scenario_hash": scenario.hash,
        "kind": scenario.kind,
        "device": device,
        "level": scenario.level,
        "dump": True,
        "rank": 0,
        "world_size": 1,
        "env": env,
        "steps": list(scenario.steps),
        "stages": list(scenario.stages),
        "numeric_settings": scenario.numeric_settings,
        "undeclared": undeclared,
        "timings": {"stages": {}, **timings},
    }
    (run_dir / "run.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


#: where a verl scenario's pinned rollouts live in a run directory (and in its golden)
ROLLOUTS = "rollouts"


def _generate_rollouts(
    scenario: Any, argv: list[str], *, run_dir: Path, env: dict[str, str], timeout: float | None, header: list[str]
) -> CommandClock:
    """Pass 1 of a recording run with pinned rollouts: run once to generate and save the rollouts, keep only them.

    verl's trainer feeds a batch it generated and one it loaded from ``skip.rollout_tq`` to the
    training stages in different row orders (it regroups a loaded batch by prompt), so the micro-batches,
    their padding and every dumped shape differ between the two paths. Check runs always load, so the
    golden must come from a run that loaded too: pass 2 (the caller) replays what this pass saved.
    The pass's log is kept as ``worker.generate.log``; each pass has the full ``timeout``.
    """
    head = [*header, "precision gate: pass 1 of 2: generating the rollouts to pin (its dumps are discarded)"]
    clock = run_command(scenario, argv, run_dir=run_dir, env=env, timeout=timeout, header=head)
    for entry in run_dir.iterdir():
        if entry.name in (ROLLOUTS, "msprobe_config.json"):
            continue
        if entry.name == "worker.log":
            entry.replace(run_dir / "worker.generate.log")
        elif entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return clock


def launch_command(
    scenario: Any, *, run_dir: Path, device: str, options: RunOptions, spec_of: SpecOf
) -> dict[str, Any]:
    """Run a command (or verl) scenario into ``run_dir``, started as ``spec_of`` says; return its ``run.json``.

    Of ``options``: ``dispatch_env`` is laid over the determinism environment and the scenario's own
    ``env``; ``pinned`` is the golden whose recorded rollouts a verl check run loads (None: generate
    them); ``ray_address`` is given as ``RAY_ADDRESS``, so a ``ray.init()`` in the command (verl's
    trainer makes one) joins that cluster, with the run's variables as its job's runtime environment on every node.
    Its nodes must see ``run_dir`` (a shared filesystem): the ranks write their dumps there. Each node is asked
    before the run, and reaped after it (:mod:`precision_harness.runs.ray_cluster`).

    Raises:
        RunFailedError: as :func:`run_command`, or msprobe would reject ``run_dir``, or on a cluster: it does not
            answer, or a node cannot read ``run_dir``.
    """
    from precision_harness.runs.numerics.devices import determinism_env

    try:
        check_dump_path(run_dir)
    except ValueError as exc:
        raise RunFailedError(f"{display_path(scenario.path)}: {exc}") from None
    pinned, timeout = options.pinned, options.timeout
    if pinned is not None:
        names = [n for n in pinned.contents if n.startswith(f"{ROLLOUTS}/")]
        pinned.export(run_dir, names)
    spec = spec_of(scenario, run_dir, device=device, joins_ray=bool(options.ray_address or options.shared_ray))
    argv, env, exclude, header = spec.argv, spec.env, spec.metrics_exclude, spec.header
    threads = scenario.config["trainer"]["num_threads"]
    env = {**determinism_env(device, threads), **env, **(options.dispatch_env or {}), ENV_DEVICE: device}
    cwd = Path(scenario.folder).resolve()
    if options.ray_address:  # the run's variables (its mark too) go to its workers on every node of the cluster
        env.update({ENV_RUN_ID: uuid.uuid4().hex, "RAY_ADDRESS": options.ray_address})
        env.update(ray_cluster.job_env(env, cwd=cwd))
    if options.shared_ray is not None:  # the same on the gate's shared Ray
        env[ENV_RUN_ID] = uuid.uuid4().hex
        env.update(options.shared_ray.driver_env(env, cwd=cwd))
    before = 0.0
    with _cluster_watched(options.ray_address, run_dir, env):
        if pinned is None and scenario.pins_rollouts:
            generate = spec.generate_argv or argv
            first = _generate_rollouts(scenario, generate, run_dir=run_dir, env=env, timeout=timeout, header=header)
            before = first.wall_s
            header = [*header, "precision gate: pass 2 of 2: the run the golden keeps, on the rollouts pass 1 saved"]
        clock = run_command(scenario, argv, run_dir=run_dir, env=env, timeout=timeout, header=header)
    timings: dict[str, Any] = {"total_s": round(before + clock.wall_s, 6)}
    if spec.timings is not None:
        timings.update(spec.timings(run_dir, clock.as_dict(), read_command_metrics(run_dir)))
    normalize_metrics(run_dir, exclude=list(exclude), fresh_steps=spec.fresh_steps)
    fingerprint = command_fingerprint(
        argv, run_dir=run_dir, device=device, num_threads=threads, environ={**os.environ, **env}
    )
    fingerprint = rank_env.merged(fingerprint, rank_env.read(run_dir))
    return write_run_json(scenario, run_dir, env=fingerprint, device=device, timings=timings)


def _cluster_watched(address: str | None, run_dir: Path, env: dict[str, str]) -> Any:
    """:func:`precision_harness.runs.ray_cluster.watched` for a run on an existing cluster; nothing otherwise."""
    if not address:
        return contextlib.nullcontext()
    return ray_cluster.watched(address, run_dir, env[ENV_RUN_ID])


def run_command_scenario(
    scenario: Any, *, out_dir: Path, device: str, options: RunOptions, spec_of: SpecOf
) -> RunResult:
    """Run a command or verl scenario into a fresh ``out_dir`` (:func:`launch_command`), timed.

    Raises:
        RunFailedError: as :func:`launch_command`, or ``options.dump`` is off (built-in scenarios only).
    """
    if not options.dump:
        raise RunFailedError(f"{display_path(scenario.path)}: runs without msprobe are for built-in scenarios only")
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    t0 = time.perf_counter()
    run_json = launch_command(scenario, run_dir=out_dir.resolve(), device=device, options=options, spec_of=spec_of)
    return RunResult(scenario=scenario.name, run_dir=out_dir, run_json=run_json, wall_s=time.perf_counter() - t0)
