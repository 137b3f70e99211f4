"""Overhead of the gate, printed as ratios measured within one run (these machines are noisy).

For each scenario under scenarios/ (or the ones named on the command line):

- ``dump / no-dump``: worker wall time with msprobe collecting every profiled stage, over the same
  run without msprobe (msprobe's own cost);
- ``pytest check / dump``: a full ``pytest scenarios/<x>.yaml`` against the committed golden, over
  the dumped run alone (what the harness adds: pytest start-up, golden checks, compare);
- ``compare speed-up``: ``msprobe compare`` on the command line over our per-stage compare of the
  same two dump.json files, for the scenario's largest stage dump, with a perturbed target so the
  full compare runs (not the byte-identical fast path).

Each timing is the minimum of ``--repeat`` runs. Also prints golden sizes and the two-scenario
gate's wall time. Nothing is asserted: this is a measurement, not a test.

Usage: python benchmarks/overhead.py [SCENARIO.yaml ...] [--repeat N]
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from precision_harness.compare import compare_stage  # noqa: E402
from precision_harness.launch import run_scenario  # noqa: E402
from precision_harness.scenario import Scenario  # noqa: E402
from precision_harness.tolerance import TolerancePolicy  # noqa: E402


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pytest_wall(args: list[str], artifacts: Path) -> float:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--precision-artifacts",
        str(artifacts),
        *args,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed:\n{proc.stdout[-2000:]}")
    return wall


def perturbed_copy(stage_dir: Path, dest: Path) -> Path:
    """Copy a stage dir, scaling one Norm by 1e-3 so the compare cannot take the sha256 fast path."""
    shutil.copytree(stage_dir, dest)
    dump = next(dest.glob("step0/rank*/dump.json"))
    data = json.loads(dump.read_text())
    first = next(iter(data["data"].values()))
    for slot in first.get("output", []):
        if isinstance(slot, dict) and slot.get("Norm") is not None:
            slot["Norm"] *= 1.001
            break
    dump.write_text(json.dumps(data, indent=1))
    return dest


def msprobe_cli() -> str:
    """The ``msprobe`` console script of this interpreter's environment (the venv need not be active)."""
    beside = Path(sys.executable).parent / "msprobe"
    return str(beside) if beside.exists() else (shutil.which("msprobe") or "msprobe")


def golden_size(name: str) -> int:
    return sum(p.stat().st_size for p in (REPO / "golden" / name).rglob("*") if p.is_file())


def measure(path: Path, tmp: Path, repeat: int) -> tuple:
    """One scenario's row: no-dump, dump and pytest check wall times, and compare speed on its largest stage."""
    scenario = Scenario.load(path)
    device = scenario.config["device"]
    nodump = best(lambda: run_scenario(scenario, out_dir=tmp / "nodump", device=device, dump=False), repeat)
    dump = best(lambda: run_scenario(scenario, out_dir=tmp / "dump", device=device, dump=True), repeat)
    check = best(lambda: pytest_wall([str(path.relative_to(REPO)), "--precision-jobs", "1"], tmp / "art"), repeat)
    # compare speed on the largest stage dump of step 1
    stage = max(
        scenario.stages,
        key=lambda s: next((tmp / "dump" / f"step_1/{s}").glob("step0/rank*/dump.json")).stat().st_size,
    )
    golden_stage = REPO / "golden" / scenario.name / device / "step_1" / stage
    target = perturbed_copy(tmp / "dump" / "step_1" / stage, tmp / f"perturbed_{scenario.name}")
    ours = best(
        lambda: compare_stage(
            target, golden_stage, scenario=scenario.name, step=1, stage=stage, policy=TolerancePolicy()
        ),
        repeat + 1,
    )
    cli_s = best(lambda: msprobe_compare(target, golden_stage, tmp), repeat)
    return scenario.name, nodump, dump, check, stage, ours, cli_s, golden_size(scenario.name)


def msprobe_compare(target: Path, golden_stage: Path, tmp: Path) -> None:
    """``msprobe compare`` (its CLI) on one rank's dump.json pair."""
    out = tmp / "cli_out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    tp, gp = next(target.glob("step0/rank*/dump.json")), next(golden_stage.glob("step0/rank*/dump.json"))
    cmd = [msprobe_cli(), "compare", "-tp", str(tp), "-gp", str(gp), "-o", str(out)]
    subprocess.run(cmd, capture_output=True, check=True, cwd=tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    paths = [p.resolve() for p in args.scenarios] or sorted((REPO / "scenarios").glob("*.yaml"))
    tmp = Path(tempfile.mkdtemp(prefix="precision_bench_"))
    rows = [measure(path, tmp, args.repeat) for path in paths]
    gate = pytest_wall(["scenarios", "precision_tests"], tmp / "art_gate")
    shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"{'scenario':<22}{'no-dump s':>10}{'dump s':>9}{'check s':>9}{'dump/no-dump':>14}{'check/dump':>12}"
        f"{'stage':>24}{'ours s':>8}{'CLI s':>8}{'speed-up':>10}{'golden MB':>11}"
    )
    for name, nodump, dump, check, stage, ours, cli_s, size in rows:
        print(
            f"{name:<22}{nodump:>10.2f}{dump:>9.2f}{check:>9.2f}{dump / nodump:>14.2f}{check / dump:>12.3f}"
            f"{stage:>24}{ours:>8.3f}{cli_s:>8.2f}{cli_s / ours:>9.1f}x{size / 1e6:>11.2f}"
        )
    n_all = len(list((REPO / "scenarios").glob("*.yaml")))
    print(f"gate (pytest scenarios precision_tests, all {n_all} scenarios): {gate:.1f} s wall")


if __name__ == "__main__":
    main()
