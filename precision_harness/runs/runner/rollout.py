"""Seeded sampling of responses and their rollout log-probs (verl's ``generate_sequences``).

Layout as verl's rollout output: ``input_ids = [prompt (left-padded) | response (right-padded)]``,
``position_ids = cumsum(attention_mask) - 1`` clipped at 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from precision_harness.runs.runner.models import ByteTokenizer


def encode_prompts(texts: list[str], tok: ByteTokenizer, *, max_prompt_length: int) -> dict[str, torch.Tensor]:
    """Left-pad prompts to ``max_prompt_length``.

    Returns ``input_ids`` and ``attention_mask``, both ``(bs, max_prompt_length)`` int64.

    Raises:
        ValueError: a prompt is longer than ``max_prompt_length`` tokens.
    """
    ids = [tok.encode(t) for t in texts]
    too_long = [t for t, i in zip(texts, ids, strict=True) if len(i) > max_prompt_length]
    if too_long:
        raise ValueError(f"data.max_prompt_length: prompt {too_long[0]!r} needs more than {max_prompt_length} tokens")
    input_ids = torch.full((len(ids), max_prompt_length), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, seq in enumerate(ids):
        input_ids[row, max_prompt_length - len(seq) :] = torch.tensor(seq)
        mask[row, max_prompt_length - len(seq) :] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(bs, seq_len)`` positions that skip left padding (verl ``compute_position_id_with_mask``)."""
    return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)


@dataclass(frozen=True)
class ResponseLimits:
    """Where a sampled response ends: after ``max_length`` tokens (``data.max_response_length``) or at
    ``eos_token_id``; the rest of its row is ``pad_token_id`` (the tokenizer's)."""

    max_length: int
    eos_token_id: int
    pad_token_id: int


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: dict[str, torch.Tensor],
    *,
    n: int,
    temperature: float,
    limits: ResponseLimits,
    generator: torch.Generator,
) -> dict[str, Any]:
    """Sample ``n`` responses per prompt from ``model`` (in whatever dtype it holds), each within ``limits``.

    Each prompt row is repeated ``n`` times consecutively (verl's ``repeat(interleave=True)``).
    Tokens are drawn with :func:`torch.multinomial` from ``softmax(logits / temperature)`` in fp32,
    using ``generator`` (CPU), so sampling is reproducible across devices.

    Returns a dict of tensors: ``prompts`` ``(bs*n, P)``, ``responses`` ``(bs*n, R)``, ``input_ids``,
    ``attention_mask`` and ``position_ids`` ``(bs*n, P+R)``, ``response_mask`` ``(bs*n, R)`` (1 up to
    and including eos), and ``rollout_log_probs`` ``(bs*n, R)``: log-probs of the sampled tokens
    under the rollout model with the same temperature (what vLLM/SGLang return), 0 on padding.
    """
    max_response_length, eos_token_id, pad_token_id = limits.max_length, limits.eos_token_id, limits.pad_token_id
    prompt_ids = prompts["input_ids"].repeat_interleave(n, dim=0)
    prompt_mask = prompts["attention_mask"].repeat_interleave(n, dim=0)
    bsz = prompt_ids.shape[0]
    device = next(model.parameters()).device
    seq, mask = prompt_ids.to(device), prompt_mask.to(device)
    responses = torch.full((bsz, max_response_length), pad_token_id, dtype=torch.long)
    log_probs = torch.zeros((bsz, max_response_length), dtype=torch.float32)
    finished = torch.zeros(bsz, dtype=torch.bool)
    for t in range(max_response_length):
        logits = model(input_ids=seq, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, -1, :]
        logp = torch.log_softmax(logits.float().cpu() / temperature, dim=-1)
        token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        token = torch.where(finished, torch.full_like(token, pad_token_id), token)
        responses[:, t] = token
        log_probs[:, t] = torch.where(finished, 0.0, logp.gather(-1, token.unsqueeze(-1)).squeeze(-1))
        finished |= token == eos_token_id
        seq = torch.cat([seq, token.unsqueeze(-1).to(device)], dim=-1)
        mask = torch.cat([mask, (~finished | (token == eos_token_id)).long().unsqueeze(-1).to(device)], dim=-1)
        if bool(finished.all()):
            responses_left = max_response_length - t - 1
            if responses_left:
                seq = torch.cat(
                    [seq, torch.full((bsz, responses_left), pad_token_id, dtype=torch.long, device=device)], dim=-1
                )
                mask = torch.cat([mask, torch.zeros((bsz, responses_left), dtype=torch.long, device=device)], dim=-1)
            break
    response_mask = mask[:, prompt_ids.shape[1] :].cpu()
    attention_mask = mask.cpu()
    return {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": seq.cpu(),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "response_mask": response_mask,
        "rollout_log_probs": log_probs * response_mask,
    }


def recompute_log_probs(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], *, micro_batch_size: int, temperature: float
) -> torch.Tensor:
    """``rollout_log_probs`` ``(bs*n, R)`` of the sampled responses, recomputed by the rollout model in one
    forward over each whole sequence (``actor_rollout_ref.rollout.log_prob_mode: recompute``).

    Token-by-token generation runs the rollout model on growing prefixes, other matmul shapes than
    the training engine's one forward over the finished sequence, so its log-probs differ from
    ``old_log_prob`` in the last bits even with the same weights and dtype. Recomputed with the same
    function, micro-batch size and temperature as ``actor_compute_log_prob``
    (:func:`~precision_harness.runs.runner.stages.compute_log_prob`), a rollout model holding the actor's
    exact weights in the actor's dtype gives ``old_log_prob`` bit for bit: the
    ``rollout_log_prob_parity: exact`` invariant (docs/consistency.md). 0 on padding.
    """
    from precision_harness.runs.runner import stages

    log_probs, _ = stages.compute_log_prob(
        model, batch, micro_batch_size=micro_batch_size, temperature=temperature, calculate_entropy=False
    )
    return log_probs * batch["response_mask"]
