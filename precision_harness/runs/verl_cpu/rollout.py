"""The rollout replica ``precision_cpu``: seeded trajectories on the CPU, weight syncs accepted.

verl's trainer needs a rollout engine even when the gate pins the rollouts (``skip.rollout_tq``
injects the recorded batch, but the trainer still launches rollout servers and syncs the actor's
weights into them each step), and verl 0.9.1 registers only vLLM, SGLang and TRT-LLM. This module
registers one more through verl's public ``RolloutReplicaRegistry.register``:

- :class:`CPUReplica` launches one :class:`TrajectoryServer` Ray actor per replica (no CPU reserved).
- :class:`TrajectoryServer` answers verl's server calls. ``generate`` returns a response drawn from a
  generator seeded by the rollout's ``seed``, the request id and the prompt's token ids, over a small
  alphabet of printable characters, of a seeded length. verl passes a stable request id
  (``det-<index of the prompt in the batch>``) only with ``actor_rollout_ref.rollout.full_determinism=true``,
  which the gate sets on CPU; the ``rollout.n`` responses of one prompt share it, so the k-th request
  with the same id, prompt and step draws with ``k`` in its seed. A group's responses are therefore
  the same on every machine; which of them lands in which row can follow the requests' arrival
  order, which is why the gate pins the rollouts (the recorded batch is replayed, not regenerated).
  The tokens are *not* sampled from the model: a CPU run gates verl's training side (log-probs,
  reference, update), not sampling.
- :class:`CPUServerAdapter` is the worker-side rollout (``BaseRollout``) that the hybrid engine
  syncs the actor's weights into after each update: it consumes every tensor, and tells the server
  the step, the number of tensors and elements received; the server returns the step in each
  response's ``extra_fields["global_steps"]``, which verl's client requires.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from typing import Any

NAME = "precision_cpu"
ALPHABET = "abcdefghijklmnopqrstuvwxyz "
logger = logging.getLogger(__name__)


def server_name(replica_rank: int, suffix: str = "") -> str:
    return f"{NAME}_server_{replica_rank}{suffix}"


def response_tokens(
    seed: int, request_id: str, prompt_ids: list[int], alphabet_ids: list[int], length: int, index: int = 0
) -> list[int]:
    """The seeded response of one request (the ``index``-th with this id and prompt): ``length // 2 .. length``
    ids drawn from ``alphabet_ids``."""
    import numpy as np

    key = hashlib.sha256(f"{seed}|{request_id}|{index}|{','.join(map(str, prompt_ids))}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    count = int(rng.integers(max(1, length // 2), length + 1))
    return [alphabet_ids[i] for i in rng.integers(0, len(alphabet_ids), size=count)]


class TrajectoryServer:
    """One replica's server actor (see the module docstring)."""

    def __init__(self, *, seed: int, model_path: str, response_length: int, replica_rank: int) -> None:
        import threading

        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        self.alphabet_ids = [tokenizer.encode(ch, add_special_tokens=False)[0] for ch in ALPHABET]
        self.seed = seed
        self.response_length = response_length
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self.syncs: list[dict[str, Any]] = []
        self.seen: dict[tuple[Any, ...], int] = {}
        self.lock = threading.Lock()

    def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        if not str(request_id).startswith("det-"):
            raise RuntimeError(
                f"{NAME}: request id {request_id!r} is not stable; set actor_rollout_ref.rollout.full_determinism=true"
            )
        length = int(sampling_params.get("max_tokens") or self.response_length)
        key = (self.global_steps, str(request_id), tuple(prompt_ids))
        with self.lock:
            index = self.seen.get(key, 0)
            self.seen[key] = index + 1
        ids = response_tokens(self.seed, str(request_id), list(prompt_ids), self.alphabet_ids, length, index)
        return TokenOutput(token_ids=ids, stop_reason="completed", extra_fields={"global_steps": self.global_steps})

    def sync_weights(self, global_steps: int | None, tensors: int, elements: int) -> None:
        self.global_steps = global_steps
        self.syncs.append({"global_steps": global_steps, "tensors": tensors, "elements": elements})
        print(
            f"[{NAME}] replica {self.replica_rank}: weights synced at step {global_steps}: "
            f"{tensors} tensors, {elements} elements",
            flush=True,
        )

    def weight_syncs(self) -> list[dict[str, Any]]:
        return list(self.syncs)

    # verl's lifecycle calls: nothing to free or resume on the CPU
    def wake_up(self) -> None: ...
    def sleep(self) -> None: ...
    def clear_kv_cache(self) -> None: ...
    def release_kv_cache(self) -> None: ...
    def resume_kv_cache(self) -> None: ...
    def abort_all_requests(self, reject_request: bool = False) -> None: ...
    def resume_generation(self) -> None: ...
    def start_profile(self, **kwargs: Any) -> None: ...
    def stop_profile(self) -> None: ...


@functools.cache
def _replica_class() -> type:
    import ray
    from verl.workers.rollout.replica import RolloutReplica

    class CPUReplica(RolloutReplica):
        """verl's ``RolloutReplica`` with a :class:`TrajectoryServer` (see the module docstring)."""

        def rollout_worker_use_gpu(self) -> bool:
            return False

        async def launch_servers(self) -> None:
            model_path = getattr(self.model_config, "local_path", None) or self.model_config.path
            name = server_name(self.replica_rank, self.name_suffix)
            server = (
                ray.remote(TrajectoryServer)
                .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
                .remote(
                    seed=int(self.config.seed),
                    model_path=str(model_path),
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

            tensors = elements = 0
            for _name, tensor in weights:
                tensors += 1
                elements += int(tensor.numel())
            if self.is_leader:
                server = ray.get_actor(server_name(self.replica_rank))
                await server.sync_weights.remote(global_steps, tensors, elements)

    return CPUServerAdapter


def __getattr__(name: str) -> Any:
    # verl's rollout registry imports the adapter by dotted name (...runs.verl_cpu.rollout.CPUServerAdapter)
    if name == "CPUServerAdapter":
        return _adapter_class()
    if name == "CPUReplica":
        return _replica_class()
    raise AttributeError(name)


def register() -> None:
    """Register the replica with verl's public ``RolloutReplicaRegistry``."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(NAME, _replica_class)
