"""A failing gate with the judgement against the same gate without it, as a ratio within one run.

The committed gate's scenarios and goldens (``scenarios/``, ``golden/``) are copied into a throwaway
project; every run gets the ``linear_bf16`` plant (tests/hooks: each fp32 matrix product computed
from bf16-rounded inputs, the regression an upgrade to a bf16 GEMM mode brings), so every scenario
fails, as a gate in front of such an upgrade does. Then ``pytest scenarios`` runs with
``--precision-judgement replay`` and with ``off``, alternating which goes first, ``--repeat`` times.
Printed: each arm's wall time (the minimum over the repeats), their ratio, and the time the
judgement's capture reruns and replays took by scenario (``<artifacts>/<scenario>/judge/judgement.json``).
Nothing is asserted: this is a measurement, not a test.

Usage: python benchmarks/judgement.py [--repeat N] [--scenario scenarios/x.yaml ...] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from pytest_timing import timed_pytest

REPO = Path(__file__).resolve().parent.parent
HOOKS = REPO / "tests" / "hooks"
PLANT = "linear_bf16"


def _pytest(project: Path, *args: str) -> float:
    """Wall time of ``pytest ARGS`` in ``project`` with the plant; exits unless the gate failed (exit 1)."""
    return timed_pytest(project, list(args), paths=[HOOKS], env={"PRECISION_TEST_PLANT": PLANT}, expect=1, timeout=3600)


def _judged(project: Path) -> dict[str, float]:
    """``{scenario: seconds}`` the judgement's capture rerun and replay took, and each judgement's verdict."""
    found = {}
    for path in sorted((project / ".precision" / "artifacts").glob("*/judge/judgement.json")):
        doc = json.loads(path.read_text())
        found[f"{path.parents[1].name} ({doc['verdict']})"] = doc["seconds"]
    return found


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    return f"{model}, {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=None, help="--precision-jobs (default: the plugin's)")
    parser.add_argument("--scenario", type=Path, action="append", help="default: every scenario in scenarios/")
    args = parser.parse_args()
    scenarios = args.scenario or sorted((REPO / "scenarios").glob("*.yaml"))
    with tempfile.TemporaryDirectory(prefix="judgement_bench_") as tmp:
        project = Path(tmp)
        (project / "scenarios").mkdir()
        (project / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
        for path in scenarios:
            shutil.copy(path, project / "scenarios" / path.name)
            shutil.copytree(REPO / "golden" / path.stem, project / "golden" / path.stem)
        jobs = ["--precision-jobs", str(args.jobs)] if args.jobs else []
        times: dict[str, list[float]] = {"replay": [], "off": []}
        judged: dict[str, float] = {}
        for i in range(args.repeat):
            for arm in ("replay", "off") if i % 2 == 0 else ("off", "replay"):
                shutil.rmtree(project / ".precision", ignore_errors=True)
                times[arm].append(_pytest(project, "scenarios", "--precision-judgement", arm, *jobs))
                if arm == "replay":
                    judged = _judged(project)
    on, off = min(times["replay"]), min(times["off"])
    print(f"failing gate ({len(scenarios)} scenarios, PRECISION_TEST_PLANT={PLANT}), {_cpu()}, min of {args.repeat}:")
    print(f"  with the judgement     {on:7.1f} s")
    print(f"  without (off)          {off:7.1f} s")
    print(f"  ratio                  {on / off:7.2f}x")
    for name, seconds in judged.items():
        print(f"    capture + replay  {seconds:6.1f} s  {name}")


if __name__ == "__main__":
    main()
