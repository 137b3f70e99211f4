"""FSDP2 gradients of a replicated batch on ``world`` CPU processes over gloo, saved by rank 0 (a test helper).

Usage: ``python fsdp2_gloo_grads.py WORLD OUT.pt``. Each rank builds the same seeded model, shards
every ``Linear`` and the model with ``fully_shard`` under verl's default mixed precision
(``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``), runs the same batch forward and
backward, and rank 0 saves every parameter's full gradient (``DTensor.full_tensor``). FSDP2 reduces
gradients with ``reduce_scatter(op=AVG)`` when there is more than one rank (a copy for one), which
gloo emulates with an all-reduce: averaging makes two ranks' gradients equal one rank's, summing
doubles them (tests/test_gloo_reduction.py). For the test's control, rank 0 also saves what gloo's
``reduce_scatter_single`` gives for one replicated tensor with ``op=AVG`` and with ``op=SUM`` (under
``"__collective__"``): an average that dropped its op would be the sum.
"""

from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def _collective(world: int) -> dict[str, torch.Tensor]:
    """One replicated tensor reduce-scattered over gloo with AVG and with SUM (this rank's chunk of each)."""
    x = torch.arange(4.0 * world) / 7  # the same on every rank
    out = {"input": x.chunk(world)[dist.get_rank()].clone()}
    for name, op in (("avg", dist.ReduceOp.AVG), ("sum", dist.ReduceOp.SUM)):
        chunk = torch.empty(4)
        dist.reduce_scatter_tensor(chunk, x.clone(), op=op)
        out[name] = chunk
    return out


def _rank(rank: int, world: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))  # the same batch on every rank
    model(x).float().pow(2).mean().backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    grads["__collective__"] = _collective(world)
    if rank == 0:
        torch.save(grads, out)
    dist.destroy_process_group()


def main() -> None:
    world, out = int(sys.argv[1]), sys.argv[2]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # forked: each rank starts with this process's torch imported (spawned ranks imported it again)
    mp.start_processes(_rank, args=(world, port, out), nprocs=world, join=True, start_method="fork")


if __name__ == "__main__":
    main()
