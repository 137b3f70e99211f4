"""Progress of a running scenario: the worker appends one JSON line per stage, the caller follows it.

Worker side, :class:`ProgressLog`: ``RUN_DIR/progress.jsonl`` gets ``{"event": "start"|"end",
"step": n, "stage": name, "t": seconds since start[, "seconds": stage time]}`` lines. Caller side,
:func:`follow`: while waiting for the run, report each stage as it starts, so a long gate shows
which scenario, step and stage is running. Imports neither torch nor pytest.

A long compare (a 7B-sized stage: 8 ranks of 65,000 calls) reports too: :class:`RankProgress` calls its
``report`` with one line per rank compared, ``step_1/actor_update: rank3 compared (4/8 ranks, 12.0 s)``,
once the stage has taken :data:`COMPARE_QUIET_S` seconds (a short compare says nothing); and
:func:`compare_bar`, the terminal bar of ``precision-harness compare`` (tqdm), counts the stages.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROGRESS_FILE = "progress.jsonl"
#: seconds a stage's compare runs silent before it reports each rank
COMPARE_QUIET_S = 2.0


class ProgressLog:
    """Appends progress lines to ``path`` (line-buffered, so a reader sees each stage at once)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.t0 = time.perf_counter()

    def write(self, **event: Any) -> None:
        event["t"] = round(time.perf_counter() - self.t0, 3)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event, sort_keys=True) + "\n")

    def wrap(self, stage_cm: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap ``Trainer.stage(step, name, model)`` so every stage logs its start and end."""

        @contextmanager
        def stage(step: int, name: str, model: Any) -> Iterator[None]:
            self.write(event="start", step=step, stage=name)
            t0 = time.perf_counter()
            with stage_cm(step, name, model):
                yield
            self.write(event="end", step=step, stage=name, seconds=round(time.perf_counter() - t0, 4))

        return stage


def read_events(path: Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete lines of ``path`` from byte ``offset``; returns (events, new offset)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events, offset + end


def follow(
    run_dir: Path,
    future: Future,
    *,
    scenario: str,
    report: Callable[[str], None],
    poll: float = 0.5,
    total_steps: int | None = None,
) -> None:
    """Call ``report("grpo_tiny: step 1/2 actor_update (4.1 s)")`` for every stage start the run logs.

    While ``future`` runs, stages are reported as they start; once it is done (or if it already was),
    the starts not read yet are reported too. So every start line is reported exactly once, in the
    order the run wrote them, however the run's end falls between two polls: what a gate prints
    depends on what the run did, not on timing. Never raises for the run's error (the caller's
    ``future.result()`` does).
    """
    path = Path(run_dir) / PROGRESS_FILE
    offset = 0

    def report_new() -> None:
        nonlocal offset
        events, offset = read_events(path, offset)
        of = f"/{total_steps}" if total_steps else ""
        for e in events:
            if e.get("event") == "start":
                report(f"{scenario}: step {e.get('step')}{of} {e.get('stage')} ({e.get('t', 0):.1f} s)")

    while not _finished(future, poll):
        report_new()
    report_new()


def _finished(future: Future, timeout: float) -> bool:
    """Wait up to ``timeout`` s; True once ``future`` is done, with a result or an error."""
    try:
        future.result(timeout=timeout)
    except FutureTimeout:
        return False
    except KeyboardInterrupt:  # Ctrl-C while waiting is the user's, never the run's: the session must end
        raise
    except BaseException:  # the run's error is raised by whoever asks for the result
        return True
    return True


def profile_line(profile: dict[str, Any]) -> str:
    """``start-up 41.0 s (driver import 5.9, config and Ray start 6.7, ...), 3 steps 51.4 s (dump 17.2 s), shut-down
    11.1 s (driver exit 11.1, reap 0.0)``:
    a verl run's start-up profile (``timings.profile`` of its run.json, precision_harness/runs/verl/profile.py)."""
    phases = profile.get("start_up", [])
    parts = ", ".join(f"{p['name']} {p['s']:.1f}" for p in phases)
    text = f"start-up {sum(p['s'] for p in phases):.1f} s ({parts})"
    steps = profile.get("steps", {})
    if steps:
        dump = sum(s.get("dump_s", 0.0) for s in steps.values())
        text += f", {len(steps)} steps {profile.get('steps_s', 0.0):.1f} s (dump {dump:.1f} s)"
    if profile.get("shut_down_s") is not None:
        parts = ", ".join(f"{p['name']} {p['s']:.1f}" for p in profile.get("shut_down", []))
        text += f", shut-down {profile['shut_down_s']:.1f} s" + (f" ({parts})" if parts else "")
    return text


def timing_line(run: dict[str, Any], *, profiled: set[str] | None = None) -> str:
    """``import 3.1 s, setup 0.2 s, 10 dumped stages 4.0 s (slowest step_1/actor_update 1.2 s)`` from run.json."""
    t = run.get("timings", {})
    stages = {k: v for k, v in t.get("stages", {}).items() if not k.endswith("/generate_sequences")}
    dumped = {k: v for k, v in stages.items() if profiled is None or k in profiled}
    parts = []
    if t.get("profile"):
        parts.append(profile_line(t["profile"]))
    else:
        if "import_s" in t:
            parts.append(f"import {t['import_s']:.1f} s")
        if "setup_s" in t:
            parts.append(f"setup {t['setup_s']:.1f} s")
    if dumped:
        slow = max(dumped, key=dumped.get)
        parts.append(f"{len(dumped)} dumped stages {sum(dumped.values()):.1f} s (slowest {slow} {dumped[slow]:.1f} s)")
    return ", ".join(parts)


class RankProgress:
    """Reports the ranks of one stage's compare as they finish, once it has run :data:`COMPARE_QUIET_S` s.

    Args:
        label: the stage, as a line names it (``step_1/actor_update``).
        total: how many ranks the stage compares.
        report: called with each line; None: silent.
    """

    def __init__(self, label: str, total: int, report: Callable[[str], None] | None) -> None:
        self.label, self.total, self.report = label, total, report
        self.done = 0
        self.t0 = time.perf_counter()

    def rank_done(self, rank: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.t0
        if self.report is not None and elapsed >= COMPARE_QUIET_S:
            self.report(f"{self.label}: {rank} compared ({self.done}/{self.total} ranks, {elapsed:.1f} s)")


def compare_bar(total: int) -> Any:
    """The terminal bar of a compare over ``total`` items (tqdm on stderr): it appears after
    :data:`COMPARE_QUIET_S` seconds and only on a terminal (``disable=None``), so logs and pipes stay clean.
    ``set_postfix_str`` takes :class:`RankProgress`'s lines, ``update(1)`` counts an item done."""
    from tqdm import tqdm

    return tqdm(total=total, unit="item", desc="compared", delay=COMPARE_QUIET_S, disable=None, leave=False)
