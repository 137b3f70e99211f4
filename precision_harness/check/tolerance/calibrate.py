"""Calibration: how much a scenario's statistics move under variations that should not matter.

``precision-harness calibrate SCENARIO --runs N`` reruns the scenario N times, each in a fresh
process (a process restart), compares every stage dump with the golden, and records in the golden's
manifest (``noise``), per stage, tensor row and statistic, the largest relative change observed over the row's
own scale (``noise.rows``, the rows that moved only), and per stage and statistic the largest of its rows
(``noise.stages``). On the CPU each
rerun also takes another thread count (1, 2, 4, ... over OMP/MKL and ``torch.set_num_threads``); on a
GPU or NPU the reruns keep the scenario's settings, so what they measure is the device and stack's
own run-to-run spread (collective reduction order, non-deterministic kernels). The gate then uses, for each row,
``rtol = max(k x observed, floor)`` (:meth:`~precision_harness.check.tolerance.policy.TolerancePolicy.with_noise`),
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
from typing import TYPE_CHECKING, Any

from precision_harness.dumps.rows import rms, row_statistics, rows
from precision_harness.dumps.stage import DirStage, StageSource
from precision_harness.dumps.statistics import STATISTICS
from precision_harness.goldens.golden import Golden
from precision_harness.goldens.manifest import fresh_rollouts
from precision_harness.scenarios.scenario import Scenario

if TYPE_CHECKING:  # the runners only run in reruns(), whose caller brings them; the compare's CLI does not load them
    from precision_harness.runs.kind_runners import Run
    from precision_harness.runs.launch import RunResult

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


#: the noise of one stage: row name -> statistic -> its largest relative change (rows that moved only)
RowChanges = dict[str, dict[str, float]]


def _dtype(item: dict[str, Any]) -> Any:
    return item.get("dtype") or item.get("type")


def row_change(target: dict[str, Any], golden: dict[str, Any]) -> dict[str, float]:
    """statistic -> relative change of one row (see :func:`~precision_harness.dumps.rows.rows`) against the
    golden's, over the scale the tolerance uses: ``|golden|`` for Max, Min, Norm and a scalar's ``value``, the
    golden tensor's RMS (``Norm / sqrt(numel)``) for Mean. Statistics that did not move are left out, and so are
    changes with no finite relative figure (a golden of 0, a value turned NaN): atol and the compare's
    structural checks own those. Empty where the dtype or shape changed (not noise)."""
    if _dtype(target) != _dtype(golden) or target.get("shape") != golden.get("shape"):
        return {}
    t_stats, g_stats = row_statistics(target), row_statistics(golden)
    mean_scale = rms(g_stats.get("Norm"), golden.get("shape"))
    changes = {}
    for stat, g_val in g_stats.items():
        t_val = t_stats.get(stat)
        if t_val is None or g_val is None or t_val == g_val:
            continue
        scale = mean_scale if stat == "Mean" else abs(g_val)
        if scale and math.isfinite(scale) and math.isfinite(t_val) and math.isfinite(g_val):
            changes[stat] = _round(abs(t_val - g_val) / scale)
    return {stat: rel for stat, rel in changes.items() if rel > 0}


def stage_row_changes(new: StageSource, golden: StageSource, into: RowChanges) -> None:
    """Merge into ``into`` each row's :func:`row_change` of ``new`` against ``golden``, the largest over ranks.

    A rank whose digest is the golden's is bitwise equal and not parsed; rows are paired by msprobe's row
    name (a rerun is the same program, so its calls carry the golden's names)."""
    golden_ranks = set(golden.ranks())
    for rank in new.ranks():
        if rank not in golden_ranks or new.digest(rank) == golden.digest(rank):
            continue
        golden_rows = rows(golden.load(rank))
        for name, item in rows(new.load(rank)).items():
            if name not in golden_rows:
                continue
            for stat, rel in row_change(item, golden_rows[name]).items():
                moved = into.setdefault(name, {})
                moved[stat] = max(moved.get(stat, 0.0), rel)


def observed_noise(
    runs: list[RunResult], golden: Golden, scenario: Scenario
) -> tuple[dict[str, dict[str, float]], dict[str, RowChanges]]:
    """``(stages, rows)``: per stage and row name, each statistic's largest relative change of any run's dump
    against the golden (:func:`row_change`), rows that moved only; and per stage and statistic the largest of
    its rows (every statistic listed, 0 where none moved)."""
    moved: dict[str, RowChanges] = {stage: {} for stage in scenario.stages}
    for run in runs:
        for step in scenario.steps:
            for stage in scenario.stages:
                new = DirStage(run.stage_dir(step, stage), step=step, name=stage)
                stage_row_changes(new, golden.stage(step, stage), moved[stage])
    return stage_summary(moved), {stage: dict(sorted(changes.items())) for stage, changes in moved.items() if changes}


def stage_summary(moved: dict[str, RowChanges]) -> dict[str, dict[str, float]]:
    """stage -> statistic -> the largest change of its rows (0 where none moved): the manifest's ``noise.stages``,
    shown by :func:`noise_table` and turned into a scenario block by :func:`proposed_tolerance`. The check reads
    it only from a manifest without ``noise.rows`` (recorded before per-row calibration)."""
    return {
        stage: {s: max((row.get(s, 0.0) for row in changes.values()), default=0.0) for s in STATISTICS}
        for stage, changes in moved.items()
    }


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
    """The manifest's ``noise`` section from :func:`reruns`' ``results``: ``rows``, per stage, row name and
    statistic, the largest relative change of any rerun against ``golden`` over the row's own scale (the rows
    that moved only: the check widens exactly those), and ``stages``, per stage and statistic the largest of
    its rows (for the table and :func:`proposed_tolerance`)."""
    stages, moved = observed_noise(results, golden, scenario)
    noise = {
        "runs": len(results),
        "k": k,
        "variations": [f"{v}, process restart" for v in variations(scenario, len(results), device)],
        "stages": stages,
        "rows": moved,
    }
    fresh = fresh_reruns(results)
    if fresh:
        noise["fresh_rollouts"] = fresh
    return noise


def fresh_reruns(results: list[RunResult]) -> dict[str, dict[str, list[float]]]:
    """``verl.fresh_steps``: per fresh step and mismatch metric, the value each rerun logged, in rerun order (what
    :mod:`.fresh_bounds` makes a bound of, with the recording's). A rerun that did not log a metric leaves it out."""
    out: dict[str, dict[str, list[float]]] = {}
    for result in results:
        for step, values in (fresh_rollouts(result.run_dir) or {}).items():
            for metric, value in values.items():
                out.setdefault(step, {}).setdefault(metric, []).append(value)
    return out


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


def noise_table(noise: dict[str, Any]) -> list[str]:
    """Lines of the observed noise per stage and statistic (the largest of its rows) and how many rows moved.

    Each row that moved is checked with fp32 ``rtol = max(k x its own change, floor)``; every other row keeps
    the floor (:meth:`~precision_harness.check.tolerance.policy.TolerancePolicy.with_noise`).
    """
    moved = noise.get("rows", {})
    lines = [
        f"observed noise over {noise['runs']} reruns (relative change vs golden, the largest row of each stage); "
        f"each row that moved gets rtol = max({noise['k']:g} x its own change, floor):",
        "  " + "stage".ljust(24) + "".join(s.ljust(12) for s in STATISTICS) + "rows moved",
    ]
    for stage, stats in noise["stages"].items():
        cells = "".join(f"{stats.get(s, 0.0):.2g}".ljust(12) for s in STATISTICS)
        lines.append("  " + stage.ljust(24) + cells + str(len(moved.get(stage, {}))))
    for step, metrics in noise.get("fresh_rollouts", {}).items():
        lines.append(f"fresh step {step}: the rollout-training mismatch each rerun logged (bounds with the recording):")
        lines += [f"  {m}: {', '.join(f'{v:.6g}' for v in values)}" for m, values in metrics.items()]
    return lines
