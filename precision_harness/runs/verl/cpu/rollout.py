"""The rollout replica ``precision_cpu``: responses sampled from the policy on the CPU, weights from verl's sync.

verl 0.9.1 registers only vLLM, SGLang and TRT-LLM replicas. This module registers one more through
verl's public ``RolloutReplicaRegistry.register``, and the worker-side adapter through the registry
patched in :mod:`.patches` (verl has no public way to add one):

- :class:`CPUReplica` launches one :class:`~.policy_server.PolicyServer` Ray actor per replica (no CPU
  reserved): transformers' Qwen2 in the rollout dtype, sampling with a seed per request and returning
  per-token log-probs, as vLLM does for verl.
- :class:`CPUServerAdapter` is the worker-side rollout (``BaseRollout``) that verl's
  ``ActorRolloutRefWorker.update_weights`` (mode ``naive``, the sync trainer's) hands the actor's
  weights to after every update: ``(HF name, full tensor)`` pairs from ``engine.get_per_tensor_param``.
  Each item is a collective over the ranks, so every rank consumes every item; the replica's leader
  (``rank % rollout world size == 0``, as in verl's vLLM adapter) keeps them, digests each cast to the
  rollout dtype, and sends them to its server's ``load_weights``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from precision_harness.runs.verl.cpu.policy_server import PolicyServer

NAME = "precision_cpu"


def server_name(replica_rank: int, suffix: str = "") -> str:
    return f"{NAME}_server_{replica_rank}{suffix}"


@functools.cache
def _replica_class() -> type:
    import ray
    from verl.workers.rollout.replica import RolloutReplica

    class CPUReplica(RolloutReplica):
        """verl's ``RolloutReplica`` with a :class:`~.policy_server.PolicyServer` (see the module docstring)."""

        def rollout_worker_use_gpu(self) -> bool:
            return False

        async def launch_servers(self) -> None:
            model_path = getattr(self.model_config, "local_path", None) or self.model_config.path
            name = server_name(self.replica_rank, self.name_suffix)
            server = (
                ray.remote(PolicyServer)
                .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
                .remote(
                    model_path=str(model_path),
                    dtype=str(self.config.dtype),
                    response_length=int(self.config.response_length),
                    replica_rank=self.replica_rank,
                )
            )
            self.servers = [server]
            self._server_handle = server
            self._server_address = name

    return CPUReplica


@functools.cache
def _adapter_class() -> type:
    from verl.workers.rollout.base import BaseRollout

    class CPUServerAdapter(BaseRollout):
        """The worker-side rollout the hybrid engine syncs weights into (see the module docstring)."""

        def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
            super().__init__(config, model_config, device_mesh)
            world = int(self.config.tensor_model_parallel_size) * int(self.config.data_parallel_size)
            world *= int(self.config.pipeline_model_parallel_size)
            rank = int(os.environ.get("RANK", "0"))
            self.replica_rank = rank // world if replica_rank < 0 else replica_rank
            self.is_leader = rank % world == 0

        async def resume(self, tags: list[str]) -> None:
            return None

        async def release(self) -> None:
            return None

        async def update_weights(self, weights: Any, global_steps: int | None = None, **kwargs: Any) -> None:
            import ray
            import torch

            from precision_harness.runs.numerics.weight_sync import tensor_digest

            dtype = getattr(torch, str(self.config.dtype))
            kept: list[tuple[str, Any]] = []
            for name, tensor in weights:  # each item is a collective: every rank takes every one
                if self.is_leader:
                    kept.append((name, tensor.detach().to("cpu", copy=True)))
            if self.is_leader:
                actor = {name: tensor_digest(tensor.to(dtype)) for name, tensor in kept}
                server = ray.get_actor(server_name(self.replica_rank))
                await server.load_weights.remote(kept, global_steps, actor)

    return CPUServerAdapter


def __getattr__(name: str) -> Any:
    # verl's rollout registry imports the adapter by dotted name (...runs.verl.cpu.rollout.CPUServerAdapter)
    if name == "CPUServerAdapter":
        return _adapter_class()
    if name == "CPUReplica":
        return _replica_class()
    raise AttributeError(name)


def register() -> None:
    """Register the replica with verl's public ``RolloutReplicaRegistry``."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, _replica_class)
