"""The one compare path: a target directory against a golden, item by item, into :class:`Outcome` s.

A target is any directory in verl's dump layout (our run, or verl's ``global_profiler.save_path``);
a golden is a :class:`~precision_harness.golden.Golden`. :func:`check_items` walks the requested
items, a ``(step, stage)`` pair (every rank's ``dump.json``) or the ``metrics.jsonl``, verifies the
golden's files against their sha256, compares, and on a failing stage asks msprobe too (first diff;
graph for L0/mix). The pytest items (through :class:`~precision_harness.session.PrecisionSession`)
and ``precision-harness compare`` both call it, so both give the same verdicts, text and artifacts.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from precision_harness import compare as compare_mod
from precision_harness import verdict_text
from precision_harness.churn import ChurnRow
from precision_harness.compare import DirStage, MetricsVerdict, StageVerdict
from precision_harness.environment import EnvironmentDiff
from precision_harness.errors import GoldenMissingError, PrecisionError
from precision_harness.golden import Golden, GoldenStage
from precision_harness.msprobe_tools import GRAPH_LEVELS, MsprobeAnswer, analyze_failure
from precision_harness.paths import display_path
from precision_harness.scenario import STAGES
from precision_harness.tolerance import TolerancePolicy


class OutcomeKind(str, Enum):
    """What an item's outcome is: compared within/beyond tolerance, identical, a recorded golden, or an error."""

    COMPARED = "compared"
    IDENTICAL = "identical"
    RECORDED = "recorded"
    ERROR = "error"


@dataclass
class Outcome:
    """What an item reports: passed or not, the verdict text, and data for summaries and reports."""

    passed: bool
    text: str
    kind: OutcomeKind
    verdict: StageVerdict | MetricsVerdict | None = None
    msprobe: MsprobeAnswer | None = None
    seconds: float = 0.0  #: compare (and msprobe analysis) wall time
    artifacts: Path | None = None
    churn: list[ChurnRow] = field(default_factory=list)  #: update mode: the stage against the previous golden
    #: ``level: auto``: the stage rerun at L1 and checked against the golden's L1 record (precision_harness.localize)
    localized: Outcome | None = None
    #: the run's environment against the golden's (every item of a scenario carries the same)
    environment: EnvironmentDiff = field(default_factory=EnvironmentDiff)

    @classmethod
    def error(cls, exc: PrecisionError) -> Outcome:
        """A failed outcome whose text is the error's one line."""
        return cls(False, str(exc), OutcomeKind.ERROR)


@dataclass(frozen=True)
class ItemKey:
    """One gate item: a ``(step, stage)`` dump, or the run's ``metrics.jsonl`` (both None)."""

    step: int | None = None
    stage: str | None = None

    @property
    def is_metrics(self) -> bool:
        return self.stage is None

    @property
    def selector(self) -> str:
        """The ``-k`` expression that selects this item alone."""
        return "metrics" if self.is_metrics else f"{self.stage} and step_{self.step}"


METRICS_ITEM = ItemKey()


@dataclass(frozen=True)
class CheckSettings:
    """What every item of one (target, golden) pair is checked with."""

    scenario: str
    policy: TolerancePolicy
    artifacts: Path | None = None  #: compare tables and verdicts go to ``<artifacts>/step_<n>/<stage>/``
    shown: Callable[[Path], Path] = Path  #: how a verdict names a path (e.g. relative to rootdir)
    rerun: Callable[[ItemKey], str] | None = None  #: the command that reruns one item
    rerecord: str | None = None  #: the command that re-records the golden
    changed: tuple[str, ...] = ()  #: numeric settings that differ from the golden's
    #: ask msprobe too on a failing stage (its compare table, first diff, graph); level auto skips it
    #: for the stage it localises, whose L1 rerun gets msprobe's answer instead
    msprobe: bool = True
    #: the target's environment against the golden's: a failing verdict names it first after its headline
    environment: EnvironmentDiff = field(default_factory=EnvironmentDiff)


def items_of(target: Path, golden: Golden) -> list[ItemKey]:
    """Every ``(step, stage)`` with a ``step0/rank*/dump.json`` on either side, in execution order, then metrics."""
    found = set(golden.stages())
    for dump in Path(target).glob("step_*/*/step0/rank*/dump.json"):
        step_dir = dump.parents[3].name
        if step_dir[5:].isdigit():
            found.add((int(step_dir[5:]), dump.parents[2].name))
    order = {s: i for i, s in enumerate(STAGES)}
    keys = [ItemKey(step, stage) for step, stage in sorted(found, key=lambda p: (p[0], order.get(p[1], 99), p[1]))]
    has_metrics = (Path(target) / "metrics.jsonl").is_file() and golden.has_metrics()
    return keys + ([METRICS_ITEM] if has_metrics else [])


def check_items(
    target: Path, golden: Golden, keys: Iterable[ItemKey], settings: CheckSettings
) -> Iterator[tuple[ItemKey, Outcome]]:
    """Outcome of each item of ``target`` against ``golden``; a user-caused problem is a failed outcome.

    Args:
        target: verl-layout directory (``step_<n>/<stage>/step0/rank<r>/dump.json``, ``metrics.jsonl``).
        golden: the golden; each of its files is checked against its sha256 before use.
        keys: the items to check (:func:`items_of` for all of them).
    """
    for key in keys:
        try:
            out = (
                _check_metrics(target, golden, settings)
                if key.is_metrics
                else _check_stage(target, golden, key, settings)
            )
        except PrecisionError as exc:
            out = Outcome.error(exc)
        out.environment = settings.environment
        yield key, out


def _check_stage(target: Path, golden: Golden, key: ItemKey, s: CheckSettings) -> Outcome:
    assert key.step is not None and key.stage is not None
    if not golden.has_stage(key.step, key.stage):
        again = f", re-record with: {s.rerecord}" if s.rerecord else ""
        raise GoldenMissingError(
            f"{display_path(golden.path)}: no dump for {key.stage} @ step_{key.step}; "
            f"the golden predates this step/stage{again}"
        )
    golden.verify_stage(key.step, key.stage)
    artifacts = s.artifacts / f"step_{key.step}" / key.stage if s.artifacts is not None else None
    if artifacts is not None:
        shutil.rmtree(artifacts, ignore_errors=True)
    return check_stage(
        Path(target) / f"step_{key.step}" / key.stage,
        golden.stage(key.step, key.stage),
        scenario=s.scenario,
        step=key.step,
        stage=key.stage,
        policy=s.policy,
        golden_sha256=golden.sha256(key.step, key.stage),
        golden_statistics=golden.statistics(key.step, key.stage),
        artifacts=artifacts,
        shown_artifacts=s.shown(artifacts) if artifacts is not None else None,
        rerun=s.rerun(key) if s.rerun else None,
        changed=list(s.changed),
        level=golden.level,
        msprobe=s.msprobe,
        environment=s.environment.headline(),
    )


def _check_metrics(target: Path, golden: Golden, s: CheckSettings) -> Outcome:
    if not golden.has_metrics():
        again = f"; re-record with: {s.rerecord}" if s.rerecord else ""
        raise GoldenMissingError(f"{display_path(golden.path)}: no metrics.jsonl in the golden{again}")
    return check_metrics(
        Path(target) / "metrics.jsonl",
        golden.metrics(),
        scenario=s.scenario,
        policy=s.policy,
        rerun=s.rerun(METRICS_ITEM) if s.rerun else None,
        changed=list(s.changed),
        environment=s.environment.headline(),
    )


def check_stage(
    target_dir: Path,
    golden_dir: Path | GoldenStage,
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
    msprobe: bool = True,
    environment: str | None = None,
) -> Outcome:
    """Compare one stage and, when it fails, ask msprobe too (first diff; graph for L0/mix).

    Args:
        target_dir: verl-layout stage directory (``.../step_<n>/<stage>``).
        golden_dir: the golden's stage (:meth:`Golden.stage`), or a stage directory.
        artifacts: where compare tables, ``verdict.txt`` and msprobe's output go (None: nowhere).
        shown_artifacts: how the verdict names ``artifacts`` (e.g. relative to rootdir).
        level: msprobe dump level; L0/mix failures also get msprobe's graph database.
        msprobe: False skips msprobe's table, first diff and graph (our verdict alone).
        environment: :meth:`EnvironmentDiff.headline`, the first line after a failing verdict's headline.
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
        artifacts=artifacts if msprobe else None,
    )
    if verdict.passed:
        kind = OutcomeKind.IDENTICAL if verdict.identical else OutcomeKind.COMPARED
        return Outcome(True, verdict_text.stage_text(verdict), kind, verdict, seconds=time.perf_counter() - t0)
    answer = None
    if msprobe and artifacts is not None and any(Path(target_dir).glob("step0/rank*/dump.json")):
        golden = DirStage(golden_dir) if isinstance(golden_dir, (str, Path)) else golden_dir
        plain = golden.plain_dir(artifacts / "golden")  # msprobe's tools read plain files
        answer = analyze_failure(Path(target_dir), plain, artifacts, graph=level in GRAPH_LEVELS)
    shown = shown_artifacts or artifacts
    text = verdict_text.stage_text(
        verdict,
        artifacts=shown,
        rerun=rerun,
        changed=changed,
        environment=environment,
        msprobe=answer.lines(graph_dir=(shown / "graph") if shown is not None else None) if answer else None,
    )
    if artifacts is not None:
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "verdict.txt").write_text(text + "\n", encoding="utf-8")
    return Outcome(
        False, text, OutcomeKind.COMPARED, verdict, answer, seconds=time.perf_counter() - t0, artifacts=shown
    )


def check_metrics(
    target: Path,
    golden: Path | list[dict[str, Any]],
    *,
    scenario: str,
    policy: TolerancePolicy,
    rerun: str | None = None,
    changed: list[str] | None = None,
    environment: str | None = None,
) -> Outcome:
    """Compare a ``metrics.jsonl`` with the golden's (a file, or its parsed rows) with ``policy.for_metric``.

    ``environment`` (:meth:`EnvironmentDiff.headline`) is the first line after a failing verdict's headline.
    """
    __tracebackhide__ = True
    t0 = time.perf_counter()
    golden_rows = compare_mod.read_metrics(golden) if isinstance(golden, (str, Path)) else golden
    verdict = compare_mod.compare_metrics(
        compare_mod.read_metrics(target), golden_rows, scenario=scenario, policy=policy
    )
    text = verdict_text.metrics_text(
        verdict,
        rerun=None if verdict.passed else rerun,
        policy_exact=policy.exact,
        changed=None if verdict.passed else changed,
        environment=None if verdict.passed else environment,
    )
    return Outcome(verdict.passed, text, OutcomeKind.COMPARED, verdict, seconds=time.perf_counter() - t0)
