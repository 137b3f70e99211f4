"""msprobe's analyses in a worker process (check.msprobe_worker): the verdict and msprobe's files read as when msprobe
is asked here; a worker starts only where it pays, never outlives its process, and one that fails leaves msprobe
asked here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness_testing import long_stage

from precision_harness.check import msprobe_worker, rank_pool
from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.items import check_stage
from precision_harness.check.msprobe_worker import Job
from precision_harness.check.tolerance import TolerancePolicy


def _paying(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen]:
    """Every failing rank with ranks left starts a worker (no size floor, two cores, not xdist, msprobe's compare
    not imported here); the workers started, in order."""
    monkeypatch.setattr(msprobe_worker, "MIN_WARM_BYTES", 0)
    monkeypatch.setattr(rank_pool, "cores", lambda: 2)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(msprobe_worker, "_MSPROBE_COMPARE", "a_module_nobody_imported")
    started: list[subprocess.Popen] = []
    start = msprobe_worker._start
    monkeypatch.setattr(msprobe_worker, "_start", lambda: started.append(start()) or started[-1])
    return started


def _files(stage_art: Path) -> dict[str, bytes]:
    """The files of a stage's artifacts, but msprobe's log (timestamps, process ids); DiffAnalyzer's by its prefix
    (its name ends in a number of its own)."""
    return {
        str(p.relative_to(stage_art)).split("diff_analyze_")[0]: p.read_bytes()
        for p in sorted(stage_art.rglob("*"))
        if p.is_file() and p.name != "msprobe.log"
    }


def test_a_failing_stage_asked_of_the_worker_reads_as_asked_here(tmp_path: Path, monkeypatch) -> None:
    run, golden = long_stage(tmp_path, factor=3.0)  # past DiffAnalyzer's threshold: msprobe names a first diff
    here = check_stage(run, golden, CheckSettings(scenario="s", policy=TolerancePolicy(), artifacts=tmp_path / "a"))
    started = _paying(monkeypatch)
    there = check_stage(run, golden, CheckSettings(scenario="s", policy=TolerancePolicy(), artifacts=tmp_path / "b"))
    assert len(started) == 1 and started[0].returncode == 0  # warmed at rank0's failure, rank1 still to come
    art_a, art_b = (tmp_path / side / "step_1" / "actor_update" for side in "ab")
    assert f"({started[0].pid})" in (art_b / "msprobe.log").read_text()  # msprobe's log lines carry its pid
    assert not (art_b / "msprobe_worker.log").exists()
    assert there.text == here.text.replace(str(tmp_path / "a"), str(tmp_path / "b"))
    assert _files(art_b) == {k: v.replace(str(tmp_path / "a").encode(), str(tmp_path / "b").encode()) for k, v in
                             _files(art_a).items()}  # fmt: skip
    assert "compare_result_rank1.csv" in _files(art_b)
    answer_a, answer_b = here.msprobe, there.msprobe
    assert answer_a.first_diff == {"rank1": "Functional.linear.450.forward"}
    assert (answer_b.first_diff, answer_b.errors, answer_b.scope) == (answer_a.first_diff, [], answer_a.scope)
    assert [p.relative_to(art_b) for p in answer_b.tables] == [p.relative_to(art_a) for p in answer_a.tables]


@pytest.mark.parametrize(
    ("code", "log"),
    [
        ("pass", False),  # gone before its job: the job cannot be handed over
        ("import sys; sys.stdin.readline(); sys.exit(3)", True),  # took its job and died
        ("import sys; sys.stdin.readline(); print('not json')", True),  # an answer that does not read
    ],
)
def test_a_worker_that_gives_no_answer_leaves_msprobe_asked_here(dumps, tmp_path: Path, code: str, log: bool) -> None:
    run, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Norm=37.5))
    job = Job(run, golden, tmp_path / "here", graph=False)
    expected = job.run()
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    stand_in = subprocess.Popen([sys.executable, "-c", code], **pipes)
    if code == "pass":
        stand_in.wait()
    msprobe_worker._warm = stand_in
    msprobe_worker._started.append(stand_in)
    job = Job(run, golden, tmp_path / "there", graph=False)
    answer = msprobe_worker.analyze(job, scope="window").result()
    assert answer.first_diff == expected.first_diff != {} and answer.errors == [] and answer.scope == "window"
    assert f"({os.getpid()})" in (tmp_path / "there" / "msprobe.log").read_text()  # asked in this process
    worker_log = tmp_path / "there" / "msprobe_worker.log"
    assert worker_log.is_file() == log
    assert not log or worker_log.read_text().rstrip().endswith(f"exit {stand_in.returncode}")
    assert stand_in.poll() is not None and stand_in not in msprobe_worker._started


@pytest.mark.parametrize(
    ("why", "size", "left"),
    [
        ("pays", 8 << 20, 1),
        ("a small stage", (8 << 20) - 1, 1),
        ("no rank left to hide the import behind", 8 << 20, 0),
        ("one core", 8 << 20, 1),
        ("an xdist worker", 8 << 20, 1),
        ("msprobe already imported here", 8 << 20, 1),
    ],
)
def test_a_worker_starts_only_where_it_pays(monkeypatch, why: str, size: int, left: int) -> None:
    started: list[str] = []

    class Warm:
        def poll(self):
            return None

    monkeypatch.setattr(msprobe_worker, "_start", lambda: started.append(why) or Warm())
    monkeypatch.setattr(msprobe_worker, "_warm", None)
    monkeypatch.setattr(rank_pool, "cores", lambda: 1 if why == "one core" else 2)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    if why == "an xdist worker":
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    imported = "json" if why == "msprobe already imported here" else "a_module_nobody_imported"
    monkeypatch.setattr(msprobe_worker, "_MSPROBE_COMPARE", imported)
    msprobe_worker.warm(size, left)
    msprobe_worker.warm(size, left)  # a warm worker is kept: never two
    assert started == ([why] if why == "pays" else [])


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)"])
def test_no_worker_outlives_its_process(tmp_path: Path, exit_call: str) -> None:
    """Its process ends normally (the worker is killed at exit) or is cut short, atexit skipped (the worker reads
    the end of its standard input and exits after its import)."""
    code = (
        "import os, sys; from precision_harness.check import msprobe_worker as w; "
        "w.MIN_WARM_BYTES = 0; w._MSPROBE_COMPARE = 'a_module_nobody_imported'; "
        "w.rank_pool.cores = lambda: 2; os.environ.pop('PYTEST_XDIST_WORKER', None); "
        f"w.warm(1, 1); print(w._warm.pid, flush=True); {exit_call}"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie is not running: its parent has gone and it waits to be reaped)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return status != "Z"
