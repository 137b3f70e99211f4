"""A code path that changed: one changed block of a stage dump, and whether the values leaving it match the golden's.

An upgrade that swaps calls (transformers 5.23.0's RoPE forms its frequencies with ``Tensor.__mul__``
where 5.10.4 used ``Tensor.__matmul__``; CANN's fused ``npu_rms_norm`` for a decomposed RMSNorm) leaves
a changed block in every dump of the stage (:class:`~precision_harness.dumps.pairing.ChangedBlock`).
Such a block is a finding of its own, not drift: it passes when the values leaving it match the
golden's, and the stage then passes with the change reported.

The values leaving a block are the outputs of its last run call that has any (the block's result;
the calls before it feed it). Each must match one of the golden's candidates: an output of any of the
golden block's calls (a replacement), or, where the golden had no calls there (an insertion), an input
of the run block's own calls (a no-op such as ``contiguous``). Calls removed (the run's side is empty)
must have passed their input on: the golden block's result matches one of its own inputs, else it is
computed nowhere in the run. Match means the same dtype and number of elements (a transposed layout
keeps its values) and every Max/Min/Mean/Norm within the stage's tolerance, Mean against the golden's
RMS as in :mod:`precision_harness.check.compare`.

What statistics cannot show: a value equal in Max/Min/Mean/Norm but permuted. The paired rows after
the block, compared as usual, are the second line of evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from precision_harness.check.tolerance import TolerancePolicy, tolerance_ratio
from precision_harness.dumps.call_site import call_sites
from precision_harness.dumps.pairing import ChangedBlock
from precision_harness.dumps.rows import numel, rms, row_statistics


class Leaving(str, Enum):
    """Whether the values leaving a changed block match the golden's."""

    MATCH = "match"  #: every output of the run's block matches a golden candidate within tolerance
    DIFFER = "differ"  #: some output matches none
    NONE = "none"  #: no tensor leaves the block (its calls return none): the rows after it carry the evidence


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
    match: str | None = None  #: the golden row nearest :attr:`row` (a differing block's), msprobe's name

    @property
    def api(self) -> str:
        """The block's first call: the run's where it has any, else the golden's."""
        return (self.block.target or self.block.golden)[0]

    @property
    def matches(self) -> bool:
        """The values leaving the block match the golden's (or it leaves none)."""
        return self.leaving is not Leaving.DIFFER

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
    """Whether the values leaving ``block`` match the golden's (module docstring)."""
    removed = not block.target
    leaving = _leaving(block.golden if removed else block.target, rows_.golden if removed else rows_.target)
    if not leaving:
        why = "no tensor leaves the block; the paired rows after it carry the evidence"
        return CodePathChange(rank, block, order, Leaving.NONE, 0.0, why, (block.target or block.golden)[0])
    candidates = _candidates(block, rows_)
    worst, lines = 0.0, []
    for name, row in leaving.items():
        ratio, match = _closest(name, row, candidates, rows_)
        worst = max(worst, ratio)
        side = "the golden's " if removed else ""
        if math.isinf(ratio) or ratio > 1.0:
            nearest = "" if match is None else f" (the nearest, {match}, is {_how(ratio)} away)"
            evidence = f"{side}{name} {_layout(row)} matches no {_pool(block)}{nearest}"
            return CodePathChange(rank, block, order, Leaving.DIFFER, ratio, evidence, name, match=match)
        lines.append(f"{side}{name} {_layout(row)} has the statistics of {_whose(removed)}{match} ({_how(ratio)})")
    return CodePathChange(rank, block, order, Leaving.MATCH, worst, "; ".join(lines), (block.target or block.golden)[0])


def _whose(removed: bool) -> str:
    return "its own input " if removed else "the golden's "


def _pool(block: ChangedBlock) -> str:
    """What a block's leaving values were looked for in (:func:`_candidates`), as a verdict says it."""
    if block.golden and block.target:
        return "output of the golden's calls there"
    if block.target:
        return "input of the inserted calls: they are not a no-op"
    return "input of the removed calls: their result is computed nowhere in this run"


def _leaving(apis: tuple[str, ...], table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The output rows of the last of ``apis`` that has any: the block's result on that side."""
    for api in reversed(apis):
        outputs = {n: r for n, r in table.get(api, {}).items() if r.get("state") == "output" and _is_tensor(r)}
        if outputs:
            return outputs
    return {}


def _candidates(block: ChangedBlock, rows_: BlockRows) -> dict[str, dict[str, Any]]:
    """What a leaving value may match: for a replacement, the golden block's outputs; for an insertion, the run
    block's own inputs (a no-op such as ``contiguous``); for a removal, the golden block's own inputs."""
    if block.golden and block.target:
        pool, state = [rows_.golden.get(api, {}) for api in block.golden], "output"
    elif block.target:
        pool, state = [rows_.target.get(api, {}) for api in block.target], "input"
    else:
        pool, state = [rows_.golden.get(api, {}) for api in block.golden], "input"
    return {n: r for rows in pool for n, r in rows.items() if r.get("state") == state and _is_tensor(r)}


def _is_tensor(row: dict[str, Any]) -> bool:
    return row.get("dtype") is not None and row.get("shape") is not None


def _closest(
    name: str, row: dict[str, Any], candidates: dict[str, dict[str, Any]], rows_: BlockRows
) -> tuple[float, str | None]:
    """The candidate of the same dtype and size whose statistics are nearest ``row``'s: (worst ratio, its name)."""
    best: tuple[float, str | None] = (math.inf, None)
    for c_name, c_row in candidates.items():
        if c_row.get("dtype") != row.get("dtype") or numel(c_row.get("shape")) != numel(row.get("shape")):
            continue
        ratio = _worst_ratio(name, row, c_row, rows_)
        best = min(best, (ratio, c_name), key=lambda b: b[0])
    return best


def _worst_ratio(name: str, row: dict[str, Any], golden: dict[str, Any], rows_: BlockRows) -> float:
    """The worst tolerance ratio over the statistics both rows record (``inf`` where one records none)."""
    mine, theirs = row_statistics(row), row_statistics(golden)
    scale = rms(theirs.get("Norm"), golden.get("shape"))
    worst = 0.0
    for stat, g_val in theirs.items():
        t_val = mine.get(stat)
        if t_val is None and g_val is None:
            continue
        if t_val is None or g_val is None:
            return math.inf
        tol = rows_.policy.for_tensor(
            dtype=str(row.get("dtype")), stage=rows_.stage, statistic=stat, api=name, rms=scale
        )
        worst = max(worst, tolerance_ratio(t_val, g_val, tol, scale=scale if stat == "Mean" else None))
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
