"""progress.follow: which stage starts a gate prints, independent of when the run ends."""

from __future__ import annotations

import json
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from precision_harness.progress import PROGRESS_FILE, follow


def _start(path: Path, step: int, stage: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"event": "start", "step": step, "stage": stage, "t": 0.25 * step}) + "\n")
        fh.write(json.dumps({"event": "end", "step": step, "stage": stage, "t": 0.5, "seconds": 0.1}) + "\n")


class ScriptedFuture(Future):
    """A run whose progress file grows by one step of ``writes`` per poll; done after the last."""

    def __init__(self, writes: list) -> None:
        super().__init__()
        self.writes = writes

    def result(self, timeout: float | None = None) -> str:
        if self.writes:
            self.writes.pop(0)()
        if self.writes:
            raise FutureTimeout
        return "done"


def test_starts_written_just_before_the_run_ends_are_reported(tmp_path: Path) -> None:
    """The run logs its last stages and exits between two polls: they are still reported, once."""
    path = tmp_path / PROGRESS_FILE
    writes = [
        lambda: _start(path, 1, "actor_compute_log_prob"),
        lambda: _start(path, 1, "actor_update"),
        lambda: (_start(path, 2, "actor_compute_log_prob"), _start(path, 2, "actor_update")),
    ]
    lines: list[str] = []
    follow(tmp_path, ScriptedFuture(writes), scenario="s", report=lines.append, total_steps=2)
    assert lines == [
        "s: step 1/2 actor_compute_log_prob (0.2 s)",
        "s: step 1/2 actor_update (0.2 s)",
        "s: step 2/2 actor_compute_log_prob (0.5 s)",
        "s: step 2/2 actor_update (0.5 s)",
    ]


def test_a_run_already_finished_is_reported_whole(tmp_path: Path) -> None:
    _start(tmp_path / PROGRESS_FILE, 1, "actor_update")
    done: Future = Future()
    done.set_result("done")
    lines: list[str] = []
    follow(tmp_path, done, scenario="s", report=lines.append)
    assert lines == ["s: step 1 actor_update (0.2 s)"]


def test_a_failed_run_reports_what_it_reached_and_does_not_raise(tmp_path: Path) -> None:
    _start(tmp_path / PROGRESS_FILE, 1, "actor_compute_log_prob")
    failed: Future = Future()
    failed.set_exception(RuntimeError("worker crashed"))
    lines: list[str] = []
    follow(tmp_path, failed, scenario="s", report=lines.append, total_steps=2)
    assert lines == ["s: step 1/2 actor_compute_log_prob (0.2 s)"]
