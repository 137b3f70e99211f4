"""Warm workers (precision_harness.runs.warm): runs forked from a preloaded forkserver write the same bytes as
fresh interpreters, fall back to a fresh one when the determinism environment differs, and fail as
fresh workers do (one line, the log's path) on a worker error or a timeout."""

from __future__ import annotations

import hashlib
import multiprocessing.forkserver
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from harness_testing import TINY

from precision_harness.errors import RunFailedError
from precision_harness.runs import kind_runners, launch, warm
from precision_harness.runs.runner.devices import determinism_env
from precision_harness.scenarios.scenario import Scenario
from precision_harness.schemas import load_schema

pytest.importorskip("msprobe")
RUN_SCHEMA = load_schema("run_manifest")


def _payloads(run_dir: Path) -> dict[str, str]:
    names = ("dump.json", "construct.json", "metrics.jsonl", "log_probs.json")
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.name in names
    }


def _variant(tmp_path: Path, overrides: dict) -> Scenario:
    return Scenario.load(TINY).with_overrides(overrides, directory=tmp_path / "scenarios", name="tiny_ppo")


def test_warm_and_fresh_runs_write_the_same_bytes(tmp_path: Path) -> None:
    scenario = Scenario.load(TINY)
    fresh = kind_runners.run_scenario(
        scenario, out_dir=tmp_path / "fresh", device="cpu", options=launch.RunOptions(warm=False)
    )
    forked = kind_runners.run_scenario(
        scenario, out_dir=tmp_path / "warm", device="cpu", options=launch.RunOptions(warm=True)
    )
    assert (fresh.run_json["warm"], forked.run_json["warm"]) == (False, True)
    payloads = _payloads(fresh.run_dir)
    assert any(name.endswith("dump.json") for name in payloads)
    assert _payloads(forked.run_dir) == payloads
    for manifest in (fresh.run_json, forked.run_json):
        jsonschema.validate(manifest, RUN_SCHEMA)


def test_another_determinism_environment_gets_a_fresh_interpreter(tmp_path: Path) -> None:
    # torch reads the thread and ISA settings at import: a server started for 1 thread cannot serve 2
    assert warm.context_for(determinism_env("cpu", 1)) is not None
    assert warm.context_for(determinism_env("cpu", 2)) is None
    scenario = _variant(tmp_path, {"trainer.num_threads": 2})
    result = kind_runners.run_scenario(
        scenario, out_dir=tmp_path / "run", device="cpu", options=launch.RunOptions(warm=True)
    )
    assert result.run_json["warm"] is False
    assert result.run_json["env"]["num_threads"] == 2


def test_warm_worker_error_is_the_worker_s_one_line(tmp_path: Path) -> None:
    scenario = _variant(tmp_path, {"data.max_prompt_length": 3})
    with pytest.raises(RunFailedError) as info:
        kind_runners.run_scenario(
            scenario, out_dir=tmp_path / "run", device="cpu", options=launch.RunOptions(warm=True)
        )
    message = str(info.value)
    assert "scenario run failed: ValueError: data.max_prompt_length: prompt" in message
    assert message.endswith("worker.log)") and "\n" not in message
    assert "Traceback" in (tmp_path / "run" / "worker.log").read_text()


def test_a_worker_ended_by_a_signal_is_named_with_its_last_log_line(tmp_path: Path) -> None:
    """A crash writes no error.txt: the one line names the signal and keeps the log's last line (CI drops logs)."""
    log = tmp_path / "worker.log"
    crash = "import ctypes; print('step_2 actor_update', flush=True); print(); ctypes.string_at(0)"
    with open(log, "wb") as fh:
        code = subprocess.run([sys.executable, "-c", crash], stdout=fh, stderr=subprocess.STDOUT).returncode
    assert launch.exit_reason(code, log) == "killed by SIGSEGV (exit code -11); last log line: step_2 actor_update"
    assert launch.exit_reason(3, tmp_path / "absent.log") == "exit code 3"


def test_warm_worker_past_its_timeout_is_killed_and_one_line(tmp_path: Path) -> None:
    scenario = _variant(tmp_path, {"trainer.total_training_steps": 50})
    with pytest.raises(RunFailedError, match=r"tiny_ppo\.\w+\.yaml: worker timed out after 1 s \(log: .*worker.log\)$"):
        kind_runners.run_scenario(
            scenario, out_dir=tmp_path / "run", device="cpu", options=launch.RunOptions(warm=True, timeout=1)
        )
    assert not (tmp_path / "run" / "run.json").exists()


def test_server_starts_with_the_determinism_environment_and_the_caller_s_is_restored(monkeypatch) -> None:
    determinism = determinism_env("cpu", 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("MKL_CBWR", raising=False)
    seen = {}
    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", lambda: seen.update(os.environ))
    before = dict(os.environ)
    warm._start_server(determinism)
    assert {key: seen[key] for key in determinism} == determinism
    assert dict(os.environ) == before


def test_a_runner_process_imports_transformers_without_scikit_learn_or_scipy() -> None:
    """transformers imports scikit-learn and SciPy where they are installed; a runner process never uses them
    (precision_harness.runs.runner.lean_imports), fresh or forked from the warm server."""
    assert warm.PRELOAD.index("precision_harness.runs.runner.lean_imports") < warm.PRELOAD.index("torch")
    probe = (
        "import sys, precision_harness.runs.runner.__main__, transformers.models.qwen2.modeling_qwen2 as m;"
        "from transformers.utils import is_scipy_available, is_sklearn_available;"
        "print(is_sklearn_available(), is_scipy_available(), sys.modules.get('sklearn'), sys.modules.get('scipy'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "None", "None"]
