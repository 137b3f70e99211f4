"""One step of ``precision-harness bisect``: the commit checked out here, judged against the fixed golden.

``git bisect run`` starts this in the bisect worktree (:func:`main` with the state file's path)
with a commit checked out, and reads its exit status: 0 the selected items pass, 1 one
drifted, 125 the commit cannot run the scenario (no scenario file there, a failed run such as an
import error, a golden that does not fit it, nothing selected), so git skips it. The items run
through pytest itself, exactly as the user's rerun line: ``pytest SCENARIO [-k EXPR]`` with the
plugin, the golden root fixed by ``-o precision_golden_dir`` and ``--precision-report`` into the
bisect's work folder. The commit's own code comes first on ``PYTHONPATH``.

Every step appends one line to ``runs.jsonl`` in the work folder (commit, exit status, why): the
run count and the first bad commit's verdict are read from there and from its ``report.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from precision_harness.check.verdicts.items import OutcomeKind
from precision_harness.history.git_history import git_text

PASS, DRIFT, SKIP = 0, 1, 125
#: git bisect run stops on a status above 127: a step that fails itself must not mark a commit
ABORT = 128
RUNS_LOG = "runs.jsonl"
#: the state file's fields (written by :mod:`precision_harness.history.bisect`)
STATE_FIELDS = ("scenario", "keyword", "golden_root", "work", "run_flags")


def classify(returncode: int, report: dict[str, Any] | None) -> tuple[int, str]:
    """``(exit status for git, why)`` of one pytest run of the selected items and its report.json.

    A failed item whose kind is ``compared`` is drift (1); an item that could not be compared (a
    failed run, a missing or stale golden: kind ``error``) or no selected item at all is a commit
    that cannot run the scenario (125); every item passing is 0.
    """
    items = (report or {}).get("items", [])
    if not items:
        return SKIP, f"no item ran (pytest exit {returncode})"
    drift = [i for i in items if not i["passed"] and i["kind"] == OutcomeKind.COMPARED]
    if drift:
        first = min(drift, key=lambda i: (i["step"] is None, i["step"] or 0))
        return DRIFT, f"drift: {len(drift)} of {len(items)} items fail, first {_where(first)}"
    errors = [i for i in items if not i["passed"]]
    if errors:
        return SKIP, f"cannot run: {errors[0]['text'].splitlines()[0][:200]}"
    return PASS, f"pass: {len(items)} items"


def _where(item: dict[str, Any]) -> str:
    return "metrics" if item["stage"] is None else f"{item['stage']} @ step_{item['step']}"


def pytest_command(state: dict[str, Any], out: Path) -> list[str]:
    """``python -m pytest SCENARIO [-k EXPR]`` with the fixed golden, a report into ``out`` and the check's run flags
    (``PrecisionOptions.run_flags``: device, Ray address, timeout)."""
    cmd = [sys.executable, "-m", "pytest", state["scenario"], "-q", "-p", "no:cacheprovider"]
    cmd += ["-o", f"precision_golden_dir={state['golden_root']}", "--precision-golden", "check"]
    cmd += ["--precision-artifacts", str(out / "artifacts"), "--precision-report", str(out)]
    cmd += state.get("run_flags") or []
    return cmd + (["-k", state["keyword"]] if state.get("keyword") else [])


def step(state: dict[str, Any], tree: Path) -> tuple[int, str]:
    """Judge the commit checked out in ``tree``; returns ``(exit status, why)`` and logs it."""
    sha = git_text(tree, "rev-parse", "HEAD")
    out = Path(state["work"]) / sha[:12]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if not (tree / state["scenario"]).is_file():
        code, why = SKIP, f"cannot run: no {state['scenario']} at this commit"
    else:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
        proc = subprocess.run(pytest_command(state, out), cwd=tree, env=env, capture_output=True, text=True)
        (out / "pytest.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
        code, why = classify(proc.returncode, _read(out / "report.json"))
    subject = git_text(tree, "log", "-1", "--format=%s")
    with open(Path(state["work"]) / RUNS_LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps({"commit": sha, "subject": subject, "code": code, "why": why}) + "\n")
    print(f"[precision] bisect: {sha[:9]} {subject[:60]}: {why}", flush=True)
    return code, why


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        state = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
        return step(state, Path.cwd())[0]
    except Exception as exc:  # any failure of the step itself stops the bisection
        print(f"[precision] bisect: the step failed itself, bisection stopped: {exc}", file=sys.stderr, flush=True)
        return ABORT


if __name__ == "__main__":
    sys.exit(main())
