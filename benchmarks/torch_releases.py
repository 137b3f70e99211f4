"""The torch rows of the stack matrix: FSDP2's all-gather buffer zero-filled under real torch releases.

For each release, under that release's own Python environment (a venv with the registry's torch wheel; it runs on
the CPU), two identical 2-rank gloo FSDP2 runs are made with the gate's fill loaded as verl loads it
(``precision_harness.runs.verl.fsdp2_fill``), and a third without it, as a control. Each rank records what
msprobe's L1 dump reads at the call it records: the output of every ``Tensor.narrow`` that FSDP2's
``all_gather_copy_in`` (``_fsdp_collectives``) takes of the all-gather buffer before anything is copied in, and the
all-gathered buffer after the collective. The row says whether the two filled runs gave identical buffers (sha256 of
every tensor's bytes, rank by rank, call by call), whether the narrowed views read zeros, and how many elements the
unfilled control read that were not zero (uninitialised memory shows as non-zero; fresh pages may read zero, so 0
there proves nothing).

Usage::

    python benchmarks/torch_releases.py 2.6.0 2.8.0 2.14.1            # builds /tmp/torch-X venvs as needed
    python benchmarks/torch_releases.py --python /tmp/torch-2.6.0/bin/python

For the stack matrix: :func:`venv_python` builds (or reuses) a release's venv, :func:`check_release` runs the three
runs under a Python and returns a :class:`ReleaseRow`; :func:`table` formats rows as a Markdown table;
:func:`overlay` gives the ``PYTHONPATH`` folder that runs the pinned environment's gate (verl's CPU scenarios) under
that torch. The parent process never imports torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: seconds one run (two ranks, torch imported in each) may take on a loaded 2-core machine
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class ReleaseRow:
    """One torch release's result. ``seconds``: wall time of the three runs."""

    torch: str
    layout: str | None
    identical: bool
    zero_before_copy: bool
    unfilled_nonzero: int
    calls: int
    seconds: float
    error: str | None = None
    #: what made the all-gathers: ``fully_shard`` (a sharded model's forward and backward), or FSDP2's copy-in
    #: operator and a gloo all-gather where this release's ``fully_shard`` does not run on the CPU
    path: str = "fully_shard"


def venv_python(version: str, root: Path = Path("/tmp")) -> Path:
    """The Python of ``root/torch-<version>``, a venv with ``torch==<version>`` and numpy from the registry, built
    when absent (the default wheel pulls about 3 GB of CUDA libraries; it runs on the CPU).

    Raises:
        subprocess.CalledProcessError: venv or pip failed.
    """
    venv = root / f"torch-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={version}", "numpy"], check=True)
    return python


def overlay(python: Path | str, root: Path = Path("/tmp")) -> Path:
    """A folder that puts ``python``'s torch (and the CUDA libraries and triton it loads) first on ``PYTHONPATH`` of
    another environment, nothing else moved: how the pinned environment runs verl's CPU scenario under that torch.
    Made of links into its site-packages (``root/torch-overlay-<version>``).

    Raises:
        subprocess.CalledProcessError: ``python`` cannot report its site-packages.
    """
    code = "import sysconfig, importlib.metadata as m; print(sysconfig.get_paths()['purelib'], m.version('torch'))"
    site, version = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.split()
    folder = root / f"torch-overlay-{version}"
    folder.mkdir(exist_ok=True)
    for entry in Path(site).iterdir():
        name = entry.name.lower()
        wanted = name.split("-")[0] in {"torch", "torchgen", "functorch", "nvidia", "triton", "cuda"}
        if wanted and not (folder / entry.name).exists():
            (folder / entry.name).symlink_to(entry)
    return folder


def check_release(python: Path | str, timeout_s: float = RUN_TIMEOUT_S, *, control: bool = True) -> ReleaseRow:
    """Two filled runs and an unfilled control under ``python``'s torch, compared (see the module's docstring);
    without ``control``, its count is 0."""
    start = time.perf_counter()
    try:
        filled = [_run(python, fill=True, timeout_s=timeout_s) for _ in range(2)]
        unfilled = _run(python, fill=False, timeout_s=timeout_s) if control else {"calls": []}
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        return ReleaseRow("?", None, False, False, 0, 0, time.perf_counter() - start, str(exc).splitlines()[-1])
    first = filled[0]
    return ReleaseRow(
        torch=first["torch"],
        layout=first["layout"],
        identical=filled[0]["calls"] == filled[1]["calls"] and bool(first["calls"]),
        zero_before_copy=all(c["narrow_nonzero"] == 0 for run in filled for c in run["calls"]),
        unfilled_nonzero=sum(c["narrow_nonzero"] for c in unfilled["calls"]),
        calls=len(first["calls"]),
        seconds=round(time.perf_counter() - start, 1),
        path=first["path"],
    )


def _run(python: Path | str, *, fill: bool, timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        argv = [str(python), __file__, "--worker", str(out)] + ([] if fill else ["--no-fill"])
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise ValueError((proc.stderr.strip() or f"exit {proc.returncode}").splitlines()[-1])
        return json.loads(out.read_text(encoding="utf-8"))


def table(rows: list[ReleaseRow]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| torch | fill point | two runs identical | narrowed views zero | unfilled non-zero | calls | s | by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.error:
            lines.append(f"| {r.torch} | error: {r.error} | | | | | {r.seconds} | |")
            continue
        yes = {True: "yes", False: "no"}
        lines.append(
            f"| {r.torch} | {r.layout or 'unknown: unchecked'} | {yes[r.identical]} | {yes[r.zero_before_copy]} "
            f"| {r.unfilled_nonzero} | {r.calls} | {r.seconds} | {r.path} |"
        )
    return "\n".join(lines)


# --- the worker: runs under the release's own Python --------------------------------------------------------------


def _digest(tensor: Any) -> str:
    return hashlib.sha256(tensor.detach().contiguous().view(-1).view(dtype=_uint8()).numpy().tobytes()).hexdigest()


def _uint8() -> Any:
    import torch

    return torch.uint8


def _rank(rank: int, world: int, port: int, out: str, fill: bool) -> None:
    if fill:
        import precision_harness.runs.verl.fsdp2_fill  # noqa: F401  (as verl imports it)
    import torch
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4, 2.5
        from torch.distributed._composable.fsdp import fully_shard
    calls: list[dict[str, Any]] = []
    narrow = torch.Tensor.narrow

    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        view = narrow(self, *args, **kwargs)
        caller = sys._getframe(1).f_code
        # torch's all_gather_copy_in_cuda, or the gate's code in its place (torch 2.5-2.7)
        if "all_gather_copy_in" in caller.co_name:
            calls.append({"narrow": _digest(view), "narrow_nonzero": int((view != 0).sum()), "buffer": self})
        return view

    torch.Tensor.narrow = recorded  # what msprobe's L1 hook sees: the narrowed view, before the copy
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    path = "fully_shard"
    try:
        model(x).pow(2).mean().backward()
    except (AttributeError, RuntimeError) as exc:  # this release's FSDP2 does not run on the CPU (2.6: Stream events)
        calls.clear()
        _copy_in_directly(rank, world)
        path = f"fsdp::all_gather_copy_in + gloo all-gather (fully_shard on CPU: {str(exc).splitlines()[0]})"
    rows = [{**c, "buffer": _digest(c["buffer"])} for c in calls]  # the buffer after the all-gather filled it
    layout = None
    if fill:
        from precision_harness.runs.verl import fsdp2_buffers

        layout = fsdp2_buffers.fill_point(next(sys.modules[m] for m in fsdp2_buffers.MODULES if m in sys.modules))
    found = {"layout": layout, "calls": rows, "path": path}
    Path(f"{out}.{rank}").write_text(json.dumps(found), encoding="utf-8")
    dist.destroy_process_group()


def _copy_in_directly(rank: int, world: int) -> None:
    """FSDP2's copy-in operator through torch's dispatcher, as ``foreach_all_gather`` calls it in this release, then
    the all-gather over gloo: where ``fully_shard`` itself does not run on the CPU."""
    import torch
    import torch.distributed as dist

    from precision_harness.runs.verl import fsdp2_buffers as fb

    module = next(sys.modules[m] for m in fb.MODULES if m in sys.modules)
    layout, cpu, op = fb.fill_point(module), torch.device("cpu"), torch.ops.fsdp.all_gather_copy_in
    inputs, sizes, numel = [torch.arange(1.0, 7.0) * (rank + 1), torch.arange(1.0, 3.0) * (rank + 1)], [6, 2], 8
    if layout == fb.ALLOC_MIXIN:
        output = module.DefaultAllGather().allocate((numel * world,), dtype=torch.float32, device=cpu)
        mine, output = op(inputs, output, sizes, numel, rank)
    elif layout == fb.ALLOCATE_MEMORY:
        group = dist.group.WORLD.group_name
        mine, output = op(inputs, sizes, numel, world, rank, torch.float32, cpu, group, False)
    else:
        mine, output = op(inputs, sizes, numel, world, rank, torch.float32, cpu)
    dist.all_gather_into_tensor(output, mine)


def _worker(out: str, fill: bool) -> None:
    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # forked, not spawned: the ranks start with this process's torch imported instead of importing it again, two
    # imports of the three a run made (gloo's process group is created in each rank, after the fork)
    mp.start_processes(_rank, args=(2, port, out, fill), nprocs=2, join=True, start_method="fork")
    ranks = [json.loads(Path(f"{out}.{r}").read_text(encoding="utf-8")) for r in range(2)]
    calls = [c for r in ranks for c in r["calls"]]
    found = {"torch": torch.__version__, "layout": ranks[0]["layout"], "calls": calls, "path": ranks[0]["path"]}
    Path(out).write_text(json.dumps(found), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", help="torch releases, each in its own venv /tmp/torch-X")
    parser.add_argument("--python", action="append", default=[], help="a Python whose torch to check")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines instead of a table")
    parser.add_argument("--overlay", help="print the PYTHONPATH folder that puts this Python's torch first")
    parser.add_argument("--no-control", action="store_true", help="skip the unfilled control run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--no-fill", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, fill=not args.no_fill)
        return
    if args.overlay:
        print(overlay(args.overlay))
        return
    pythons = [*args.python, *(venv_python(v) for v in args.versions)]
    rows = [check_release(p, control=not args.no_control) for p in pythons]
    print("\n".join(json.dumps(asdict(r)) for r in rows) if args.json else table(rows))


if __name__ == "__main__":
    main()
