"""What one side's msprobe records and the other's does not: a statistic that is a number on one side only.

msprobe's releases differ in what they record, not only in how: mindstudio-probe 26.0.0 records Mean and Norm of
integer tensors, 26.2.0 writes them null (``get_stat_info`` computes them for floating-point tensors only), and
``"precision": "high"`` nulls Mean and Norm altogether. Such a statistic was not computed differently; it was
recorded on one side only, so the compare judges the statistics both sides record and counts the others here, by
statistic and dtype, in two directions (docs/msprobe.md, "What is recorded"):

- **added**: the run records what the golden does not (an msprobe that records more). Nothing to compare it with:
  named and counted, the item passes; re-recording the golden makes them compared.
- **lost**: the golden records what the run does not (an msprobe that records less). The gate would check less than
  the golden promises without a word: the item fails, naming what is lost, until the golden is re-recorded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from precision_harness.check.environment import Change, EnvironmentDiff
from precision_harness.dumps.statistics import STATISTICS

#: the environment's label of msprobe's version (:data:`precision_harness.check.environment.ORDER`)
MSPROBE = "mindstudio-probe"
#: one-sided rows a failing verdict names
MAX_NAMED = 3


@dataclass
class RecordingDiff:
    """The statistics one side records and the other does not, counted by ``(statistic, dtype)``.

    Attributes:
        added: the run records them, the golden does not (not compared).
        lost: the golden records them, the run does not (coverage lost: fails).
        lost_rows: the first lost ones, ``"rank0: <row> <statistic>"`` (at most :data:`MAX_NAMED` a rank).
        lost_ranks: the ranks where any is lost.
    """

    added: Counter[tuple[str, str]] = field(default_factory=Counter)
    lost: Counter[tuple[str, str]] = field(default_factory=Counter)
    lost_rows: list[str] = field(default_factory=list)
    lost_ranks: set[str] = field(default_factory=set)

    def note(self, statistic: str, dtype: str, *, lost: bool, where: tuple[str, str]) -> None:
        """One statistic null on one side: ``lost`` where the golden's is the number; ``where`` is ``(rank, row)``."""
        if not lost:
            self.added[statistic, dtype] += 1
            return
        self.lost[statistic, dtype] += 1
        rank, row = where
        if rank not in self.lost_ranks or len(self.lost_rows) < MAX_NAMED:
            self.lost_rows.append(f"{rank}: {row} {statistic}")
        self.lost_ranks.add(rank)

    def merge(self, other: RecordingDiff) -> None:
        self.added += other.added
        self.lost += other.lost
        self.lost_rows += other.lost_rows[: max(0, MAX_NAMED - len(self.lost_rows))]
        self.lost_ranks |= other.lost_ranks

    def __bool__(self) -> bool:
        return bool(self.added or self.lost)


def what(counts: Counter[tuple[str, str]]) -> str:
    """``"Mean and Norm of torch.int64 and torch.int32 tensors"``: the statistics by the dtypes they are recorded
    for, dtypes that share a set of statistics said together."""
    by_dtype: dict[str, list[str]] = {}
    for statistic, dtype in sorted(counts, key=lambda k: (k[1], _order(k[0]))):
        by_dtype.setdefault(dtype, []).append(statistic)
    groups: dict[tuple[str, ...], list[str]] = {}
    for dtype, statistics in by_dtype.items():
        groups.setdefault(tuple(statistics), []).append(dtype)
    return "; ".join(f"{_and(list(stats))} of {_and(dtypes)} tensors" for stats, dtypes in groups.items())


def _order(statistic: str) -> int:
    return STATISTICS.index(statistic) if statistic in STATISTICS else len(STATISTICS)


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def msprobe_change(environment: EnvironmentDiff) -> Change | None:
    """msprobe's version change between the golden's environment and the run's, where both record it."""
    return next((c for c in environment.changes if c.what == MSPROBE and c.recorded), None)


def added_line(diff: RecordingDiff, environment: EnvironmentDiff) -> str | None:
    """What a verdict says of the statistics only the run records (None: none): passing, named and counted."""
    if not diff.added:
        return None
    n = sum(diff.added.values())
    change = msprobe_change(environment)
    who = f"{change} records" if change is not None else "this run's msprobe records"
    return (
        f"{who} {what(diff.added)}, which the golden's did not: {n} statistic(s) not compared "
        "(not a numeric change; re-record the golden to compare them)"
    )


def lost_line(diff: RecordingDiff, environment: EnvironmentDiff, *, rerecord: str | None = None) -> str | None:
    """What a failing verdict says of the statistics the golden records and the run does not (None: none)."""
    if not diff.lost:
        return None
    n = sum(diff.lost.values())
    change = msprobe_change(environment)
    who = f"{change} no longer records" if change is not None else "this run's msprobe does not record"
    again = f": {rerecord}" if rerecord else ""
    return (
        f"{who} {what(diff.lost)}, which the golden records: {n} statistic(s) of the golden unchecked "
        f"(first: {diff.lost_rows[0]}); re-record the golden to accept the narrower check{again}"
    )
