"""The rollout engine scores the pinned responses in verl's trainer, for verl 0.9.1 only: ``rollout_compute_log_prob``.

Why: with rollouts pinned a check samples nothing, so the rollout engine's numerics (its kernels, its logits'
processing, the weights the sync handed it) reached no stage; a rollout engine upgrade was gated by nothing but the
replayed ``rollout_log_probs``, which it never computed.

What: when the scenario declares ``rollout_compute_log_prob`` for the step, the batch the trainer samples from its
replay buffer (``prompts``, ``responses``, from TransferQueue) goes to the rollout engine right after it is sampled
(the replay buffer's ``sample``, wrapped where ``PPOTrainer._build_replay_buffer`` in
``verl/trainer/ppo/v1/trainer_base.py`` builds it): before ``on_sample_end``, where verl's colocated trainer puts a
vLLM or SGLang replica to sleep, its weights discarded, so the engine still holds the weights of this step's sync.
It computes each response's log-probs teacher-forced, through verl's token-in, token-out call to the replica's
server (``RolloutReplica.server_handle``'s ``generate``) asked for ``prompt_logprobs: 0`` and one token, the call
verl's vLLM and SGLang servers answer too (:func:`response_log_probs` reads their layout). Right after
``actor_compute_log_prob`` (``PPOTrainer._compute_old_log_prob``) the scores meet the training forward's
``old_log_probs`` and ``response_mask`` (TransferQueue), and the stage's ``dump.json`` (msprobe's statistics
layout, ``step_<n>/rollout_compute_log_prob/step0/rank0/``) holds, rows in the order of their (prompt, response)
tokens, so the order of uids and of verl's balancing does not matter:

- ``Stage.rollout_log_probs.<row>.forward``: the engine's log-probs of the row's response tokens;
- ``Stage.log_prob_mismatch.<row>.forward``: engine minus training, per response token (``Max``/``Min`` bound
  max |Δ log p|);
- ``Stage.rollout_corr_<metric>.0.forward``: verl's own rollout-correction diagnostics of the whole batch with the
  engine's log-probs as the rollout's (``compute_offpolicy_metrics`` in ``verl/trainer/ppo/rollout_corr_helper.py``:
  ``kl``, ``k3_kl``, ``log_ppl_diff``, ``ppl_ratio``, ``chi2_token``, ...), each a float64 scalar.

and, beside ``data``, ``rollout_engine``: the engine's name (``actor_rollout_ref.rollout.name``) and version, for
the verdict. The gate compares the dump with the golden's as any stage's, with the stage's tolerance.

Reaching into verl: ``_build_replay_buffer``, ``_compute_old_log_prob``, the TransferQueue fields and
``llm_server_manager`` are verl 0.9.1's internals, so :func:`apply` refuses any other verl. Off the CPU the gate
declares the stage for vLLM and SGLang at temperature 1 only, since their prompt log-probs ignore the sampling params
(:func:`precision_harness.runs.verl.engine.score_refusal`); no vLLM or SGLang run has checked it (docs/consistency.md,
"What a device adapter must answer").
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
    """``{"name", "version"}`` of the rollout engine (the gate's CPU server's version is the gate's; vLLM's names
    vllm-ascend's beside it where that plugin is installed)."""
    import importlib.metadata

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    name = str(rollout.name)
    package = {"precision_cpu": "pytest-precision", "vllm": "vllm", "sglang": "sglang"}.get(name, name)
    found = version(package) or "unknown"
    ascend = version("vllm-ascend") if name == "vllm" else None
    return {"name": name, "version": f"{found} (vllm-ascend {ascend})" if ascend else found}


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


def _pair(row: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A trajectory's ``(prompt tokens, response tokens)``: the key its scores are kept under, and its row order."""
    return tuple(row["prompts"].tolist()), tuple(row["responses"].tolist())


def _trajectories(batch: Any, fields: list[str]) -> list[dict[str, Any]]:
    """``fields`` of each trajectory of ``batch`` (verl's ``KVBatchMeta``), read from TransferQueue."""
    import transfer_queue as tq

    from precision_harness.runs.verl.rescore import rows

    return rows(tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields))


def score_sampled(trainer: Any, batch: Any) -> dict[tuple[tuple[int, ...], tuple[int, ...]], list[float]]:
    """The rollout engine's teacher-forced log-probs of each trajectory of ``batch`` (verl's ``KVBatchMeta``, as the
    replay buffer sampled it), keyed by ``(prompt tokens, response tokens)``, from replica 0 of ``trainer`` (verl's
    ``PPOTrainer``): ``R`` floats a response.

    Raises:
        RuntimeError: an answer not in verl's ``prompt_logprobs`` layout (:func:`response_log_probs`).
    """
    import ray

    pairs = sorted({_pair(row) for row in _trajectories(batch, ["prompts", "responses"])})
    params = {**sampling_params(trainer.config.actor_rollout_ref.rollout), "max_tokens": 1, "prompt_logprobs": 0}
    server = trainer.llm_server_manager.get_replicas()[0].server_handle
    step = int(trainer.global_steps)
    refs = [
        server.generate.remote(request_id=f"precision-score-{step}-{i}", prompt_ids=[*p, *r], sampling_params=params)
        for i, (p, r) in enumerate(pairs)
    ]
    answers = ray.get(refs)
    return {
        (p, r): response_log_probs(a.extra_fields, len(p), len(r)) for (p, r), a in zip(pairs, answers, strict=True)
    }


def write_scored(trainer: Any, batch: Any, scores: dict[Any, list[float]], stage_dir: Path) -> int:
    """Write the stage's ``dump.json`` under ``stage_dir`` from the engine's ``scores`` (:func:`score_sampled`) and
    the training forward's ``old_log_probs`` of ``batch`` (after ``_compute_old_log_prob``); return how many rows.

    Raises:
        RuntimeError: a trajectory of ``batch`` the engine did not score (one line).
    """
    from precision_harness.runs.verl.cpu.policy_server import write_stage_dump

    data = sorted(_trajectories(batch, FIELDS), key=_pair)
    keys = [_pair(row) for row in data]
    missing = [key for key in keys if key not in scores]
    if missing:
        raise RuntimeError(
            f"{ROLLOUT_COMPUTE_LOG_PROB} of step {trainer.global_steps}: {len(missing)} of {len(data)} trajectories "
            "reached actor_compute_log_prob without the engine's scores from the sampled batch"
        )
    engine = [scores[key] for key in keys]
    rollout = trainer.config.actor_rollout_ref.rollout
    write_stage_dump(
        stage_dir / "step0" / "rank0", mismatch_dump(data, engine), rollout_engine=engine_identity(rollout)
    )
    return len(data)


#: the trainer's attribute the sampled batch's scores wait in until ``_compute_old_log_prob``
SCORES = "_precision_engine_scores"


def _scoring_sample(trainer: Any, sample: Any) -> Any:
    """``sample`` (a replay buffer's) that has the engine score a training batch of a declared step, while the
    replicas are awake."""

    def scored(*args: Any, **kwargs: Any) -> Any:
        batch, metrics = sample(*args, **kwargs)
        partition = kwargs.get("partition_id", args[1] if len(args) > 1 else "train")
        if partition != "val" and enabled(int(trainer.global_steps)) is not None:
            scores = getattr(trainer, SCORES, None) or {}
            scores.update(score_sampled(trainer, batch))
            setattr(trainer, SCORES, scores)
        return batch, metrics

    return scored


def _patch(module: ModuleType) -> None:
    trainer = module.PPOTrainer
    build, compute = trainer._build_replay_buffer, trainer._compute_old_log_prob

    def _build_replay_buffer(self: Any, *args: Any, **kwargs: Any) -> Any:
        buffer = build(self, *args, **kwargs)
        buffer.sample = _scoring_sample(self, buffer.sample)
        return buffer

    def _compute_old_log_prob(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        batch = compute(self, batch, *args, **kwargs)
        stage_dir = enabled(int(self.global_steps))
        if stage_dir is not None:
            count = write_scored(self, batch, getattr(self, SCORES, None) or {}, stage_dir)
            setattr(self, SCORES, None)
            print(
                f"precision gate: {ROLLOUT_COMPUTE_LOG_PROB} of step {self.global_steps}: the rollout engine scored "
                f"{count} pinned responses teacher-forced, as the trainer took them from its replay buffer",
                flush=True,
            )
        return batch

    trainer._build_replay_buffer, trainer._compute_old_log_prob = _build_replay_buffer, _compute_old_log_prob


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
