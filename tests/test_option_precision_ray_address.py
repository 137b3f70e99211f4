"""--precision-ray-address / precision-harness run --ray-address: runs on an existing Ray cluster, compared locally."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness_testing import make_project

pytest.importorskip("ray", reason="Ray paths need ray: pip install -c constraints/cpu.txt 'ray[default]'")

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local one-node cluster (`ray start --head --block` on 127.0.0.1), stopped in teardown; yields its address.

    Only this cluster's processes are stopped (its own process group), never `ray stop`, which would
    end every Ray instance on the machine.
    """
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="/tmp/rt")  # Ray's socket paths must stay short
    log = tmp_path_factory.mktemp("ray") / "ray_start.log"
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [
        str(ray_bin),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--num-cpus=2",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=false",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
    ]
    with open(log, "wb") as fh:
        # Ray >= 2.5x turns on token auth for `ray start` clusters; a loopback test cluster opts out
        # (a real cluster's token reaches the driver through RAY_AUTH_TOKEN or ~/.ray/auth_token)
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start --head did not come up in 120 s: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)  # ray drains for up to 30 s; this cluster has nothing left to drain
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_remote_run_is_compared_locally_and_matches_the_local_golden(
    project: pytest.Pytester, ray_cluster: str
) -> None:
    """The golden was recorded by a local subprocess; the cluster's run reproduces it byte for byte."""
    result = project.runpytest_subprocess("--precision-ray-address", ray_cluster)
    result.assert_outcomes(passed=11)
    result.stdout.fnmatch_lines(
        ["*11 precision items: 10 identical to golden, 1 within tolerance or compared, 0 failed*"]
    )
    run = json.loads((project.path / ".precision/artifacts/tiny_ppo/run/run.json").read_text())
    assert run["ray"]["address"] == ray_cluster and run["ray"]["world_size"] == 1
    assert run["ray"]["actor_options"] == {"num_cpus": 1, "resources": {}}


def test_cli_run_with_ray_address(project: pytest.Pytester, ray_cluster: str) -> None:
    """``precision-harness run --ray-address`` runs on the cluster; ``compare`` finds it identical to the golden."""
    cli = [sys.executable, "-m", "precision_harness.cli"]
    proc = subprocess.run(
        [*cli, "run", "scenarios/tiny_ppo.yaml", "--out", "remote_run", "--ray-address", ray_cluster],
        cwd=project.path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads((project.path / "remote_run/run.json").read_text())
    assert run["ray"]["address"] == ray_cluster
    proc = subprocess.run(
        [*cli, "compare", "remote_run", "golden/tiny_ppo/cpu", "--scenario", "scenarios/tiny_ppo.yaml"],
        cwd=project.path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS ") == 11
    assert "PASS actor_update @ step_2, rank0: " in proc.stdout and "identical to the golden (sha256)" in proc.stdout


def test_resources_the_cluster_lacks_fail_clearly(pytester: pytest.Pytester, ray_cluster: str) -> None:
    """A scenario asking for {"NPU": 1} on a CPU-only cluster fails at once, naming the resource.

    Ray alone would wait forever for the resource.
    """
    make_project(pytester.path)
    path = pytester.path / "scenarios/tiny_ppo.yaml"
    path.write_text(
        path.read_text().replace(
            "trainer:\n  total_training_steps: 2\n",
            "trainer:\n  total_training_steps: 2\n  ray: {resources: {NPU: 1}}\n",
        )
    )
    (pytester.path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\nprecision_timeout = 120\n")
    result = pytester.runpytest_subprocess(
        "--precision-ray-address", ray_cluster, "--precision-golden", "update", "-k", "metrics"
    )
    result.assert_outcomes(failed=1, deselected=10)
    result.stdout.fnmatch_lines(
        [
            "*tiny_ppo.yaml: scenario run failed: tiny_ppo.yaml: trainer.ray: 1 rank(s) need NPU=1 "
            f"but the Ray cluster ({ray_cluster}) has NPU=0; *(log: *worker.log)"
        ]
    )


def test_collect_only_with_ray_address_imports_no_ray_or_torch(pytester: pytest.Pytester) -> None:
    make_project(pytester.path)
    pytester.makeconftest(
        textwrap.dedent("""
        import sys
        def pytest_collection_finish(session):
            print("HEAVY-MODULES:", sorted(m for m in ("torch", "ray", "msprobe.pytorch") if m in sys.modules))
    """)
    )
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-s", "--precision-ray-address", "127.0.0.1:1")
    result.stdout.fnmatch_lines(["HEAVY-MODULES: []", "*11 tests collected*"])
