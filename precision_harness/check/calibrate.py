"""Calibration: how much a scenario's statistics move under variations that should not matter.

``precision-harness calibrate SCENARIO --runs N`` reruns the scenario N times, each in a fresh
process (a process restart), compares every stage dump with the golden, and records in the golden's
manifest, per stage and statistic, the largest relative change observed (``noise``). On the CPU each
rerun also takes another thread count (1, 2, 4, ... over OMP/MKL and ``torch.set_num_threads``); on a
GPU or NPU the reruns keep the scenario's settings, so what they measure is the device and stack's
own run-to-run spread (collective reduction order, non-deterministic kernels). The gate then uses
``rtol = max(k x observed, floor)`` (:meth:`~precision_harness.check.tolerance.TolerancePolicy.with_noise`),
and :func:`proposed_tolerance` writes the same figures as a ``tolerance:`` block for the scenario file.

Choice of k and floor (Megatron: k = 1.5 x max observed, floor 1e-3):

- **k = 3.** The observed value is the maximum of only N reruns, and a gate checks thousands of
  statistics per run, so the tolerance must cover a much rarer event than the N-run maximum. For
  roughly Gaussian summation-order noise the maximum of 4 draws sits near 1.5-2 sigma, while a
  1-in-10^5 event per statistic is about 4.4 sigma: a factor of 2.2-3. k = 3 covers that with
  N >= 4; Megatron's 1.5 assumes many more repeated runs than a CI budget allows here.
- **floor = the dtype's rtol** (``torch.testing.assert_close``: fp32 1.3e-6, bf16 1.6e-2) or the
  scenario's override, not a fixed 1e-3. On CPU reruns are usually bit-identical (observed = 0,
  docs/msprobe.md#determinism); a fixed 1e-3 floor would then loosen an fp32 gate a thousandfold, while the
  dtype floor keeps it exactly as tight as without calibration. Calibration can only widen.

Relative change is ``|x - golden| / |golden|`` (Max, Min, Norm) and ``|x - golden| / RMS`` (Mean),
the same scales the tolerance uses; changes where the golden is 0 are left to atol.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_harness.dumps.stage import DirStage
from precision_harness.dumps.statistics import STATISTICS
from precision_harness.goldens.churn import stage_churn
from precision_harness.goldens.golden import Golden
from precision_harness.runs.kind_runners import Run
from precision_harness.runs.launch import RunResult
from precision_harness.scenarios.scenario import Scenario

DEFAULT_K = 3.0
#: thread counts cycled through the reruns (the scenario's own count comes first)
THREAD_COUNTS = (1, 2, 4, 3)


@dataclass(frozen=True)
class Variation:
    """One rerun's setting: its thread count (each rerun is also a fresh process)."""

    num_threads: int

    def __str__(self) -> str:
        return f"num_threads={self.num_threads}"


def variations(scenario: Scenario, runs: int, device: str = "cpu") -> list[Variation]:
    """``runs`` variations: on cpu the scenario's thread count, then the others of :data:`THREAD_COUNTS` in
    turn; on a GPU or NPU the scenario's own settings each time (plain reruns)."""
    own = scenario.config["trainer"]["num_threads"]
    cycle = [own] + ([t for t in THREAD_COUNTS if t != own] if device == "cpu" else [])
    return [Variation(cycle[i % len(cycle)]) for i in range(runs)]


def variant(scenario: Scenario, variation: Variation, directory: Path) -> Scenario:
    """The scenario under ``variation``, written to ``directory`` (same name, so the same golden)."""
    return scenario.with_overrides(
        {"trainer.num_threads": variation.num_threads},
        directory=directory,
        name=scenario.name,
        tag=f"{variation.num_threads}threads",
    )


def _round(x: float) -> float:
    return float(f"{x:.3g}")


def observed_noise(runs: list[RunResult], golden: Golden, scenario: Scenario) -> dict[str, dict[str, float]]:
    """stage -> statistic -> largest finite relative change of any run's dump against the golden."""
    noise: dict[str, dict[str, float]] = {stage: {s: 0.0 for s in STATISTICS} for stage in scenario.stages}
    for run in runs:
        for step in scenario.steps:
            for stage in scenario.stages:
                new = DirStage(run.stage_dir(step, stage), step=step, name=stage)
                row = stage_churn(scenario.name, new, golden.stage(step, stage))
                for stat, rel in row.max_rel.items():
                    if math.isfinite(rel):
                        noise[stage][stat] = max(noise[stage][stat], _round(rel))
    return noise


def reruns(
    scenario: Scenario,
    *,
    runs: int,
    work_dir: Path,
    run: Run,
    on_run: Callable[[int, Variation, RunResult], None] | None = None,
    device: str = "cpu",
) -> list[RunResult]:
    """Rerun ``scenario`` ``runs`` times under :func:`variations` for ``device``, into ``work_dir/run_<i>``.

    Args:
        run: starts one run (:func:`~precision_harness.runs.kind_runners.bind`: the device and timeout bound).
        on_run: called after each rerun with its index, variation and result.

    Raises:
        RunFailedError: a rerun failed.
    """
    results = []
    for i, variation in enumerate(variations(scenario, runs, device)):
        result = run(variant(scenario, variation, work_dir / "scenarios"), work_dir / f"run_{i}")
        results.append(result)
        if on_run is not None:
            on_run(i, variation, result)
    return results


def calibrate(
    scenario: Scenario, golden: Golden, results: list[RunResult], *, k: float = DEFAULT_K, device: str = "cpu"
) -> dict[str, Any]:
    """The manifest's ``noise`` section from :func:`reruns`' ``results``: per stage and statistic, the
    largest relative change of any rerun against ``golden``."""
    return {
        "runs": len(results),
        "k": k,
        "variations": [f"{v}, process restart" for v in variations(scenario, len(results), device)],
        "stages": observed_noise(results, golden, scenario),
    }


def proposed_tolerance(noise: dict[str, Any]) -> dict[str, Any]:
    """A scenario ``tolerance:`` block from ``noise``: per stage whose reruns moved, ``rtol`` = k x the largest
    relative change of any statistic (``{"stages": {}}`` when every rerun reproduced the golden exactly).

    The gate already applies the manifest's noise; the block is for a scenario that should carry its
    tolerance itself (a golden re-recorded on another stack keeps it), reviewed like any tolerance.
    """
    stages = {}
    for stage, stats in noise["stages"].items():
        worst = max(stats.values(), default=0.0)
        if worst > 0:
            stages[stage] = {"rtol": _round(noise["k"] * worst)}
    return {"stages": stages}


def noise_table(scenario: Scenario, noise: dict[str, Any]) -> list[str]:
    """Lines of the observed noise per stage and statistic, and the fp32 rtol the gate now uses."""
    from precision_harness.check.tolerance import TolerancePolicy

    policy = TolerancePolicy.from_config(scenario.config["tolerance"]).with_noise(noise)
    lines = [
        f"observed noise over {noise['runs']} reruns (relative change vs golden) -> "
        f"fp32 rtol = max({noise['k']:g} x observed, floor):",
        "  " + "stage".ljust(24) + "".join(s.ljust(20) for s in STATISTICS),
    ]
    for stage, stats in noise["stages"].items():
        cells = [
            f"{stats[s]:.2g} -> {policy.for_tensor(dtype='torch.float32', stage=stage, statistic=s, api='').rtol:.2g}"
            for s in STATISTICS
        ]
        lines.append("  " + stage.ljust(24) + "".join(c.ljust(20) for c in cells))
    return lines
