"""How each kind of scenario runs: one :class:`KindRunner` per ``Scenario.kind``, in :data:`RUNNERS`.

A scenario describes a run (:mod:`precision_harness.scenarios`); this module turns its kind into
one. ``builtin``: our PPO loop in a worker process (:func:`~precision_harness.runs.launch.run_worker`);
``command``: the scenario's own argv, run by :mod:`~precision_harness.runs.command.run`; ``verl``:
verl's trainer with the overrides the gate owns (:func:`~precision_harness.runs.verl.engine.command_spec`),
run the same way. A verl scenario is also checked against the installed verl (installed, the
stages it dumps, the overrides the gate owns, Hydra's composition of the rest) by
:func:`load_scenario`, the loader the plugin, the session and the CLI use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from precision_harness.errors import RunFailedError, VerlMissingError
from precision_harness.paths import display_path
from precision_harness.runs import launch, processes
from precision_harness.runs.command import run as command_runner
from precision_harness.runs.command.run import CommandSpec
from precision_harness.runs.host import device_lock
from precision_harness.runs.launch import RunOptions, RunResult
from precision_harness.runs.verl import engine as verl_engine
from precision_harness.runs.verl import shared_ray
from precision_harness.scenarios.scenario import Scenario


def _nothing_to_check(scenario: Scenario) -> None:
    """A kind whose scenario file says all there is to check (the built-in loop, a command)."""


@dataclass(frozen=True)
class KindRunner:
    """How one kind of scenario runs."""

    #: ``run(scenario, *, out_dir, device, options)``: the run, into a fresh ``out_dir``
    run: Callable[..., RunResult]
    #: ``command(scenario, env, run_dir, device, joins_ray)``: a command or verl scenario's argv and environment
    #: (``env``: the ``PRECISION_*`` variables; ``joins_ray``: it joins a running Ray); None for a kind that is
    #: no command
    command: Callable[[Scenario, dict[str, str], Path, str, bool], CommandSpec] | None = None
    #: checks that need the engine the kind runs on, made when a scenario is loaded to be run
    preflight: Callable[[Scenario], None] = _nothing_to_check
    #: why the engine the kind runs on is not installed here (one line), else None
    engine_missing: Callable[[Scenario], str | None] = lambda scenario: None


def _argv_as_written(
    scenario: Scenario, env: dict[str, str], run_dir: Path, device: str, joins_ray: bool = False
) -> CommandSpec:
    """A command scenario's own argv, with the ``PRECISION_*`` variables."""
    return CommandSpec(list(scenario.config["command"]), env)


def _check_verl(scenario: Scenario) -> None:
    """An ``engine: verl`` scenario needs verl installed, stages verl dumps, and overrides verl's config has.

    Raises:
        VerlMissingError: verl is not installed (the scenario's items cannot run).
        ScenarioError: a stage verl does not dump, an override of a key the gate owns, or one Hydra rejects.
    """
    verl_engine.check_engine(scenario.path, list(scenario.stages))
    overrides = scenario.config["verl"]["overrides"]
    verl_engine.check_user_overrides(scenario.path, overrides)
    verl_engine.compose(overrides, source=f"{scenario.path}: verl.overrides")


def _run_command(scenario: Scenario, *, out_dir: Path, device: str, options: RunOptions) -> RunResult:
    return command_runner.run_command_scenario(
        scenario, out_dir=out_dir, device=device, options=options, spec_of=command_spec
    )


def _run_verl(scenario: Scenario, *, out_dir: Path, device: str, options: RunOptions) -> RunResult:
    """A verl run: on the CPU (no ``--precision-ray-address``) on this process's shared Ray instance.

    Raises:
        RunFailedError: as a command run; one whose shared Ray died says so (the next run starts a fresh one).
    """
    if device != "cpu" or options.ray_address:
        return _run_command(scenario, out_dir=out_dir, device=device, options=options)
    instance = shared_ray.shared()
    with instance.lease() as lease:
        try:
            return _run_command(scenario, out_dir=out_dir, device=device, options=replace(options, shared_ray=lease))
        except RunFailedError as exc:
            why = instance.failure()
            if why is None:
                raise
            raise RunFailedError(
                f"{display_path(scenario.path)}: {why}; the next verl run starts a fresh one. The run: {exc}"
            ) from None


#: every kind of scenario, by ``Scenario.kind``
RUNNERS: dict[str, KindRunner] = {
    "builtin": KindRunner(run=launch.run_worker),
    "command": KindRunner(run=_run_command, command=_argv_as_written),
    "verl": KindRunner(
        run=_run_verl,
        command=verl_engine.command_spec,
        preflight=_check_verl,
        engine_missing=lambda scenario: verl_engine.missing_reason(scenario.path),
    ),
}


def run_scenario(scenario: Scenario, *, out_dir: Path, device: str, options: RunOptions | None = None) -> RunResult:
    """Run ``scenario`` to completion in a subprocess, into a fresh ``out_dir``, as its kind runs
    (:data:`RUNNERS`): a built-in scenario through :func:`~precision_harness.runs.launch.run_worker`,
    a command or verl scenario through its own command
    (:func:`~precision_harness.runs.command.run.run_command_scenario`). ``options`` default: as the gate
    runs it, fresh.

    A run on npu or cuda holds the host's device set while it runs (:mod:`~precision_harness.runs.host.device_lock`):
    one at a time across pytest-xdist's workers and gate sessions, unless it runs on an existing Ray cluster.

    Raises:
        RunFailedError: the run exited non-zero or timed out, or Ray is needed and not installed.
    """
    how = options or RunOptions()
    with device_lock.taken(device, ray_address=how.ray_address):
        return RUNNERS[scenario.kind].run(scenario, out_dir=Path(out_dir), device=device, options=how)


#: starts one run of a scenario into a folder, its device and options bound (:func:`bind`)
Run = Callable[[Scenario, Path], RunResult]


def bind(device: str, options: RunOptions | None = None) -> Run:
    """:func:`run_scenario` on ``device`` with ``options``, as a :data:`Run`."""
    how = options or RunOptions()
    return lambda scenario, out_dir: run_scenario(scenario, out_dir=out_dir, device=device, options=how)


def command_spec(scenario: Scenario, run_dir: Path, *, device: str = "cpu", joins_ray: bool = False) -> CommandSpec:
    """How a command or verl scenario's run starts in ``run_dir``: the ``PRECISION_*`` environment
    (:func:`~precision_harness.runs.command.run.command_env`) laid under what the scenario's kind adds
    (``joins_ray``: the command joins a running Ray instance, a cluster's or the shared one).

    Raises:
        ScenarioError: a verl scenario on cpu with an unsupported verl or an override of a CPU-owned key.
    """
    spec_of = RUNNERS[scenario.kind].command
    assert spec_of is not None, f"a {scenario.kind} scenario is no command"
    return spec_of(scenario, command_runner.command_env(scenario, run_dir), run_dir, device, joins_ray)


def preflight(scenario: Scenario) -> Scenario:
    """``scenario``, once its kind's checks against the engine it runs on pass (see :data:`RUNNERS`).

    Raises:
        VerlMissingError: an ``engine: verl`` scenario and no verl installed.
        ScenarioError: the engine rejects the scenario (one line naming the file and the field).
    """
    RUNNERS[scenario.kind].preflight(scenario)
    return scenario


def load_scenario(path: str | Path) -> Scenario:
    """:meth:`Scenario.load <precision_harness.scenarios.scenario.Scenario.load>`, then :func:`preflight`:
    how the plugin, the session and the CLI load a scenario they may run.

    Raises:
        ScenarioError: as :meth:`Scenario.load <precision_harness.scenarios.scenario.Scenario.load>` and
            :func:`preflight` (VerlMissingError where an ``engine: verl`` scenario finds no verl).
    """
    return preflight(Scenario.load(path))


def collect_scenario(path: str | Path) -> Scenario:
    """:func:`load_scenario` for collection: a scenario whose engine is not installed here (verl) loads without
    the engine's checks, so its items exist and each says it cannot run (:func:`engine_missing`).

    Raises:
        ScenarioError: as :func:`load_scenario`, except VerlMissingError.
    """
    scenario = Scenario.load(path)
    try:
        return preflight(scenario)
    except VerlMissingError:
        return scenario


def engine_missing(scenario: Scenario) -> str | None:
    """Why ``scenario``'s engine is not installed here (one line naming the fix), or None (its kind needs none,
    or it is installed)."""
    return RUNNERS[scenario.kind].engine_missing(scenario)


def stop() -> None:
    """End what this process's runs left running: commands still in flight (a session interrupted mid-run, Ctrl-C)
    and the shared Ray instance of its verl runs. Nothing a gate session started outlives it."""
    processes.stop_running()
    shared_ray.shutdown()
