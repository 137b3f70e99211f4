"""Run one scenario on Ray: one actor per rank (verl's worker group), dumps fetched back to the caller.

Used when a scenario has ``trainer.world_size > 1`` (a local Ray instance is started for the run) or
when the user passes ``--precision-ray-address ADDRESS`` / ``precision-harness run --ray-address``
(the run is submitted to that existing cluster, with the resources the scenario asks for:
``trainer.ray.num_cpus``, ``trainer.ray.resources`` such as ``{"NPU": 1}``, one GPU per rank on cuda).

Process layout::

    pytest / CLI (no ray, no torch)
      -> driver subprocess: python -m precision_harness.runs.runner.ray_launch SCENARIO --out DIR [--address A]
           ray.init(); W RankWorker actors (fresh processes: msprobe's debugger is a singleton)
           rank r: join the gloo/nccl/hccl group, run the scenario, dump to rank<r>, return a tar
           driver: unpack every rank's tar into DIR (verl layout), write DIR/run.json

The driver runs in its own process so the pytest process never imports ray (about 1 s and a
dozen threads) and a crashed cluster connection fails one scenario, not the session. A failure is
reported the same way as a local worker's: one line in ``DIR/error.txt``, details in ``worker.log``.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import socket
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from precision_harness.runs.numerics.devices import determinism_env
from precision_harness.runs.ray_cluster import HEAD_ENV

#: environment variables forwarded from the caller to every rank (test hooks, msprobe/torch knobs, and the
#: CPU dispatch settings of the portability check).
FORWARDED_ENV_PREFIXES = (
    "PRECISION_TEST_",
    "ASCEND_",
    "HCCL_",
    "NCCL_",
    "GLOO_",
    "MKL_",
    "ONEDNN_",
    "PRECISION_MKLDNN",
)
RAY_INSTALL_HINT = "pip install 'ray[default]>=2.40' (a dependency of pytest-precision: reinstall it with pip)"


def ray_available() -> bool:
    """True if ``ray`` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        return False


def driver_command(
    scenario_path: Path, *, out_dir: Path, device: str, address: str | None, dump: bool = True
) -> list[str]:
    """The command line of the driver process for one scenario run."""
    cmd = [
        sys.executable,
        "-m",
        "precision_harness.runs.runner.ray_launch",
        str(scenario_path),
        "--out",
        str(out_dir),
        "--device",
        device,
    ]
    if address:
        cmd += ["--address", address]
    return cmd + ([] if dump else ["--no-dump"])


# ------------------------------------------------------------------------------ the rank actor
class RankWorker:
    """One rank of a scenario run; wrapped with ``ray.remote`` by the driver (one fresh process each)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def master_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port for the process group's store (called on rank 0)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def run(
        self, scenario: Any, *, world_size: int, master_addr: str, master_port: int, device: str, dump: bool
    ) -> dict[str, Any]:
        """Run the scenario as rank ``self.rank``.

        Returns ``{"rank", "archive": tar.gz bytes | None, "error": str | None}``.

        Rank 0's archive holds the whole run directory; rank ``r > 0``'s only its ``rank<r>`` dump folders.
        """
        import shutil

        out = Path(tempfile.mkdtemp(prefix=f"precision_rank{self.rank}_"))
        try:
            from precision_harness.runs.runner import distributed
            from precision_harness.runs.runner.__main__ import run

            if world_size > 1:
                distributed.init_process_group(
                    rank=self.rank,
                    world_size=world_size,
                    master_addr=master_addr,
                    master_port=master_port,
                    device=device,
                )
            try:
                run(scenario, out=out, device=device, dump=dump, rank=self.rank)
            finally:
                distributed.destroy_process_group()
            return {"rank": self.rank, "archive": _archive(out, self.rank), "error": None}
        except BaseException as exc:
            message = str(exc).splitlines()[0] if str(exc) else ""
            return {
                "rank": self.rank,
                "archive": None,
                "error": f"rank{self.rank}: {type(exc).__name__}: {message}",
                "traceback": traceback.format_exc(),
            }
        finally:
            shutil.rmtree(out, ignore_errors=True)


def _archive(out: Path, rank: int) -> bytes:
    """tar.gz of what this rank contributes to the run directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if rank == 0:
            for p in sorted(out.iterdir()):
                if p.name != "_unused":
                    tar.add(p, arcname=p.name)
        else:
            for p in sorted(out.glob(f"step_*/*/step0/rank{rank}")):
                tar.add(p, arcname=str(p.relative_to(out)))
    return buf.getvalue()


# ----------------------------------------------------------------------------------- the driver
def run_driver(
    scenario_path: Path, *, out: Path, device: str, address: str | None, dump: bool = True
) -> dict[str, Any]:
    """Start (or connect to) Ray, run every rank, unpack their dumps into ``out``; return run.json.

    Raises:
        RuntimeError: a rank failed (the message names the rank and its error), or Ray could not start.
    """
    import ray

    from precision_harness.scenarios.scenario import Scenario

    scenario = Scenario.load(scenario_path)
    world_size, actor_options = scenario.world_size, scenario.ray_resources(device)
    t0 = time.perf_counter()
    _init_ray(scenario, device=device, address=address, num_cpus=world_size * actor_options["num_cpus"])
    startup_s = time.perf_counter() - t0
    try:
        where = address or "local instance"
        _check_feasible(actor_options, world_size, ray.cluster_resources(), where=where, scenario=scenario)
        t_run = time.perf_counter()
        results = _run_ranks(scenario, actor_options, device=device, dump=dump)
        run_s = time.perf_counter() - t_run
        for rank in sorted(results):
            with tarfile.open(fileobj=io.BytesIO(results[rank]["archive"]), mode="r:gz") as tar:
                tar.extractall(out, filter="data")
        manifest = json.loads((out / "run.json").read_text(encoding="utf-8"))
        manifest["ray"] = {
            "address": address or "local",
            "world_size": world_size,
            "actor_options": actor_options,
            "startup_s": round(startup_s, 6),
            "ranks_s": round(run_s, 6),
        }
        (out / "run.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return manifest
    finally:
        ray.shutdown()


def _init_ray(scenario: Any, *, device: str, address: str | None, num_cpus: float) -> None:
    """Connect to the cluster at ``address``, or start a loopback-only local instance of ``num_cpus``."""
    import ray

    env = {**determinism_env(device, scenario.config["trainer"]["num_threads"])}
    env.update({k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)})
    runtime_env: dict[str, Any] = {"env_vars": env}
    if address:
        # ship this checkout's engine to the cluster's nodes (they need torch, transformers, msprobe installed)
        import precision_harness

        runtime_env["py_modules"] = [str(Path(precision_harness.__file__).parent)]
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        return
    for name, value in HEAD_ENV.items():  # the local raylet ray.init starts inherits this process's environment
        os.environ.setdefault(name, value)
    ray.init(
        address="local",
        num_cpus=int(max(num_cpus, 1) + 0.999),
        include_dashboard=False,
        runtime_env=runtime_env,
        _node_ip_address="127.0.0.1",
        log_to_driver=True,
        configure_logging=False,
    )


def _run_ranks(scenario: Any, actor_options: dict[str, Any], *, device: str, dump: bool) -> dict[int, dict[str, Any]]:
    """One RankWorker actor per rank, run together; the first failing rank stops them all.

    Raises:
        RuntimeError: a rank failed (its traceback goes to stderr, the worker log).
    """
    import ray

    world_size = scenario.world_size
    remote_cls = ray.remote(RankWorker)
    actors = [remote_cls.options(**actor_options).remote(rank) for rank in range(world_size)]
    master_addr, master_port = ray.get(actors[0].master_address.remote())
    kwargs = {"world_size": world_size, "master_addr": master_addr, "master_port": master_port}
    pending = {a.run.remote(scenario, device=device, dump=dump, **kwargs): rank for rank, a in enumerate(actors)}
    results: dict[int, dict[str, Any]] = {}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            res = ray.get(ref)
            results[pending.pop(ref)] = res
            if res["error"] is not None:
                sys.stderr.write(res.get("traceback", ""))
                for a in actors:  # the other ranks would wait in a collective until its timeout
                    ray.kill(a)
                raise RuntimeError(res["error"])
    return results


def _check_feasible(
    actor_options: dict[str, Any], world_size: int, cluster: dict[str, float], *, where: str, scenario: Any
) -> None:
    """Fail at once, naming the resource, when the cluster cannot hold every rank (Ray would wait forever).

    An autoscaling cluster that would add such nodes on demand is not supported by this check.
    """
    needed = {"CPU": actor_options["num_cpus"] * world_size}
    if actor_options.get("num_gpus"):
        needed["GPU"] = actor_options["num_gpus"] * world_size
    for key, value in actor_options["resources"].items():
        needed[key] = value * world_size
    short = {k: v for k, v in needed.items() if cluster.get(k, 0) < v}
    if short:
        have = ", ".join(f"{k}={cluster.get(k, 0):g}" for k in short)
        want = ", ".join(f"{k}={v:g}" for k, v in short.items())
        raise RuntimeError(
            f"{scenario.path.name}: trainer.ray: {world_size} rank(s) need {want} "
            f"but the Ray cluster ({where}) has {have}; "
            "connect to a cluster with those resources or change trainer.ray / trainer.world_size"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m precision_harness.runs.runner.ray_launch", description="run one scenario's ranks as Ray actors"
    )
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "npu"])
    parser.add_argument(
        "--address",
        default=None,
        help="existing Ray cluster (ray://host:10001 or host:6379); default: a local instance",
    )
    parser.add_argument("--no-dump", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        run_driver(args.scenario, out=args.out, device=args.device, address=args.address, dump=not args.no_dump)
    except BaseException as exc:
        message = str(exc).splitlines()[0] if str(exc) else ""
        reason = (
            message
            if message.startswith("rank") or isinstance(exc, RuntimeError)
            else f"{type(exc).__name__}: {message}"
        )
        (args.out / "error.txt").write_text(reason + "\n", encoding="utf-8")
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
