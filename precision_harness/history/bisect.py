"""``precision-harness bisect``: the first commit at which a scenario's selected items drift from a fixed golden.

The user's checkout is never touched: one temporary ``git worktree`` (detached) is made for the
bisection, and ``git bisect`` runs inside it, so its state (``BISECT_LOG``, ``refs/bisect/*``,
both per worktree) is the worktree's own. Each commit is judged by
:mod:`precision_harness.history.bisect_step` (0 pass, 1 drift, 125 cannot run), driven by ``git bisect
run``. The golden is fixed for the whole bisection: the golden folder as committed at ``--good``
(``git archive``; the folder the ``precision_golden_dir`` of the commit's pytest ini file names,
:mod:`precision_harness.history.pytest_ini`), or the working tree's with ``--golden-dir``. Each
bisection writes into a new folder named by its UTC start time, so earlier logs are kept.

Before bisecting, ``--good`` must pass and ``--bad`` must drift; otherwise one line says which
does not. The end is the first bad commit, its subject, its verdict (stage, step, first divergent
API, and the API localised at L1 under ``level: auto``), the run count, and the ``git bisect log``
copied into the work folder for ``git bisect replay``. ``git bisect reset``, the worktree's removal
and the end of every process started run in ``finally``, on an interrupt (SIGINT) too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precision_harness.errors import HistoryError, PrecisionError
from precision_harness.history.bisect_step import DRIFT, PASS, RUNS_LOG, SKIP
from precision_harness.history.git_history import Commit, Repository, git, git_text
from precision_harness.history.pytest_ini import golden_dir_at
from precision_harness.paths import display_path

#: seconds an interrupted bisection's processes get to end after SIGINT before SIGKILL
GRACE_S = 10
_FIRST_BAD = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.M)
#: the step, started in the worktree: the worktree is dropped from sys.path first, so the step is this
#: harness's even where the commit holds another precision_harness (python -P does this from 3.11 only)
_STEP = (
    "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "from precision_harness.history.bisect_step import main; sys.exit(main(sys.argv[1:]))"
)


class BisectError(PrecisionError):
    """The bisection cannot start or conclude (good does not pass, bad does not drift, only skipped
    commits left)."""


@dataclass(frozen=True)
class BisectSettings:
    """One bisection's inputs (the CLI's arguments, resolved)."""

    scenario: Path  #: the scenario YAML in the user's checkout (the same path at every commit)
    good: str
    bad: str
    keyword: str | None  #: pytest ``-k`` expression selecting the items
    golden_dir: Path | None  #: the golden root in the working tree; None: the one the pytest ini at good names
    work: Path  #: the scenario's bisect folder; each bisection writes reports, runs.jsonl and bisect.log below it
    #: the gate's flags each commit's run takes, as the check ran (``PrecisionOptions.run_flags``: device, Ray
    #: address, timeout)
    run_flags: tuple[str, ...] = ()


@dataclass
class BisectResult:
    """The first bad commit, its verdict lines, how many scenario runs it took, the replayable log."""

    first_bad: Commit
    verdict: list[str]
    runs: int
    log: Path


def run_bisect(settings: BisectSettings, say: Callable[[str], None]) -> BisectResult:
    """Bisect ``settings.good..settings.bad``; ``say`` prints a line.

    Raises:
        HistoryError: not a git checkout, an unknown revision, no scenario or golden at ``--good``,
            a worktree that cannot be made.
        BisectError: good does not pass, bad does not drift, or skipped commits hide the answer.
    """
    repo = Repository.holding(Path.cwd())
    if repo is None:
        raise HistoryError(f"{Path.cwd()}: not a git checkout; bisect walks the commits of your repository")
    good, bad = repo.resolve(settings.good), repo.resolve(settings.bad)
    scenario = repo.relative(settings.scenario)
    if git(repo.toplevel, "cat-file", "-e", f"{good.sha}:{scenario}", check=False).returncode != 0:
        raise HistoryError(f"--good {settings.good}: no {scenario} at {good.short}; pick a commit that has it")
    scratch = Path(tempfile.mkdtemp(prefix="precision-bisect-"))
    tree = scratch / "tree"
    try:
        golden_root = _golden_root(repo, settings, (good, scenario), scratch)
        git(repo.toplevel, "worktree", "add", "--detach", str(tree), good.sha)
        work = new_work_folder(settings.work)
        state = {"scenario": scenario, "keyword": settings.keyword, "golden_root": str(golden_root)}
        state.update(work=str(work.resolve()), run_flags=list(settings.run_flags))
        state_path = scratch / "state.json"
        state_path.write_text(json.dumps(state), encoding="utf-8")
        step = [sys.executable, "-c", _STEP, str(state_path)]
        _check_ends(tree, step, (good, bad), say)
        first_bad = _bisect(tree, step, (good, bad), say)
        log = work / "bisect.log"
        log.write_text(git_text(tree, "bisect", "log") + "\n", encoding="utf-8")
        first = repo.resolve(first_bad)
        return BisectResult(first, verdict_lines(work / first.sha[:12]), _runs(work), log)
    finally:
        _clean(repo, tree, scratch)


def new_work_folder(base: Path) -> Path:
    """A new folder below ``base`` named by the UTC time (``20261123T195200Z``, ``-2`` on a clash):
    every bisection keeps its own log and reports."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in itertools.count(1):
        work = base / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            work.mkdir(parents=True)
        except FileExistsError:
            continue
        return work
    raise AssertionError("unreachable")


def _golden_root(repo: Repository, settings: BisectSettings, at: tuple[Commit, str], scratch: Path) -> Path:
    """The fixed golden root: the working tree's, or the one committed at good (extracted) in the folder
    the pytest ini at good names for the scenario."""
    good, scenario = at
    if settings.golden_dir is not None:
        if not settings.golden_dir.is_dir():
            raise HistoryError(f"--golden-dir {settings.golden_dir}: no such directory")
        return settings.golden_dir.resolve()
    rel = golden_dir_at(repo, good, scenario)
    root = repo.extract(good.sha, rel, scratch / "golden")
    if root is None:
        raise HistoryError(f"--good {settings.good}: no {rel}/ committed at {good.short}; record goldens there first")
    return root


def _check_ends(tree: Path, step: list[str], ends: tuple[Commit, Commit], say: Callable[[str], None]) -> None:
    """Good must pass and bad must drift before any bisecting (a bisection over a wrong premise lies)."""
    for commit, want, flag in ((ends[0], PASS, "--good"), (ends[1], DRIFT, "--bad")):
        git(tree, "checkout", "-q", "--detach", commit.sha)
        code, _ = _run_group(step, tree, echo=say)
        if code != want:
            what = {PASS: "passes", DRIFT: "drifts", SKIP: "cannot run the scenario"}.get(code, f"exit {code}")
            need = "pass" if want == PASS else "drift"
            raise BisectError(f"{flag} {commit.short} ({commit.subject[:60]}) {what}; it must {need} to bisect")


def _bisect(tree: Path, step: list[str], ends: tuple[Commit, Commit], say: Callable[[str], None]) -> str:
    """``git bisect start bad good`` and ``git bisect run step`` in ``tree``; the first bad commit's sha."""
    started = git_text(tree, "bisect", "start", ends[1].sha, ends[0].sha)
    for line in started.splitlines():
        if line.startswith("Bisecting:"):
            say(line)
    code, out = _run_group(["git", "bisect", "run", *step], tree, echo=say)
    found = _FIRST_BAD.search(out)
    if found is None:
        tail = [line for line in out.splitlines() if line.strip()][-3:]
        raise BisectError(f"git bisect run ended without a first bad commit (exit {code}): {' | '.join(tail)}")
    return found.group(1)


def _run_group(cmd: list[str], cwd: Path, *, echo: Callable[[str], None]) -> tuple[int, str]:
    """Run ``cmd`` in a process group of its own; echo the step lines; its exit status and output.

    On any exception (KeyboardInterrupt included) the whole group gets SIGINT, then SIGKILL after
    :data:`GRACE_S`: no process of the bisection outlives it.
    """
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(("[precision] bisect", "Bisecting:")):
                echo(line.rstrip())
        return proc.wait(), "".join(lines)
    except BaseException:
        _end_group(proc)
        raise


def _end_group(proc: subprocess.Popen) -> None:
    """SIGINT to ``proc``'s process group, SIGKILL to what is left of it after :data:`GRACE_S`."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=GRACE_S)
        os.killpg(proc.pid, signal.SIGKILL)  # children the leader left behind
    except ProcessLookupError:
        pass
    proc.wait()


def _clean(repo: Repository, tree: Path, scratch: Path) -> None:
    """``git bisect reset`` in the worktree, remove it, prune its record, delete the scratch folder."""
    if tree.exists():
        git(tree, "bisect", "reset", check=False)
    git(repo.toplevel, "worktree", "remove", "--force", str(tree), check=False)
    git(repo.toplevel, "worktree", "prune", check=False)
    shutil.rmtree(scratch, ignore_errors=True)


def _runs(work: Path) -> int:
    path = work / RUNS_LOG
    return len(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else 0


def verdict_lines(out: Path) -> list[str]:
    """The first bad commit's verdict from its report.json: per failing item its stage and step, the
    first divergent API, the largest drift, and the API localised at L1 (level auto) where the item
    was localised."""
    try:
        report: dict[str, Any] = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [f"no report.json in {display_path(out)}"]
    lines = []
    failed = [i for i in report["items"] if not i["passed"]]
    for item in sorted(failed, key=lambda i: (i["step"] is None, i["step"] or 0, i["stage"] or "")):
        where = "metrics" if item["stage"] is None else f"{item['stage']} @ step_{item['step']}"
        first = item.get("first_divergence")
        lines.append(f"{where}: first divergent API {_drift(first)}" if first else f"{where}: {item['text'][:200]}")
        largest = item.get("largest")
        if largest and largest != first:
            lines.append(f"  largest: {_drift(largest)}")
        local = (item.get("localized") or {}).get("first_divergence")
        if local:
            lines.append(f"  localised at {item['localized']['level']}: {_drift(local)}")
    return lines


def _drift(d: dict[str, Any]) -> str:
    """``"Functional.linear.0.forward.input.1 Max 0.52 -> 0.55 (41x tolerance)"`` (report.json's drift)."""
    values = f" {d['golden']:.6g} -> {d['target']:.6g}" if d["golden"] is not None and d["target"] is not None else ""
    ratio = f" ({d['ratio']:.3g}x tolerance)" if d["ratio"] is not None else " (must match exactly)" if values else ""
    return f"{d['tensor']} {d['statistic']}{values}{ratio}"
