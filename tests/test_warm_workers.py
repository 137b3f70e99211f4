"""Warm workers (precision_harness.runs.warm.workers): runs forked from a preloaded forkserver write the same bytes as
fresh interpreters, fall back to a fresh one when the determinism environment differs, and fail as
fresh workers do (one line, the log's path) on a worker error or a timeout."""

from __future__ import annotations

import hashlib
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from harness_testing import TINY

from precision_harness.errors import RunFailedError
from precision_harness.runs import kind_runners, launch
from precision_harness.runs.numerics.devices import determinism_env
from precision_harness.runs.warm import shared as warm_shared
from precision_harness.runs.warm import workers as warm
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


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> warm_shared.SharedServers:
    """Shared warm servers in a folder of this test's, owned by this process (not the test session's)."""
    folder = tmp_path / "warm"
    folder.mkdir()
    monkeypatch.setenv(warm_shared.DIR_ENV, str(folder))
    monkeypatch.setenv(warm_shared.OWNER_ENV, str(os.getpid()))
    yield warm_shared.SharedServers(folder, os.getpid())
    warm_shared.stop_all(folder)


@pytest.fixture
def per_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's own forkserver, as a pytest session without ``PRECISION_WARM_DIR`` has."""
    monkeypatch.delenv(warm_shared.DIR_ENV, raising=False)


def test_warm_and_fresh_runs_write_the_same_bytes(tmp_path: Path, shared, monkeypatch) -> None:
    scenario = Scenario.load(TINY)
    runs = {}
    for name, warm_run in (("fresh", False), ("shared", True), ("per_session", True)):
        if name == "per_session":
            monkeypatch.delenv(warm_shared.DIR_ENV)
        options = launch.RunOptions(warm=warm_run)
        runs[name] = kind_runners.run_scenario(scenario, out_dir=tmp_path / name, device="cpu", options=options)
    assert [run.run_json["warm"] for run in runs.values()] == [False, True, True]
    assert len(list(shared.folder.glob("*.pid"))) == 1  # the shared run forked from a server in its folder
    payloads = _payloads(runs["fresh"].run_dir)
    assert any(name.endswith("dump.json") for name in payloads)
    assert _payloads(runs["shared"].run_dir) == payloads
    assert _payloads(runs["per_session"].run_dir) == payloads
    for run in runs.values():
        jsonschema.validate(run.run_json, RUN_SCHEMA)


def test_another_determinism_environment_gets_a_fresh_interpreter(tmp_path: Path, per_session) -> None:
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


#: a child module whose run is known: ``main([seconds, code])`` sleeps, then returns ``code``
SLEEPER = "import time\n\ndef main(argv):\n    time.sleep(float(argv[0]))\n    return int(argv[1])\n"


def _sleeper_env(tmp_path: Path, **more: str) -> dict[str, str]:
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **more}


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while warm_shared.running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not warm_shared.running(pid)


def test_a_shared_server_serves_several_clients_passes_exit_codes_and_kills_what_it_must(
    tmp_path: Path, shared, monkeypatch
) -> None:
    env, log = _sleeper_env(tmp_path), str(tmp_path / "child.log")
    monkeypatch.chdir(tmp_path)  # the other session's folder too, so both are one run environment
    first = shared.start(["0", "3"], env, log, "sleeper")
    first.join(60)
    assert first.exitcode == 3
    another = subprocess.run(  # another session, in another process and folder, forks from the same server
        [sys.executable, "-c", "from precision_harness.runs.warm import workers as warm; import sys;"
         "c = warm.start(warm.context_for({}), ['0', '5'], dict(__import__('os').environ), sys.argv[1], 'sleeper');"
         "c.join(60); print(c.exitcode)", log],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert another.stdout.split() == ["5"]
    assert len(list(shared.folder.glob("*.pid"))) == 1
    slow = shared.start(["600", "0"], env, log, "sleeper")
    slow.join(0.5)
    assert slow.is_alive()
    slow.kill()
    slow.join(60)
    assert slow.exitcode == -signal.SIGKILL
    orphan = shared.start(["600", "0"], env, log, "sleeper")
    orphan._conn.close()  # the client vanished: its child is killed
    assert _gone(orphan.pid)


def test_a_shared_server_ends_when_idle_and_with_its_owner(tmp_path: Path, shared, monkeypatch) -> None:
    env, log = _sleeper_env(tmp_path), str(tmp_path / "child.log")
    monkeypatch.setattr(warm_shared, "IDLE_S", 1.0)
    child = shared.start(["0", "0"], env, log, "sleeper")
    child.join(60)
    server = int(next(shared.folder.glob("*.pid")).read_text())
    assert _gone(server), "an idle server stays up"
    assert not list(shared.folder.glob("*.sock"))
    owner = subprocess.Popen(["sleep", "600"])
    try:
        monkeypatch.setattr(warm_shared, "IDLE_S", 600.0)
        child = warm_shared.SharedServers(shared.folder, owner.pid).start(["0", "0"], env, log, "sleeper")
        child.join(60)
        server = int(next(shared.folder.glob("*.pid")).read_text())
        assert not _gone(server, within_s=1.5)
    finally:
        owner.kill()
        owner.wait()
    assert _gone(server), "a server outlives its owner"


def test_a_shared_server_that_cannot_start_is_one_line_naming_its_log(tmp_path: Path, shared) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\n\nos._exit(3)\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    with pytest.raises(RunFailedError, match=r"^the warm server exited with 3 \(log: .*warm/\w+\.log\)$"):
        shared.start(["0", "0"], env, str(tmp_path / "child.log"), "sleeper")


def test_the_server_key_ignores_only_the_per_test_variables_and_those_named() -> None:
    env = {"PATH": "/bin", "PRECISION_TEST_PLANT": "loss", "OMP_NUM_THREADS": "1"}
    same = {**env, "PYTEST_CURRENT_TEST": "t.py::x (call)", "PYTEST_XDIST_WORKER": "gw1"}
    assert warm_shared.server_key(same) == warm_shared.server_key(env)
    for name, value in (("PRECISION_TEST_PLANT", "kl"), ("OMP_NUM_THREADS", "2"), ("PYTHONPATH", "/hooks")):
        assert warm_shared.server_key({**env, name: value}) != warm_shared.server_key(env), name
    named = {**env, warm_shared.IGNORE_ENV: "PRECISION_TEST_PLANT, PRECISION_TEST_PERTURB_RANK"}
    assert warm_shared.server_key({**named, "PRECISION_TEST_PLANT": "kl"}) == warm_shared.server_key(named)
    assert warm_shared.server_key({**named, "OMP_NUM_THREADS": "2"}) != warm_shared.server_key(named)


def test_the_server_key_drops_the_working_directory_from_pythonpath_unless_it_customizes(tmp_path: Path) -> None:
    env = {"PATH": "/bin", "PYTHONPATH": "/src"}
    here = {**env, "PYTHONPATH": f"/src{os.pathsep}{tmp_path}"}  # what pytester's subprocess sessions set
    assert warm_shared.server_key(here, str(tmp_path)) == warm_shared.server_key(env, "/elsewhere")
    assert warm_shared.server_key(here, "/elsewhere") != warm_shared.server_key(env, "/elsewhere")
    (tmp_path / "sitecustomize.py").write_text("")  # imported at start-up from PYTHONPATH: the entry counts
    assert warm_shared.server_key(here, str(tmp_path)) != warm_shared.server_key(env, "/elsewhere")


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        (warm_shared.OWNER_ENV, "me", r"^PRECISION_WARM_OWNER='me': expected the pid of the process that owns"),
        (warm_shared.DIR_ENV, "/no/warm", r"^PRECISION_WARM_DIR=/no/warm: no such folder; create one of the job.s own"),
    ],
)
def test_bad_shared_server_variables_are_one_line(shared, monkeypatch, name: str, value: str, expected: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(RunFailedError, match=expected):
        warm_shared.configured()
