"""One Ray instance shared by a session's verl runs on the CPU (runs/verl/shared_ray.py, runs/verl/ray_head.py).

Real ``ray start`` (5-15 s on 2 loaded cores), with a stand-in for verl's ``main_ppo``
(``verl.entrypoint``: the gate runs it as it runs verl, on the same shared instance): it waits for the
instance as verl's driver does in the CPU extension, records which instance it got, and then does what
the test needs: writes a dump, exits 1, kills the shared Ray under it, or hangs. Each session is a pytest
subprocess, as a user's, and afterwards no process of it is left: not the run's, not Ray's GCS, raylet,
agents or watcher (every process whose working directory is the session's project is counted).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from precision_harness.runs import ray_cluster
from precision_harness.runs.verl import shared_ray

FAKE_VERL = """
import json, os, pathlib, signal, sys, time
from precision_harness.runs.verl.ray_head import wait_ready

wait_ready()  # what the CPU extension does in verl's driver before ray.init
run = pathlib.Path(os.environ["PRECISION_DUMP_DIR"])
job = json.loads(os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"])["runtime_env"]["env_vars"]
seen = {"address": os.environ["RAY_ADDRESS"], "workdir": job["PRECISION_WORKDIR"], "mode": os.environ["FAKE_MODE"],
        "mark_in_job": job["PRECISION_RUN_ID"] == os.environ["PRECISION_RUN_ID"],
        "ray_folder": str(pathlib.Path(os.environ["PRECISION_RAY_READY"]).parent)}
with open(pathlib.Path(__file__).parent / "seen.jsonl", "a") as fh:
    fh.write(json.dumps(seen) + "\\n")
mode = os.environ["FAKE_MODE"]
if mode == "kill_ray":  # the shared instance dies under the run: its GCS and raylet, found by its folder
    folder = str(pathlib.Path(os.environ["PRECISION_RAY_READY"]).parent)
    for proc in pathlib.Path("/proc").iterdir():
        try:
            cmdline = proc.joinpath("cmdline").read_bytes().decode(errors="replace")
            if proc.name.isdigit() and folder in cmdline and ("gcs_server" in cmdline or "raylet" in cmdline):
                os.kill(int(proc.name), signal.SIGKILL)
        except OSError:
            pass
    sys.exit(1)
if mode == "hang":
    (pathlib.Path(__file__).parent / "hanging").write_text("")
    time.sleep(600)
rank = run / "step_1" / "actor_update" / "step0" / "rank0"
rank.mkdir(parents=True)
rank.joinpath("dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
    "data": {"Functional.linear.0.forward": {"output": [{"type": "torch.Tensor", "dtype": "torch.float32",
    "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 1.0, "requires_grad": False}]}}}))
run.joinpath("metrics.jsonl").write_text(json.dumps({"step": 1, "data": {"actor/loss": 0.5}}) + "\\n")
"""


def _project(root: Path, modes: dict[str, str]) -> Path:
    """A project of verl scenarios run by the stand-in, one per ``{name: mode}``."""
    (root / "scenarios").mkdir(parents=True)
    (root / "fake_verl.py").write_text(FAKE_VERL)
    for name, mode in modes.items():
        (root / "scenarios" / f"{name}.yaml").write_text(
            "engine: verl\n"
            f"env: {{FAKE_MODE: {mode}}}\n"
            f"verl: {{entrypoint: [{sys.executable}, ../fake_verl.py], pin_rollouts: false,\n"
            "       overrides: {algorithm.adv_estimator: grpo}}\n"
            "global_profiler:\n  steps: [1]\n  global_tool_config:\n    precision_debugger: {stages: [actor_update]}\n"
        )
    return root


def _default_sigint() -> None:
    # a job a shell starts in the background inherits SIGINT ignored; a user's pytest takes Ctrl-C
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def gate() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``pytest ARGS`` in a project, as a user's session of its own; whatever a failed test left of it goes."""
    started: list[subprocess.Popen] = []

    def start(project: Path, *args: str) -> subprocess.Popen:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "--precision-device", "cpu", *args]
        proc = subprocess.Popen(
            argv,
            cwd=project,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_for_hang(project: Path, proc: subprocess.Popen) -> None:
    """Until the stand-in's run hangs on the shared instance (Ray up, the run started)."""
    deadline = time.monotonic() + 300
    while not (project / "hanging").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.5)


def _left_in(project: Path, grace: float = 10.0) -> list[str]:
    """Live processes working in ``project`` after ``grace`` seconds: what a session there left behind."""
    deadline = time.monotonic() + grace
    while True:
        left = []
        for entry in Path("/proc").iterdir():
            try:
                here = entry.name.isdigit() and Path(os.readlink(entry / "cwd")).is_relative_to(project.resolve())
                if here and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    left.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
            except OSError:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _gone_after(folder: Path, grace: float = 20.0) -> list[str]:
    """What is still in ``folder`` after ``grace`` seconds (nothing, once it is removed)."""
    deadline = time.monotonic() + grace
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _seen(project: Path) -> list[dict]:
    return [json.loads(line) for line in (project / "seen.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_shared_ray_that_dies_fails_its_run_in_one_line_and_the_next_run_starts_a_fresh_one(
    tmp_path: Path, gate
) -> None:
    """Two verl scenarios in one session: the first's run kills the shared instance under it and fails with a line
    saying so; the second runs on a fresh instance (another address) and is recorded. Each run's Ray workers get
    its variables and its working directory. Nothing is left when the session ends."""
    project = _project(tmp_path / "p", {"a_kills_ray": "kill_ray", "b_runs": "ok"})
    proc = gate(project, "--precision-golden", "update")
    out, _ = proc.communicate(timeout=600)
    assert re.search(
        r"a_kills_ray\.yaml: the session's shared Ray instance \(127\.0\.0\.1:\d+\) failed during the run: it stopped; "
        r"the next verl run starts a fresh one\. The run: .*command exited with 1",
        out,
    ), out[-3000:]
    assert "b_runs.yaml::actor_update[step_1] PASSED" in out, out[-3000:]
    first, second = _seen(project)
    assert first["address"] != second["address"]
    assert first["workdir"] == second["workdir"] == str((project / "scenarios").resolve())
    assert first["mark_in_job"] and second["mark_in_job"]
    assert not _left_in(project)


@pytest.mark.slow
def test_ctrl_c_of_a_session_sharing_one_ray_leaves_nothing_behind(tmp_path: Path, gate) -> None:
    """SIGINT to pytest while a verl run hangs on the shared instance: the run and the instance both go, and the
    instance's temp folder (``/tmp/prray-*``) with them."""
    project = _project(tmp_path / "p", {"hangs": "hang"})
    proc = gate(project, "--precision-golden", "update")
    _wait_for_hang(project, proc)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert not _left_in(project)
    (seen,) = _seen(project)
    assert not _gone_after(Path(seen["ray_folder"]))


@pytest.mark.slow
def test_a_run_past_its_timeout_on_the_shared_ray_is_one_line_and_leaves_nothing(tmp_path: Path, gate) -> None:
    project = _project(tmp_path / "p", {"hangs": "hang"})
    proc = gate(project, "--precision-golden", "update", "-o", "precision_timeout=30")  # Ray is up in 5-15 s
    out, _ = proc.communicate(timeout=600)
    assert re.search(r"hangs\.yaml: command timed out after 30 s; no stage was reached", out), out[-3000:]
    (seen,) = _seen(project)  # the run got as far as the hang, on the shared instance
    assert seen["mode"] == "hang"
    assert not _left_in(project)


@pytest.mark.slow
def test_a_gate_process_killed_mid_run_leaves_no_ray_no_driver_and_no_folder(tmp_path: Path, gate) -> None:
    """pytest killed outright while a verl run hangs (an OOM kill, a cancelled CI job): it cannot take anything
    down, so the watcher notices, takes Ray down, kills the run's driver (in a session of its own, out of reach
    of a signal to pytest's group) and removes the instance's temp folder."""
    project = _project(tmp_path / "p", {"hangs": "hang"})
    proc = gate(project, "--precision-golden", "update")
    _wait_for_hang(project, proc)
    assert len(_left_in(project, grace=0)) > 2  # pytest, the watcher, Ray's processes and the driver
    proc.kill()
    proc.communicate()
    assert not _left_in(project, grace=20)
    (seen,) = _seen(project)
    assert not _gone_after(Path(seen["ray_folder"]))


def test_a_lease_hands_a_driver_the_run_variables_and_verl_keeps_its_own() -> None:
    """What the driver's environment gets (no instance started): the address, the ready file, the token, and the
    job's runtime environment with the run's variables, where verl's own ray.init values win."""
    lease = shared_ray.Lease(address="127.0.0.1:1", ready=Path("/tmp/r/ready"), token="t0k")
    env = lease.driver_env({"PRECISION_RUN_ID": "r1", "OMP_NUM_THREADS": "1"}, cwd=Path("/s"))
    job = json.loads(env[ray_cluster.JOB_CONFIG])["runtime_env"]["env_vars"]
    assert job["PRECISION_RUN_ID"] == "r1" and job["OMP_NUM_THREADS"] == "1" and job[ray_cluster.ENV_WORKDIR] == "/s"
    assert env["RAY_ADDRESS"] == "127.0.0.1:1" and env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "t0k" and "RAY_AUTH_TOKEN" not in job
