"""Data parallelism for multi-rank scenarios (``trainer.world_size > 1``), as verl's worker groups do it.

One process per rank (a Ray actor, see ``precision_harness.runs.runner.ray_launch``) joins a torch.distributed
process group: gloo on CPU, nccl on CUDA, hccl on NPU. Every rank generates the same rollout from the
same seeded generator, so the driver-side math (reward, advantages over the whole batch) is identical
on every rank; the worker stages then follow verl's ``Dispatch.DP_COMPUTE_PROTO``:

- :func:`dp_compute` (``compute_log_prob``, ``compute_values``, ``compute_rm_score``): rank ``r``
  computes rows ``[r*B/W, (r+1)*B/W)`` of the batch and the results are all-gathered back to ``(B, ...)``;
- :func:`dp_update` (``actor_update``, ``critic_update``): rank ``r`` trains on its shard and
  :func:`average_gradients` all-reduces (mean) the gradients before each optimizer step, so the
  weights stay identical on every rank (FSDP/DDP semantics);
- :func:`reduce_metrics`: per-step metrics are averaged over ranks outside the profiled stages.

With one rank (no process group) every function here is a no-op, so single-rank runs are unchanged
byte for byte. The collectives run inside the profiled stages, so msprobe L1 dumps them
(``Distributed.all_reduce.N.forward``), as it does in a real verl run.

"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

F = TypeVar("F", bound=Callable[..., Any])

#: torch.distributed backend per device (verl: nccl on GPU, hccl on Ascend; gloo for CPU CI).
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


def init_process_group(
    *, rank: int, world_size: int, master_addr: str, master_port: int, device: str, timeout_s: float = 120.0
) -> None:
    """Join the scenario's process group over a TCP store at ``master_addr:master_port``."""
    global _CPU_GROUP
    backend = BACKENDS[device]
    # under Ray each rank's actor sees only its own accelerator (CUDA_/ASCEND_RT_VISIBLE_DEVICES): index 0
    if device == "cuda":
        torch.cuda.set_device(0)
    elif device == "npu":
        import torch_npu  # noqa: F401

        torch.npu.set_device(0)  # type: ignore[attr-defined]
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    # metrics are reduced in float64 on CPU (nccl/hccl float64 support varies): a gloo group beside the device group
    _CPU_GROUP = None if backend == "gloo" else dist.new_group(backend="gloo")


#: gloo group for CPU-side collectives when the device group is nccl/hccl (None: use the default group)
_CPU_GROUP: Any = None


def destroy_process_group() -> None:
    global _CPU_GROUP
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _CPU_GROUP = None


def world_size() -> int:
    """Ranks in the process group; 1 when none is initialised (single-rank scenario)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def shard(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This rank's contiguous chunk of every ``(B, ...)`` tensor: rows ``[r*B/W, (r+1)*B/W)``.

    As verl's ``DataProto.chunk``.

    Raises:
        ValueError: ``B`` is not divisible by the world size (``Scenario`` checks this at load time).
    """
    w, r = world_size(), rank()
    out = {}
    for key, value in batch.items():
        if value.shape[0] % w:
            raise ValueError(f"batch key {key!r}: {value.shape[0]} rows cannot be split over world_size {w}")
        size = value.shape[0] // w
        out[key] = value[r * size : (r + 1) * size]
    return out


def all_gather_rows(local: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``(b, ...)`` tensor in rank order: ``(W*b, ...)``."""
    parts = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.cat(parts)


def dp_compute(fn: F) -> F:
    """Decorate a no-grad stage ``fn(model, batch, **kw) -> Tensor | tuple[Tensor | None, ...]``.

    Each rank computes its shard; the outputs are gathered back in rank order."""

    @functools.wraps(fn)
    def wrapper(model: Any, batch: dict[str, torch.Tensor], **kwargs: Any) -> Any:
        if world_size() == 1:
            return fn(model, batch, **kwargs)
        out = fn(model, shard(batch), **kwargs)
        if isinstance(out, tuple):
            return tuple(None if t is None else all_gather_rows(t) for t in out)
        return all_gather_rows(out)

    return wrapper  # type: ignore[return-value]


def dp_update(fn: F) -> F:
    """Decorate a training stage ``fn(model, optimizer, batch, cfg, **kw) -> metrics``: train on this rank's shard."""

    @functools.wraps(fn)
    def wrapper(model: Any, optimizer: Any, batch: dict[str, torch.Tensor], cfg: dict[str, Any], **kwargs: Any) -> Any:
        if world_size() == 1:
            return fn(model, optimizer, batch, cfg, **kwargs)
        return fn(model, optimizer, shard(batch), cfg, **kwargs)

    return wrapper  # type: ignore[return-value]


def per_rank(n_sequences: int) -> int:
    """A global count of sequences (e.g. a mini-batch) divided over the ranks.

    verl normalises ``ppo_mini_batch_size`` the same way."""
    return n_sequences // world_size()


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """All-reduce (mean) every gradient over the ranks, in parameter order; no-op with one rank.

    With two ranks the sum ``g0 + g1`` is the same bits on both ranks (fp addition is commutative),
    so the weights stay identical and reruns are byte-identical.
    """
    w = world_size()
    if w == 1:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(w)


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Average float metrics over the ranks (verl ``reduce_metrics`` over the gathered workers' lists).

    Called outside the profiled stages. Keys are sorted so every rank reduces the same vector.
    """
    w = world_size()
    if w == 1:
        return metrics
    keys = sorted(k for k, v in metrics.items() if isinstance(v, float))
    if not keys:
        return metrics
    vec = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(vec, op=dist.ReduceOp.SUM, group=_CPU_GROUP)
    out = dict(metrics)
    out.update({k: float(v) / w for k, v in zip(keys, vec.tolist(), strict=True)})
    return out
