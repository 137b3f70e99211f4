"""``--precision-jobs``: runs on npu or cuda go one at a time unless the user sets it (issue 40).

A plain ``pytest`` on a device host used to start as many runs as the host has CPUs, so every verl
scenario asked for every accelerator at once. The runner here is a fake that notes how many runs
are in flight together; each waits (up to a bound) for a second run to join it, so overlap, where
it is allowed, is seen whatever the machine's speed.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from harness_testing import TINY

from precision_harness.options import PrecisionOptions
from precision_harness.runs.launch import RunResult
from precision_harness.scenarios.scenario import Scenario
from precision_harness.session import PrecisionSession

#: seconds a fake run waits for a second one to join it
JOIN_WAIT_S = 1.5


class OverlapRunner:
    """A session runner that records the most runs in flight at once."""

    def __init__(self) -> None:
        self.lock, self.joined = threading.Lock(), threading.Event()
        self.active = self.most = 0

    def __call__(self, scenario: Scenario, *, out_dir: Path, **kw) -> RunResult:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
            if self.active > 1:
                self.joined.set()
        self.joined.wait(JOIN_WAIT_S)
        with self.lock:
            self.active -= 1
        return RunResult(scenario.name, out_dir, {}, 0.0)


def _most_in_flight(tmp_path: Path, options: PrecisionOptions) -> int:
    (tmp_path / "scenarios").mkdir()
    scenarios = []
    for name in ("first", "second"):
        shutil.copy(TINY, tmp_path / "scenarios" / f"{name}.yaml")
        scenarios.append(Scenario.load(tmp_path / "scenarios" / f"{name}.yaml"))
    runner = OverlapRunner()
    session = PrecisionSession(options, rootdir=tmp_path, runner=runner)
    try:
        for future in [session.start(s) for s in scenarios]:
            future.result()
    finally:
        session.close()
    return runner.most


@pytest.mark.parametrize("device", ["npu", "cuda"])
def test_device_runs_go_one_at_a_time_by_default(tmp_path: Path, device: str) -> None:
    assert _most_in_flight(tmp_path, PrecisionOptions(device=device, golden_mode="update")) == 1


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: the default allows one cpu run at a time")
def test_cpu_runs_overlap_by_default(tmp_path: Path) -> None:
    assert _most_in_flight(tmp_path, PrecisionOptions(device="cpu", golden_mode="update")) == 2


def test_jobs_set_by_the_user_holds_on_a_device(tmp_path: Path) -> None:
    assert _most_in_flight(tmp_path, PrecisionOptions(device="npu", golden_mode="update", jobs=2)) == 2


def test_the_default_is_unset_and_resolved_per_device() -> None:
    options = PrecisionOptions()
    assert options.jobs is None
    assert options.jobs_for("npu") == options.jobs_for("cuda") == 1
    assert options.jobs_for("cpu") == max(1, os.cpu_count() or 1)
    assert PrecisionOptions(jobs=3).jobs_for("npu") == 3


def test_the_pytest_flag_fills_jobs(pytestconfig: pytest.Config) -> None:
    """This very session's ``--precision-jobs`` (unset here) reaches PrecisionOptions as None."""
    assert PrecisionOptions.from_pytest(pytestconfig).jobs == pytestconfig.getoption("precision_jobs")
