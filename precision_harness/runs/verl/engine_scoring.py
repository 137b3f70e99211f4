"""The rollout engine scores the pinned responses in verl's trainer, for verl 0.9.1 only: ``rollout_compute_log_prob``.

Why: with rollouts pinned a check samples nothing, so the rollout engine's numerics (its kernels, its logits'
processing, the weights the sync handed it) reached no stage; a rollout engine upgrade was gated by nothing but the
replayed ``rollout_log_probs``, which it never computed.

What: right after ``actor_compute_log_prob`` (``PPOTrainer._compute_old_log_prob`` in
``verl/trainer/ppo/v1/trainer_base.py``), when the scenario declares ``rollout_compute_log_prob`` for the step, the
trainer's batch (``prompts``, ``responses``, ``response_mask`` and the training forward's ``old_log_probs``, from
TransferQueue) goes to the rollout engine, which holds the weights the sync before this step handed it: it computes
each response's log-probs teacher-forced, through verl's token-in, token-out call to the replica's server
(``RolloutReplica.server_handle``'s ``generate``) asked for ``prompt_logprobs: 0`` and one token, the call verl's
vLLM and SGLang servers answer too (:func:`response_log_probs` reads their layout). The stage's
``dump.json`` (msprobe's statistics layout, ``step_<n>/rollout_compute_log_prob/step0/rank0/``) then holds, rows in
the order of their (prompt, response) tokens, so the order of uids and of verl's balancing does not matter:

- ``Stage.rollout_log_probs.<row>.forward``: the engine's log-probs of the row's response tokens;
- ``Stage.log_prob_mismatch.<row>.forward``: engine minus training, per response token (``Max``/``Min`` bound
  max |Δ log p|);
- ``Stage.rollout_corr_<metric>.0.forward``: verl's own rollout-correction diagnostics of the whole batch with the
  engine's log-probs as the rollout's (``compute_offpolicy_metrics`` in ``verl/trainer/ppo/rollout_corr_helper.py``:
  ``kl``, ``k3_kl``, ``log_ppl_diff``, ``ppl_ratio``, ``chi2_token``, ...), each a float64 scalar.

and, beside ``data``, ``rollout_engine``: the engine's name (``actor_rollout_ref.rollout.name``) and version, for
the verdict. The gate compares the dump with the golden's as any stage's, with the stage's tolerance.

Reaching into verl: ``_compute_old_log_prob``, the TransferQueue fields and ``llm_server_manager`` are verl 0.9.1's
internals, so :func:`apply` refuses any other verl. The gate declares the stage on the CPU only
(:mod:`precision_harness.runs.verl.engine`): verl's colocated trainer sleeps a vLLM or SGLang replica, its weights
discarded, before ``_compute_old_log_prob`` (``PPOTrainerSync.on_sample_end``), and their prompt log-probs ignore
the temperature (docs/consistency.md, "What a device adapter must answer").
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from precision_harness.runs.verl.release import SUPPORTED_VERSIONS
from precision_harness.runs.verl.stages import on_import
from precision_harness.scenarios.profiling import ROLLOUT_COMPUTE_LOG_PROB

#: verl's module whose trainer computes ``old_log_probs`` (``PPOTrainer._compute_old_log_prob``)
TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"
#: the TransferQueue fields the scoring reads (the agent loop's output and the training forward's)
FIELDS = ["prompts", "responses", "response_mask", "old_log_probs"]


def enabled(step: int) -> Path | None:
    """The stage's folder for ``step`` when the run declares the stage for it (``PRECISION_STAGES``,
    ``PRECISION_STEPS``, ``PRECISION_DUMP_DIR``, as the gate sets them), else None."""
    dump_dir = os.environ.get("PRECISION_DUMP_DIR")
    stages = os.environ.get("PRECISION_STAGES", "").split(",")
    steps = {int(s) for s in os.environ.get("PRECISION_STEPS", "").split(",") if s}
    if not dump_dir or ROLLOUT_COMPUTE_LOG_PROB not in stages or step not in steps:
        return None
    return Path(dump_dir) / f"step_{step}" / ROLLOUT_COMPUTE_LOG_PROB


def sampling_params(rollout: Any) -> dict[str, Any]:
    """The processing verl's agent loop asks the engine for (``actor_rollout_ref.rollout``: temperature, top-k,
    top-p), so the scores are the log-probs the engine would have returned with these tokens."""
    return {
        "temperature": float(rollout.temperature),
        "top_k": int(rollout.get("top_k", -1)),
        "top_p": float(rollout.get("top_p", 1.0)),
    }


def engine_identity(rollout: Any) -> dict[str, str]:
    """``{"name", "version"}`` of the rollout engine (the gate's CPU server's version is the gate's)."""
    import importlib.metadata

    name = str(rollout.name)
    package = {"precision_cpu": "pytest-precision", "vllm": "vllm", "sglang": "sglang"}.get(name, name)
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"name": name, "version": version}


def mismatch_dump(rows: list[dict[str, Any]], engine: list[list[float]]) -> dict[str, Any]:
    """The stage's ``data`` (the module docstring) from the trajectories ``rows`` (``prompts``, ``responses``,
    ``response_mask`` int64/bool ``[R]``, ``old_log_probs`` float32 ``[R]``) and the engine's log-probs ``engine``
    (one list of ``R`` floats per row), in that row order."""
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics

    from precision_harness.runs.numerics.stage_outputs import tensor_statistics

    width = max(len(r["responses"]) for r in rows)
    old = torch.zeros(len(rows), width)
    ours = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width)
    for i, (row, scores) in enumerate(zip(rows, engine, strict=True)):
        n = len(row["responses"])
        old[i, :n] = row["old_log_probs"].float()
        ours[i, :n] = torch.tensor(scores, dtype=torch.float32)
        mask[i, :n] = row["response_mask"].float()
    data: dict[str, Any] = {}
    for i in range(len(rows)):
        valid = mask[i] > 0
        data[f"Stage.rollout_log_probs.{i}.forward"] = {"output": [tensor_statistics(ours[i][valid])]}
        data[f"Stage.log_prob_mismatch.{i}.forward"] = {"output": [tensor_statistics((ours[i] - old[i])[valid])]}
    metrics = compute_offpolicy_metrics(old_log_prob=old, rollout_log_prob=ours, response_mask=mask)
    for name, value in metrics.items():
        scalar = torch.tensor(float(value), dtype=torch.float64)
        data[f"Stage.rollout_corr_{name}.0.forward"] = {"output": [tensor_statistics(scalar)]}
    return data


def response_log_probs(fields: dict[str, Any] | None, prompt_len: int, response_len: int) -> list[float]:
    """The ``response_len`` log-probs of the response from a ``prompt_logprobs: 0`` answer's ``extra_fields`` for
    prompt plus response, in verl 0.9.1's layout (one ``[log-prob]`` per position from the second, then a dummy
    row; ``extract_prompt_logprobs`` in ``verl/workers/rollout/vllm_rollout/utils.py``): token ``j`` of the
    response is row ``prompt_len - 1 + j``.

    Raises:
        RuntimeError: no ``prompt_logprobs``, or not ``prompt_len + response_len`` rows (one line).
    """
    rows = (fields or {}).get("prompt_logprobs")
    if rows is None or len(rows) != prompt_len + response_len:
        got = "no prompt_logprobs" if rows is None else f"{len(rows)} prompt_logprobs rows"
        raise RuntimeError(
            f"{ROLLOUT_COMPUTE_LOG_PROB}: the rollout engine answered {got} for {prompt_len} prompt and "
            f"{response_len} response tokens, expected {prompt_len + response_len} (verl's prompt_logprobs layout)"
        )
    return [float(row[0]) for row in rows[prompt_len - 1 : prompt_len - 1 + response_len]]


def score_batch(trainer: Any, batch: Any, stage_dir: Path) -> int:
    """Have the rollout engine of ``trainer`` (verl's ``PPOTrainer``) score the trajectories of ``batch`` (verl's
    ``KVBatchMeta``) and write the stage's ``dump.json`` under ``stage_dir``; return how many it scored."""
    import ray
    import transfer_queue as tq

    from precision_harness.runs.verl.cpu.policy_server import write_stage_dump
    from precision_harness.runs.verl.rescore import rows as trajectories

    data = trajectories(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=FIELDS))
    data.sort(key=lambda r: (r["prompts"].tolist(), r["responses"].tolist()))
    rollout = trainer.config.actor_rollout_ref.rollout
    params = {**sampling_params(rollout), "max_tokens": 1, "prompt_logprobs": 0}
    server = trainer.llm_server_manager.get_replicas()[0].server_handle
    requests = [(r["prompts"].tolist(), r["responses"].tolist()) for r in data]
    outputs = ray.get(
        [
            server.generate.remote(
                request_id=f"precision-score-{trainer.global_steps}-{i}", prompt_ids=[*p, *r], sampling_params=params
            )
            for i, (p, r) in enumerate(requests)
        ]
    )
    engine = [
        response_log_probs(out.extra_fields, len(p), len(r)) for out, (p, r) in zip(outputs, requests, strict=True)
    ]
    identity = engine_identity(rollout)
    write_stage_dump(stage_dir / "step0" / "rank0", mismatch_dump(data, engine), rollout_engine=identity)
    return len(data)


def _patch(module: ModuleType) -> None:
    trainer = module.PPOTrainer
    compute = trainer._compute_old_log_prob

    def _compute_old_log_prob(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        batch = compute(self, batch, *args, **kwargs)
        stage_dir = enabled(int(self.global_steps))
        if stage_dir is not None:
            count = score_batch(self, batch, stage_dir)
            print(
                f"precision gate: {ROLLOUT_COMPUTE_LOG_PROB} of step {self.global_steps}: the rollout engine scored "
                f"{count} pinned responses teacher-forced",
                flush=True,
            )
        return batch

    trainer._compute_old_log_prob = _compute_old_log_prob


def apply(version: str) -> None:
    """Patch verl's trainer when its module is first imported.

    Raises:
        RuntimeError: ``version`` is not one this module was checked against (one line).
    """
    refusal = (
        f"precision_harness.runs.verl.engine_scoring: verl {version} is not supported: the rollout engine scores "
        f"the pinned responses through verl {', '.join(SUPPORTED_VERSIONS)}'s trainer and TransferQueue internals"
    )
    on_import.apply_checked(version, SUPPORTED_VERSIONS, refusal, ((TRAINER_MODULE, _patch),))
