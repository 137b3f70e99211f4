"""Worker entry point: ``python -m precision_harness.runs.runner SCENARIO --out DIR [--device D] [--no-dump]``.

Runs one scenario in this process and writes, under ``--out``:
``step_<n>/<stage>/step0/rank0/dump.json`` (profiled stages), ``step_<n>/log_probs.json``,
``metrics.jsonl``, ``run.json``.
On failure it writes ``error.txt`` (one line, for the caller) and exits 1; the traceback goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import precision_harness.runs.runner.lean_imports  # noqa: F401  (before transformers: see the module)

_T0 = time.perf_counter()
#: set in a child of the warm server (precision_harness.runs.warm.workers), recorded in run.json
WARM = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m precision_harness.runs.runner", description=__doc__.splitlines()[0]
    )
    parser.add_argument("scenario", type=Path, help="scenario YAML file")
    parser.add_argument("--out", type=Path, required=True, help="run directory (created; must be empty or absent)")
    parser.add_argument(
        "--device", default=None, choices=["cpu", "cuda", "npu"], help="overrides the scenario's device"
    )
    parser.add_argument(
        "--no-dump", action="store_true", help="run without msprobe (baseline for overhead measurements)"
    )
    parser.add_argument("--rank", type=int, default=0, help="rank passed to PrecisionDebugger.start(rank_id=...)")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        run(args.scenario, out=out, device=args.device, dump=not args.no_dump, rank=args.rank)
    except BaseException as exc:
        message = str(exc).splitlines()[0] if str(exc) else ""
        (out / "error.txt").write_text(f"{type(exc).__name__}: {message}\n", encoding="utf-8")
        traceback.print_exc()
        return 1
    return 0


def run(scenario_path: Path | Any, *, out: Path, device: str | None, dump: bool, rank: int = 0) -> dict:
    """Run one scenario (a YAML path, or an already loaded ``Scenario`` as Ray actors get it) into ``out``.

    Multi-rank runs call this once per rank, after joining the process group (``ray_launch``).
    """
    from precision_harness.scenarios.scenario import Scenario

    scenario = scenario_path if isinstance(scenario_path, Scenario) else Scenario.load(scenario_path)
    device = device or scenario.config["device"]
    if dump:
        try:
            import msprobe.pytorch  # noqa: F401
        except Exception as exc:  # a release built for numpy 1 raises AttributeError, not ImportError
            from precision_harness.errors import ProbeUnavailableError
            from precision_harness.runs.host.msprobe_release import unimportable

            raise ProbeUnavailableError(unimportable(exc)) from None
    from precision_harness.runs.numerics import devices
    from precision_harness.runs.runner.trainer import Trainer

    t_setup = time.perf_counter()
    trainer = Trainer(scenario, out_dir=out, device=device)
    trainer.setup()
    if dump:
        from precision_harness.runs.stage_api import StageProbe

        trainer.probe = StageProbe(msprobe_config=scenario.msprobe_config(), root=out, rank=rank)
    from precision_harness.progress import PROGRESS_FILE, ProgressLog

    trainer.stage = ProgressLog(out / PROGRESS_FILE).wrap(trainer.stage)  # type: ignore[method-assign]
    import_s = t_setup - _T0
    setup_s = time.perf_counter() - t_setup
    trainer.fit()
    manifest = {
        "format": 1,
        "scenario": scenario.name,
        "scenario_hash": scenario.hash,
        "device": device,
        "level": scenario.level,
        "dump": dump,
        "warm": WARM,
        "rank": rank,
        "world_size": scenario.config["trainer"]["world_size"],
        "env": devices.fingerprint(device, scenario.config["trainer"]["num_threads"]),
        "steps": list(scenario.steps),
        "stages": list(scenario.stages),
        "numeric_settings": scenario.numeric_settings,
        "timings": {
            "total_s": round(time.perf_counter() - _T0, 6),
            "import_s": round(import_s, 6),
            "setup_s": round(setup_s, 6),
            "stages": trainer.timings,
        },
    }
    (out / "run.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for leftover in (out / "_unused",):
        if leftover.exists() and not any(leftover.iterdir()):
            leftover.rmdir()
    return manifest


if __name__ == "__main__":
    sys.exit(main())
