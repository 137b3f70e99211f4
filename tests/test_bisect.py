"""precision-harness bisect over foreign repositories (tests/bisect_repo.py): twelve commits of a
stage-API loop, one numeric change planted at commit 8; five commits of a built-in ``level: auto``
scenario whose ``optim.lr`` is raised at commit 3, its golden where the pytest ini puts it."""

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
from bisect_repo import BUILTIN_PLANTED, PLANTED, git, make_builtin_repo, make_repo

from precision_harness.errors import HistoryError
from precision_harness.history.bisect_step import DRIFT, PASS, SKIP, classify
from precision_harness.history.git_history import Repository
from precision_harness.history.pytest_ini import golden_dir_at
from precision_harness.runs.warm import shared as warm_shared

#: each bisection of the loop writes into a new ``<UTC time>/`` folder below this one
WORK = Path(".precision/artifacts/bisect/loop")
#: the commit after the planted one whose ``mylib.py`` is not Python: its check exits 125 and git skips it
BROKEN = PLANTED + 1


def _bisect(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "precision_harness.cli", "bisect", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _works(repo: Path, base: Path = WORK) -> list[Path]:
    """The bisections' work folders, oldest first (their names are UTC times)."""
    return sorted((repo / base).iterdir()) if (repo / base).is_dir() else []


def _runs(repo: Path, before: list[Path] | None = None) -> list[dict]:
    """The newest bisection's runs; none where no bisection started after ``before`` was listed."""
    works = _works(repo)
    if not works or (before is not None and works[-1] in before):
        return []
    path = works[-1] / "runs.jsonl"
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
    """The twelve commits, commit :data:`BROKEN` unable to import the loop's module."""
    root = tmp_path_factory.mktemp("bisect") / "repo"
    return root, make_repo(root, broken=(BROKEN,))


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
def test_finds_the_planted_commit_past_an_unimportable_one(repo) -> None:
    """Commit 8 is found in at most seven runs (six, and one for the skipped commit 9, which cannot import the loop's
    module: 125, skipped)."""
    root, shas = repo
    proc = _bisect(root, "--good", shas[0], "scenarios/loop.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    planted = shas[PLANTED - 1]
    out = proc.stdout.splitlines()
    assert f"first bad commit: {planted[:7]} commit {PLANTED}: raise the learning rate" in out
    verdict = out[out.index(f"first bad commit: {planted[:7]} commit {PLANTED}: raise the learning rate") + 1]
    assert verdict.startswith("  actor_update @ step_2: first divergent API Functional.")
    runs = _runs(root)
    assert len(runs) <= 7 and f"scenario runs: {len(runs)} (the good and bad checks included)" in out
    assert [r["code"] for r in runs[:2]] == [PASS, DRIFT]  # good and bad checked first
    log = _works(root)[-1] / "bisect.log"
    shown = log.relative_to(root)
    assert f"bisect log: {shown} (replay: git bisect replay {shown})" in out
    assert f"# first bad commit: [{planted}]" in log.read_text()
    (broken,) = [r for r in runs if r["commit"] == shas[BROKEN - 1]]
    assert broken["code"] == SKIP and broken["why"].startswith("cannot run: "), broken
    assert f"# skip: [{shas[BROKEN - 1]}]" in log.read_text()
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


@pytest.mark.slow
def test_an_interrupt_halfway_leaves_the_repository_clean(repo) -> None:
    """SIGINT (Ctrl-C) during git bisect run: no worktree, no bisect state, no process, the branch as it was."""
    root, shas = repo
    before, works = _scratch_dirs(), _works(root)
    cli = subprocess.Popen(
        [sys.executable, "-m", "precision_harness.cli", "bisect", "--good", shas[0], "scenarios/loop.yaml"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # the bisection's own processes only: no warm server of the test session's, which outlives this command
        env={k: v for k, v in os.environ.items() if k not in (warm_shared.DIR_ENV, warm_shared.OWNER_ENV)},
        # a terminal's Ctrl-C: SIGINT handled, even where this pytest runs as a shell's background job
        # (which starts with SIGINT ignored, and Python keeps an ignored SIGINT ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 600
    while len(_runs(root, works)) < 3 and cli.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the good and bad checks done, bisect run under way
    assert cli.poll() is None, cli.stdout.read() if cli.stdout else ""
    processes = _descendants(cli.pid)
    assert processes  # git bisect run and its step are running
    os.killpg(cli.pid, signal.SIGINT)  # what Ctrl-C sends to the terminal's foreground group
    output, _ = cli.communicate(timeout=120)
    assert cli.returncode == 130 and "first bad commit" not in output, output
    assert output.splitlines()[-1] == (
        "[precision] bisect interrupted: git bisect reset, its worktree removed; your checkout is as it was"
    )
    assert_untouched(root, shas[-1])
    assert _scratch_dirs() <= before
    alive = [p for p in processes if warm_shared.running(p)]
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
    before, works = _scratch_dirs(), _works(root)
    blocker.write_text("")
    try:
        proc = _bisect(root, "--good", shas[0], "scenarios/loop.yaml")
    finally:
        blocker.unlink()
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("precision-harness bisect: git worktree add --detach: fatal: "), proc.stderr
    assert _scratch_dirs() <= before and _works(root) == works  # no work folder for a bisection that never started
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
    earlier = root / WORK / "20000101T000000Z"  # an earlier bisection's folder: kept
    earlier.mkdir(parents=True, exist_ok=True)
    (earlier / "bisect.log").write_text("# an earlier bisection\n")
    works = _works(root)
    proc = _bisect(root, "--good", shas[PLANTED - 1], "--golden-dir", "golden", "scenarios/loop.yaml")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"precision-harness bisect: --good {shas[PLANTED - 1][:7]} (commit 8: raise the learning rate) drifts; "
        "it must pass to bisect"
    )
    assert len(_runs(root, works)) == 1
    assert set(works) < set(_works(root)) and (earlier / "bisect.log").read_text() == "# an earlier bisection\n"
    assert_untouched(root, shas[-1])


@pytest.mark.slow
def test_builtin_auto_scenario_with_its_golden_where_the_ini_puts_it(tmp_path: Path) -> None:
    """A built-in scenario at ``level: auto``: commit 3's ``optim.lr`` (compared by value, not stale) is
    found, and the verdict names the stage, the step, the first divergent API and the API localised at
    L1. The golden is read from the ``precision_golden_dir`` of the repository's pytest.ini at --good."""
    root = tmp_path / "builtin"
    shas = make_builtin_repo(root, ini="precision_golden_dir = goldens/ref\n")
    assert (root / "goldens/ref/auto/cpu/manifest.json").is_file() and not (root / "golden").exists()
    proc = _bisect(root, "--good", shas[0], "scenarios/auto.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout.splitlines()
    head = f"first bad commit: {shas[BUILTIN_PLANTED - 1][:7]} commit {BUILTIN_PLANTED}: raise optim.lr"
    assert head in out, proc.stdout
    verdict = out[out.index(head) + 1 : out.index(head) + 4]
    assert verdict[0].startswith("  actor_compute_log_prob @ step_2: first divergent API Module."), verdict
    assert verdict[1].startswith("    largest: Module."), verdict
    assert verdict[2].startswith("    localised at L1: Functional."), verdict
    runs = [json.loads(line) for line in _runs_file(root, "auto").read_text().splitlines()]
    assert [r["code"] for r in runs] == [PASS, DRIFT, DRIFT, PASS], runs  # good, bad, commit 3, commit 2
    assert_untouched(root, shas[-1])


def _runs_file(repo: Path, scenario: str) -> Path:
    (work,) = _works(repo, Path(".precision/artifacts/bisect") / scenario)
    return work / "runs.jsonl"


def test_golden_dir_is_read_from_the_ini_file_pytest_would_use(tmp_path: Path) -> None:
    """pytest's order: the scenario's folder before its parents; in one folder pytest.ini, then
    pyproject.toml's [tool.pytest.ini_options], tox.ini's [pytest], setup.cfg's [tool:pytest]; a file
    without the section does not count (pytest.ini always does); the value is relative to its folder."""
    root = tmp_path / "ini"
    (root / "sub").mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    repo = Repository(root)

    def at(files: dict[str, str], scenario: str = "sub/s.yaml") -> str:
        for old in root.rglob("*"):
            if old.is_file() and ".git" not in old.parts:
                old.unlink()
        for name, text in {**files, scenario: "x: 1\n"}.items():
            (root / name).write_text(text)
        git(root, "add", "-A")
        git(root, "commit", "-q", "--allow-empty", "-m", "ini")
        return golden_dir_at(repo, repo.resolve("HEAD"), scenario)

    assert at({}) == "golden"
    assert at({"setup.cfg": "[tool:pytest]\nprecision_golden_dir = g/cfg\n"}) == "g/cfg"
    assert at({"setup.cfg": "[metadata]\nname = x\n"}) == "golden"
    tox = "[pytest]\nprecision_golden_dir = g/tox\n"
    assert at({"tox.ini": tox, "setup.cfg": "[tool:pytest]\nprecision_golden_dir = g/cfg\n"}) == "g/tox"
    toml = '[tool.pytest.ini_options]\nprecision_golden_dir = "g/toml"\n'
    assert at({"pyproject.toml": toml, "tox.ini": tox}) == "g/toml"
    assert at({"pyproject.toml": "[project]\nname = 'x'\n", "tox.ini": tox}) == "g/tox"
    assert at({"pytest.ini": "", "pyproject.toml": toml}) == "golden"  # an empty pytest.ini still wins
    assert at({"pytest.ini": "[pytest]\nprecision_golden_dir = g/ini\n", "sub/tox.ini": tox}) == "sub/g/tox"
    with pytest.raises(HistoryError, match=r"^pytest.ini at [0-9a-f]{7}: precision_golden_dir = /abs is outside"):
        at({"pytest.ini": "[pytest]\nprecision_golden_dir = /abs\n"})
    with pytest.raises(HistoryError, match=r"^tox.ini at [0-9a-f]{7}: does not parse \("):
        at({"tox.ini": "[pytest\n"})
