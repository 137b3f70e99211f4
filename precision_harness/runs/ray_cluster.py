"""A command or verl run on an existing Ray cluster (``--precision-ray-address``): its variables on every node, the
run folder checked from every node before it starts, and every node reaped after it.

A driver's own environment never reaches the workers an existing cluster's raylets start, on this node or any
other. The run's variables (the ``PRECISION_*`` ones, ``VERL_USE_EXTERNAL_MODULES`` with the gate's patches, the
determinism settings, the run's mark ``PRECISION_RUN_ID``) therefore go to them as the job's runtime environment
(:func:`job_env`), as they do on the gate's own shared Ray (:mod:`precision_harness.runs.verl.shared_ray`).

The ranks write their dumps into the run folder, on whatever node each runs: the nodes must share it. A watcher
process (:func:`watched`, ``python -m precision_harness.runs.ray_cluster``) joins the cluster before the run, as
a driver of its own that reserves nothing, and asks every live node, with one task pinned to it, whether it reads
a token written in the run folder; a node that cannot, or an address that does not answer, is one line before
anything runs. After the run, or when the gate dies (its pipe closes: a kill, a cancelled CI job), the watcher
runs :func:`precision_harness.runs.processes.reap` on every node, so no process carrying the run's mark is left
on any of them (Ray ends a dead driver's actors, not what they started).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from precision_harness.errors import RunFailedError
from precision_harness.runs.processes import ENV_RUN_ID, reap

#: the variable Ray's ``ray.init`` reads a job's runtime environment from (ray._private.runtime_env.constants)
JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
#: the working directory of a run's Ray workers (the driver's); the gate's modules in verl's processes change to it
ENV_WORKDIR = "PRECISION_WORKDIR"
#: the file in the run folder every node must read (:func:`watched`)
SEEN = ".nodes_see_this"
#: seconds the watcher may take to join the cluster and hear from every node, and to reap them all
READY_S = 120.0
REAP_S = 60.0
#: the environment of a Ray head the gate starts (its raylet reads Ray's settings from ``RAY_<name>``). Ray
#: prestarts idle workers for the first driver that connects (``prestart_worker_first_driver``, ray_config_def.h),
#: about 2 CPU-s each for ``import ray``; a run's actors carry a runtime environment of their own and never take
#: them, so every one of them started and ended unused (3 per head on 2 cores, measured with process accounting).
HEAD_ENV = {"RAY_prestart_worker_first_driver": "0"}


def job_env(env: Mapping[str, str], *, cwd: Path) -> dict[str, str]:
    """What a driver started in ``cwd`` adds to ``env`` so that its Ray workers, on every node, get the same
    variables and start in ``cwd`` (``PRECISION_WORKDIR``; the gate's modules in each verl process change to it).
    Where verl's own ``ray.init`` sets a variable too (``PYTHONHASHSEED``), verl's value wins, as in a run with a
    Ray of its own (``RAY_OVERRIDE_JOB_RUNTIME_ENV``)."""
    variables = {**{k: str(v) for k, v in env.items()}, ENV_WORKDIR: str(cwd)}
    if os.environ.get("PYTHONPATH") and "PYTHONPATH" not in env:
        variables["PYTHONPATH"] = os.environ["PYTHONPATH"]
    job = {"runtime_env": {"env_vars": variables}}
    return {JOB_CONFIG: json.dumps(job, sort_keys=True), "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}


def _gcs_endpoint(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host:port`` or ``ray://host:port`` address (None: another form, such as ``auto``)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    return (host, int(port)) if host and "://" not in host and port.isdigit() else None


def check_answers(address: str, *, timeout: float = 5.0) -> None:
    """Raise RunFailedError (one line) when nothing listens at the cluster's ``host:port`` (a GCS address, or a Ray
    client's ``ray://host:port``), or the host has no address.

    ``ray.init`` would retry for a minute before it says so.
    """
    endpoint = _gcs_endpoint(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=timeout):
            return
    except OSError as exc:
        raise RunFailedError(
            f"--precision-ray-address {address}: the Ray cluster does not answer ({exc.strerror or exc}); "
            "start it (ray start --head) or give the address `ray status` prints on its head node"
        ) from None


@contextlib.contextmanager
def watched(address: str, run_dir: Path, run_id: str) -> Iterator[list[dict[str, Any]]]:
    """Run the body with the cluster at ``address`` watched for the run marked ``run_id`` (see the module
    docstring); yields the cluster's live nodes (``ip``, ``node_id``) as the watcher found them.

    Raises:
        RunFailedError: the cluster does not answer, or a node cannot read ``run_dir`` (one line naming the node
            and the folder), before the body runs.
    """
    check_answers(address)
    token = uuid.uuid4().hex
    (run_dir / SEEN).write_text(token, encoding="utf-8")
    argv = [sys.executable, "-m", "precision_harness.runs.ray_cluster", f"--address={address}"]
    argv += [f"--see={run_dir / SEEN}", f"--token={token}", f"--mark={run_id}"]
    env = {k: v for k, v in os.environ.items() if k != ENV_RUN_ID}  # the watcher is no process of the run
    with open(run_dir / "ray_cluster.log", "wb") as log:
        # a session of its own: a CI cancel that kills the gate's process group leaves the watcher to reap the nodes
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True
        )
    try:
        nodes = _ready(proc, address, run_dir)
        yield nodes
    finally:
        _reap_nodes(proc)
        (run_dir / SEEN).unlink(missing_ok=True)


def _ready(proc: subprocess.Popen, address: str, run_dir: Path) -> list[dict[str, Any]]:
    """The watcher's first line: the nodes, or the one-line reason it cannot watch (raised)."""
    assert proc.stdout is not None
    line = _line_within(proc, READY_S)
    answer = json.loads(line) if line.startswith("{") else {"error": f"the watcher said nothing in {READY_S:g} s"}
    if "error" in answer:
        raise RunFailedError(f"--precision-ray-address {address}: {answer['error']} (log: {run_dir}/ray_cluster.log)")
    blind = [n for n in answer["nodes"] if not n["sees"]]
    if blind:
        names = ", ".join(f"{n['ip']} ({n['node_id'][:8]})" for n in blind)
        raise RunFailedError(
            f"--precision-ray-address {address}: node {names} cannot read the run folder {run_dir}: every rank "
            "writes its dumps there; put --precision-artifacts on a filesystem every node mounts at the same path"
        )
    return answer["nodes"]


def _line_within(proc: subprocess.Popen, seconds: float) -> str:
    """The watcher's next stdout line, or "" if it exits or stays silent for ``seconds`` (it is killed then)."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if sel.select(timeout=seconds):
            return proc.stdout.readline().decode(errors="replace").strip()
    proc.kill()
    return ""


def _reap_nodes(proc: subprocess.Popen) -> None:
    """Tell the watcher the run is over (it reaps every node, then exits); bounded by :data:`REAP_S`."""
    with contextlib.suppress(OSError, ValueError):
        assert proc.stdin is not None
        proc.stdin.close()
    try:
        proc.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# --- the watcher (its own process: it imports ray) -----------------------------------------------------------------


def _on_every_node(ray: Any, fn: Any, *args: Any) -> list[tuple[dict[str, Any], Any]]:
    """``fn(*args)`` run once on each live node (a task pinned to it, no CPU reserved): ``[(node, result)]``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(*args)
        for n in nodes
    ]
    return list(zip(nodes, ray.get(refs, timeout=READY_S), strict=True))


def _reads(path: str, token: str) -> bool:
    try:
        return Path(path).read_text(encoding="utf-8") == token
    except OSError:
        return False


def _say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """The watcher: join, say which nodes read the run folder, wait for the pipe to close, reap every node."""
    parser = argparse.ArgumentParser(prog="python -m precision_harness.runs.ray_cluster")
    for name in ("address", "see", "token", "mark"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args(argv)
    import ray

    try:
        ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
        seen = _on_every_node(ray, _reads, args.see, args.token)
    except Exception as exc:  # any failure to join or to reach a node is the run's one line
        _say({"error": f"cannot reach every node of the cluster: {type(exc).__name__}: {str(exc).splitlines()[0]}"})
        return 1
    _say({"nodes": [{"ip": n["NodeManagerAddress"], "node_id": n["NodeID"], "sees": ok} for n, ok in seen]})
    sys.stdin.read()  # until the gate closes the pipe: its run ended, or the gate died
    left = _on_every_node(ray, reap, args.mark)
    print(json.dumps({"left": {n["NodeManagerAddress"]: pids for n, pids in left if pids}}), file=sys.stderr)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
