"""Pinned rollouts scored again by the scenario's reward function, in verl's trainer, for verl 0.9.1 only.

Why: verl 0.9.1's rollout cache for its v1 trainer (``skip.rollout_tq``, ``RolloutTqSkip`` in
``verl/utils/skip/rollout_skip.py``) saves every field of a step's trajectories as ``ReplayBuffer.sample``
returns them (``prepare_data``: ``tq.kv_batch_get`` with no field selection) and a later run puts them back into
TransferQueue as they were (``load_dump_data``). The reward is among them: the agent loop asks a reward loop
worker for it before it stores a trajectory (``AgentLoopWorkerTQ._agent_loop_postprocess`` ->
``AgentLoopWorker._compute_score``), as ``rm_scores`` (0 but at the last response token) and
``extra_fields["reward_extra_info"]``; the trainer takes ``rm_scores`` as ``token_level_scores``
(``_compute_advantage``). A check that loads pinned rollouts would train on the recorded scores, and an edit to the
reward function would move nothing it checks.

What: :func:`skip_class` derives verl's ``RolloutTqSkip`` into one whose ``load_dump_data``, after verl put the
cached trajectories into TransferQueue, computes each one's reward again as the agent loop does: the same inputs
(:func:`reward_input`, ``_compute_score``'s ``DataProto`` rebuilt from the stored fields) sent to verl's own reward
loop workers (``RewardLoopWorker.compute_score``: the scenario's reward manager and
``reward.custom_reward_function``, or its reward model's server), and writes ``rm_scores`` and
``reward_extra_info`` back as the agent loop lays them out (``AgentLoopOutput.as_dict``). Left as recorded: a
trajectory without ``reward_extra_info`` (its agent loop set the score itself, so no reward loop was asked), and
every trajectory when a reward model is colocated with the actor: verl then scores the sampled batch itself
(``_compute_reward_colocate``, which overwrites ``rm_scores``). It is registered under verl's name ``rollout_tq``
(``register_skip``), which ``SkipManager.init`` reads when the trainer's ``fit`` starts.

Reaching into verl: the cache's fields, the agent loop's reward inputs, the keys ``load_dump_data`` writes
(``{uid}_{session}_0``) and the reward loop workers' Ray names (``reward_loop_worker_{i}``,
``RewardLoopManager._init_reward_loop_workers``) are verl 0.9.1's internals, so :func:`apply` refuses any other
verl (the gate does not load this module under one: :mod:`precision_harness.runs.verl.pinning`).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from precision_harness.runs.verl.release import SUPPORTED_VERSIONS
from precision_harness.runs.verl.stages import on_import

#: the fields the agent loop's output and verl's TransferQueue adapter write beside the prompt's own
#: (``AgentLoopOutput.as_dict`` and ``AgentLoopWorkerTQ._agent_loop_postprocess``): the rest are the keyword
#: arguments ``_compute_score`` passes to the reward (``data_source``, ``reward_model``, ``extra_info``, ...)
OUTPUT_FIELDS = frozenset(
    {
        "prompts",
        "responses",
        "response_mask",
        "rollout_log_probs",
        "routed_experts",
        "rm_scores",
        "num_turns",
        "metrics",
        "extra_fields",
        "mm_processor_kwargs",
        "mm_processor_output",
        "teacher_ids",
        "teacher_logprobs",
        "loss_mask",
        "input_ids",
        "position_ids",
        "multi_modal_inputs",
    }
)
REWARD_INFO = "reward_extra_info"
#: verl's module whose ``RolloutTqSkip`` is derived (its rollout cache)
SKIP_MODULE = "verl.utils.skip.rollout_skip"


def rows(data: Any) -> list[dict[str, Any]]:
    """A TensorDict from TransferQueue (jagged tensors, ``NonTensorStack``) as one dict per trajectory."""
    import torch

    columns = {}
    for key in data.keys():  # noqa: SIM118 (a TensorDict iterates its keys only through keys())
        value = data.get(key)
        columns[key] = list(value.unbind(0)) if isinstance(value, torch.Tensor) else list(value.tolist())
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def reward_input(row: dict[str, Any]) -> Any:
    """The ``DataProto`` ``AgentLoopWorker._compute_score`` sends a reward loop worker for one single-turn
    trajectory (``verl/experimental/agent_loop/agent_loop.py``, verl 0.9.1): ``prompts``, ``responses``, an
    all-ones ``attention_mask``, ``input_ids`` (int64, ``[1, prompt + response]``) and ``position_ids``; the
    prompt's keyword arguments, ``__num_turns__``, ``tool_extra_fields`` (the agent loop's extra fields as they
    were before the reward was added), ``prompt_len`` and ``response_len``."""
    import numpy as np
    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto

    prompts, responses = row["prompts"], row["responses"]
    input_ids = torch.cat([prompts, responses], dim=0)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "attention_mask": torch.ones_like(input_ids, dtype=torch.int64),
        "input_ids": input_ids,
        "position_ids": row["position_ids"],
    }
    extra = {k: v for k, v in (row.get("extra_fields") or {}).items() if k != REWARD_INFO}
    non_tensor = {
        **{k: np.array([v]) for k, v in row.items() if k not in OUTPUT_FIELDS},
        "__num_turns__": np.array([row["num_turns"]]),
        "tool_extra_fields": np.array([extra], dtype=object),
        "prompt_len": np.array([len(prompts)]),
        "response_len": np.array([len(responses)]),
    }
    batch = TensorDict({k: v.unsqueeze(0) for k, v in tensors.items()}, batch_size=1)
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def scored(row: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """``rm_scores`` and ``extra_fields`` of ``row`` from a reward loop worker's ``result``, laid out as
    ``AgentLoopOutput.as_dict`` does: float32 zeros over the response, the score at its last token."""
    import torch

    rm_scores = torch.zeros_like(row["response_mask"], dtype=torch.float32)
    rm_scores[-1] = result["reward_score"]
    return {"rm_scores": rm_scores, "extra_fields": {**row["extra_fields"], REWARD_INFO: result[REWARD_INFO]}}


def rescore(config: Any, keys: list[str], partition_id: str) -> int:
    """Score the trajectories at ``keys`` again through verl's reward loop workers and write their reward back;
    return how many were scored (those the agent loop had the reward loop score)."""
    import ray
    import torch
    import transfer_queue as tq
    from verl.utils import tensordict_utils

    data = rows(tq.kv_batch_get(keys=keys, partition_id=partition_id))
    todo = [i for i, row in enumerate(data) if REWARD_INFO in (row.get("extra_fields") or {})]
    if not todo:
        return 0
    workers = [ray.get_actor(f"reward_loop_worker_{i}") for i in range(int(config.reward.num_workers))]
    results = ray.get(
        [workers[n % len(workers)].compute_score.remote(reward_input(data[i])) for n, i in enumerate(todo)]
    )
    out = [scored(data[i], result) for i, result in zip(todo, results, strict=True)]
    # as verl writes a recomputed reward back (_compute_reward_colocate): jagged scores, one extra_fields per row
    fields = tensordict_utils.get_tensordict(
        {
            "rm_scores": torch.nested.as_nested_tensor([o["rm_scores"] for o in out], layout=torch.jagged),
            "extra_fields": [o["extra_fields"] for o in out],
        }
    )
    tq.kv_batch_put(keys=[keys[i] for i in todo], partition_id=partition_id, fields=fields)
    return len(todo)


def verl_scores_itself(config: Any) -> bool:
    """A reward model colocated with the actor: verl scores each sampled batch after sampling
    (``RayPPOTrainer._step_once`` -> ``_compute_reward_colocate``, when ``reward_loop_worker_handles`` is None)."""
    model = config.reward.reward_model
    return bool(model.enable) and not bool(model.enable_resource_pool)


def skip_class(base: type) -> type:
    """verl's ``RolloutTqSkip`` (``base``) whose loaded trajectories are scored again (the module docstring)."""

    class RescoredRolloutTqSkip(base):  # type: ignore[misc, valid-type]
        def load_dump_data(self, step: int, new_prompt_uids: list[str], n: int, global_steps: int, **kw: Any) -> None:
            super().load_dump_data(step=step, new_prompt_uids=new_prompt_uids, n=n, global_steps=global_steps, **kw)
            config, partition_id = self.global_config, kw.get("partition_id", "train")
            keys = [f"{uid}_{session}_0" for uid in new_prompt_uids for session in range(n)]
            if verl_scores_itself(config):
                done = "verl scores them again itself after sampling (a colocated reward model)"
            else:
                count = rescore(config, keys, partition_id)
                done = f"{count} of {len(keys)} trajectories scored again by the reward function"
            print(f"precision gate: pinned rollouts of step {step}: {done}", flush=True)

    RescoredRolloutTqSkip.__qualname__ = RescoredRolloutTqSkip.__name__
    return RescoredRolloutTqSkip


def _register(module: ModuleType) -> None:
    module.register_skip("rollout_tq")(skip_class(module.RolloutTqSkip))


def apply(version: str) -> None:
    """Register the rescoring cache when verl's rollout cache module is first imported.

    Raises:
        RuntimeError: ``version`` is not one this module was checked against (one line).
    """
    refusal = (
        f"precision_harness.runs.verl.rescore: verl {version} is not supported: the pinned rollouts' reward is "
        f"computed again through verl {', '.join(SUPPORTED_VERSIONS)}'s rollout cache and reward loop internals"
    )
    on_import.apply_checked(version, SUPPORTED_VERSIONS, refusal, ((SKIP_MODULE, _register),))
