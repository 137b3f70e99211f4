"""runs/host/device_lock.py: one run at a time on a host's device set across processes (issue 55, item 6).

Another process (an xdist worker, another gate session) holds the set in a subprocess here; a run on the same set
says so in one line and starts once it is released, a run on another set or on the CPU starts at once. No device is
needed: the lock is taken before the run starts. Ordering is shown by events, never by timing.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest
from filelock import FileLock, Timeout

from precision_harness.runs import kind_runners
from precision_harness.runs.host import device_lock

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from precision_harness.runs.host import device_lock
    with device_lock.taken(sys.argv[1], say=print):
        Path(sys.argv[2]).write_text("held")
        while not Path(sys.argv[3]).exists():
            time.sleep(0.05)
    """
)


def _own_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The locks' folder, this test's own, here and in the processes it starts (tempfile caches its answer)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.fixture
def holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Another process holding cuda's set ``0,1`` until the returned ``release()``."""
    _own_locks(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 1")
    held, go = tmp_path / "held", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, "cuda", str(held), str(go)])
    try:
        while not held.exists():
            assert proc.poll() is None, "the holder exited before taking the set"
            threading.Event().wait(0.05)

        def release() -> None:
            go.write_text("")
            assert proc.wait(timeout=60) == 0

        yield release
    finally:
        go.write_text("")
        proc.wait(timeout=60)


def _in_thread(body) -> tuple[threading.Thread, list[str], threading.Event]:
    said, started = [], threading.Event()

    def run() -> None:
        with device_lock.taken("cuda", say=lambda line: (said.append(line), started.set())):
            body()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, said, started


def test_a_run_on_a_taken_set_says_so_in_one_line_and_starts_once_it_is_released(holder) -> None:
    ran = threading.Event()
    thread, said, waiting = _in_thread(ran.set)
    assert waiting.wait(60), "no line about the taken set"
    assert not ran.is_set()
    (line,) = said
    assert line.startswith("[precision] cuda devices 0,1: another gate process is running on them"), line
    holder()
    thread.join(60)
    assert ran.is_set()


def test_another_set_and_the_cpu_start_at_once(holder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with device_lock.taken("cuda", say=pytest.fail):
        pass
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with (
        device_lock.taken("cpu", say=pytest.fail),
        device_lock.taken("cuda", ray_address="10.0.0.1:6379", say=pytest.fail),
    ):
        pass


def test_run_scenario_holds_the_set_while_the_run_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of a session, ``calibrate`` and ``portability`` starts through ``run_scenario``."""
    _own_locks(tmp_path, monkeypatch)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4")
    held = []

    def run(scenario, *, out_dir, device, options):
        try:
            FileLock(str(device_lock.lock_path(device))).acquire(timeout=0)
            held.append(False)
        except Timeout:
            held.append(True)

    monkeypatch.setitem(kind_runners.RUNNERS, "builtin", kind_runners.KindRunner(run=run))
    scenario = type("S", (), {"kind": "builtin"})()
    kind_runners.run_scenario(scenario, out_dir=tmp_path / "run", device="npu")
    assert held == [True]
    assert device_lock.lock_path("npu").name == "npu-4.lock"
