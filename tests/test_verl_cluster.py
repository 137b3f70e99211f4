"""verl's real trainer on an existing Ray cluster of several nodes (``--precision-ray-address``), and cancellation.

The cluster is Ray's own test cluster on this machine (tests/ray_nodes.py: a head node and two worker nodes with
one ``GPU`` each, each node its own raylet and object store), so the 2-rank bf16 scenario, placed as a multi-node
team places it (``trainer.nnodes: 2``, ``trainer.n_gpus_per_node: 1``), runs one rank per node. Its golden is the
example's, recorded on one node of the gate's own Ray with ``trainer.n_gpus_per_node: 2``: the manifest's identity is
re-keyed to the two-node placement (the dumps are the example's, byte for byte), so "identical to golden" says that
two nodes reproduce one node's numbers bit for bit.

Cancellation: a CI cancel is SIGTERM to the gate. Signalled once the ranks have started (their ``env/rank<r>.json``
exist), nothing of the run is left on any node within a bound, the cluster holds no live actor, and the golden is as
it was; the same for an xdist worker signalled on the gate's own Ray.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness_testing import left_behind

#: one worker runs the three (they share the cluster); they run copies of examples/verl_cpu, so not in the group of
#: the tests that run it where it stands ("verl_cpu_example"), whose runs they would otherwise wait for
pytestmark = [pytest.mark.xdist_group("verl_cluster"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "verl_cpu"
NAME = "grpo_dp2_bf16_cpu"
#: seconds every process of a signalled run has to be gone in (the gate's clean-up: 5 s grace per reap, the
#: cluster watcher's reap on every node)
STOP_BOUND_S = 60


def _project(root: Path, *, nodes: int) -> Path:
    """The example copied to ``root``; with ``nodes`` > 1 its scenario placed one rank per node, and the golden's
    identity re-keyed to that placement (its files untouched)."""
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns(".precision", "__pycache__"))
    if nodes == 1:
        return root
    from precision_harness.scenarios.scenario import Scenario

    path = root / "scenarios" / f"{NAME}.yaml"
    text = path.read_text()
    assert "    trainer.n_gpus_per_node: 2\n" in text
    path.write_text(
        text.replace(
            "    trainer.n_gpus_per_node: 2\n", f"    trainer.nnodes: {nodes}\n    trainer.n_gpus_per_node: 1\n"
        )
    )
    manifest_path = root / "golden" / NAME / "cpu" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["scenario_hash"] = Scenario.load(path).hash
    manifest["identity"].update({"settings.trainer.n_gpus_per_node": 1, "settings.trainer.nnodes": nodes})
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return root


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A head node and two worker nodes (tests/ray_nodes.py) in a session of their own; its address."""
    pytest.importorskip("ray", reason="the gate's Ray paths need ray")
    temp = Path(tempfile.mkdtemp(prefix="prnodes-", dir="/tmp"))  # Ray's socket paths must stay short
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "ray_nodes.py"), f"--temp-dir={temp}", "--gpu-nodes=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # ray_nodes.py prints ADDRESS once every node is up, or exits
            lines.append(line)
            if line.startswith("ADDRESS "):
                break
        else:
            pytest.fail("the test cluster did not start: " + "".join(lines)[-3000:])
        yield line.split()[1]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _alive_actors(address: str) -> list[str]:
    """The class names of the cluster's live actors (read from its GCS; the test cluster has no dashboard)."""
    code = (
        "import ray, json\nfrom ray._private import state\n"
        f"ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "print(json.dumps([a['ActorClassName'] for a in state.actors().values() if a['State'] == 'ALIVE']))\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _gate(project: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", f"scenarios/{NAME}.yaml", *args]
    return subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=1200, check=False)


def test_e2e_two_nodes_one_rank_each_reproduce_the_one_node_golden_with_the_gates_settings_on_each(
    tmp_path: Path, cluster: str
) -> None:
    """Step 1 of the 2-rank bf16 scenario on the cluster, one rank per node: every dump identical to the golden
    recorded on one node, and each rank's record shows it ran with the gate's hook (the record is written by the
    module verl loads through ``VERL_USE_EXTERNAL_MODULES``, which reaches a node only through the job's runtime
    environment), the device's deterministic settings and seeds, on its own node. Nothing is left on any node."""
    project = _project(tmp_path / "verl_cpu", nodes=2)
    proc = _gate(project, "-k", "step_1", "--precision-ray-address", cluster)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    assert "6 precision items: 4 identical to golden, 2 within tolerance or compared, 0 failed" in out, out[-3000:]
    assert "ray_node" not in out  # where a rank ran is not an environment difference
    run = project / ".precision" / "artifacts" / NAME / "run"
    ranks = {r: json.loads((run / "env" / f"rank{r}.json").read_text()) for r in (0, 1)}
    for record in ranks.values():
        assert record["deterministic_algorithms"] == "on"
        assert record["seeds"] == "python, numpy, torch: 1234"
    assert ranks[0]["ray_node"] and ranks[1]["ray_node"] and ranks[0]["ray_node"] != ranks[1]["ray_node"]
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["env"]["deterministic_algorithms"] == "on"
    assert not left_behind(project / ".precision")
    assert _alive_actors(cluster) == []


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie its parent has not collected yet)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _signal_once_ranks_started(argv: list[str], project: Path, target: Any) -> tuple[str, float]:
    """Start the gate (``argv``, in ``project``, a session of its own), SIGTERM ``target(gate)``'s pid once both
    ranks wrote their record, and wait for that process to end: the gate's output and the seconds from the signal
    to that end (then the gate is ended, whatever it does next)."""
    runs = project / ".precision" / "artifacts" / NAME  # run/, or run-gw0/ under xdist
    log = project / "gate.log"
    with open(log, "wb") as fh:
        gate = subprocess.Popen(argv, cwd=project, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len(list(runs.glob("run*/env/rank*.json"))) < 2:
            assert gate.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the ranks did not start in 600 s"
            time.sleep(1)
        pid = target(gate)
        os.kill(pid, signal.SIGTERM)
        signalled = time.monotonic()
        while not _ended(pid) and time.monotonic() < signalled + STOP_BOUND_S * 3:
            time.sleep(0.2)
        took = time.monotonic() - signalled
        if pid == gate.pid:
            gate.wait(timeout=10)
        return log.read_text(errors="replace"), took
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(gate.pid, signal.SIGKILL)
        gate.wait()


def test_e2e_sigterm_to_the_gate_on_a_cluster_stops_every_process_on_every_node_and_keeps_the_golden(
    tmp_path: Path, cluster: str
) -> None:
    """A golden update on the cluster, SIGTERM to pytest once both ranks run: pytest stops as on Ctrl-C, within
    the bound no process of the run is left on any node and the cluster holds no live actor, the golden is byte
    for byte what it was, and the cluster itself is still up (it is not the gate's)."""
    project = _project(tmp_path / "verl_cpu", nodes=2)
    golden = project / "golden" / NAME / "cpu"
    before = _digest(golden)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"scenarios/{NAME}.yaml", "-k", "step_1"]
    argv += ["--precision-golden", "update", "--precision-ray-address", cluster]
    out, took = _signal_once_ranks_started(argv, project, lambda gate: gate.pid)
    assert re.search(r"KeyboardInterrupt|SIGTERM", out), out[-3000:]
    assert took < STOP_BOUND_S, f"the gate took {took:.0f} s to stop"
    assert not left_behind(project / ".precision", grace=0)
    assert _alive_actors(cluster) == []
    assert _digest(golden) == before


def _xdist_worker(gate: subprocess.Popen) -> int:
    """The pid of the gate's xdist worker: its child interpreter that execnet started."""
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            child = entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == gate.pid
            if child and any(word in (entry / "cmdline").read_bytes() for word in (b"execnet", b"sys.stdin")):
                return int(entry.name)
    raise AssertionError("no xdist worker under the gate")


def test_e2e_sigterm_to_an_xdist_worker_on_the_gates_own_ray_stops_every_process_and_keeps_the_golden(
    tmp_path: Path,
) -> None:
    """The example as it stands (the gate's own shared Ray), under ``-n 1``: SIGTERM to the worker once both ranks
    run. The worker stops as on Ctrl-C, within the bound: when it has ended nothing of the run is left (verl's
    driver, its Ray workers), and the golden is as it was. (Killed outright, the worker would leave them to the
    shared Ray's watcher, seconds later.)"""
    project = _project(tmp_path / "verl_cpu", nodes=1)
    golden = project / "golden" / NAME / "cpu"
    before = _digest(golden)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1", "--max-worker-restart=0"]
    argv += [f"scenarios/{NAME}.yaml"]
    argv += ["-k", "step_1", "--precision-golden", "update"]
    _, took = _signal_once_ranks_started(argv, project, _xdist_worker)
    assert took < STOP_BOUND_S, f"the worker took {took:.0f} s to stop"
    assert not left_behind(project / ".precision", grace=0)  # the worker stopped its runs before it ended
    assert _digest(golden) == before
