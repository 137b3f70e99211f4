"""A code path that changed: one changed block of a stage dump, and whether the values leaving it match the golden's.

An upgrade that swaps calls (transformers 5.23.0's RoPE forms its frequencies with ``Tensor.__mul__``
where 5.10.4 used ``Tensor.__matmul__``; CANN's fused ``npu_rms_norm`` for a decomposed RMSNorm) leaves
a changed block in every dump of the stage (:class:`~precision_harness.dumps.pairing.ChangedBlock`).
Such a block is a finding of its own, not drift: it passes when the values leaving it match the
golden's, and the stage then passes with the change reported.

The values leaving a block are the outputs of its last run call that has any (the block's result;
the calls before it feed it). Each is matched to the value in its place (by order: the block's first
output with the first, and so on): for a replacement, the output of the golden block's last call that
has any; where the golden had no calls there (an insertion), the input of the run block's first call
(a no-op such as ``contiguous`` passes its input on); for calls removed (the run's side is empty), the
golden block's result against its first call's input, else it is computed nowhere in the run. Match
means the same dtype, the same shape up to the order of its dimensions and dimensions of size 1 (a
transpose, a view that adds or drops them: 5.23.0's RoPE product ``[4, 18, 4]`` for 5.10.4's
``[4, 4, 18]``, a mask ``[4, 18, 18]`` for ``[4, 1, 18, 18]``), and every Max/Min/Mean/Norm within the
stage's tolerance, Mean against the golden's RMS as in :mod:`precision_harness.check.compare.stage`. An output
of another place, however equal, is not a match. A block from which no tensor leaves is undecided
(:attr:`Leaving.NONE`): it passes reported as such, the paired rows after it being the only evidence, and
fails under ``tolerance.code_path: fail``.

What statistics cannot show: a value equal in Max/Min/Mean/Norm but permuted. The paired rows after
the block, compared as usual, are the second line of evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from precision_harness.check.compare.stat_table import RowRule, judge_statistics
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.dumps.call_site import call_sites
from precision_harness.dumps.pairing import ChangedBlock
from precision_harness.dumps.rows import rms, row_statistics


class Leaving(str, Enum):
    """Whether the values leaving a changed block match the golden's."""

    MATCH = "match"  #: every output of the run's block matches the golden's value in its place within tolerance
    DIFFER = "differ"  #: some output does not
    NONE = "none"  #: no tensor leaves the block (its calls return none): undecided, the rows after it are the evidence


@dataclass(frozen=True)
class CodePathChange:
    """One changed block of one rank's dump, with what its values show.

    Attributes:
        rank: the rank (``rank0``).
        block: the golden's calls there and the run's (:class:`~precision_harness.dumps.pairing.ChangedBlock`).
        order: the run's row index where the block sits (its first row; for removed calls, the next paired
            call's first row), comparable with a verdict's profile and drifts.
        leaving: whether the values leaving it match (:class:`Leaving`).
        ratio: the worst tolerance ratio of those values against their golden match (0: identical;
            ``inf`` where an output matches no candidate).
        evidence: one sentence on what was matched with what, or what did not match.
        row: the value leaving the block that differs (msprobe's row name); else the block's first call.
        site: where the run's block was called from, where the run's files say
            (:func:`precision_harness.dumps.call_site.call_sites`).
    """

    rank: str
    block: ChangedBlock
    order: int
    leaving: Leaving
    ratio: float
    evidence: str
    row: str = ""
    site: str | None = None
    match: str | None = None  #: the golden row in :attr:`row`'s place (a differing block's, of its dtype and shape)

    @property
    def api(self) -> str:
        """The block's first call: the run's where it has any, else the golden's."""
        return (self.block.target or self.block.golden)[0]

    @property
    def matches(self) -> bool:
        """The values leaving the block do not differ from the golden's (they match, or none leaves: undecided)."""
        return self.leaving is not Leaving.DIFFER

    @property
    def undecided(self) -> bool:
        """No tensor leaves the block: nothing of it was compared (it fails under ``tolerance.code_path: fail``)."""
        return self.leaving is Leaving.NONE

    @property
    def where(self) -> str:
        """``"after Torch.where.0.forward, before Tensor.cos.0.forward"`` (the run's keys of the paired calls)."""
        parts = []
        if self.block.before is not None:
            parts.append(f"after {self.block.before[0]}")
        if self.block.after is not None:
            parts.append(f"before {self.block.after[0]}")
        if self.site:
            parts.append(self.site if self.site.startswith("in ") else f"at {self.site}")
        return ", ".join(parts) or "the whole dump"

    @property
    def summary(self) -> str:
        """``"Tensor.__matmul__ -> Tensor.__mul__ (after ..., before ...)"``."""
        return f"{self.block.what} ({self.where})"

    def to_json(self) -> dict[str, Any]:
        """The change as report.json keeps it."""
        return {
            "rank": self.rank,
            "golden_calls": list(self.block.golden),
            "run_calls": list(self.block.target),
            "what": self.block.what,
            "where": self.where,
            "leaving": self.leaving.value,
            "ratio": None if math.isinf(self.ratio) else self.ratio,
            "evidence": self.evidence,
            "row": self.row,
            "site": self.site,
        }


@dataclass(frozen=True)
class BlockRows:
    """One rank's rows on both sides, grouped by call: ``{dump.json key: {row name: row}}``."""

    target: dict[str, dict[str, dict[str, Any]]]
    golden: dict[str, dict[str, dict[str, Any]]]
    policy: TolerancePolicy
    stage: str


def by_call(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """msprobe's rows (:func:`precision_harness.dumps.rows.rows`) grouped by their call's dump.json key."""
    grouped: dict[str, dict[str, dict[str, Any]]] = {}
    for name, row in table.items():
        grouped.setdefault(str(row["api"]), {})[name] = row
    return grouped


def evaluate(block: ChangedBlock, rows_: BlockRows, *, rank: str, order: int) -> CodePathChange:
    """Whether the values leaving ``block`` match the golden's in their places (module docstring)."""
    removed = not block.target
    leaving = _leaving(block.golden if removed else block.target, rows_.golden if removed else rows_.target)
    if not leaving:
        why = "no tensor leaves the block: undecided, only the paired rows after it carry evidence"
        return CodePathChange(rank, block, order, Leaving.NONE, 0.0, why, (block.target or block.golden)[0])
    places = _places(block, rows_)
    worst, lines = 0.0, []
    side = "the golden's " if removed else ""
    for k, (name, row) in enumerate(leaving.items()):
        match, theirs = places[k] if k < len(places) else (None, None)
        alike = theirs is not None and _same_place(row, theirs)
        ratio = _worst_ratio(name, row, theirs, rows_) if alike else math.inf
        worst = max(worst, ratio)
        if math.isinf(ratio) or ratio > 1.0:
            there = "nothing" if theirs is None else f"{match} {_layout(theirs)}, {_how(ratio)} away"
            evidence = f"{side}{name} {_layout(row)} does not match the {_pool(block)} in its place ({there})"
            # the replay judges against the golden's value in its place only where it is of the same dtype and shape
            return CodePathChange(
                rank, block, order, Leaving.DIFFER, ratio, evidence, name, match=match if alike else None
            )
        lines.append(f"{side}{name} {_layout(row)} has the statistics of {_whose(removed)}{match} ({_how(ratio)})")
    return CodePathChange(rank, block, order, Leaving.MATCH, worst, "; ".join(lines), (block.target or block.golden)[0])


def _whose(removed: bool) -> str:
    return "its own input " if removed else "the golden's "


def _pool(block: ChangedBlock) -> str:
    """Where a block's leaving values were looked for (:func:`_places`), as a verdict says it."""
    if block.golden and block.target:
        return "golden's output"
    if block.target:
        return "input of the inserted calls (they are not a no-op)"
    return "input of the removed calls (their result is computed nowhere in this run)"


def _leaving(apis: tuple[str, ...], table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The output rows of the last of ``apis`` that has any: the block's result on that side."""
    for api in reversed(apis):
        outputs = _tensors(table.get(api, {}), "output")
        if outputs:
            return outputs
    return {}


def _places(block: ChangedBlock, rows_: BlockRows) -> list[tuple[str, dict[str, Any]]]:
    """The values the leaving ones are matched to, in order: for a replacement, the golden block's result (the
    outputs of its last call that has any); for an insertion, the run block's first call's inputs (a no-op passes
    its input on); for a removal, the golden block's first call's inputs."""
    if block.golden and block.target:
        return list(_leaving(block.golden, rows_.golden).items())
    first, table = (block.target[0], rows_.target) if block.target else (block.golden[0], rows_.golden)
    return list(_tensors(table.get(first, {}), "input").items())


def _tensors(rows_: dict[str, dict[str, Any]], state: str) -> dict[str, dict[str, Any]]:
    return {n: r for n, r in rows_.items() if r.get("state") == state and _is_tensor(r)}


def _is_tensor(row: dict[str, Any]) -> bool:
    return row.get("dtype") is not None and row.get("shape") is not None


def _same_place(row: dict[str, Any], theirs: dict[str, Any]) -> bool:
    """The same dtype, and the same dimensions but for their order and those of size 1 (a transpose, a view)."""
    return row.get("dtype") == theirs.get("dtype") and _dims(row.get("shape")) == _dims(theirs.get("shape"))


def _dims(shape: Any) -> list[int] | None:
    return sorted(int(d) for d in shape if int(d) != 1) if isinstance(shape, (list, tuple)) else None


def _worst_ratio(name: str, row: dict[str, Any], golden: dict[str, Any], rows_: BlockRows) -> float:
    """The worst tolerance ratio over the statistics both rows record (``inf`` where one records none)."""
    theirs = row_statistics(golden)
    rule = RowRule(rows_.policy, rows_.stage, str(row.get("dtype")), name, rms(theirs.get("Norm"), golden.get("shape")))
    worst = 0.0
    for judged in judge_statistics(row_statistics(row), theirs, rule):
        if judged.ratio is None:
            return math.inf
        worst = max(worst, judged.ratio)
    return worst


def _layout(row: dict[str, Any]) -> str:
    return f"{row.get('shape')}"


def _how(ratio: float) -> str:
    if ratio == 0:
        return "identical"
    return "non-finite" if math.isinf(ratio) else f"{ratio:.3g}x tolerance"


def describe(changes: list[CodePathChange]) -> str:
    """What changed, each distinct change once with its count and first place:
    ``"Tensor.__matmul__ -> Tensor.__mul__ (x2; first after Torch.where.0.forward, before Tensor.cos.0.forward)"``."""
    seen: dict[str, list[CodePathChange]] = {}
    for change in sorted(changes, key=lambda c: (c.order, c.rank)):
        seen.setdefault(change.block.what, []).append(change)
    parts = []
    for what, found in seen.items():
        count = f"x{len(found)}; first " if len(found) > 1 else ""
        parts.append(f"{what} ({count}{found[0].where})")
    return "; ".join(parts)


def placed(changes: list[CodePathChange], target: Any) -> list[CodePathChange]:
    """``changes`` with the place in the code each run block was called from, where the run's folder says
    (``target``, a :class:`~precision_harness.dumps.stage.StageSource`: a run's ``DirStage`` has a folder; a golden
    keeps no stack.json), in execution order."""
    folder = getattr(target, "path", None)
    if not changes or folder is None:
        return changes
    found = []
    for rank in sorted({c.rank for c in changes}):
        mine = [c for c in changes if c.rank == rank]
        sites = call_sites(Path(folder) / "step0" / rank, [c.api for c in mine])
        found += [replace(c, site=sites.get(c.api)) for c in mine]
    return sorted(found, key=lambda c: (c.order, c.rank))
