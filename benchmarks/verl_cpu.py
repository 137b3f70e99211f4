"""Where a verl CPU scenario's time goes: start-up against the training steps, and the dump's share of a step.

``examples/verl_cpu/`` is copied into a throwaway folder; the scenario (default
``grpo_dp2_bf16_cpu``: two ranks, bf16, sampled rollouts) is run with ``precision-harness run`` as
committed (every step dumped at its level) and as a variant dumping only its last step, alternating
which goes first, ``--repeat`` times. From each run's ``worker.log`` (verl's console logger,
``timing_s/*`` per step) and its wall time:

- start-up share: ``1 - sum(timing_s/step) / wall`` of the committed scenario (Ray, TransferQueue, the
  worker processes, model and FSDP2 set-up, the rollout server, and the shut-down);
- dump share of step 2: ``1 - step_2(variant, not dumped) / step_2(committed, dumped)``, for the whole
  step and for each dumped stage (``old_log_prob``, ``ref``, ``update_actor``);
- the wall time of each.

Each figure is the minimum over the repeats; the shares are ratios within one invocation, so a
noisy machine moves them less than the seconds. Nothing is asserted.

Usage: python benchmarks/verl_cpu.py [--repeat N] [--scenario grpo_dp2_bf16_cpu]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "verl_cpu"
TIMING = re.compile(r"step:(\d+) - .*")
#: verl's timers of the stages the gate dumps, and the whole step
TIMERS = ("step", "old_log_prob", "ref", "update_actor", "gen")


def _step_timings(log: str) -> dict[int, dict[str, float]]:
    """``{step: {timer: seconds}}`` from verl's console lines (``step:2 - ... timing_s/ref:1.3 ...``)."""
    out: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        match = TIMING.search(line)
        if not match:
            continue
        timers = dict(re.findall(r"timing_s/(\w+):([0-9.]+)", line))
        out.setdefault(int(match.group(1)), {}).update({k: float(v) for k, v in timers.items() if k in TIMERS})
    return out


def _run(project: Path, scenario: Path, out: Path) -> tuple[float, dict[int, dict[str, float]]]:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "precision_harness.cli", "run", str(scenario), "--out", str(out)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{scenario.name} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, _step_timings((out / "worker.log").read_text(errors="replace"))


def _variant(scenario: Path) -> Path:
    """The scenario dumping only its last step (the earlier steps still run, undumped)."""
    config = yaml.safe_load(scenario.read_text())
    config["global_profiler"]["steps"] = [max(config["global_profiler"]["steps"])]
    config.pop("invariants", None)  # weight_sync and parity are checked at profiled steps only
    path = scenario.with_name(scenario.stem + "_last_step_dumped.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--scenario", default="grpo_dp2_bf16_cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="verl-cpu-bench-") as tmp:
        project = Path(tmp) / "verl_cpu"
        shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("golden", ".precision"))
        committed = project / "scenarios" / f"{args.scenario}.yaml"
        variant = _variant(committed)
        results: dict[str, list[tuple[float, dict[int, dict[str, float]]]]] = {"committed": [], "variant": []}
        for i in range(args.repeat):
            order = [("committed", committed), ("variant", variant)]
            for name, path in order if i % 2 == 0 else order[::-1]:
                results[name].append(_run(project, path, Path(tmp) / f"run-{name}"))
                wall, steps = results[name][-1]
                seconds = [round(s["step"], 1) for s in steps.values()]
                print(f"[bench] {name} run {i + 1}: {wall:.1f} s, steps {seconds}")
    wall = min(w for w, _ in results["committed"])
    step_sum = min(sum(s["step"] for s in steps.values()) for _, steps in results["committed"])
    print(f"{args.scenario}: wall {wall:.1f} s; the steps {step_sum:.1f} s; start-up share {1 - step_sum / wall:.2f}")
    for timer in ("step", "old_log_prob", "ref", "update_actor"):
        dumped = min(steps[2][timer] for _, steps in results["committed"] if timer in steps.get(2, {}))
        plain = min(steps[2][timer] for _, steps in results["variant"] if timer in steps.get(2, {}))
        share = 1 - plain / dumped
        print(f"  step 2 {timer:<13} dumped {dumped:6.2f} s, not dumped {plain:6.2f} s: dump share {share:.2f}")


if __name__ == "__main__":
    main()
