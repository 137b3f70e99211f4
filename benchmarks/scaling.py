"""Scaling of the gate: serial vs ``pytest -n N`` (xdist), and what running a scenario on Ray costs.

Usage (from the repository root, in the project's venv; ray needed for the Ray part)::

    python benchmarks/scaling.py                      # both measurements, every scenarios/*.yaml
    python benchmarks/scaling.py --skip-ray -n 2
    python benchmarks/scaling.py --ray-scenario scenarios/grpo_tiny.yaml --repeats 2

Printed as ratios (wall-clock, best of ``--repeats``), because absolute seconds depend on the box:

- ``xdist speed-up = serial / -n N`` for ``pytest <scenarios>`` in check mode. "serial" is the plugin's
  default (scenario runs overlap on a thread pool of CPU-count workers); ``--precision-jobs 1`` (one
  scenario at a time) is printed too, as the floor both are compared with.
- ``Ray overhead = Ray run / local subprocess run`` for one single-rank scenario: the same worker code,
  once as ``python -m precision_harness.runs.runner`` and once through ``precision_harness.runs.runner.ray_launch``
  on a fresh local Ray instance (``ray.init`` + one actor + fetching the dumps back); the Ray
  start-up share (``run.json`` ``ray.startup_s``) is printed as a fraction of the Ray run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _timed(cmd: list[str], *, cwd: Path = ROOT) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(
            f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return wall


def gate_seconds(scenarios: list[str], *, extra: list[str], repeats: int) -> float:
    """Best wall time of ``pytest <scenarios> <extra>`` (check mode, fresh artifacts directory each time)."""
    best = float("inf")
    for _ in range(repeats):
        artifacts = tempfile.mkdtemp(prefix="precision_bench_")
        try:
            best = min(
                best,
                _timed(
                    [
                        sys.executable,
                        "-m",
                        "pytest",
                        "-q",
                        "-p",
                        "no:randomly",
                        "-p",
                        "no:cacheprovider",
                        "--precision-artifacts",
                        artifacts,
                        *scenarios,
                        *extra,
                    ]
                ),
            )
        finally:
            shutil.rmtree(artifacts, ignore_errors=True)
    return best


def ray_overhead(scenario: str, *, repeats: int) -> tuple[float, float, float]:
    """(local subprocess s, Ray run s, Ray start-up s), best of ``repeats`` each."""
    from precision_harness.runs.kind_runners import run_scenario
    from precision_harness.scenarios.scenario import Scenario

    sc = Scenario.load(ROOT / scenario)
    local = ray = startup = float("inf")
    for _ in range(repeats):
        out = Path(tempfile.mkdtemp(prefix="precision_bench_"))
        try:
            local = min(local, run_scenario(sc, out_dir=out / "local", device="cpu").wall_s)
            # world_size 1 through the Ray driver with no address: a fresh local Ray instance, as multi-rank runs get
            t0 = time.perf_counter()
            _timed(
                [
                    sys.executable,
                    "-m",
                    "precision_harness.runs.runner.ray_launch",
                    str(ROOT / scenario),
                    "--out",
                    str(out / "ray"),
                    "--device",
                    "cpu",
                ]
            )
            ray = min(ray, time.perf_counter() - t0)
            startup = min(startup, json.loads((out / "ray" / "run.json").read_text())["ray"]["startup_s"])
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return local, ray, startup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "scenarios", nargs="*", help="scenario files for the gate measurement (default: scenarios/*.yaml)"
    )
    parser.add_argument("-n", type=int, default=2, help="xdist workers (default 2)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--ray-scenario", default="scenarios/grpo_tiny.yaml")
    parser.add_argument("--skip-xdist", action="store_true")
    parser.add_argument("--skip-ray", action="store_true")
    args = parser.parse_args(argv)
    scenarios = args.scenarios or sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scenarios").glob("*.yaml"))
    if not args.skip_xdist:
        one = gate_seconds(scenarios, extra=["--precision-jobs", "1"], repeats=args.repeats)
        serial = gate_seconds(scenarios, extra=[], repeats=args.repeats)
        xdist = gate_seconds(scenarios, extra=["-n", str(args.n)], repeats=args.repeats)
        print(
            f"gate over {len(scenarios)} scenarios: --precision-jobs 1 {one:.1f} s, serial {serial:.1f} s, "
            f"-n {args.n} {xdist:.1f} s"
        )
        print(
            f"xdist speed-up (serial / -n {args.n}): {serial / xdist:.2f}x;  "
            f"vs one scenario at a time: {one / xdist:.2f}x"
        )
    if not args.skip_ray:
        local, ray, startup = ray_overhead(args.ray_scenario, repeats=args.repeats)
        print(
            f"{args.ray_scenario}: local subprocess {local:.1f} s, local Ray instance {ray:.1f} s "
            f"(ray.init {startup:.1f} s)"
        )
        print(
            f"Ray overhead (Ray run / local subprocess): {ray / local:.2f}x;  "
            f"Ray start-up share of the Ray run: {startup / ray:.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
