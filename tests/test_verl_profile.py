"""The start-up profile of a verl run (runs/verl/profile.py), and the deferred patching its cut relies on.

The profile is read from a verl run's files: ``worker.log`` (verl's and Ray's messages with their
timestamps, the ``(Role pid=N)`` prefixes), the timeline the CPU extension writes in every verl process,
and verl's own ``timing_s/*`` metrics. Here they are written by hand, with known times, so each phase,
process and step can be checked to the millisecond; the end-to-end test of the examples checks a real
run's profile (tests/test_verl_cpu.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from precision_harness.progress import profile_line, timing_line
from precision_harness.runs.verl import profile as verl_profile

T0 = datetime(2026, 11, 25, 16, 0, 0).timestamp()


def _stamp(seconds: float) -> str:
    """A log timestamp ``seconds`` after T0, as verl's logging writes it (milliseconds after a comma)."""
    when = datetime.fromtimestamp(T0 + seconds)
    return when.strftime("%Y-%m-%d %H:%M:%S,") + f"{when.microsecond // 1000:03d}"


def _write_run(run: Path) -> dict[str, float]:
    """A two-rank run's files: driver ready at 5 s, Ray at 11, TaskRunner at 16, data at 26, ranks at 33, models at
    41, ready at 53; steps of 16 and 7 s; the driver exits at 80.5 and everything is reaped at 81."""
    log = [
        "precision gate: verl on cpu: gate-owned overrides (docs/scenarios.md):",
        f"INFO:{_stamp(4.9)}:Platform override from VERL_PLATFORM: precision_cpu",
        f"{_stamp(11.0)}\tINFO worker.py:2029 -- Started a local Ray instance.",
        f"\x1b[36m(TaskRunnerV1 pid=200)\x1b[0m INFO:{_stamp(26.0)}:train and validate dataloader initialized, ...",
        f"(TaskRunnerV1 pid=200) INFO:{_stamp(41.0)}:actor and ref model engine initialized",
        "(WorkerDict pid=301) Qwen2ForCausalLM contains 108.10K parameters",
        f"(pid=302) INFO:{_stamp(30.0)}:Platform override from VERL_PLATFORM: precision_cpu",
        "(WorkerDict pid=302) Qwen2ForCausalLM contains 108.10K parameters",
        f"(TaskRunnerV1 pid=200) INFO:{_stamp(53.0)}:all initialize finished, ready to fit",
        "(AgentLoopWorkerTQ pid=400) Using dataset class: RLHFDataset",
    ]
    (run / "worker.log").write_text("\n".join(log) + "\n")
    events = [
        {"event": "process", "pid": 100, "started": T0 + 0.1, "ready": T0 + 5.0},
        {"event": "process", "pid": 200, "started": T0 + 12.0, "ready": T0 + 16.0},
        {"event": "process", "pid": 301, "started": T0 + 27.0, "ready": T0 + 32.0},
        {"event": "process", "pid": 302, "started": T0 + 27.5, "ready": T0 + 33.0},
        {"event": "process", "pid": 400, "started": T0 + 54.0, "ready": T0 + 59.5},
        {"event": "process", "pid": 400, "started": T0 + 54.0, "ready": T0 + 70.0},  # a second one: the first counts
    ]
    for step, base in ((1, 60.0), (2, 70.0)):
        for rank in (0, 1):
            events.append(
                {"event": "stage", "pid": 301 + rank, "rank": rank, "step": step, "stage": "actor_update"}
                | {"start": T0 + base, "end": T0 + base + 2.5 + rank, "dump_s": 1.5}
            )
    (run / verl_profile.TIMELINE).write_text("".join(json.dumps(e) + "\n" for e in events) + "not json\n")
    return {"started": T0, "exited": T0 + 80.5, "reaped": T0 + 81.0, "driver_pid": 100}


METRICS = [
    {"step": 1, "data": {"timing_s/step": 16.0, "timing_s/gen": 2.0, "actor/loss": 0.1}},
    {"step": 2, "data": {"timing_s/step": 7.0, "timing_s/gen": 1.5}},
]


def test_the_profile_names_each_phase_process_and_step_from_the_runs_files(tmp_path: Path) -> None:
    clock = _write_run(tmp_path)
    profile = verl_profile.profile(tmp_path, clock=clock, metrics=METRICS)
    phases = {p["name"]: p["s"] for p in profile["start_up"]}
    assert phases == {
        "driver import": 5.0,
        "config and Ray start": 6.0,
        "TaskRunner": 5.0,
        "TransferQueue and data": 10.0,
        "rank processes": 7.0,
        "models and engines": 8.0,
        "rollout, reward, checkpoint engine": 12.0,
    }
    assert profile["steps_s"] == 23.0 and profile["wall_s"] == 81.0
    assert profile["shut_down"] == [{"name": "driver exit", "s": 4.5}, {"name": "reap", "s": 0.5}]
    assert profile["shut_down_s"] == 5.0
    roles = [(p["role"], p["imports_s"]) for p in profile["processes"]]
    assert roles == [
        ("driver", 4.9),
        ("TaskRunnerV1", 4.0),
        ("WorkerDict", 5.0),
        ("WorkerDict", 5.5),
        ("AgentLoopWorkerTQ", 5.5),
    ]
    # each step: verl's time, and of it the lowest rank's dumped stages and msprobe's own time
    assert profile["steps"]["1"] == {
        "step_s": 16.0,
        "gen_s": 2.0,
        "dumped_stages_s": 2.5,
        "dump_s": 1.5,
        "compute_s": 14.5,
    }
    timings = verl_profile.timings(tmp_path, clock, METRICS)
    assert timings["import_s"] == 5.0 and timings["setup_s"] == 48.0
    assert timings["stages"] == {"step_1/actor_update": 2.5, "step_2/actor_update": 2.5}


def test_a_phase_whose_end_was_not_logged_is_merged_into_the_next(tmp_path: Path) -> None:
    """Off the CPU there is no timeline: the driver's, the TaskRunner's and the ranks' ends are unknown, and their
    time goes to the next phase verl's log names, so the phases still add up to the start-up."""
    clock = _write_run(tmp_path)
    (tmp_path / verl_profile.TIMELINE).unlink()
    profile = verl_profile.profile(tmp_path, clock=clock, metrics=METRICS)
    assert [(p["name"], p["s"]) for p in profile["start_up"]] == [
        ("driver import, config and Ray start", 11.0),
        ("TaskRunner, TransferQueue and data", 15.0),
        ("rank processes, models and engines", 15.0),
        ("rollout, reward, checkpoint engine", 12.0),
    ]
    assert profile["processes"] == [] and profile["steps"]["2"]["dump_s"] == 0.0


def test_the_terminal_line_shows_the_profile_in_place_of_import_and_setup(tmp_path: Path) -> None:
    clock = _write_run(tmp_path)
    timings = {"total_s": 81.0, **verl_profile.timings(tmp_path, clock, METRICS)}
    line = timing_line({"timings": timings}, profiled={"step_1/actor_update", "step_2/actor_update"})
    assert line == (
        "start-up 53.0 s (driver import 5.0, config and Ray start 6.0, TaskRunner 5.0, TransferQueue and data 10.0, "
        "rank processes 7.0, models and engines 8.0, rollout, reward, checkpoint engine 12.0), "
        "2 steps 23.0 s (dump 3.0 s), shut-down 5.0 s (driver exit 4.5, reap 0.5), "
        "2 dumped stages 5.0 s (slowest step_1/actor_update 2.5 s)"
    )
    assert "import" not in line.split("driver import")[0]  # no "import X s, setup Y s" beside the profile
    assert profile_line({"start_up": []}) == "start-up 0.0 s ()"


def _python(code: str, tmp_path: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_a_deferred_patch_runs_when_its_module_is_imported_and_another_finder_keeps_its_own(tmp_path: Path) -> None:
    """on_import: a module not yet imported is patched right after its import (before the importer reads it); one
    already imported is patched at once; a finder after it that wraps the same module (tests/hooks) still does."""
    (tmp_path / "late_mod.py").write_text("VALUE = 1\n")
    (tmp_path / "other_mod.py").write_text("VALUE = 10\n")
    out = _python(
        """
        import importlib.abc, importlib.machinery, sys, json
        sys.path.insert(0, ".")
        import other_mod

        class Hooks(importlib.abc.MetaPathFinder):  # as tests/hooks' finder wraps the modules it plants
            def find_spec(self, name, path, target=None):
                if name != "late_mod":
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                run = spec.loader.exec_module
                def exec_module(module):
                    run(module)
                    module.VALUE += 100
                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, Hooks())
        from precision_harness.runs.verl.stages import on_import
        on_import.when_imported("late_mod", lambda m: setattr(m, "VALUE", m.VALUE * 2))
        on_import.when_imported("other_mod", lambda m: setattr(m, "VALUE", m.VALUE + 5))
        seen = "late_mod" in sys.modules
        from late_mod import VALUE
        print(json.dumps([seen, VALUE, other_mod.VALUE]))
        """,
        tmp_path,
    )
    assert json.loads(out) == [False, 202, 15]


@pytest.mark.parametrize("module", ["verl.workers.engine_workers", "verl.workers.engine.fsdp.transformer_impl"])
def test_the_cpu_extension_leaves_the_engine_modules_to_whoever_imports_them(tmp_path: Path, module: str) -> None:
    """``import verl`` with the CPU extension no longer imports verl's engine modules (2.5 s a process); a process
    that imports one gets it patched."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    from precision_harness.runs.numerics.devices import determinism_env
    from precision_harness.runs.verl import engine as verl_engine

    env = {**determinism_env("cpu", 1), **verl_engine.cpu_env()}
    code = f"""
        import os, sys, json
        os.environ.update({env!r})
        import verl
        before = {module!r} in sys.modules
        import importlib
        importlib.import_module({module!r})
        import verl.workers.engine_workers as ew, verl.workers.engine.fsdp.transformer_impl as fi
        print(json.dumps([before, ew.initialize_global_process_group_ray.__precision_patched__,
                          fi.CPUOffloadPolicy.__precision_patched__]))
        """
    assert json.loads(_python(code, tmp_path).splitlines()[-1]) == [False, True, True]
