"""The start-up profile of a verl run: where its wall time went, from the log, the metrics and the timeline.

Every verl run gets one (:func:`profile`), written into ``run.json`` (``timings.profile``) and shown on
the terminal line (:func:`precision_harness.progress.timing_line`). Its sources:

- the gate's own clock: when the command started, exited and its processes were reaped;
- verl 0.9.1's messages in ``worker.log``, with their timestamps (:data:`MILESTONES`): Ray started, the
  TaskRunner's dataloader, the worker group, the model engines, ``all initialize finished``;
- verl's console/file logger: ``timing_s/step`` and ``timing_s/gen`` of every step (``metrics.jsonl`` as
  verl wrote it, before the gate drops the timings it never gates);
- ``verl_timeline.jsonl`` (:data:`TIMELINE`), written by the gate's extensions in every verl process
  (:mod:`precision_harness.runs.verl.stages.timeline`): on the CPU when each process started and finished
  its imports, and (on the CPU, and at ``level: auto`` on a device) each dumped stage on each rank with the
  time spent inside msprobe.

Phases (seconds, in order; one whose end was not seen is merged into the next): ``driver import`` (the
command's start to ``import verl`` done in the driver), ``config and Ray start`` (Hydra's composition, verl's
validation, then Ray started or joined), ``TaskRunner``
(its actor's start-up and imports), ``TransferQueue and data`` (to the dataloader), ``rank processes``
(their start-up and imports), ``models and engines`` (to the engines initialised), ``rollout, reward,
checkpoint engine`` (the rollout server, reward workers and weight sync, to ``all initialize finished``),
then the steps, and the shut-down: ``driver exit`` (verl's end of run, Ray's included) and ``reap`` (every
process of the run gone). Each
verl process is listed with its role (the ``(Role pid=N)`` prefix Ray gives its lines), its start and
its imports. Each step: verl's ``timing_s/step``, and of it the dumped stages and the dump (msprobe's
own time) on the lowest rank. This module imports neither torch nor verl.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

#: the timeline file verl's processes append to, in the run folder
TIMELINE = "verl_timeline.jsonl"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ROLE = re.compile(r"^\((\w+) pid=(\d+)(?:,[^)]*)?\)")
#: ``INFO:2026-11-25 16:31:55,516:message`` (verl's logging) or ``2026-11-25 16:31:20,074\tINFO ...`` (Ray's)
_STAMP = re.compile(r"(?:^|[A-Z]+:)(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
#: (phase ending at the message, the message of verl 0.9.1 that ends it); in run order
MILESTONES = (
    ("ray", ("Started a local Ray instance", "Connected to Ray cluster")),
    ("data", ("train and validate dataloader initialized",)),
    ("models", ("actor and ref model engine initialized",)),
    ("ready", ("all initialize finished, ready to fit",)),
)
#: the Ray actor class of verl's TaskRunner and of its rank processes (colocated workers)
TASK_RUNNER, RANKS = "TaskRunnerV1", "WorkerDict"


def _stamp(text: str) -> float | None:
    match = _STAMP.search(text)
    if not match:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def read_log(path: Path) -> tuple[dict[str, float], dict[int, str]]:
    """``({milestone: epoch seconds}, {pid: Ray actor class})`` from a verl run's ``worker.log``."""
    marks: dict[str, float] = {}
    roles: dict[int, str] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return marks, roles
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        role = _ROLE.match(line)
        if role and role.group(1) != "pid":
            roles.setdefault(int(role.group(2)), role.group(1))
        for name, messages in MILESTONES:
            if name not in marks and any(m in line for m in messages):
                when = _stamp(line)
                if when is not None:
                    marks[name] = when
    return marks, roles


def read_timeline(path: Path) -> list[dict[str, Any]]:
    """The events of ``verl_timeline.jsonl`` (none when the file is missing; unreadable lines skipped)."""
    events = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return events
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def step_timings(rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """``{step: {"step_s", "gen_s"}}`` from verl's metrics lines (``{"step": n, "data": {...}}`` or flat)."""
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        data = row.get("data", row) if isinstance(row, dict) else {}
        step = row.get("step", data.get("training/global_step"))
        if not isinstance(step, int) or "timing_s/step" not in data:
            continue
        out[step] = {"step_s": float(data["timing_s/step"]), "gen_s": float(data.get("timing_s/gen", 0.0))}
    return out


def _phases(marks: list[tuple[str, float | None]], start: float) -> list[dict[str, Any]]:
    """Consecutive phases from ``(name, end)`` marks; a mark not seen is merged into the next one's name."""
    phases, pending, last = [], [], start
    for name, end in marks:
        pending.append(name)
        if end is None:
            continue
        phases.append({"name": ", ".join(pending), "s": round(max(0.0, end - last), 3)})
        pending, last = [], max(last, end)
    return phases


def _processes(events: list[dict[str, Any]], roles: dict[int, str], start: float) -> list[dict[str, Any]]:
    """One row per process: its first ``process`` event (the rollout server records one when its model is loaded,
    and another when it first imports verl)."""
    out, seen = [], set()
    for e in events:
        if e.get("event") != "process" or e.get("started") is None or e["pid"] in seen:
            continue
        seen.add(e["pid"])
        role = roles.get(int(e["pid"]), "process")
        out.append(
            {
                "role": role,
                "pid": e["pid"],
                "started_s": round(e["started"] - start, 3),
                "imports_s": round(e["ready"] - e["started"], 3),
            }
        )
    return sorted(out, key=lambda p: p["started_s"])


def _ready(processes: list[dict[str, Any]], role: str, start: float) -> float | None:
    """When the last process of ``role`` finished its imports (epoch seconds), or None."""
    ends = [start + p["started_s"] + p["imports_s"] for p in processes if p["role"] == role]
    return max(ends) if ends else None


def stage_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lowest rank's ``stage`` events (each rank dumps the same stages; one rank's times are the step's)."""
    stages = [e for e in events if e.get("event") == "stage"]
    if not stages:
        return []
    rank = min(int(e.get("rank", 0)) for e in stages)
    return [e for e in stages if int(e.get("rank", 0)) == rank]


def _steps(timings: dict[int, dict[str, float]], stages: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for step, t in sorted(timings.items()):
        mine = [e for e in stages if e.get("step") == step]
        dumped = sum(e["end"] - e["start"] for e in mine)
        dump = sum(float(e.get("dump_s", 0.0)) for e in mine)
        out[str(step)] = {
            **t,
            "dumped_stages_s": round(dumped, 3),
            "dump_s": round(dump, 3),
            "compute_s": round(t["step_s"] - dump, 3),
        }
    return out


def profile(run_dir: Path, *, clock: dict[str, float], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The profile of the verl run in ``run_dir`` (see the module docstring), for ``run.json``'s ``timings.profile``.

    Args:
        clock: the gate's epoch seconds: ``started`` (the command), ``exited``, ``reaped``, and ``driver_pid``.
        metrics: verl's metrics lines as it wrote them (timings included).
    """
    start = clock["started"]
    marks, roles = read_log(run_dir / "worker.log")
    roles[int(clock["driver_pid"])] = "driver"
    events = read_timeline(run_dir / TIMELINE)
    processes = _processes(events, roles, start)
    timings = step_timings(metrics)
    steps_s = sum(t["step_s"] for t in timings.values())
    ready = marks.get("ready")
    start_up = _phases(
        [
            ("driver import", _ready(processes, "driver", start)),
            ("config and Ray start", marks.get("ray")),
            ("TaskRunner", _ready(processes, TASK_RUNNER, start)),
            ("TransferQueue and data", marks.get("data")),
            ("rank processes", _ready(processes, RANKS, start)),
            ("models and engines", marks.get("models")),
            ("rollout, reward, checkpoint engine", ready),
        ],
        start,
    )
    end_of_steps = ready + steps_s if ready is not None else None
    tail = _phases(
        [("steps", end_of_steps), ("driver exit", clock["exited"]), ("reap", clock["reaped"])], ready or start
    )
    shut_down = [p for p in tail if p["name"] in ("driver exit", "reap")]
    return {
        "start_up": start_up,
        "steps_s": round(steps_s, 3),
        "shut_down": shut_down,
        "shut_down_s": round(sum(p["s"] for p in shut_down), 3) if end_of_steps is not None else None,
        "wall_s": round(clock["reaped"] - start, 3),
        "processes": processes,
        "steps": _steps(timings, stage_events(events)),
    }


def stage_seconds(run_dir: Path) -> dict[str, float]:
    """``{"step_<n>/<stage>": seconds}`` of each dumped stage on the lowest rank (dump included), from the timeline."""
    return {
        f"step_{e['step']}/{e['stage']}": round(e["end"] - e["start"], 6)
        for e in stage_events(read_timeline(Path(run_dir) / TIMELINE))
    }


def timings(run_dir: Path, clock: dict[str, float], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """``run.json``'s ``timings`` entries of a verl run besides ``total_s``: ``import_s`` (the driver's import),
    ``setup_s`` (the rest of the start-up), ``stages`` (:func:`stage_seconds`) and ``profile`` (:func:`profile`)."""
    prof = profile(run_dir, clock=clock, metrics=metrics)
    phases = prof["start_up"]
    driver = phases[0]["s"] if phases and phases[0]["name"] == "driver import" else 0.0
    return {
        "import_s": driver,
        "setup_s": round(sum(p["s"] for p in phases) - driver, 3),
        "stages": stage_seconds(run_dir),
        "profile": prof,
    }
