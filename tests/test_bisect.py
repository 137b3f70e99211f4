"""precision-harness bisect over a foreign repository (tests/bisect_repo.py): twelve commits of a
stage-API loop, one numeric change planted at commit 8."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from bisect_repo import PLANTED, git, make_repo

from precision_harness.history.bisect_step import DRIFT, PASS, SKIP, classify

WORK = Path(".precision/artifacts/bisect/loop")


def _bisect(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "precision_harness.cli", "bisect", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _runs(repo: Path) -> list[dict]:
    path = repo / WORK / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _scratch_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("precision-bisect-*")}


def assert_untouched(repo: Path, head: str) -> None:
    """The user's checkout as it was: branch and HEAD, no change, one worktree, no bisect state."""
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert git(repo, "rev-parse", "HEAD").strip() == head
    assert len(git(repo, "worktree", "list", "--porcelain").split("worktree ")) == 2  # "" and the main one
    assert not (repo / ".git" / "worktrees").exists() or not any((repo / ".git" / "worktrees").iterdir())
    assert git(repo, "for-each-ref", "refs/bisect") == ""
    assert not (repo / ".git" / "BISECT_LOG").exists()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("bisect") / "clean"
    return root, make_repo(root)


def test_exit_status_of_a_step() -> None:
    """0 pass, 1 a compared item beyond tolerance, 125 an item that could not be compared or nothing ran."""
    passed = {"passed": True, "kind": "identical", "step": 1, "stage": "actor_update", "text": ""}
    drift = {"passed": False, "kind": "compared", "step": 2, "stage": "actor_update", "text": "drift"}
    error = {"passed": False, "kind": "error", "step": 1, "stage": "actor_update", "text": "run failed: ImportError"}
    assert classify(0, {"items": [passed]})[0] == PASS
    assert classify(1, {"items": [passed, drift]}) == (DRIFT, "drift: 1 of 2 items fail, first actor_update @ step_2")
    assert classify(1, {"items": [error, error]}) == (SKIP, "cannot run: run failed: ImportError")
    assert classify(5, None)[0] == SKIP and classify(2, {"items": []})[0] == SKIP


@pytest.mark.slow
def test_finds_the_planted_commit_in_six_runs(repo) -> None:
    root, shas = repo
    proc = _bisect(root, "--good", shas[0], "scenarios/loop.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    planted = shas[PLANTED - 1]
    out = proc.stdout.splitlines()
    assert f"first bad commit: {planted[:7]} commit {PLANTED}: raise the learning rate" in out
    verdict = out[out.index(f"first bad commit: {planted[:7]} commit {PLANTED}: raise the learning rate") + 1]
    assert verdict.startswith("  actor_update @ step_2: first divergent API Functional.")
    runs = _runs(root)
    assert len(runs) <= 6 and f"scenario runs: {len(runs)} (the good and bad checks included)" in out
    assert [r["code"] for r in runs[:2]] == [PASS, DRIFT]  # good and bad checked first
    log = root / WORK / "bisect.log"
    assert f"bisect log: {WORK / 'bisect.log'} (replay: git bisect replay {WORK / 'bisect.log'})" in out
    assert f"# first bad commit: [{planted}]" in log.read_text()
    assert_untouched(root, shas[-1])


@pytest.mark.slow
def test_an_unimportable_commit_is_skipped(repo, tmp_path: Path) -> None:
    """Commit 9 cannot import the loop's module: 125, skipped, and commit 8 is still found."""
    clean, _ = repo
    root = tmp_path / "broken"
    shas = make_repo(root, golden_from=clean, broken=(9,))
    proc = _bisect(root, "--good", shas[0], "scenarios/loop.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"first bad commit: {shas[PLANTED - 1][:7]} commit {PLANTED}: raise the learning rate" in proc.stdout
    (broken,) = [r for r in _runs(root) if r["commit"] == shas[8]]
    assert broken["code"] == SKIP and broken["why"].startswith("cannot run: "), broken
    assert "# skip: [" + shas[8] + "]" in (root / WORK / "bisect.log").read_text()
    assert_untouched(root, shas[-1])


def _descendants(pid: int) -> set[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parents.items() if pp == p}
        todo += list(kids - found)
        found |= kids
    return found


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a container's pid 1 may never reap orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_an_interrupt_halfway_leaves_the_repository_clean(repo) -> None:
    """SIGINT (Ctrl-C) during git bisect run: no worktree, no bisect state, no process, the branch as it was."""
    root, shas = repo
    before = _scratch_dirs()
    (root / WORK / "runs.jsonl").unlink(missing_ok=True)
    cli = subprocess.Popen(
        [sys.executable, "-m", "precision_harness.cli", "bisect", "--good", shas[0], "scenarios/loop.yaml"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while len(_runs(root)) < 3 and cli.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the good and bad checks done, bisect run under way
    assert cli.poll() is None, cli.stdout.read() if cli.stdout else ""
    processes = _descendants(cli.pid)
    assert processes  # git bisect run and its step are running
    os.killpg(cli.pid, signal.SIGINT)  # what Ctrl-C sends to the terminal's foreground group
    output, _ = cli.communicate(timeout=120)
    assert cli.returncode == 130 and "first bad commit" not in output
    assert output.splitlines()[-1] == (
        "[precision] bisect interrupted: git bisect reset, its worktree removed; your checkout is as it was"
    )
    assert_untouched(root, shas[-1])
    assert _scratch_dirs() <= before
    alive = [p for p in processes if _running(p)]
    assert not alive, alive


def test_bad_input_is_one_line_and_leaves_no_worktree(repo, tmp_path: Path) -> None:
    root, shas = repo
    proc = _bisect(root, "--good", "nosuchrev", "scenarios/loop.yaml")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"precision-harness bisect: nosuchrev: unknown revision in {root.resolve()} (expected a commit, branch or tag)"
    )
    proc = _bisect(root, "--good", shas[0], "scenarios/nope.yaml")
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(f"no scenarios/nope.yaml at {shas[0][:7]}; pick a commit that has it")
    proc = _bisect(root, "--good", shas[0], "--golden-dir", "missing", "scenarios/loop.yaml")
    assert proc.returncode == 2 and proc.stderr.strip().endswith("--golden-dir missing: no such directory")
    blocker = root / ".git" / "worktrees"  # a file where git keeps worktrees: git worktree add fails
    assert not blocker.exists()
    before = _scratch_dirs()
    blocker.write_text("")
    try:
        proc = _bisect(root, "--good", shas[0], "scenarios/loop.yaml")
    finally:
        blocker.unlink()
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("precision-harness bisect: git worktree add --detach: fatal: "), proc.stderr
    assert _scratch_dirs() <= before and _runs(root) == []
    outside = tmp_path / "outside"
    outside.mkdir()
    proc = _bisect(outside, "--good", "HEAD", "loop.yaml")
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        "not a git checkout; bisect walks the commits of your repository"
    )
    assert_untouched(root, shas[-1])


@pytest.mark.slow
def test_good_must_pass(repo) -> None:
    """--good at the planted commit drifts from the golden committed there: one line, nothing bisected."""
    root, shas = repo
    proc = _bisect(root, "--good", shas[PLANTED - 1], "--golden-dir", "golden", "scenarios/loop.yaml")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"precision-harness bisect: --good {shas[PLANTED - 1][:7]} (commit 8: raise the learning rate) drifts; "
        "it must pass to bisect"
    )
    assert len(_runs(root)) == 1
    assert_untouched(root, shas[-1])
