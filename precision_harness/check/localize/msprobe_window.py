"""What msprobe's own analyses read on a failing stage: the first divergent rank, around its first divergence.

msprobe's compare table (pandas) and its first-diff analysis (``DiffAnalyzer``) cost seconds per thousand
calls: on a 7B-sized stage (65,000 calls a rank, 8 ranks) hours, for an opinion beside the gate's verdict,
which is already decided. So by default they read a *window*: the calls of the first divergent rank (the
rank of :attr:`~precision_harness.check.compare.stage_verdict.StageVerdict.first_divergence`, ranks running in lock
step) from :data:`WINDOW_CALLS` before its first divergence to :data:`WINDOW_CALLS` after, and the golden's
calls paired with them (:func:`~precision_harness.dumps.pairing.aligned_golden`, renamed to the run's
names, as msprobe pairs by name). Both are written as plain stage folders under
``<artifacts>/msprobe_window/`` (``run/`` and ``golden/``, ``step0/<rank>/dump.json``), and
:attr:`Window.line` is the verdict's line saying what was and was not analysed.

``--precision-msprobe-full`` (``precision-harness compare --msprobe-full``) gives every failing rank's whole
table and first diff instead, as before the window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.dumps.files import DUMP, collector_paused, restored_calls
from precision_harness.dumps.pairing import aligned_golden, pair_calls
from precision_harness.dumps.stage import StageSource, cut_rank

#: calls on each side of the first divergence that msprobe's table and first diff read
WINDOW_CALLS = 200
#: the folder under a stage's artifacts that holds the window's two plain stage folders
WINDOW_DIR = "msprobe_window"
#: how the verdict names the option that analyses everything
FULL_OPTION = "--precision-msprobe-full"


@dataclass(frozen=True)
class Window:
    """The calls msprobe reads for one failing stage.

    Attributes:
        rank: the first divergent rank, e.g. ``rank3``.
        start, end: the run's calls ``[start, end)`` of that rank, in execution order (0-based).
        calls: how many calls that rank's dump holds.
        others: the failing ranks msprobe does not read.
        target_dir, golden_dir: the two plain stage folders (``step0/<rank>/dump.json`` each).
    """

    rank: str
    start: int
    end: int
    calls: int
    others: tuple[str, ...]
    target_dir: Path
    golden_dir: Path

    @property
    def line(self) -> str:
        """``rank3, calls 1,000-1,400 of 65,000 (around its first divergence); not analysed: rank5; every table:
        --precision-msprobe-full``."""
        whole = self.start == 0 and self.end == self.calls
        calls = f"all {self.calls:,} calls" if whole else f"calls {self.start:,}-{self.end - 1:,} of {self.calls:,}"
        text = f"{self.rank}, {calls} (around its first divergence)"
        if self.others:
            text += f"; not analysed: {', '.join(self.others)}"
        return text + (f"; every table: {FULL_OPTION}" if self.others or not whole else "")


def write_window(target: StageSource, golden: StageSource, verdict: StageVerdict, artifacts: Path) -> Window | None:
    """Write the window of ``verdict``'s first divergent rank under ``artifacts``; None where no rank both sides
    hold fails (a missing rank, an unreadable dump: msprobe has nothing to read).

    Raises:
        GoldenCorruptError: a dump on either side is unreadable.
    """
    rank = verdict.first_divergent_rank
    if rank is None or rank not in target.ranks() or rank not in golden.ranks():
        return None
    apis = verdict.calls.get(rank)  # the same calls both sides: the window is cut from the dumps' bytes
    sides = _cut(target, golden, rank, verdict) if apis is not None else None
    if sides is None:
        with collector_paused():  # two parsed dumps: millions of acyclic objects a full collection would walk
            # raw: only the window's calls get their non-finite values back, not every call of the rank
            t_dump, g_dump = target.load(rank, raw=True), golden.load(rank, raw=True)
            apis = list(t_dump["data"])
            keep = apis[slice(*_span(apis, verdict, rank))]
            named = aligned_golden(g_dump, pair_calls(t_dump, g_dump))
            sides = {"run": restored_calls(t_dump, keep), "golden": restored_calls(named, keep)}
            del t_dump, g_dump, named
    start, end = _span(apis, verdict, rank)
    out = artifacts / WINDOW_DIR
    for side, dump in sides.items():
        rank_dir = out / side / "step0" / rank
        rank_dir.mkdir(parents=True, exist_ok=True)
        (rank_dir / DUMP).write_text(json.dumps(dump), encoding="utf-8")
        (rank_dir / "construct.json").write_text("{}", encoding="utf-8")
    others = tuple(r for r in verdict.failing_ranks if r != rank)
    return Window(rank, start, end, len(apis), others, out / "run", out / "golden")


def _cut(target: StageSource, golden: StageSource, rank: str, verdict: StageVerdict) -> dict[str, Any] | None:
    """The window's two dumps cut from the bytes of ``rank``'s dump.json files (:func:`~precision_harness.dumps.stage.
    cut_rank`), where both hold ``verdict.calls[rank]``; None where either does not cut so."""
    apis = verdict.calls[rank]
    span = _span(apis, verdict, rank)
    sides = {"run": cut_rank(target, rank, apis, span), "golden": cut_rank(golden, rank, apis, span)}
    return sides if all(cut is not None for cut in sides.values()) else None


def _span(apis: list[str], verdict: StageVerdict, rank: str) -> tuple[int, int]:
    """The window's calls ``[start, end)`` in ``apis``: :data:`WINDOW_CALLS` either side of the first divergence."""
    at = _divergent_call(apis, verdict, rank)
    return max(0, at - WINDOW_CALLS), min(len(apis), at + WINDOW_CALLS + 1)


def _divergent_call(apis: list[str], verdict: StageVerdict, rank: str) -> int:
    """Index in ``apis`` of the call where ``rank`` first diverged: its first drift's, else its first changed
    block's, else 0 (a structural problem names no call the window could centre on)."""
    drifts = [d for d in verdict.drifts if d.rank == rank]
    wanted = min(drifts, key=lambda d: d.order).tensor if drifts else None
    blocks = [c for c in verdict.failing_code_paths if c.rank == rank]
    for i, api in enumerate(apis):
        if wanted is not None and wanted.startswith(api + "."):
            return i
        if wanted is None and blocks and (api == blocks[0].api or api in blocks[0].block.target):
            return i
    return 0
