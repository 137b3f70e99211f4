"""The rollout server of the replica ``precision_cpu``: responses sampled from the current policy on the CPU.

verl 0.9.1 has no in-tree CPU rollout (``HFRollout`` no longer matches ``BaseRollout``'s constructor
and is not in its registry), so this server does what vLLM's server does for verl, with
transformers' Qwen2 in the rollout dtype (``actor_rollout_ref.rollout.dtype``, bf16 by default):

- :meth:`PolicyServer.generate` samples one response token by token with a KV cache, from a
  ``torch.Generator`` seeded per request (``sampling_params["seed"]``, set by the agent loop
  :mod:`.agent_loop` from the prompt's index, the step and the sample, never the global RNG), and
  returns one log-prob per returned token, EOS included: ``log_softmax`` in float32 of the logits
  after temperature, top-k and top-p (vLLM's ``logprobs_mode: processed_logprobs``; verl turns them
  into ``rollout_log_probs``).
- :meth:`PolicyServer.generate` asked for ``prompt_logprobs: 0`` samples nothing: it computes the log-prob of
  each token of ``prompt_ids`` after the ones before it, teacher-forced (one forward), under the same processed
  distribution it samples from, and returns them in ``extra_fields["prompt_logprobs"]`` in the layout verl's
  vLLM and SGLang servers return vLLM's ``prompt_logprobs`` in (:func:`prompt_logprobs_fields`). A check with
  pinned rollouts asks it, through that same call, for each pinned prompt plus response after the weight
  sync (:mod:`precision_harness.runs.verl.engine_scoring`), so the engine is gated though it samples
  nothing.
- :meth:`PolicyServer.load_weights` takes the actor's weights from verl's own sync
  (``ActorRolloutRefWorker.update_weights``, through :class:`~.rollout.CPUServerAdapter`), casts each to
  the rollout dtype and copies it into the parameter of the same name, as vLLM's loader does.

What it records under ``PRECISION_DUMP_DIR`` (verl's ``global_profiler.save_path``) for the gate:

- ``step_<n>/weight_sync.json``: per parameter, the sha256 of the actor's tensor cast to the rollout
  dtype (computed on the trainer side) and of the rollout model's tensor after the load
  (:mod:`precision_harness.runs.numerics.weight_sync`'s format; the ``weight_sync`` invariant reads it).
  The sync with ``global_steps = g`` (after step g's update; 0 at start-up) serves step ``g + 1``.
- ``step_<n>/rollout_generate/step0/rank0/sampled_tokens.json`` and ``dump.json``, when the scenario
  declares ``rollout_generate`` for that step: the sampled tokens, one row per (prompt index, sample),
  padded with -1, and per row the statistics of its log-probs (``Stage.rollout_log_probs.<row>.forward``).

The server's kernels are the trainer's portable ones with one difference, :data:`ROLLOUT_SPLIT_K`: a
rollout engine's kernels are not the trainer's (vLLM's decode GEMMs reduce over ``k`` in another order
than FSDP's training GEMMs), and without a difference the training forward would recompute the
rollout's log-probs bit for bit, leaving rollout correction nothing to measure.

Requests are served one at a time (a lock): each is a batch of one with its own generator, so
what it returns does not depend on which other requests arrived, or when.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import torch

from precision_harness.dumps.files import DUMP
from precision_harness.dumps.sampled_tokens import SAMPLED_TOKENS, payload
from precision_harness.runs.numerics.stage_outputs import tensor_statistics
from precision_harness.runs.numerics.weight_sync import WEIGHT_SYNC_FILE, tensor_digest
from precision_harness.runs.verl.stages import timeline

ROLLOUT_GENERATE = "rollout_generate"
#: the key the agent loop adds to sampling_params: ``[prompt index, global step, sample]`` of the request
SAMPLE_KEY = "precision_sample"
#: padding of a sampled_tokens.json row after its last token (never a token id)
PAD = -1
#: the rollout's matrix products sum k in blocks of 16, as the split-K decode GEMMs of GPU inference engines
#: do; the trainer sums k in one pass. Both portable; the two differ in rounding as vLLM and FSDP do.
ROLLOUT_SPLIT_K = 16


def processed_logits(logits: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Float32 logits ``[V]`` after temperature, top-k (-1 or 0: off) and top-p (1: off), as vLLM applies them.

    Tokens removed by top-k/top-p get ``-inf``. Temperature 0 is refused here (greedy is not sampling).
    """
    temperature = float(params.get("temperature", 1.0))
    if temperature <= 0:
        raise ValueError("precision_cpu samples with temperature > 0 (rollout.temperature)")
    x = logits.float() / temperature
    top_k = int(params.get("top_k", -1) or -1)
    if 0 < top_k < x.numel():
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    top_p = float(params.get("top_p", 1.0))
    if top_p < 1.0:
        order = torch.argsort(x, descending=True, stable=True)
        probs = torch.softmax(x[order], dim=-1)
        outside = torch.cumsum(probs, dim=-1) - probs > top_p  # keep the smallest prefix reaching top_p
        x = x.clone()
        x[order[outside]] = float("-inf")
    return x


@torch.no_grad()
def sample_response(model: Any, prompt_ids: list[int], params: dict[str, Any], *, seed: int, eos: set[int]) -> tuple:
    """One response sampled from ``model`` (a transformers causal LM) for ``prompt_ids``.

    ``params``: verl's sampling params (``temperature``, ``top_k``, ``top_p``, ``max_tokens``). Decoding
    stops after an EOS id (kept) or ``max_tokens`` tokens.

    Returns:
        ``(token_ids, log_probs, stop_reason)``: lists of equal length; log-probs of the sampled tokens
        under the processed distribution, float32 as Python floats; ``"completed"``.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    max_tokens = int(params["max_tokens"])
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    past = None
    tokens: list[int] = []
    log_probs: list[float] = []
    for _ in range(max_tokens):
        out = model(input_ids=ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logp = torch.log_softmax(processed_logits(out.logits[0, -1], params), dim=-1)
        token = int(torch.multinomial(logp.exp(), 1, generator=generator).item())
        tokens.append(token)
        log_probs.append(float(logp[token]))
        if token in eos:
            break
        ids = torch.tensor([[token]], dtype=torch.long)
    return tokens, log_probs, "completed"


@torch.no_grad()
def prompt_log_probs(model: Any, token_ids: list[int], params: dict[str, Any]) -> list[float]:
    """The log-prob of each of ``token_ids`` but the first after the tokens before it, teacher-forced: one forward
    of ``token_ids`` (``[1, L]``, int64), then ``log_softmax`` in float32 of each position's processed logits
    (:func:`processed_logits`, as :func:`sample_response` samples from them).

    Returns:
        ``L - 1`` float32 log-probs as Python floats: vLLM's ``prompt_logprobs=0`` values of positions 1 to L - 1.

    Raises:
        ValueError: fewer than two tokens, or temperature <= 0.
    """
    if len(token_ids) < 2:
        raise ValueError("precision_cpu: scoring needs at least two tokens (a prompt and a response)")
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    logits = model(input_ids=ids, use_cache=False).logits[0]
    out = []
    for position in range(1, len(token_ids)):  # position i's token is predicted by the logits of position i - 1
        logp = torch.log_softmax(processed_logits(logits[position - 1], params), dim=-1)
        out.append(float(logp[token_ids[position]]))
    return out


def prompt_logprobs_fields(token_ids: list[int], log_probs: list[float]) -> dict[str, list[list[Any]]]:
    """``extra_fields``' ``prompt_logprobs`` and ``prompt_ids`` for ``prompt_logprobs=0``, as verl 0.9.1's servers
    lay them out (``extract_prompt_logprobs`` in ``verl/workers/rollout/vllm_rollout/utils.py``, and its SGLang
    twin): one one-element list per position from the second (the first token has no context), then a dummy
    ``[0.0]`` (``[0]``), so both hold ``len(token_ids)`` rows."""
    return {
        "prompt_logprobs": [[float(lp)] for lp in log_probs] + [[0.0]],
        "prompt_ids": [[int(t)] for t in token_ids[1:]] + [[0]],
    }


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_stage_dump(rank_dir: Path, data: dict[str, Any], **fields: Any) -> None:
    """``rank_dir/dump.json`` of a stage the gate records itself (``rollout_generate``, ``rollout_compute_log_prob``):
    msprobe's statistics layout with ``data`` and any further top-level ``fields``, replaced atomically."""
    _write_json(rank_dir / DUMP, {"task": "statistics", "level": "L1", "framework": "pytorch", **fields, "data": data})


class StepRecords:
    """What the server sampled at one step, in (prompt index, sample) order, written as the gate reads it."""

    def __init__(self, stage_dir: Path) -> None:
        self.stage_dir = stage_dir
        self.rows: dict[tuple[int, int], tuple[list[int], list[float]]] = {}

    def add(self, index: int, sample: int, tokens: list[int], log_probs: list[float]) -> None:
        self.rows[(index, sample)] = (tokens, log_probs)
        self.write()

    def write(self) -> None:
        rank_dir = self.stage_dir / "step0" / "rank0"
        keys = sorted(self.rows)
        width = max(len(self.rows[k][0]) for k in keys)
        responses = [self.rows[k][0] + [PAD] * (width - len(self.rows[k][0])) for k in keys]
        rank_dir.mkdir(parents=True, exist_ok=True)
        (rank_dir / SAMPLED_TOKENS).write_text(payload(responses), encoding="utf-8")
        data = {
            f"Stage.rollout_log_probs.{row}.forward": {
                "output": [tensor_statistics(torch.tensor(self.rows[k][1], dtype=torch.float32))]
            }
            for row, k in enumerate(keys)
        }
        write_stage_dump(rank_dir, data)


class PolicyServer:
    """One replica's server actor (see the module docstring)."""

    def __init__(self, *, model_path: str, dtype: str, response_length: int, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM

        from precision_harness.runs.verl.cpu import kernels

        kernels.setup_process(split_k=ROLLOUT_SPLIT_K)
        self.dtype = getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, torch_dtype=self.dtype, attn_implementation="sdpa", local_files_only=True
        ).eval()
        eos = self.model.generation_config.eos_token_id or self.model.config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.response_length = response_length
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self.lock = threading.Lock()
        dump_dir = os.environ.get("PRECISION_DUMP_DIR")
        self.dump_dir = Path(dump_dir) if dump_dir else None
        self.steps = {int(s) for s in os.environ.get("PRECISION_STEPS", "").split(",") if s}
        self.records_rollout = ROLLOUT_GENERATE in os.environ.get("PRECISION_STAGES", "").split(",")
        self.records: dict[int, StepRecords] = {}
        timeline.process_ready()  # the server imports verl only at its first request: its start-up ends here

    def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        if sampling_params.get("prompt_logprobs") is not None:
            return TokenOutput(
                token_ids=[],
                log_probs=None,
                stop_reason="completed",
                extra_fields=self._score(list(prompt_ids), dict(sampling_params)),
            )
        if "seed" not in sampling_params or SAMPLE_KEY not in sampling_params:
            raise RuntimeError(
                "precision_cpu: a request without a seed; the gate's agent loop (precision_cpu_single_turn, "
                "actor_rollout_ref.rollout.agent.default_agent_loop) seeds each request"
            )
        params = dict(sampling_params)
        params.setdefault("max_tokens", self.response_length)
        with self.lock:
            tokens, log_probs, stop = sample_response(
                self.model, list(prompt_ids), params, seed=int(params["seed"]), eos=self.eos
            )
            self._record(params[SAMPLE_KEY], tokens, log_probs)
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs if params.get("logprobs") else None,
            stop_reason=stop,
            extra_fields={"global_steps": self.global_steps},
        )

    def _score(self, token_ids: list[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
        """A ``prompt_logprobs`` request's ``extra_fields`` (:func:`prompt_log_probs`, :func:`prompt_logprobs_fields`)
        under the weights of the last sync; served under the lock, as a request is, so a sync never lands halfway.

        Raises:
            ValueError: ``prompt_logprobs`` other than 0 (the top-k alternatives are not served).
        """
        if int(sampling_params["prompt_logprobs"]) != 0:
            raise ValueError("precision_cpu: only prompt_logprobs=0 is served (each prompt token's own log-prob)")
        with self.lock:
            log_probs = prompt_log_probs(self.model, token_ids, sampling_params)
        return {"global_steps": self.global_steps, **prompt_logprobs_fields(token_ids, log_probs)}

    def _record(self, sample: list[int], tokens: list[int], log_probs: list[float]) -> None:
        index, step, session = (int(v) for v in sample)
        if self.dump_dir is None or not self.records_rollout or step not in self.steps:
            return
        if step not in self.records:
            self.records[step] = StepRecords(self.dump_dir / f"step_{step}" / ROLLOUT_GENERATE)
        self.records[step].add(index, session, tokens, log_probs)

    def load_weights(self, weights: list[tuple[str, torch.Tensor]], global_steps: int | None, actor: dict) -> int:
        """Copy the actor's tensors (HF names, any dtype) into the model, cast to its dtype; record the sync.

        ``actor``: the sha256 of each tensor cast to the rollout dtype, computed on the trainer side.
        Returns the number of tensors loaded.

        Raises:
            KeyError: a name the rollout model does not have.
        """
        params = dict(self.model.named_parameters())
        with self.lock, torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor.to(params[name].dtype))
            self.global_steps = global_steps
        step = 1 if global_steps is None else int(global_steps) + 1
        if self.dump_dir is not None and step in self.steps:
            _write_json(self.dump_dir / f"step_{step}" / WEIGHT_SYNC_FILE, self.sync_record(step, actor))
        print(f"[precision_cpu] replica {self.replica_rank}: {len(weights)} tensors loaded for step {step}", flush=True)
        return len(weights)

    def sync_record(self, step: int, actor: dict[str, str]) -> dict[str, Any]:
        """The ``weight_sync.json`` record: the actor's digest against the rollout model's, by name."""
        rows = []
        for name, held in self.model.named_parameters():
            rows.append(
                {
                    "name": name,
                    "shape": list(held.shape),
                    "actor": actor.get(name),
                    "rollout": tensor_digest(held),
                    "rollout_tensor_dtype": str(held.dtype).removeprefix("torch."),
                }
            )
        known = {row["name"] for row in rows}
        rows += [
            {"name": n, "shape": None, "actor": d, "rollout": None, "rollout_tensor_dtype": None}
            for n, d in actor.items()
            if n not in known
        ]
        return {"step": step, "rollout_dtype": str(self.dtype).removeprefix("torch."), "parameters": rows}

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


def request_seed(base: int, index: int, step: int, sample: int) -> int:
    """The seed of one request: a hash of the rollout seed, the prompt's index, the step and the sample (63 bits)."""
    key = hashlib.sha256(f"{base}|{index}|{step}|{sample}".encode()).digest()
    return int.from_bytes(key[:8], "little") & ((1 << 63) - 1)
