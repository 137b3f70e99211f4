"""Where a drifted stage's change entered: the classification a failing verdict leads with.

A stage's first divergent row (the first statistic beyond tolerance, in execution order) is where
the drift became visible. Where the change *entered* is the earliest row that differs at all
(:attr:`~precision_harness.check.compare.stage_verdict.StageVerdict.profile`: a worst ratio above 0, or another
dtype or shape than the golden's, whose statistics may still match), at or before it, on any rank:
every recorded value before that row equals the golden's, so whatever made it differ did not come
from an API of the stage msprobe recorded. Its place in the dump says
which of four kinds of change it is, checked in this order:

=============  ===============================================================  ===============================
kind           the earliest differing row is                                    the verdict says
=============  ===============================================================  ===============================
``upstream``   a forward input that does not require grad, or a Python value    the change is upstream of the
               (data entering the stage: advantages, rollouts, batches,         stage
               settings); a ``Stage.*`` input row of ``level: auto``
``weights``    a module's ``parameters`` row (L0, mix), or a forward input      an earlier update moved the
               that requires grad: the parameters as the stage began            weights
``api``        an output of an API (or module) whose every input matches        this API computes differently
               the golden's                                                     now
``unrecorded`` a backward input (the gradient reaching an API) that no          the change entered through
               recorded API produced; an output of an entry that records no     values msprobe does not record
               inputs (``rollout_generate``'s log-prob rows); an input whose
               dtype or shape changed that carries an earlier recorded
               output's value (a cast, int/bool ones included: never upstream)
``code_path``  a changed block of the call stream (calls inserted, removed or   the code path changed there
               replaced: :mod:`precision_harness.check.compare.code_path`) whose
               values differ from the golden's, before any differing row
=============  ===============================================================  ===============================

A changed block whose values match the golden's is not where a change entered: the rows after it are
compared as usual, so a numeric change further on is named where it is. A stage that fails on
structure alone (a dtype or shape changed, every statistic within tolerance) is classified from its
earliest structural row.

The earliest differing row cannot be an input an earlier recorded API produced: that API's output
would have differed first. What the rule cannot see: a value computed inside the stage by an op
msprobe does not hook (an ``aten`` call, a custom kernel) reads as data (``upstream``) or, when it
requires grad, as a weight (docs/triage.md, "When not to trust them").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from precision_harness.check.compare.code_path import CodePathChange
from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.dumps.files import restored_calls
from precision_harness.dumps.pairing import aligned_golden, pair_calls
from precision_harness.dumps.rows import numel, row_statistics, rows
from precision_harness.dumps.stage import StageSource, cut_rank
from precision_harness.dumps.statistics import relative_change

#: msprobe row states (``read_op``) of a module's parameters, and of their gradients
PARAMETERS, PARAMETERS_GRAD = "parameters", "parameters_grad"
#: the API prefix of the rows ``level: auto`` adds (the runner's stage inputs and outputs)
STAGE_PREFIX = "Stage."
#: the label of the classification line in a verdict
LABEL = "change entered"


class OriginKind(str, Enum):
    """Where a stage's change entered (module docstring's table)."""

    UPSTREAM = "upstream"
    WEIGHTS = "weights"
    API = "api"
    UNRECORDED = "unrecorded"
    CODE_PATH = "code_path"


@dataclass(frozen=True)
class DriftOrigin:
    """Where one failing stage's change entered.

    Attributes:
        kind: which of the four kinds (:class:`OriginKind`).
        row: the earliest differing row, msprobe's name (``Tensor.__mul__.23.forward.input.0``).
        api: the dump.json key the row belongs to (``Tensor.__mul__.23.forward``).
        rank: the rank it differs on first.
        stage: the stage's name (``actor_update``).
        first_divergence: the first row beyond tolerance (equal to ``row`` when the change passed
            tolerance where it entered).
        structural: ``row``'s dtype or shape differs from the golden's (its statistics may not).
        code_path: the changed block where the change entered (``kind`` ``code_path``).
        producer: for a ``row`` whose dtype or shape changed inside the stage, the earlier recorded output it
            holds (equal statistics): an op msprobe does not record (a cast) changed it between the two.
        inputs_rel: for an ``api`` origin, the largest relative change of a statistic of the API's inputs from
            the golden's (0.0: every statistic equal; None: not measured, no golden given).
    """

    kind: OriginKind
    row: str
    api: str
    rank: str
    stage: str
    first_divergence: str
    structural: bool = False
    code_path: CodePathChange | None = None
    producer: str | None = None  #: the recorded output ``row`` holds, another dtype or shape (an unrecorded op)
    inputs_rel: float | None = None

    @property
    def below_tolerance(self) -> bool:
        """The change entered within tolerance and passed it later (at :attr:`first_divergence`)."""
        return self.row != self.first_divergence and not self.structural and self.code_path is None

    @property
    def summary(self) -> str:
        """What the verdict's classification line says (after its label)."""
        text = _SUMMARIES[self.kind](self)
        if self.structural and self.producer is None:
            text += "; its dtype or shape differs from the golden's"
        elif self.below_tolerance:
            text += "; within tolerance there, it passes tolerance at the first divergence below"
        return text

    def to_json(self) -> dict[str, Any]:
        """``{"kind", "row", "api", "rank", "first_divergence", "text"}``, as report.json keeps it."""
        return {
            "kind": self.kind.value,
            "row": self.row,
            "api": self.api,
            "rank": self.rank,
            "first_divergence": self.first_divergence,
            "text": self.summary,
        }


_SUMMARIES = {
    OriginKind.UPSTREAM: lambda o: (
        f"the change is upstream of {o.stage}: its input {o.row} is the first value that differs, and no API of "
        "the stage computed it (look at what computes it before the stage: advantages, rollouts, batches, settings)"
    ),
    OriginKind.WEIGHTS: lambda o: (
        f"an earlier update moved the weights: {o.row}, a weight {o.stage} started from, is the first value "
        "that differs (look at the update stages before this one)"
    ),
    OriginKind.API: lambda o: (
        f"this API computes differently now: {o.api} gives other outputs from inputs "
        + (
            f"within tolerance of the golden's (max rel {o.inputs_rel:.1e})"
            if o.inputs_rel
            else "whose statistics equal the golden's"
        )
    ),
    OriginKind.UNRECORDED: lambda o: (
        f"inside {o.stage}, through an op msprobe does not record: {o.row} is the first value that differs (its "
        f"dtype or shape), and it carries {o.producer}'s value (equal statistics): an unrecorded op between the two "
        "(a cast, a reshape) differs from the golden's"
        if o.producer is not None
        else f"through values msprobe does not record: {o.row} is the first that differs, and no recorded value "
        "it was computed from differs"
    ),
    OriginKind.CODE_PATH: lambda o: (
        f"the code path changed in {o.stage}: {o.code_path.summary}, and the values leaving it differ from "
        "the golden's (code path below)"
        if o.code_path is not None and not o.code_path.matches
        else f"the code path changed in {o.stage}: {o.code_path.summary if o.code_path else o.api} "
        "(tolerance.code_path: fail makes any changed code path fail)"
    ),
}


def classify(verdict: StageVerdict, target: StageSource, golden: StageSource | None = None) -> DriftOrigin | None:
    """Where ``verdict``'s change entered, read from its profile and ``target``'s rows; None without a drift.

    Args:
        verdict: a failing stage's verdict with its profile (every compared row's worst ratio).
        target: the run's side of the stage, for the earliest differing row's state, type and
            ``requires_grad`` (msprobe's ``read_op`` row fields).
        golden: the golden's side, for how far an ``api`` origin's inputs are from the golden's
            (:attr:`DriftOrigin.inputs_rel`); without it the line claims no more than equal statistics.

    Raises:
        GoldenCorruptError: the target's dump is unreadable.
        ProbeUnavailableError: msprobe (its row parser) is not installed.
    """
    shown = _shown(verdict)
    if shown is None:  # nothing differs row by row: a changed block may still fail the stage
        return _code_path_origin(verdict, None)
    earliest = verdict.profile.earliest_moved(shown[0]) or shown
    block = _code_path_origin(verdict, earliest)
    if block is not None:
        return block
    _, rank, name, _ = earliest
    dump, calls, known = _up_to(target, verdict.calls.get(rank), rank, name)
    table = rows(restored_calls(dump, calls))
    row = table.get(name)
    if row is None:  # the profile names only rows both sides hold; a missing one is the first divergence's
        row, name, rank = {"api": _api_of(shown[2]), "state": "output"}, shown[2], shown[1]
        dump, known = target.load(rank, raw=True), None
        calls = list(dump["data"])  # its call may come later: every row, as before the cut
        table = rows(restored_calls(dump, calls))
    api = str(row["api"])
    has_inputs = any(r["api"] == api and r.get("state") == "input" for r in table.values())
    kind = _kind(row, has_inputs=has_inputs)
    structural = (rank, name) in verdict.structural
    producer = _producer(name, table) if structural and kind in _OUTSIDE else None
    if producer is not None:  # computed inside the stage: its dtype or shape changed there, not upstream
        kind = OriginKind.UNRECORDED
    paired = _paired_golden((dump, known), golden, rank, calls) if kind is OriginKind.API else None
    inputs_rel = _inputs_rel(api, table, paired) if paired is not None else None
    return DriftOrigin(
        kind, name, api, rank, verdict.stage, shown[2], structural=structural, producer=producer,
        inputs_rel=inputs_rel,
    )  # fmt: skip


#: the kinds that say the change came from outside the stage's recorded calls
_OUTSIDE = (OriginKind.UPSTREAM, OriginKind.WEIGHTS)


def _producer(name: str, table: dict[str, dict[str, Any]]) -> str | None:
    """The recorded output nearest before ``name`` (an input whose dtype or shape changed) whose value ``name``
    holds, if any: the same number of elements and the same statistics (Max/Min/Mean/Norm as numbers; Max/Min where
    msprobe records only those: an integer or bool tensor, True and 1 alike, so a mask built as bool where the
    golden's was int64 is found). Then the value was computed inside the stage, and what changed its dtype or shape
    is an op between the two that msprobe does not record (a cast): never upstream (issue 52)."""
    row = table[name]
    stats = row_statistics(row)
    if stats.get("Mean") is None and stats.get("Norm") is None:
        stats = {s: stats.get(s) for s in ("Max", "Min")}
    if row.get("state") != "input" or any(v is None for v in stats.values()):
        return None
    names = list(table)
    for other_name in reversed(names[: names.index(name)]):
        other = table[other_name]
        if other.get("state") != "output" or numel(other.get("shape")) != numel(row.get("shape")):
            continue
        theirs = row_statistics(other)
        if all(theirs.get(s) == v for s, v in stats.items()):
            return other_name
    return None


#: ``(order, rank, row, ratio)`` of one compared row, ordered as execution goes
_Point = tuple[int, str, str, float]


def _shown(verdict: StageVerdict) -> _Point | None:
    """Where the stage shows its change: the first divergence, or on a stage that fails on structure alone
    (a dtype or shape changed, every statistic within tolerance), its earliest structural row."""
    first = verdict.first_divergence
    if first is not None:
        return first.order, first.rank, first.tensor, first.ratio
    return min(((o, r, n, x) for r, o, n, x in verdict.profile if (r, n) in verdict.structural), default=None)


def _code_path_origin(verdict: StageVerdict, earliest: _Point | None) -> DriftOrigin | None:
    """The failing changed block at or before ``earliest`` (the earliest differing row), if any."""
    blocks = [c for c in verdict.failing_code_paths if earliest is None or (c.order, c.rank) <= earliest[:2]]
    if not blocks:
        return None
    block = min(blocks, key=lambda c: (c.order, c.rank))
    first = earliest[2] if earliest is not None else block.row
    return DriftOrigin(OriginKind.CODE_PATH, block.row, block.api, block.rank, verdict.stage, first, code_path=block)


def _calls_up_to(keys: list[str], name: str) -> list[str]:
    """The calls ``keys`` (a dump.json's, in order) up to the last one whose rows ``name`` can be (a row's name starts
    with its call's key): every row the classification reads (those of the row's own call, and those before it) comes
    from them. Every call where none matches (a row of stage_outputs.json, say)."""
    last = max((i for i, key in enumerate(keys) if name.startswith(key + ".")), default=len(keys) - 1)
    return keys[: last + 1]


def _up_to(
    target: StageSource, known: list[str] | None, rank: str, name: str
) -> tuple[dict[str, Any], list[str], list[str] | None]:
    """``rank``'s dump read raw, :func:`_calls_up_to` ``name`` in it, and ``known`` where the dump is cut to those
    calls: cut from its bytes (:func:`~precision_harness.dumps.stage.cut_rank`) where the compare kept the rank's
    calls (``known``: the same on both sides) and they cut; else the whole dump (and None)."""
    if known:
        calls = _calls_up_to(known, name)
        cut = cut_rank(target, rank, known, (0, len(calls)))
        if cut is not None:
            return cut, calls, known
    dump = target.load(rank, raw=True)
    return dump, _calls_up_to(list(dump["data"]), name), None


def _paired_golden(
    run: tuple[dict[str, Any], list[str] | None], golden: StageSource | None, rank: str, calls: list[str]
) -> dict[str, dict[str, Any]] | None:
    """The golden's rows of ``rank`` named as the run's ``calls`` they pair with (dumps.pairing; ``run``: the run's
    dump read raw, and the rank's calls where it is cut to ``calls``, the golden's being the same); None without a
    golden."""
    if golden is None:
        return None
    mine, known = run
    if known is not None:  # the same calls on both sides: each pairs with its namesake, cut alike
        cut = cut_rank(golden, rank, known, (0, len(calls)))
        return rows(restored_calls(cut if cut is not None else golden.load(rank, raw=True), calls))
    theirs = golden.load(rank, raw=True)
    named = aligned_golden(theirs, pair_calls(mine, theirs))
    return rows(restored_calls(named, calls))


def _inputs_rel(api: str, table: dict[str, dict[str, Any]], golden: dict[str, dict[str, Any]]) -> float:
    """The largest relative change of any statistic of ``api``'s input rows from the golden's (rows on both sides)."""
    worst = 0.0
    for name, row in table.items():
        if row["api"] != api or row.get("state") != "input" or name not in golden:
            continue
        theirs = row_statistics(golden[name])
        for stat, value in row_statistics(row).items():
            if value is not None and theirs.get(stat) is not None and value != theirs[stat]:
                worst = max(worst, relative_change(value, theirs[stat]))
    return worst


def _kind(row: dict[str, Any], *, has_inputs: bool) -> OriginKind:
    """The kind of change an earliest differing row shows (module docstring's table)."""
    state, api = row.get("state"), str(row.get("api", ""))
    if state == PARAMETERS:
        return OriginKind.WEIGHTS
    if state != "input":  # output, parameters_grad: computed by an API whose inputs all match
        return OriginKind.API if has_inputs else OriginKind.UNRECORDED
    if api.startswith(STAGE_PREFIX):
        return OriginKind.UPSTREAM
    if ".backward" in api:
        return OriginKind.UNRECORDED
    if not str(row.get("type", "")).startswith("torch.") or str(row.get("requires_grad")) != "True":
        return OriginKind.UPSTREAM  # a Python value, or data that needs no gradient
    return OriginKind.WEIGHTS


def _api_of(row_name: str) -> str:
    """``Functional.linear.0.forward.output.0`` -> ``Functional.linear.0.forward``."""
    for direction in (".forward", ".backward"):
        head, sep, _ = row_name.rpartition(direction + ".")
        if sep:
            return head + direction
    return row_name
