"""msprobe's analyses in a worker process (check.localize.msprobe_worker): the verdict and msprobe's files read as when
msprobe is asked here; a worker starts only where it pays, never outlives its process, and one that fails leaves msprobe
asked here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from subprocess import PIPE

import pytest
from harness_testing import long_stage

from precision_harness.check.check_settings import CheckSettings
from precision_harness.check.compare import rank_pool
from precision_harness.check.localize import msprobe_worker
from precision_harness.check.localize.msprobe_worker import Job
from precision_harness.check.tolerance.policy import TolerancePolicy
from precision_harness.check.verdicts.items import check_stage
from precision_harness.dumps.stage import DirStage


@pytest.fixture
def paying(monkeypatch: pytest.MonkeyPatch):
    """Every failing rank with ranks left starts a worker (no size floor, two cores, not xdist, msprobe's compare
    not imported here); the workers started, in order, each stopped at the end."""
    monkeypatch.setattr(msprobe_worker, "MIN_WARM_BYTES", 0)
    monkeypatch.setattr(rank_pool, "cores", lambda: 2)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(msprobe_worker, "_MSPROBE_COMPARE", "a_module_nobody_imported")
    started: list[msprobe_worker._Worker] = []
    start = msprobe_worker._start
    monkeypatch.setattr(msprobe_worker, "_start", lambda: started.append(start()) or started[-1])
    yield started
    msprobe_worker._stop_worker()


def _files(stage_art: Path) -> dict[str, bytes]:
    """The files of a stage's artifacts, but msprobe's log (timestamps, process ids); DiffAnalyzer's by its prefix
    (its name ends in a number of its own)."""
    return {
        str(p.relative_to(stage_art)).split("diff_analyze_")[0]: p.read_bytes()
        for p in sorted(stage_art.rglob("*"))
        if p.is_file() and p.name != "msprobe.log"
    }


def _settings(artifacts: Path) -> CheckSettings:
    return CheckSettings(scenario="s", policy=TolerancePolicy(), artifacts=artifacts)


def test_failing_stages_asked_of_the_worker_read_as_asked_here(tmp_path: Path, monkeypatch, request) -> None:
    run, golden = long_stage(tmp_path, factor=3.0)  # past DiffAnalyzer's threshold: msprobe names a first diff
    here = check_stage(run, golden, _settings(tmp_path / "a"))
    started = request.getfixturevalue("paying")
    there = [check_stage(run, golden, _settings(tmp_path / side)) for side in ("b", "c")]
    assert len(started) == 1 and started[0].alive()  # warmed at rank0's failure, kept for the next stage
    art_a = tmp_path / "a" / "step_1" / "actor_update"
    for side, out in zip("bc", there, strict=True):
        art = tmp_path / side / "step_1" / "actor_update"
        assert f"({started[0].proc.pid})" in (art / "msprobe.log").read_text()  # msprobe's log lines carry its pid
        assert not (art / "msprobe_worker.log").exists()
        assert out.text == here.text.replace(str(tmp_path / "a"), str(tmp_path / side))
        renamed = {k: v.replace(str(tmp_path / "a").encode(), str(tmp_path / side).encode()) for k, v in
                   _files(art_a).items()}  # fmt: skip
        assert _files(art) == renamed and "compare_result_rank1.csv" in renamed
        assert here.msprobe.first_diff == {"rank1": "Functional.linear.450.forward"}
        assert (out.msprobe.first_diff, out.msprobe.errors, out.msprobe.scope) == (
            here.msprobe.first_diff,
            [],
            here.msprobe.scope,
        )
        assert [p.relative_to(art) for p in out.msprobe.tables] == [p.relative_to(art_a) for p in here.msprobe.tables]


@pytest.mark.parametrize(
    ("code", "log"),
    [
        ("pass", True),  # gone before its job: the job cannot be handed over (its log was dropped before issue 53)
        ("import sys; sys.stdin.readline(); sys.exit(3)", True),  # took its job and died
        ("import sys; sys.stdin.readline(); print('not json')", True),  # an answer that does not read
    ],
)
def test_a_worker_that_gives_no_answer_leaves_msprobe_asked_here(dumps, tmp_path: Path, code: str, log: bool) -> None:
    run, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Norm=37.5))
    expected = Job(run, golden, tmp_path / "here", graph=False).run()
    with tempfile.TemporaryFile() as err:
        stand_in = subprocess.Popen([sys.executable, "-c", code], stdin=PIPE, stdout=PIPE, stderr=err)
        if code == "pass":
            stand_in.wait()
        msprobe_worker._worker = msprobe_worker._Worker(stand_in, err)
        answer = msprobe_worker.analyze(Job(run, golden, tmp_path / "there", graph=False), scope="window").result()
        assert msprobe_worker._worker is None  # a worker that failed, or had gone, is forgotten
    assert answer.first_diff == expected.first_diff != {} and answer.errors == [] and answer.scope == "window"
    assert f"({os.getpid()})" in (tmp_path / "there" / "msprobe.log").read_text()  # asked in this process
    worker_log = tmp_path / "there" / "msprobe_worker.log"
    assert worker_log.is_file() == log
    assert not log or worker_log.read_text().rstrip().endswith(f"exit {stand_in.returncode}")
    assert stand_in.poll() is not None


#: a worker that takes its job and never answers, as a hung msprobe would (its log says it took the job)
HUNG = "import sys, time; sys.stdin.readline(); print('reading', file=sys.stderr, flush=True); time.sleep(600)"


def test_a_worker_that_does_not_answer_in_time_is_killed_and_the_verdict_says_so(dumps, tmp_path: Path) -> None:
    """The stage's verdict says msprobe did not answer in one line; the worker is killed, its log kept in the stage's
    artifacts, and msprobe is not asked here. Before issue 53: the gate waited on the worker for ever."""
    run, golden = dumps(tmp_path, lambda d: d["Functional.linear.0.forward"]["output"][0].update(Norm=37.5))
    settings = replace(_settings(tmp_path / "art"), msprobe_timeout=0.5)
    with tempfile.TemporaryFile() as err:
        stand_in = subprocess.Popen([sys.executable, "-c", HUNG], stdin=PIPE, stdout=PIPE, stderr=err)
        msprobe_worker._worker = msprobe_worker._Worker(stand_in, err)
        try:
            out = check_stage(DirStage(run), DirStage(golden), settings)
        finally:
            stand_in.kill()
            stand_in.wait()
        assert msprobe_worker._worker is None and stand_in.returncode == -signal.SIGKILL
    art = tmp_path / "art" / "step_1" / "actor_update"
    line = "did not answer within 0.5 s (precision_msprobe_timeout): its worker was killed, its log kept as "
    assert out.msprobe.errors == [line + "msprobe_worker.log in this stage's artifacts"]
    assert out.msprobe.first_diff == {} and not (art / "msprobe.log").exists()  # not asked here
    assert [ln.strip() for ln in out.text.splitlines() if line in ln] == [f"msprobe           {line}" + (
        "msprobe_worker.log in this stage's artifacts")]  # fmt: skip
    log = (art / msprobe_worker.LOG).read_text()
    assert log.startswith("reading") and log.rstrip().endswith(f"exit {-signal.SIGKILL}")


def test_an_answer_never_collected_is_not_read_as_the_next_stages(dumps, tmp_path: Path, paying) -> None:
    """A check that stopped between handing a stage over and reading its answer (an error in between): the next
    stage's answer is its own, asked here, and the worker owing the old one is stopped."""
    stages = {
        api: dumps(tmp_path / api, lambda d, api=api: d[api]["output"][0].update(Norm=37.5))
        for api in ("Functional.linear.0.forward", "Functional.softmax.0.forward")
    }
    msprobe_worker.warm(1, 1)
    (first, (run_a, golden_a)), (second, (run_b, golden_b)) = stages.items()
    msprobe_worker.analyze(Job(run_a, golden_a, tmp_path / "a", graph=False))  # never collected
    answer = msprobe_worker.analyze(Job(run_b, golden_b, tmp_path / "b", graph=False)).result()
    assert answer.first_diff == {"rank0": second} != {"rank0": first}
    assert f"({os.getpid()})" in (tmp_path / "b" / "msprobe.log").read_text()
    assert len(paying) == 1 and not paying[0].alive() and msprobe_worker._worker is None


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
        def alive(self) -> bool:
            return True

    monkeypatch.setattr(msprobe_worker, "_start", lambda: started.append(why) or Warm())
    monkeypatch.setattr(msprobe_worker, "_worker", None)
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
        "import os, sys; from precision_harness.check.localize import msprobe_worker as w; "
        "w.MIN_WARM_BYTES = 0; w._MSPROBE_COMPARE = 'a_module_nobody_imported'; "
        "w.rank_pool.cores = lambda: 2; os.environ.pop('PYTEST_XDIST_WORKER', None); "
        f"w.warm(1, 1); print(w._worker.proc.pid, flush=True); {exit_call}"
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
