"""What the gate costs a verl user's CI against the same training run without it, as ratios within one run.

Issue 55, item 8 (target: at most 1.3x). In one invocation, alternating which goes first, on the same machine:

- ``gate``: the check as a user's CI runs it, ``pytest scenarios/<scenario>.yaml`` in the scenario's project
  (the folder with its ``pytest.ini``; a fresh pytest each time, its artifacts in a throwaway folder): the
  scenario at its own level (``level: auto`` for the committed ``grpo_dp2_bf16_cpu``) on the session's
  shared Ray, then every item compared against the committed golden. It must pass.
- ``plain``: the same ``python -m verl.trainer.main_ppo`` command, built from the gate's own
  :class:`~precision_harness.runs.command.run.CommandSpec` (the user's overrides, the gate's CPU overrides
  and variables, its determinism variables, its steps, logger and no validation or checkpoints) with the
  gate's instrumentation removed (:func:`plain_spec`): no ``global_profiler.*`` (no profiler tool, so no
  precision debugger and no msprobe), no actor or critic ``profiler.*``, no ``skip.rollout_tq.*`` (rollouts
  sampled, as a user's run samples them), no stage window or rank-stack module in
  ``VERL_USE_EXTERNAL_MODULES``, none of the msprobe config, steps, stages or stage-outputs variables (so
  the CPU rollout server records no rollout and no weight-sync file). It starts verl's own Ray, as a user's
  run does, and runs through the gate's command runner (its own session, every process reaped after it).

What both keep (the gate's CPU support, without which verl does not run on a CPU): the CPU platform,
rollout server, agent loop, sampler and patches (:func:`precision_harness.runs.verl.engine.cpu_env`,
:func:`~precision_harness.runs.verl.engine.cpu_overrides`), FSDP2's zero-filled all-gather buffers, the
portable CPU kernels, the pinned threads, verl's file logger, and the CPU support's own records: each
process's start in ``verl_timeline.jsonl`` and the actor-side sha256 of each synced tensor.

Printed per pair: the wall time of each (``gate``: the whole pytest invocation; ``plain``: the command from
its start to every process reaped) and their ratio; the CPU time of each one's process tree (every
descendant's own user and system time, sampled with psutil every :data:`SAMPLE_S` s; this process is made
a child subreaper so Ray's processes stay in the tree; a process's last fraction of a sample and one that
lives less than a sample go uncounted, alike on both sides); then the medians, and where the time went:
verl's start-up, steps (of them the dumped stages and msprobe's own time, on rank 0), shut-down, from
each run's profile (:func:`precision_harness.runs.verl.profile.profile`), and, for the gate, its compare
(pytest's summary line) and the rest of the pytest process (start-up, collection, scenario checks, golden,
report, the shared Ray); and the CPU time of each kind of process (:func:`role`). Nothing is asserted.

On another device (``--device cuda``, ``npu``) both run there: the check with ``--precision-device``, the plain
run with that device's determinism variables and the gate's modules for it (FSDP2's zero-filled buffers kept).

Usage: python benchmarks/verl_cost.py [--scenario PATH] [--device cpu|cuda|npu] [--repeat N] [--warm-up N]
       [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from precision_harness.runs import kind_runners  # noqa: E402
from precision_harness.runs.command import run as command_runner  # noqa: E402
from precision_harness.runs.command.run import CommandSpec  # noqa: E402
from precision_harness.runs.numerics.devices import DEVICES, determinism_env  # noqa: E402
from precision_harness.runs.stage_api import ENV_MSPROBE_CONFIG, ENV_STAGES, ENV_STEPS  # noqa: E402
from precision_harness.runs.verl import engine as verl_engine  # noqa: E402
from precision_harness.runs.verl import profile as verl_profile  # noqa: E402
from precision_harness.scenarios.scenario import Scenario  # noqa: E402

SCENARIO = REPO / "examples" / "verl_cpu" / "scenarios" / "grpo_dp2_bf16_cpu.yaml"
#: the issue's target for gate / plain, wall time
TARGET = 1.3
#: seconds between samples of the process tree's CPU time
SAMPLE_S = 0.25
#: override keys of the gate's instrumentation (a leading ``+`` ignored): what the plain run drops
INSTRUMENTATION_KEYS = ("global_profiler.", "actor_rollout_ref.actor.profiler.", "critic.profiler.", "skip.rollout_tq.")
#: variables of the gate's instrumentation: msprobe's config, the dumped steps and stages, the stage outputs
INSTRUMENTATION_ENV = (ENV_MSPROBE_CONFIG, ENV_STEPS, ENV_STAGES, verl_engine.STAGE_OUTPUTS_ENV)
#: modules of the gate's instrumentation that ``import verl`` loads: the stage window, each rank's stack record
INSTRUMENTATION_MODULES = (verl_engine.STAGES_MODULE, verl_engine.RANK_STACK_MODULE)
#: a Ray of the plain run's own: verl's bare ``ray.init()`` would join the newest ``ray start`` cluster of the host
#: (Ray's ``/tmp/ray/ray_current_cluster``), another gate's shared Ray, say, and refuse the run's ``num_cpus``
OWN_RAY = {"RAY_ADDRESS": "local"}
_COMPARE = re.compile(r"\bon \w+: run [0-9.]+ s.*, compare ([0-9.]+) s -> ")
_PR_SET_CHILD_SUBREAPER = 36


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+")


def plain_spec(gate: CommandSpec) -> CommandSpec:
    """The gate's verl command (``gate``, from :func:`precision_harness.runs.kind_runners.command_spec`) without
    the gate's instrumentation (:data:`INSTRUMENTATION_KEYS`, :data:`INSTRUMENTATION_ENV`,
    :data:`INSTRUMENTATION_MODULES`); everything else as the gate runs it."""
    argv = [a for a in gate.argv if not _key(a).startswith(INSTRUMENTATION_KEYS)]
    env = {k: v for k, v in gate.env.items() if k not in INSTRUMENTATION_ENV}
    modules = env.get("VERL_USE_EXTERNAL_MODULES", "").split(",")
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(m for m in modules if m and m not in INSTRUMENTATION_MODULES)
    header = [f"verl_cost: plain run, the gate's instrumentation removed: {' '.join(dropped(gate, argv))}"]
    return CommandSpec(argv, env, gate.metrics_exclude, header, timings=gate.timings)


def dropped(gate: CommandSpec, argv: list[str]) -> list[str]:
    """The keys of ``gate``'s overrides that ``argv`` lacks."""
    kept = {_key(a) for a in argv}
    return [_key(a) for a in gate.argv if "=" in a and _key(a) not in kept]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring); a scenario that is no verl scenario is refused in one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=SCENARIO, help="a verl scenario with a committed golden")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="both runs' device (default cpu)")
    parser.add_argument("--repeat", type=_positive, default=3, help="pairs of runs (default 3)")
    parser.add_argument("--warm-up", type=_count, default=1, help="untimed plain runs first (default 1)")
    parser.add_argument("--json", type=Path, help="also write every figure there")
    args = parser.parse_args(argv)
    if not args.scenario.is_file():
        parser.error(f"--scenario {args.scenario}: no such file")
    if Scenario.load(args.scenario).kind != "verl":
        parser.error(f"--scenario {args.scenario}: expected an engine: verl scenario")
    return args


def project_of(scenario: Path) -> Path:
    """The folder of the nearest ``pytest.ini`` above the scenario: where its users run pytest."""
    for folder in Path(scenario).resolve().parents:
        if (folder / "pytest.ini").is_file():
            return folder
    sys.exit(f"{scenario}: no pytest.ini above it: the gate's check runs in a pytest project")


def role(cmdline: list[str], name: str) -> str:
    """What a process is, for the CPU breakdown: a Ray worker's actor class (its title, ``ray::PolicyServer``), a
    Python module run with ``-m`` (``verl.trainer.main_ppo``, ``pytest``), else the executable's name."""
    first = cmdline[0] if cmdline else name
    if first.startswith("ray::"):
        return "ray::" + first[5:].split(".")[0].split(":")[-1].split(" ")[0]
    if "-m" in cmdline[:3]:
        return cmdline[cmdline.index("-m") + 1]
    return Path(first).name or name


class TreeCPU:
    """CPU seconds (user + system) of this process's descendants, sampled in a thread every :data:`SAMPLE_S` s,
    each process under its :func:`role` at its last sample."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        for proc in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                self.seen[(proc.pid, proc.create_time())] = (
                    role(proc.cmdline(), proc.name()),
                    times.user + times.system,
                )

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def __enter__(self) -> TreeCPU:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(cpu for _, cpu in self.seen.values())

    def by_role(self) -> dict[str, float]:
        """CPU seconds of each role's processes together."""
        out: dict[str, float] = {}
        for name, cpu in self.seen.values():
            out[name] = out.get(name, 0.0) + cpu
        return out


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _settle(cpu: TreeCPU, grace: float = 30.0) -> list[str]:
    """Wait up to ``grace`` s for every descendant to end (sampling them), reap them; kill by pid what is left,
    and return its names (a process the run left behind)."""
    deadline = time.monotonic() + grace
    while True:
        cpu._sample()
        alive = [p for p in psutil.Process().children(recursive=True) if _running(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(SAMPLE_S)
    left = []
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            left.append(f"{proc.name()} (pid {proc.pid})")
            proc.kill()
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return left


@dataclass
class Measured:
    """One run: its wall and process-tree CPU seconds, its verl profile, and what else it reports."""

    wall_s: float
    cpu_s: float
    profile: dict[str, Any]
    extra: dict[str, float] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    #: CPU seconds by process role (:meth:`TreeCPU.by_role`)
    cpu_by_role: dict[str, float] = field(default_factory=dict)


def _gate(args: argparse.Namespace, tmp: Path) -> Measured:
    """The check as CI runs it: a fresh ``pytest <scenario>`` in its project on ``args.device``, artifacts under
    ``tmp``."""
    scenario = args.scenario
    project, artifacts = project_of(scenario), tmp / "artifacts"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--precision-artifacts", str(artifacts)]
    cmd += ["--precision-device", args.device]
    with TreeCPU() as cpu:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [*cmd, str(Path(scenario).resolve().relative_to(project))],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        wall = time.perf_counter() - t0
        left = _settle(cpu)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"gate: pytest exited {proc.returncode}; the check must pass:\n{out[-3000:]}")
    run_json = next(artifacts.glob(f"{Scenario.load(scenario).name}/run/run.json"), None)
    if run_json is None:
        sys.exit(f"gate: no run.json under {artifacts}")
    timings = json.loads(run_json.read_text())["timings"]
    compare = _COMPARE.search(out)
    extra = {"verl_command_s": timings["total_s"], "compare_s": float(compare.group(1)) if compare else float("nan")}
    return Measured(wall, cpu.seconds, timings["profile"], extra, left, cpu.by_role())


def _plain(args: argparse.Namespace, tmp: Path) -> Measured:
    """``main_ppo`` as the gate runs it, without the gate's instrumentation (:func:`plain_spec`), into ``tmp/plain``."""
    scenario = Scenario.load(args.scenario)
    run_dir = tmp / "plain"
    run_dir.mkdir(parents=True)
    spec = plain_spec(kind_runners.command_spec(scenario, run_dir, device=args.device))
    env = {**determinism_env(args.device, scenario.config["trainer"]["num_threads"]), **spec.env, **OWN_RAY}
    with TreeCPU() as cpu:
        t0 = time.perf_counter()
        clock = command_runner.run_command(
            scenario, spec.argv, run_dir=run_dir, env=env, timeout=3600, header=spec.header
        )
        wall = time.perf_counter() - t0
        left = _settle(cpu)
    dumped = sorted(run_dir.glob("step_*/**/dump.json")) + sorted(run_dir.glob("**/stage_outputs.json"))
    if dumped:
        sys.exit(f"plain: the run was instrumented: {dumped[0]} exists")
    metrics = command_runner.read_command_metrics(run_dir)
    prof = verl_profile.profile(run_dir, clock=clock.as_dict(), metrics=metrics)
    return Measured(wall, cpu.seconds, prof, {}, left, cpu.by_role())


def _once(name: str, args: argparse.Namespace) -> Measured:
    with tempfile.TemporaryDirectory(prefix=f"verl-cost-{name}-") as tmp:
        result = (_gate if name == "gate" else _plain)(args, Path(tmp))
    note = f"; left running, killed: {', '.join(result.left)}" if result.left else ""
    print(f"[bench] {name}: wall {result.wall_s:.1f} s, process tree CPU {result.cpu_s:.1f} s{note}", flush=True)
    return result


def breakdown(run: Measured) -> dict[str, float]:
    """Where a run's wall time went (seconds): verl's start-up, steps, dumped stages and msprobe on rank 0,
    shut-down, and for the gate its compare and the rest of pytest."""
    prof = run.profile
    steps = prof.get("steps", {}).values()
    out = {
        "verl start-up": sum(p["s"] for p in prof.get("start_up", [])),
        "verl steps": prof.get("steps_s", 0.0),
        "  of them dumped stages (rank 0)": sum(s.get("dumped_stages_s", 0.0) for s in steps),
        "  of them msprobe (rank 0)": sum(s.get("dump_s", 0.0) for s in steps),
        "verl shut-down": prof.get("shut_down_s") or 0.0,
        "the verl command (start to reaped)": prof.get("wall_s", 0.0),
    }
    out |= {f"  start-up: {p['name']}": p["s"] for p in prof.get("start_up", [])}
    if run.extra:
        out["compare"] = run.extra["compare_s"]
        out["the rest of pytest"] = run.wall_s - run.extra["verl_command_s"] - run.extra["compare_s"]
    return {**out, "wall": run.wall_s}


def summary(pairs: list[tuple[Measured, Measured]]) -> dict[str, Any]:
    """Per pair and median: gate / plain of wall and CPU time, and whether the median wall meets :data:`TARGET`."""
    wall = [g.wall_s / p.wall_s for g, p in pairs]
    cpu = [g.cpu_s / p.cpu_s if p.cpu_s else float("nan") for g, p in pairs]
    median = statistics.median(wall)
    return {
        "wall_ratio": wall,
        "cpu_ratio": cpu,
        "median_wall_ratio": median,
        "median_cpu_ratio": statistics.median(cpu),
        "target": TARGET,
        "met": median <= TARGET,
    }


def _median_breakdown(runs: list[Measured]) -> dict[str, float]:
    rows = [breakdown(r) for r in runs]
    return {k: statistics.median(r.get(k, 0.0) for r in rows) for k in dict.fromkeys(k for r in rows for k in r)}


def report(scenario: Path, pairs: list[tuple[Measured, Measured]]) -> dict[str, Any]:
    """Print the figures (see the module docstring) and return them."""
    figures = summary(pairs)
    print(f"{Scenario.load(scenario).name}: the gate (pytest, its level) against plain main_ppo (profiler off)")
    for i, ((g, p), w, c) in enumerate(zip(pairs, figures["wall_ratio"], figures["cpu_ratio"], strict=True), 1):
        walls, cpus = f"{g.wall_s:.1f} / {p.wall_s:.1f} s", f"{g.cpu_s:.1f} / {p.cpu_s:.1f} s"
        print(f"  pair {i}: wall {walls} = {w:.2f}x   CPU {cpus} = {c:.2f}x")
    verdict = "met" if figures["met"] else "missed"
    print(
        f"  median of {len(pairs)}: wall {figures['median_wall_ratio']:.2f}x (target <= {TARGET}x: {verdict}), "
        f"CPU {figures['median_cpu_ratio']:.2f}x"
    )
    gate, plain = _median_breakdown([g for g, _ in pairs]), _median_breakdown([p for _, p in pairs])
    _table("where the wall time went (s, median)", gate, plain)
    cpu = {side: _median_roles([pair[i] for pair in pairs]) for i, side in enumerate(("gate", "plain"))}
    _table("CPU time by process (s, median)", cpu["gate"], cpu["plain"])
    return {**figures, "breakdown": {"gate": gate, "plain": plain}, "cpu_by_role": cpu}


def _median_roles(runs: list[Measured]) -> dict[str, float]:
    """Each role's median CPU seconds (0 in a run without it), the largest first; roles under 0.5 s left out."""
    roles = dict.fromkeys(r for run in runs for r in run.cpu_by_role)
    medians = {r: statistics.median(run.cpu_by_role.get(r, 0.0) for run in runs) for r in roles}
    return dict(sorted(((r, s) for r, s in medians.items() if s >= 0.5), key=lambda rs: -rs[1]))


def _table(title: str, gate: dict[str, float], plain: dict[str, float]) -> None:
    print(f"  {title}:{'gate':>{61 - len(title)}} {'plain':>8}")
    for key in dict.fromkeys([*gate, *plain]):
        shown = [f"{d[key]:8.1f}" if key in d else f"{'':8}" for d in (gate, plain)]
        print(f"    {key:<52}{shown[0]} {shown[1]}")


def _subreaper() -> None:
    """Make this process the child subreaper of what it starts: a process whose parent ends (Ray's, once the
    pytest that started them exits) stays in the tree :class:`TreeCPU` samples."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _subreaper()
    for _ in range(args.warm_up):
        _once("warm-up plain", args)
    pairs = []
    for i in range(args.repeat):
        names = ["gate", "plain"] if i % 2 == 0 else ["plain", "gate"]
        runs = {name: _once(name, args) for name in names}
        pairs.append((runs["gate"], runs["plain"]))
    figures = report(args.scenario, pairs)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
