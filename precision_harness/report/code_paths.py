"""Changed code paths in a report: each record's view of them, and the terminal's one line per distinct change.

A changed code path (calls inserted, removed or replaced: :mod:`precision_harness.check.code_path`) is
usually one upgrade seen in every stage dump of every scenario; the terminal names it once, with the
software that differs from the golden's as its likely cause and whether the values leaving the changed
calls match.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from precision_harness.check.environment import EnvironmentDiff
from precision_harness.check.stage_verdict import StageVerdict
from precision_harness.check.verdict_text import code_path_line

#: scenarios named in a summary line before "and N more"
MAX_NAMED = 3
#: changes kept per record
MAX_CHANGES = 20


class _Record(Protocol):
    scenario: str
    passed: bool
    code_path: dict[str, Any] | None


def code_path_json(v: StageVerdict, environment: EnvironmentDiff) -> dict[str, Any] | None:
    """``{"line", "count", "failing", "what", "cause", "changes"}`` of a stage (report.json's ``code_path``);
    None where its call streams pair one to one."""
    if not v.code_paths:
        return None
    return {
        "line": code_path_line(v, environment) or "",
        "count": len(v.code_paths),
        "failing": len(v.failing_code_paths),
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
        match = "the values leaving the changed calls match the golden's"
        if differ:
            how = f"in {differ} the values leaving the changed calls differ from the golden's: their verdicts say how"
        elif failed:  # a re-record would erase what fails them
            how = f"{match}; {failed} fail elsewhere: their verdicts say why"
        else:
            how = f"{match}; re-record to refresh"
        head = f"{cause} changed the code path" if cause else "the code path changed"
        yield f"{head} in {len(found)} stage dump(s) of {whom}: {'; '.join(what)} ({how})"
