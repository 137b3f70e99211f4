"""The replay buffer the gate gives verl's trainer on the CPU: a step's batch in (prompt, sample) order.

verl's sync ``ReplayBuffer`` builds a batch from TransferQueue's metadata in the order trajectories
finished, which follows the rollout server's arrival order, so two runs of the same scenario put
the same responses in different rows, micro-batches and ranks (verl then balances ranks by sequence
length from that order). vLLM on a GPU has the same property; a gate cannot. This subclass, passed
through verl's public hook ``trainer.v1.sampler.custom_sampler.{path,name}``, keeps verl's selection
and eviction and only sorts the selected trajectories by the prompt's dataset ``index``, then the
sample (``session_id``) and the output's position, read from their keys (``{uid}_{session}_{i}``)
and stored fields.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer


def _values(column: Any) -> list[int]:
    if hasattr(column, "tolist"):
        return [int(v) for v in column.tolist()]
    return [int(getattr(v, "data", v)) for v in column]


def order(keys: list[str], indices: list[int]) -> list[int]:
    """Positions of ``keys`` sorted by (dataset index, session, output index); keys are ``{uid}_{session}_{i}``."""

    def rank(pos: int) -> tuple[int, int, int]:
        _uid, session, out = keys[pos].rsplit("_", 2)
        return indices[pos], int(session), int(out)

    return sorted(range(len(keys)), key=rank)


class OrderedReplayBuffer(ReplayBuffer):
    """verl's sync ``ReplayBuffer`` whose batches come in (prompt, sample) order (see the module docstring)."""

    def _materialize_batch(
        self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict[str, dict]
    ) -> KVBatchMeta:
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        if not batch.keys:
            return batch
        fields = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id, select_fields=["index"])
        positions = order(batch.keys, _values(fields["index"]))
        return KVBatchMeta(
            partition_id=batch.partition_id,
            keys=[batch.keys[i] for i in positions],
            tags=[batch.tags[i] for i in positions],
        )
