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

Whole calls too: mindstudio-probe 26.x records, at L1 and mix, only the APIs its ``risk_level`` keeps (``FOCUS`` by
default: every API but the low-risk ones of :data:`LOW_RISK_APIS`, ``.to``, ``.transpose``, ``cat``...); the 8.x line
has no ``risk_level`` and records them all. A stage recorded by each holds the same calls but those, and their
statistics are the same (the 8.3.3 row of docs/stacks.md). Where one side holds no call of a low-risk API and the
other does, those calls were recorded on one side only: :func:`drop_one_sided_calls` takes them out before the
calls are paired, and counts them in the same two directions (a call of one of those APIs that a code change adds
where both record them is paired, as any other).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from precision_harness.check.environment import Change, EnvironmentDiff
from precision_harness.dumps.statistics import STATISTICS

#: the environment's label of msprobe's version (:data:`precision_harness.check.environment.ORDER`)
MSPROBE = "mindstudio-probe"
#: one-sided rows a failing verdict names
MAX_NAMED = 3
#: the APIs mindstudio-probe 26.x leaves out at ``risk_level`` FOCUS (its default): ``LOW_RISK_API_SET`` of
#: msprobe/pytorch/dump/api_dump/api_risk_level.py, the same in 26.0.0, 26.1.0 and 26.2.0. Copied, not imported: the
#: golden's msprobe is not the one installed where it matters (a run under the 8.x line, which has no such module).
# fmt: off
LOW_RISK_APIS = frozenset({
    "squeeze", "unsqueeze", "reshape", "reshape_as", "view", "view_as", "flatten", "unflatten", "expand", "expand_as",
    "repeat", "repeat_interleave", "tile", "transpose", "permute", "moveaxis", "movedim", "swapaxes", "swapdims",
    "chunk", "unsafe_chunk", "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "tensor_split",
    "hsplit", "vsplit", "dsplit", "unbind", "stack", "cat", "concat", "concatenate", "hstack", "vstack", "dstack",
    "column_stack", "row_stack", "align_as", "align_to", "atleast_1d", "atleast_2d", "atleast_3d", "ravel", "clamp",
    "unfold", "type_as", "to", "float", "double", "int", "long", "half", "bfloat16", "byte", "char", "bool", "cfloat",
    "numpy", "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "arange",
    "linspace", "logspace", "eye", "identity", "diag", "diagflat", "diag_embed", "triu", "tril", "triu_indices",
    "tril_indices", "clone", "__bool__", "stride",
})
# fmt: on
#: why a call is recorded on one side only: its API is low-risk (26.x leaves it out), or it is a backward that
#: repeats the one before it (8.x hooks an autograd node again through a call whose output is its input)
LOW_RISK, REPEATED = "low-risk", "repeated backward"
#: a dump.json key's call suffix, and the prefixes risk_level never leaves out (data_collector.py, both as 26.2.0's)
_CALL = re.compile(r"\.\d+\.(forward|backward)$")
_MODULES = ("Module", "Cell")


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
    #: calls one side records and the other does not, by ``(why, API)``: :data:`LOW_RISK` or :data:`REPEATED`
    calls_added: Counter[tuple[str, str]] = field(default_factory=Counter)
    calls_lost: Counter[tuple[str, str]] = field(default_factory=Counter)

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

    def note_calls(self, names: dict[str, str], *, lost: bool, rank: str) -> None:
        """Whole calls one side records (dump.json key -> why): ``lost`` where the golden's are the ones recorded."""
        apis = Counter((why, _CALL.sub("", name)) for name, why in names.items())
        names = list(names)
        if not lost:
            self.calls_added += apis
            return
        self.calls_lost += apis
        self.lost_rows += [f"{rank}: {name}" for name in names[: max(0, MAX_NAMED - len(self.lost_rows))]]
        self.lost_ranks.add(rank)

    @property
    def loses(self) -> bool:
        """The golden records something the run does not: statistics or calls (coverage lost: fails)."""
        return bool(self.lost or self.calls_lost)

    def merge(self, other: RecordingDiff) -> None:
        self.added += other.added
        self.lost += other.lost
        self.calls_added += other.calls_added
        self.calls_lost += other.calls_lost
        self.lost_rows += other.lost_rows[: max(0, MAX_NAMED - len(self.lost_rows))]
        self.lost_ranks |= other.lost_ranks

    def __bool__(self) -> bool:
        return bool(self.added or self.lost or self.calls_added or self.calls_lost)


def low_risk(name: str) -> bool:
    """Whether dump.json key ``name`` is a call of an API msprobe 26.x leaves out at risk_level FOCUS."""
    prefix, _, api = _CALL.sub("", name).partition(".")
    return prefix not in _MODULES and api in LOW_RISK_APIS


def drop_one_sided_calls(diff: RecordingDiff, dumps: tuple[dict[str, Any], dict[str, Any]], rank: str) -> dict | None:
    """Take out of ``dumps`` (the run's and the golden's parsed dump.json, changed in place) the calls one side's
    msprobe records and the other's does not, and count them into ``diff``: where one side holds no low-risk call and
    the other does (two msprobe lines, as the module docstring says), that side's low-risk calls, and its backward
    calls that the other side does not hold and that repeat, entry for entry, the backward recorded just before them
    (8.3.3 hooks the autograd node of a call whose output is its input, dropout at p=0, and records that node's
    backward again under the call's name; 26.x records it once). Returns the golden's calls taken out (``{"data":
    {key: entry}}``, for the coverage ledger), or None where none was."""
    t_data, g_data = dumps[0]["data"], dumps[1]["data"]
    t_low, g_low = [n for n in t_data if low_risk(n)], [n for n in g_data if low_risk(n)]
    if bool(t_low) == bool(g_low):
        return None
    lost = bool(g_low)
    data, other = (g_data, t_data) if lost else (t_data, g_data)
    why = {name: LOW_RISK for name in (g_low or t_low)}
    why.update({name: REPEATED for name in _repeated_backwards(data, other) if name not in why})
    taken = {name: data.pop(name) for name in why}
    diff.note_calls(why, lost=lost, rank=rank)
    return {"data": taken} if lost else None


def _repeated_backwards(data: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """The backward calls of ``data`` that ``other`` does not hold and whose entry equals the backward before them."""
    found, before = [], None
    for name, entry in data.items():
        if not name.endswith(".backward"):
            continue
        if before is not None and name not in other and entry == data[before]:
            found.append(name)
        before = name
    return found


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
    """What a verdict says of the statistics and calls only the run records (None: none): passing, named and
    counted."""
    if not diff.added and not diff.calls_added:
        return None
    change = msprobe_change(environment)
    who = f"{change} records" if change is not None else "this run's msprobe records"
    parts = [f"{what(diff.added)}, which the golden's did not: {sum(diff.added.values())} statistic(s)"]
    parts = parts if diff.added else []
    if diff.calls_added:
        calls = sum(diff.calls_added.values())
        parts.append(f"{_calls(diff.calls_added)}, which the golden's left out: {calls} call(s)")
    return f"{who} {'; and '.join(parts)} not compared (not a numeric change; re-record the golden to compare them)"


def _calls(calls: Counter[tuple[str, str]]) -> str:
    """``"the calls of 9 low-risk API(s) (msprobe 26.x's risk_level FOCUS leaves them out: Tensor.to x26, ...)"``, and
    the backward calls that repeat the one before them, by API."""
    parts = []
    for why, said in ((LOW_RISK, _LOW_RISK_SAID), (REPEATED, _REPEATED_SAID)):
        apis = Counter({api: n for (kind, api), n in calls.items() if kind == why})
        if apis:
            named = ", ".join(f"{api} x{n}" for api, n in apis.most_common(MAX_NAMED))
            more = f" and {len(apis) - MAX_NAMED} more" if len(apis) > MAX_NAMED else ""
            parts.append(said.format(n=len(apis), named=f"{named}{more}"))
    return " and ".join(parts)


_LOW_RISK_SAID = "the calls of {n} low-risk API(s) (msprobe 26.x's risk_level FOCUS leaves them out: {named})"
_REPEATED_SAID = (
    "the backward calls of {n} API(s) that repeat the backward before them ({named}: 8.x records an autograd node "
    "again for a call whose output is its input)"
)


def lost_line(diff: RecordingDiff, environment: EnvironmentDiff, *, rerecord: str | None = None) -> str | None:
    """What a failing verdict says of the statistics the golden records and the run does not (None: none)."""
    if not diff.loses:
        return None
    change = msprobe_change(environment)
    who = f"{change} no longer records" if change is not None else "this run's msprobe does not record"
    again = f": {rerecord}" if rerecord else ""
    parts = [f"{what(diff.lost)}, which the golden records: {sum(diff.lost.values())} statistic(s)"]
    parts = parts if diff.lost else []
    if diff.calls_lost:
        parts.append(f"{_calls(diff.calls_lost)}, which the golden records: {sum(diff.calls_lost.values())} call(s)")
    return (
        f"{who} {'; and '.join(parts)} of the golden unchecked (first: {diff.lost_rows[0]}); re-record the golden "
        f"to accept the narrower check{again}"
    )
