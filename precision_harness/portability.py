"""Portability check: does a scenario's dump depend on the CPU dispatch choices other processors take?

``precision-harness portability SCENARIO...`` runs a scenario once as the gate runs it (the
baseline: ``devices.determinism_env``), then once under each :data:`SETTINGS` entry, a set of
environment variables that make MKL's dispatcher, oneDNN and torch take the code paths another
processor would take (MKL's branch is pinned to COMPATIBLE, which every processor runs, so only
what its dispatcher is told the processor has is varied). Every ``step_<n>/<stage>`` dump (with
its ``stage_outputs.json``) and ``metrics.jsonl`` must be byte-identical to the baseline's; a
(step, stage) that changes is reported with its first differing row in execution order, found by
the gate's own compare (:func:`precision_harness.check.compare.stage.compare_stage` under ``mode: exact``).

What each setting emulates, and what the check cannot see, is in docs/tolerance.md ("CPU
portability"). In short: MKL's and oneDNN's code paths can be forced down, not up, so a path
only a newer processor takes (AVX-512, AMX) is covered by keeping the matrix products out of MKL and
oneDNN (``trainer.cpu_kernels: portable``), not by this check; nor can it see MKL on another
vendor's processor, a library that picks its blocking from the cache sizes of the processor it
runs on, or ATen code that asks cpuinfo directly.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare.metrics import compare_metrics
from precision_harness.check.compare.stage import compare_stage
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.verdict_text import pair
from precision_harness.dumps.files import read_metrics, sha256_file
from precision_harness.dumps.stage import DirStage, rank_dirs
from precision_harness.goldens.store import GoldenStore
from precision_harness.paths import join_inside
from precision_harness.runs.kind_runners import run_scenario
from precision_harness.runs.launch import RunOptions, RunResult
from precision_harness.scenarios.scenario import Scenario

METRICS = "metrics.jsonl"
_EXACT = CheckSettings(scenario="", policy=TolerancePolicy(mode="exact"))


@dataclass(frozen=True)
class DispatchSetting:
    """Environment variables laid over the gate's determinism environment, and what they stand for."""

    env: tuple[tuple[str, str], ...]
    emulates: str

    @property
    def name(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.env)


def _setting(emulates: str, **env: str) -> DispatchSetting:
    return DispatchSetting(env=tuple(env.items()), emulates=emulates)


#: the dispatch choices the check runs a scenario under (docs/tolerance.md, "CPU portability"). MKL's branch is pinned
#: (``devices.MKL_BRANCH``, COMPATIBLE, which every x86-64 processor runs), not varied; what MKL's dispatcher is told
#: the processor has is: under the pin nothing may change, where MKL_CBWR=AVX2 (the pin before) changed exp and log
SETTINGS: tuple[DispatchSetting, ...] = (
    _setting("a processor with SSE4.2 at most, as MKL's dispatcher sees it", MKL_ENABLE_INSTRUCTIONS="SSE4_2"),
    _setting(
        "a processor with AVX-512, as MKL's dispatcher sees it (where this one has it)",
        MKL_ENABLE_INSTRUCTIONS="AVX512",
    ),
    _setting("a processor oneDNN runs with SSE4.1 kernels", ONEDNN_MAX_CPU_ISA="SSE41"),
    _setting("oneDNN's best kernels for this processor (no cap)", ONEDNN_MAX_CPU_ISA="ALL"),
    _setting("torch with oneDNN off (torch.backends.mkldnn.enabled = False)", PRECISION_MKLDNN="0"),
)


@dataclass(frozen=True)
class Change:
    """One (step, stage), or the metrics, that changed under one setting."""

    setting: str
    where: str  #: ``actor_update @ step_1`` or ``metrics.jsonl``
    first: str  #: the first differing row, e.g. ``Functional.linear.0.forward.output.0 Max 0.40287176 -> 0.40287173``


@dataclass
class ScenarioPortability:
    """The check of one scenario: the settings run, the files compared per run, what changed."""

    scenario: str
    settings: list[str] = field(default_factory=list)
    files: int = 0
    changes: list[Change] = field(default_factory=list)
    against: str = "baseline run"  #: what every setting's run was compared with: "baseline run" or "golden"

    @property
    def independent(self) -> bool:
        return not self.changes

    def lines(self) -> list[str]:
        """The report: one headline, then each changed (step, stage) with the settings that moved it."""
        if self.independent:
            runs = len(self.settings) + (self.against == "baseline run")
            against = "" if self.against == "baseline run" else f" to the {self.against}"
            return [
                f"{self.scenario}: dispatch-independent: {self.files} stage dumps and metrics.jsonl byte-identical"
                f"{against} under {len(self.settings)} settings ({runs} runs)"
            ]
        moved = sorted({c.where for c in self.changes}, key=_where_order)
        stages = sum(where != METRICS for where in moved)
        metrics = " and metrics.jsonl" if METRICS in moved else ""
        lines = [f"{self.scenario}: {stages} of {self.files} stage dumps{metrics} change with the CPU dispatch"]
        for where in moved:
            changes = [c for c in self.changes if c.where == where]
            lines.append(f"  {where}: first differing row {changes[0].first}")
            lines.append(f"    under {'; '.join(c.setting for c in changes)}")
        return lines


def _where_order(where: str) -> tuple[int, str]:
    if where == METRICS:
        return (1 << 30, where)
    stage, _, step = where.partition(" @ step_")
    return (int(step), stage)


def stage_dirs(run_dir: Path) -> dict[str, Path]:
    """``{"actor_update @ step_1": RUN/step_1/actor_update, ...}`` for every dumped stage of a run."""
    found = {}
    for stage_dir in sorted(Path(run_dir).glob("step_*/*")):
        if stage_dir.is_dir() and rank_dirs(stage_dir):
            step = stage_dir.parent.name.removeprefix("step_")
            found[f"{stage_dir.name} @ step_{step}"] = stage_dir
    return found


def _stage_change(target: Path | None, baseline: Path) -> str | None:
    """The first differing row of one stage (None: identical)."""
    if target is None:
        return "missing from this run"
    base, other = DirStage(baseline, step=0), DirStage(target, step=0)
    if base.ranks() == other.ranks() and all(base.digest(r) == other.digest(r) for r in base.ranks()):
        return None
    verdict = compare_stage(other, base, _EXACT)
    first = verdict.first_divergence
    if first is not None:
        rank = f"{first.rank} " if len(verdict.ranks) > 1 else ""
        return f"{rank}{first.tensor} {first.statistic} {pair(first.golden, first.target)}"
    if verdict.problems:
        return str(verdict.problems[0])
    return "dump bytes differ, every statistic equal"


def _metrics_change(target: Path, baseline: Path) -> str | None:
    if not baseline.is_file():
        return None
    if not target.is_file():
        return "missing from this run"
    if sha256_file(target) == sha256_file(baseline):
        return None
    verdict = compare_metrics(read_metrics(target), read_metrics(baseline), _EXACT)
    if verdict.drifts:
        d = verdict.drifts[0]
        return f"step_{d.step} {d.name} {pair(d.golden, d.target)}"
    return verdict.problems[0] if verdict.problems else "bytes differ, every value equal"


def diff_runs(baseline: Path, target: Path, setting: str) -> list[Change]:
    """Every (step, stage) and the metrics of ``target`` that differ from ``baseline``, in execution order."""
    base, other = stage_dirs(baseline), stage_dirs(target)
    changes = []
    for where in sorted(base, key=_where_order):
        first = _stage_change(other.get(where), base[where])
        if first is not None:
            changes.append(Change(setting=setting, where=where, first=first))
    for where in sorted(set(other) - set(base), key=_where_order):
        changes.append(Change(setting=setting, where=where, first="not dumped by the baseline run"))
    first = _metrics_change(Path(target) / METRICS, Path(baseline) / METRICS)
    if first is not None:
        changes.append(Change(setting=setting, where=METRICS, first=first))
    return changes


@dataclass(frozen=True)
class PortabilityRun:
    """How to run the check: device, where runs go, per-run timeout, settings, progress callback."""

    device: str
    work_dir: Path
    timeout: float | None = None
    settings: tuple[DispatchSetting, ...] = SETTINGS
    on_run: Callable[[str, RunResult], Any] | None = None
    #: a run directory recorded in the gate's own environment (an exported golden: ``Golden.export``) that each
    #: setting's run is compared with, in place of a baseline run of its own; one run fewer a scenario, and valid
    #: only where the gate holds that golden bitwise (the CPU goldens on x86: docs/tolerance.md)
    baseline: Path | None = None


def check_scenario(scenario: Scenario, how: PortabilityRun) -> ScenarioPortability:
    """Run ``scenario`` as the gate does, then under each setting; compare every dump with the first run
    (or with ``how.baseline``, where given, without running the baseline).

    Runs go to ``how.work_dir/<scenario>/baseline`` and ``.../setting_<i>`` (replaced).

    Raises:
        RunFailedError: a run failed or timed out (one line, with the worker's log).
    """
    root = Path(how.work_dir) / scenario.name
    shutil.rmtree(root, ignore_errors=True)
    if how.baseline is None:
        baseline = _run(scenario, how, root / "baseline", "baseline", None).run_dir
        against = "baseline run"
    else:
        baseline, against = Path(how.baseline), "golden"
    result = ScenarioPortability(scenario=scenario.name, files=len(stage_dirs(baseline)), against=against)
    for i, setting in enumerate(how.settings):
        run = _run(scenario, how, root / f"setting_{i}", setting.name, dict(setting.env))
        result.settings.append(setting.name)
        result.changes.extend(diff_runs(baseline, run.run_dir, setting.name))
    return result


def exported_golden(store: GoldenStore, scenario: Scenario, device: str, work_dir: Path) -> Path:
    """The scenario's golden written out as a run directory under ``work_dir/.golden/<scenario>`` (replaced): the
    baseline of ``--against-golden``. Beside, not inside, ``work_dir/<scenario>``, which :func:`check_scenario`
    clears before its runs (a scenario's name never starts with a dot).

    Raises:
        GoldenMissingError: no golden (its line names the command that records it); GoldenCorruptError as
            :meth:`Golden.read`; UnsafePathError: the scenario's name would leave ``work_dir``.
    """
    golden = store.load(scenario, device)
    out = join_inside(Path(work_dir), ".golden", scenario.name, what="scenario name")
    shutil.rmtree(out, ignore_errors=True)
    return golden.export(out)


def _run(scenario: Scenario, how: PortabilityRun, out: Path, label: str, env: dict[str, str] | None) -> RunResult:
    options = RunOptions(timeout=how.timeout, dispatch_env=env)
    run = run_scenario(scenario, out_dir=out, device=how.device, options=options)
    if how.on_run is not None:
        how.on_run(label, run)
    return run
