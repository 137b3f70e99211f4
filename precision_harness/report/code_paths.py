"""Changed code paths in a report: each record's view of them, and the terminal's one line per distinct change.

A changed code path (calls inserted, removed or replaced: :mod:`precision_harness.check.compare.code_path`) is
usually one upgrade seen in every stage dump of every scenario; the terminal names it once, with the
software that differs from the golden's as its likely cause and whether the values leaving the changed
calls match. A block from which no tensor leaves is undecided
(:attr:`~precision_harness.check.compare.code_path.Leaving.NONE`): the line counts those blocks and never reads as a
match while any is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from precision_harness.check.compare.stage_verdict import StageVerdict
from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.verdicts.verdict_text import code_path_line

#: scenarios named in a summary line before "and N more"
MAX_NAMED = 3
#: changes kept per record
MAX_CHANGES = 20


class _Record(Protocol):
    scenario: str
    passed: bool
    code_path: dict[str, Any] | None


def code_path_json(v: StageVerdict, environment: EnvironmentDiff) -> dict[str, Any] | None:
    """``{"line", "count", "failing", "undecided", "what", "cause", "changes"}`` of a stage (report.json's
    ``code_path``; ``undecided``: the blocks from which no tensor leaves); None where its call streams pair one
    to one."""
    if not v.code_paths:
        return None
    return {
        "line": code_path_line(v, environment) or "",
        "count": len(v.code_paths),
        "failing": len(v.failing_code_paths),
        "undecided": sum(c.undecided for c in v.code_paths),
        "what": sorted({c.block.what for c in v.code_paths}),
        "cause": "; ".join(map(str, environment.software)),
        "changes": [c.to_json() for c in v.code_paths[:MAX_CHANGES]],
    }


def code_path_lines(records: Iterable[_Record]) -> Iterator[str]:
    """One terminal line per distinct changed code path (usually one for the whole run), never one per item."""
    groups: dict[tuple[str, tuple[str, ...]], list[_Record]] = {}
    for r in records:
        if r.code_path is not None:
            groups.setdefault((r.code_path["cause"], tuple(r.code_path["what"])), []).append(r)
    for (cause, what), found in groups.items():
        names = sorted({r.scenario for r in found})
        more = len(names) - MAX_NAMED
        whom = ", ".join(names[:MAX_NAMED]) + (f" and {more} more" if more > 0 else "")
        differ = sum(r.code_path["failing"] > 0 for r in found if r.code_path is not None)
        failed = sum(not r.passed for r in found)
        head = f"{cause} changed the code path" if cause else "the code path changed"
        yield f"{head} in {len(found)} stage dump(s) of {whom}: {'; '.join(what)} ({_how(found, differ, failed)})"


def _how(found: list[_Record], differ: int, failed: int) -> str:
    """How the values leaving the changed calls of ``found`` compare: differing in ``differ`` stage dumps, or
    matching; the undecided blocks (no tensor leaves them) counted apart, and never read as a match."""
    paths = [r.code_path for r in found if r.code_path is not None]
    undecided = sum(p["undecided"] for p in paths)
    decided = sum(p["count"] - p["undecided"] for p in paths)
    if differ:
        how = f"in {differ} the values leaving the changed calls differ from the golden's: their verdicts say how"
    elif decided:
        how = "the values leaving the " + ("other " if undecided else "") + "changed calls match the golden's"
    else:
        how = ""
    if undecided:
        where = sum(p["undecided"] > 0 for p in paths)
        unsure = (
            f"{undecided} changed block(s) in {where} stage dump(s) undecided: no tensor leaves them, only the paired "
            "values after them were compared"
        )
        how = f"{unsure}; {how}" if how else unsure
    if differ:
        return how
    if failed:  # a re-record would erase what fails them
        return f"{how}; {failed} fail elsewhere: their verdicts say why"
    return f"{how}; re-record to refresh"
