"""The one path that turns a (target, golden) stage pair or metrics pair into an :class:`Outcome`.

The pytest items (through :class:`~precision_harness.session.PrecisionSession`) and
``precision-harness compare`` both call :func:`check_stage` and :func:`check_metrics`, so the CLI's
verdict, text, artifacts and msprobe analysis are the plugin's (STYLE.md: "one path decides").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precision_harness import compare as compare_mod
from precision_harness import report
from precision_harness.msprobe_tools import GRAPH_LEVELS, MsprobeAnswer, analyze_failure
from precision_harness.tolerance import TolerancePolicy


@dataclass
class Outcome:
    """What an item reports: passed or not, the verdict text, and data for summaries and reports."""

    passed: bool
    text: str
    kind: str  # "compared", "identical", "recorded", "error"
    verdict: Any = None
    msprobe: MsprobeAnswer | None = None
    seconds: float = 0.0  #: compare (and msprobe analysis) wall time
    artifacts: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)  #: e.g. ``churn`` rows in update mode


def check_stage(
    target_dir: Path,
    golden_dir: Path,
    *,
    scenario: str,
    step: int,
    stage: str,
    policy: TolerancePolicy,
    golden_sha256: dict[str, str] | None = None,
    golden_statistics: int | None = None,
    artifacts: Path | None = None,
    shown_artifacts: Path | None = None,
    rerun: str | None = None,
    changed: list[str] | None = None,
    level: str | None = None,
) -> Outcome:
    """Compare one stage and, when it fails, ask msprobe too (first diff; graph for L0/mix).

    Args:
        target_dir, golden_dir: verl-layout stage directories (``.../step_<n>/<stage>``).
        artifacts: where compare tables, ``verdict.txt`` and msprobe's output go (None: nowhere).
        shown_artifacts: how the verdict names ``artifacts`` (e.g. relative to rootdir).
        level: msprobe dump level; L0/mix failures also get msprobe's graph database.
    """
    __tracebackhide__ = True
    t0 = time.perf_counter()
    verdict = compare_mod.compare_stage(
        target_dir,
        golden_dir,
        scenario=scenario,
        step=step,
        stage=stage,
        policy=policy,
        golden_sha256=golden_sha256,
        golden_statistics=golden_statistics,
        artifacts=artifacts,
    )
    answer = None
    if not verdict.passed and artifacts is not None and any(Path(target_dir).glob("step0/rank*/dump.json")):
        answer = analyze_failure(Path(target_dir), Path(golden_dir), artifacts, graph=level in GRAPH_LEVELS)
    shown = shown_artifacts or artifacts
    text = report.stage_text(
        verdict,
        artifacts=None if verdict.passed else shown,
        rerun=None if verdict.passed else rerun,
        changed=None if verdict.passed else changed,
        msprobe=answer.lines(graph_dir=(shown / "graph") if shown is not None else None) if answer else None,
    )
    if not verdict.passed and artifacts is not None:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "verdict.txt").write_text(text + "\n", encoding="utf-8")
    return Outcome(
        verdict.passed,
        text,
        "identical" if verdict.identical else "compared",
        verdict,
        answer,
        seconds=time.perf_counter() - t0,
        artifacts=None if verdict.passed else shown,
    )


def check_metrics(
    target: Path,
    golden: Path,
    *,
    scenario: str,
    policy: TolerancePolicy,
    rerun: str | None = None,
    changed: list[str] | None = None,
) -> Outcome:
    """Compare two ``metrics.jsonl`` files with ``policy.for_metric``."""
    __tracebackhide__ = True
    t0 = time.perf_counter()
    verdict = compare_mod.compare_metrics(
        compare_mod.read_metrics(target), compare_mod.read_metrics(golden), scenario=scenario, policy=policy
    )
    text = report.metrics_text(
        verdict,
        rerun=None if verdict.passed else rerun,
        policy_exact=policy.exact,
        changed=None if verdict.passed else changed,
    )
    return Outcome(verdict.passed, text, "compared", verdict, seconds=time.perf_counter() - t0)
