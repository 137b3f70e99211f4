"""A run on an existing Ray cluster, without a cluster: the job's runtime environment, the one-line refusals before
a run (an address that does not answer, a node that cannot read the run folder), the signals that stop a gate as
Ctrl-C does, the placement of a verl scenario's ranks over nodes, and what each verl process records of its
determinism. The cluster itself is in tests/test_verl_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from precision_harness.check.environment import diff
from precision_harness.errors import RunFailedError, ScenarioError
from precision_harness.runs import ray_cluster
from precision_harness.runs.verl import engine as verl_engine

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "examples" / "verl_cpu" / "scenarios" / "grpo_dp2_bf16_cpu.yaml"


def test_the_job_carries_the_runs_variables_and_working_folder_and_verl_keeps_its_own() -> None:
    env = ray_cluster.job_env({"PRECISION_RUN_ID": "r1", "VERL_USE_EXTERNAL_MODULES": "a,b"}, cwd=Path("/s"))
    job = json.loads(env[ray_cluster.JOB_CONFIG])["runtime_env"]["env_vars"]
    assert job == {"PRECISION_RUN_ID": "r1", "VERL_USE_EXTERNAL_MODULES": "a,b", ray_cluster.ENV_WORKDIR: "/s"}
    assert env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"


def test_an_address_that_does_not_answer_is_one_line_before_any_run() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        with pytest.raises(RunFailedError) as err:
            ray_cluster.check_answers(f"127.0.0.1:{port}", timeout=2)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"--precision-ray-address 127.0.0.1:{port}: the Ray cluster does not answer")
    assert "ray start --head" in text


def _watcher_saying(answer: dict) -> subprocess.Popen:
    """A process that answers as the watcher does, on its stdout."""
    code = f"import sys; print({json.dumps(json.dumps(answer))}, flush=True); sys.stdin.read()"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def test_a_node_that_cannot_read_the_run_folder_is_one_line_naming_it(tmp_path: Path) -> None:
    nodes = [
        {"ip": "10.0.0.1", "node_id": "a" * 56, "sees": True},
        {"ip": "10.0.0.2", "node_id": "3f9a1c2e" + "0" * 48, "sees": False},
    ]
    proc = _watcher_saying({"nodes": nodes})
    try:
        with pytest.raises(RunFailedError) as err:
            ray_cluster._ready(proc, "10.0.0.1:6379", tmp_path)
    finally:
        ray_cluster._reap_nodes(proc)
    text = str(err.value)
    assert "\n" not in text
    assert f"node 10.0.0.2 (3f9a1c2e) cannot read the run folder {tmp_path}" in text
    assert "10.0.0.1 (" not in text and "--precision-artifacts" in text


def test_a_cluster_the_watcher_cannot_reach_is_one_line_with_its_log(tmp_path: Path) -> None:
    proc = _watcher_saying({"error": "cannot reach every node of the cluster: ConnectionError: no GCS"})
    try:
        with pytest.raises(RunFailedError, match=r"^--precision-ray-address h:1: cannot reach every node .*GCS "):
            ray_cluster._ready(proc, "h:1", tmp_path)
    finally:
        ray_cluster._reap_nodes(proc)


def test_every_node_that_reads_the_folder_is_the_answer(tmp_path: Path) -> None:
    nodes = [{"ip": "10.0.0.1", "node_id": "a" * 56, "sees": True}]
    proc = _watcher_saying({"nodes": nodes})
    try:
        assert ray_cluster._ready(proc, "h:1", tmp_path) == nodes
    finally:
        ray_cluster._reap_nodes(proc)


STOPPABLE = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    from precision_harness.runs.processes import stop_on_signals
    out = pathlib.Path(sys.argv[1])
    if sys.argv[2] == "own":
        signal.signal(signal.SIGTERM, lambda *_: out.joinpath("own").write_text("") or sys.exit(3))
    stop_on_signals()
    out.joinpath("ready").write_text("")
    try:
        time.sleep(60)
    except KeyboardInterrupt as exc:
        out.joinpath("interrupted").write_text(str(exc))
        os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM, as CI repeats it: the clean-up goes on
        time.sleep(0.5)
        out.joinpath("cleaned").write_text("")
        raise
""")


def _signalled(tmp_path: Path, mode: str) -> int:
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE, str(tmp_path), mode])
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


def test_sigterm_stops_the_gate_as_ctrl_c_and_a_second_one_does_not_cut_its_clean_up(tmp_path: Path) -> None:
    _signalled(tmp_path, "default")
    assert (tmp_path / "interrupted").read_text() == "SIGTERM: stopping every run of this process"
    assert (tmp_path / "cleaned").exists()


def test_a_handler_the_caller_installed_is_kept(tmp_path: Path) -> None:
    assert _signalled(tmp_path, "own") == 3
    assert (tmp_path / "own").exists() and not (tmp_path / "interrupted").exists()


def test_two_nodes_of_one_rank_are_two_ranks_and_the_scenario_may_say_so(tmp_path: Path) -> None:
    """``trainer.nnodes`` is the scenario's: 2 x 1 is two ranks (the rollout's tensor parallelism spans both), and the
    key reaches verl's command line once."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    from precision_harness.runs import kind_runners

    assert verl_engine.cpu_ranks(SCENARIO, {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 1}, limit=2) == 2
    with pytest.raises(ScenarioError, match=r"trainer.nnodes x n_gpus_per_node: 4 ranks on cpu, but .* at most 2"):
        verl_engine.cpu_ranks(SCENARIO, {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 2}, limit=2)
    with pytest.raises(ScenarioError, match=r"trainer.nnodes: expected a positive integer$"):
        verl_engine.cpu_ranks(SCENARIO, {"trainer.nnodes": 0})
    folder = tmp_path / "scenarios"
    folder.mkdir()
    text = SCENARIO.read_text().replace(
        "    trainer.n_gpus_per_node: 2\n", "    trainer.nnodes: 2\n    trainer.n_gpus_per_node: 1\n"
    )
    (folder / SCENARIO.name).write_text(text)
    for sibling in ("data", "model", "reward.py"):
        os.symlink(SCENARIO.parents[1] / sibling, tmp_path / sibling)
    scenario = kind_runners.load_scenario(folder / SCENARIO.name)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    argv = kind_runners.command_spec(scenario, run_dir, device="cpu", joins_ray=True).argv
    assert argv.count("trainer.nnodes=2") == 1 and "trainer.n_gpus_per_node=1" in argv
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in argv
    assert not any(a.startswith("trainer.nnodes=") and a != "trainer.nnodes=2" for a in argv)


def test_where_a_rank_ran_is_no_environment_difference() -> None:
    golden = {"torch": "2.13.0", "ray_node": "aaaa", "ray_node@rank1": "bbbb"}
    run = {"torch": "2.13.0", "ray_node": "cccc", "ray_node@rank1": "dddd"}
    assert diff(golden, run) == []
    assert diff({**golden, "seeds": "x"}, {**run, "seeds": "y"}) == ["seeds x -> y"]


def test_a_verl_process_of_a_gate_run_applies_and_records_the_devices_determinism(tmp_path: Path) -> None:
    """What verl's hook (runs/verl/rank_stack.py) does in a rank process of a gate run: strict deterministic
    algorithms on cpu, python's, numpy's and torch's generators seeded, and the rank's record saying so."""
    code = textwrap.dedent("""
        import random, numpy, torch
        import precision_harness.runs.verl.rank_stack
        print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
        print(random.random() == __import__("random").Random(1234).random(), torch.initial_seed())
    """)
    env = {**os.environ, "PRECISION_DUMP_DIR": str(tmp_path), "RANK": "1", "PRECISION_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False", "True", "1234"]
    record = json.loads((tmp_path / "env" / "rank1.json").read_text())
    assert record["deterministic_algorithms"] == "on" and record["seeds"] == "python, numpy, torch: 1234"
    assert record["ray_node"] == ""  # not a Ray worker


def test_a_users_own_verl_process_keeps_its_settings(tmp_path: Path) -> None:
    """Outside a gate run (no PRECISION_DUMP_DIR), importing the hook changes nothing."""
    code = "import torch, precision_harness.runs.verl.rank_stack; print(torch.are_deterministic_algorithms_enabled())"
    env = {k: v for k, v in os.environ.items() if k != "PRECISION_DUMP_DIR"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"
