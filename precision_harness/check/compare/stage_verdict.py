"""The verdicts of a stage compare: one rank's (:class:`RankVerdict`) and the stage's (:class:`StageVerdict`), and the
always-failures they hold (:class:`Problem`); built by :mod:`~precision_harness.check.compare.stage`, read by the
verdict text, the reports, the judgement and msprobe's window."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any

from precision_harness.check.compare.code_path import CodePathChange
from precision_harness.check.compare.drift_profile import DriftProfile
from precision_harness.check.compare.drift_set import Drift, DriftSet, kept
from precision_harness.check.coverage import DECLARED_UNCHECKED, NOT_RECORDED, Ledger
from precision_harness.check.recording import RecordingDiff
from precision_harness.dumps.statistics import STATISTICS


@dataclass(frozen=True)
class Problem:
    """An always-failure (a structural difference, a value turned non-finite), on one rank or on the stage.

    ``str()`` is the verdict's line: ``"rank1: Functional.linear.0.forward.output.0: not in the golden"``.
    """

    text: str
    rank: str | None = None

    def __str__(self) -> str:
        return f"{self.rank}: {self.text}" if self.rank is not None else self.text


class _Verdict:
    """What every verdict answers: passed, when nothing drifted beyond tolerance and nothing always fails."""

    drifts: list[Any]
    problems: list[Any]

    @property
    def passed(self) -> bool:
        return not self.drifts and not self.problems


@dataclass
class RankVerdict(_Verdict):
    """Outcome of comparing one rank's dump pair (its share of a :class:`StageVerdict`)."""

    rank: str
    checked: int = 0
    #: the first and the largest drifts (:mod:`~precision_harness.check.compare.drift_set`), in row order
    drifts: list[Drift] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: the count of the drifts not kept, and every drift by API and statistic
    drift_set: DriftSet = field(default_factory=DriftSet)
    profile: DriftProfile = field(default_factory=DriftProfile)  #: every compared row, in execution order
    #: the changed blocks of the call stream (:mod:`precision_harness.check.compare.code_path`)
    code_paths: list[CodePathChange] = field(default_factory=list)
    #: ``(rank, row)`` of every paired row whose dtype or shape changed (its profile ratio is ``inf``, as is that
    #: of any change under ``mode: exact``: this set tells the two apart)
    structural: set[tuple[str, str]] = field(default_factory=set)
    #: tensor rows neither side recorded a statistic of: compared by nothing
    unchecked: list[str] = field(default_factory=list)
    #: rows of FSDP2's unfilled all-gather buffer, left out of the compare
    #: (:mod:`~precision_harness.check.compare.unfilled`)
    unfilled: list[str] = field(default_factory=list)
    #: the statistics one side's msprobe records and the other's does not (:mod:`~precision_harness.check.recording`)
    recording: RecordingDiff = field(default_factory=RecordingDiff)
    #: the rank's calls in order, where the run's and the golden's are the same; a failing rank's only (msprobe's
    #: window is cut from the dumps' bytes around them: :mod:`~precision_harness.check.localize.msprobe_window`)
    calls: list[str] | None = field(default=None, repr=False)
    #: the golden rank's tensor rows and statistics: compared, or why not (:mod:`~precision_harness.check.coverage`)
    coverage: Ledger = field(default_factory=Ledger, repr=False)
    _nan_reported: bool = field(default=False, repr=False)
    _table_kept: list[Drift] = field(default_factory=list, repr=False)  #: those judged at once, until bound()

    def problem(self, text: str) -> None:
        self.problems.append(Problem(text, self.rank))

    def bound(self) -> None:
        """Keep the rank's first and largest drifts (:func:`~precision_harness.check.compare.drift_set.kept`): those
        built row by row, counted here, with those already selected from the table's arrays; the profile packed into
        columns (:mod:`~precision_harness.check.compare.drift_profile`)."""
        self.drift_set.count(self.drifts)
        every = sorted(self.drifts + self._table_kept, key=lambda d: (d.order, STATISTICS.index(d.statistic)))
        self.drifts, self._table_kept = kept(every), []
        self.drift_set.dropped += len(every) - len(self.drifts)
        self.profile.pack()
        if self.passed:
            self.calls = None


@dataclass
class StageVerdict(_Verdict):
    """Outcome of comparing one (scenario, step, stage) across all its ranks."""

    scenario: str
    step: int
    stage: str
    checked: int = 0  #: statistics compared
    #: each rank's first and largest drifts (:mod:`~precision_harness.check.compare.drift_set`), by rank and row order
    drifts: list[Drift] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  #: always-failures, one line each
    #: the count of the drifts not kept, and every drift by API and statistic
    drift_set: DriftSet = field(default_factory=DriftSet)
    tolerance: str = ""
    identical: bool = False  #: every rank's digest equals the golden's
    ranks: list[str] = field(default_factory=list)
    #: ``(rank, order, tensor, worst ratio)`` for every compared row, in execution order: the drift profile a
    #: report plots, where the change entered and the replay read, whole on a failing stage; a passing stage
    #: keeps only its worst point, all its readers use (:meth:`settle`); empty for identical dumps.
    profile: DriftProfile = field(default_factory=DriftProfile)
    #: the changed blocks of every rank's call stream, in execution order
    #: (:mod:`precision_harness.check.compare.code_path`)
    code_paths: list[CodePathChange] = field(default_factory=list)
    #: any changed block fails the stage (the scenario's ``tolerance.code_path: fail``), even one whose
    #: values match the golden's
    strict_code_path: bool = False
    #: ``(rank, row)`` of every paired row whose dtype or shape changed
    structural: set[tuple[str, str]] = field(default_factory=set)
    #: ``(rank, row)`` of every tensor row neither side recorded a statistic of (msprobe records none of a
    #: FRACTAL_NZ or fp8 tensor on NPU): compared by nothing
    unchecked: list[tuple[str, str]] = field(default_factory=list)
    #: globs of the rows the scenario allows to go unchecked (``tolerance.unchecked``)
    allow_unchecked: tuple[str, ...] = ()
    #: ``(rank, row)`` of the rows of FSDP2's all-gather buffer left out where a side ran without its zero-fill, and
    #: why (:mod:`~precision_harness.check.compare.unfilled`)
    unfilled: list[tuple[str, str]] = field(default_factory=list)
    unfilled_reason: str = ""
    #: the statistics one side's msprobe records and the other's does not: those only the golden records (``lost``)
    #: fail the stage, those only the run records (``added``) are named (:mod:`~precision_harness.check.recording`)
    recording: RecordingDiff = field(default_factory=RecordingDiff)
    #: :attr:`RankVerdict.calls` of :attr:`first_divergent_rank` once the stage is settled (:meth:`settle`)
    calls: dict[str, list[str]] = field(default_factory=dict, repr=False)
    #: the golden stage's ranks, tensor rows and statistics: compared, or why not (read :attr:`ledger`)
    coverage: Ledger = field(default_factory=Ledger, repr=False)

    @property
    def ledger(self) -> Ledger:
        """:attr:`coverage`, its unrecorded rows that a ``tolerance.unchecked`` glob names counted as declared."""
        ledger = Ledger.of([self.coverage])
        if "rows" in ledger.units:
            ledger["rows"].reclass(NOT_RECORDED, DECLARED_UNCHECKED, len(self.unchecked) - len(self.failing_unchecked))
        return ledger

    @property
    def passed(self) -> bool:
        """Nothing drifted, nothing always fails, every changed block passes (its values match, not strict), every
        tensor row compared by nothing is one the scenario allows, and the run records all the golden records."""
        unchecked = self.failing_code_paths or self.failing_unchecked or self.recording.loses
        return super().passed and not unchecked

    @property
    def coverage_only(self) -> bool:
        """It fails only because the run records less than the golden (:mod:`~precision_harness.check.recording`):
        nothing moved for msprobe's analyses or for where a change entered to read."""
        others = self.drifts or self.problems or self.failing_code_paths or self.failing_unchecked
        return self.recording.loses and not others

    @property
    def beyond(self) -> int:
        """Statistics beyond tolerance, every one counted (only some are kept as :attr:`drifts`)."""
        return len(self.drifts) + self.drift_set.dropped

    @property
    def failing_unchecked(self) -> list[tuple[str, str]]:
        """The unchecked tensor rows no ``tolerance.unchecked`` glob names (row or API name)."""
        allowed = self.allow_unchecked
        return [(r, n) for r, n in self.unchecked if not any(fnmatch.fnmatchcase(n, g) for g in allowed)]

    @property
    def failing_code_paths(self) -> list[CodePathChange]:
        """The changed blocks that fail the stage: those whose values differ, or every one under ``strict``."""
        return [c for c in self.code_paths if self.strict_code_path or not c.matches]

    @property
    def worst_ratio(self) -> float:
        """Largest tolerance ratio of any statistic (``inf`` for a structural failure; 0 if identical)."""
        worst = max([d.ratio for d in self.drifts] + [self.profile.max_ratio()])
        worst = max([worst] + [c.ratio for c in self.code_paths])
        failing = self.problems or self.failing_code_paths or self.failing_unchecked or self.recording.loses
        return math.inf if failing else worst

    @property
    def first_divergence(self) -> Drift | None:
        """The drift earliest in execution order; across ranks, the one whose rank diverged first.

        Ranks run the same program in lock step (collectives synchronise them), so a row index is
        comparable across ranks: a change to rank 1's data shows in rank 1's forward before rank 0
        sees it through the gradient all-reduce.
        """
        return min(self.drifts, key=lambda d: (d.order, d.rank)) if self.drifts else None

    @property
    def first_divergent_rank(self) -> str | None:
        """The rank msprobe's analyses read: that of :attr:`first_divergence`, else the first failing rank."""
        first = self.first_divergence
        if first is not None:
            return first.rank
        return self.failing_ranks[0] if self.failing_ranks else None

    @property
    def failing_ranks(self) -> list[str]:
        """Ranks with a drift or an always-failure, sorted (``rank2`` before ``rank10``)."""
        ranks = {d.rank for d in self.drifts} | {p.rank for p in self.problems if p.rank is not None}
        ranks |= {c.rank for c in self.failing_code_paths} | {r for r, _ in self.failing_unchecked}
        ranks |= self.recording.lost_ranks
        return sorted(ranks, key=lambda r: (len(r), r))

    @property
    def largest(self) -> Drift | None:
        return max(self.drifts, key=lambda d: (d.ratio, -d.order)) if self.drifts else None

    def settle(self) -> None:
        """Once every rank is in: a passing stage drops its profile but for its worst point (the first of the
        largest ratio), which is all :attr:`worst_ratio` and the code path line read of a passing verdict; at 7B a
        stage's profile is 1.6 M rows, and a check holds every stage's verdict to the end."""
        if self.passed and self.profile:
            self.profile = DriftProfile([self.profile.worst()])
        rank = self.first_divergent_rank
        self.calls = {rank: self.calls[rank]} if rank in self.calls else {}

    def add(self, rank: RankVerdict) -> None:
        """Take in one rank's result."""
        self.checked += rank.checked
        self.drifts += rank.drifts
        self.drift_set.merge(rank.drift_set)
        self.problems += rank.problems
        self.profile += rank.profile
        self.code_paths += rank.code_paths
        self.structural |= rank.structural
        self.unchecked += [(rank.rank, name) for name in rank.unchecked]
        self.unfilled += [(rank.rank, name) for name in rank.unfilled]
        self.coverage.add(rank.coverage)
        self.recording.merge(rank.recording)
        if rank.calls is not None:
            self.calls[rank.rank] = rank.calls
