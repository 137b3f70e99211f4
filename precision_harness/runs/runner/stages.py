"""The verl stages, each a plain function over a batch dict of tensors.

Shapes: ``B`` sequences (prompts x rollout.n), prompt length ``P``, response length ``R``.
A stage reads and returns tensors; a training stage also returns its metrics (verl's names).
Semantics follow verl's ``workers/actor/dp_actor.py`` and ``workers/critic/dp_critic.py``:
mini-batches of ``ppo_mini_batch_size x n`` sequences in order (no shuffle), micro-batches of
``ppo_micro_batch_size_per_gpu``, loss scaled by ``micro / mini`` for gradient accumulation, grad-norm
clipping, one optimizer step per mini-batch, ``ppo_epochs`` passes.
With ``trainer.world_size > 1`` the ``dp`` decorators (``runner/distributed.py``) give each rank its
shard of the batch, gather no-grad results back and all-reduce gradients before every optimizer step;
mini-batches are then ``ppo_mini_batch_size x n / world_size`` sequences per rank, as in verl.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch

from precision_harness.runs.runner import algorithms as core_algos
from precision_harness.runs.runner import distributed as dp

Batch = dict[str, torch.Tensor]


def split(batch: Batch, size: int) -> Iterator[Batch]:
    """Consecutive chunks of ``size`` rows (verl ``DataProto.split``)."""
    total = next(iter(batch.values())).shape[0]
    for start in range(0, total, size):
        yield {k: v[start : start + size] for k, v in batch.items()}


def accumulation_scale(micro: Batch, mini: Batch) -> float:
    """The gradient-accumulation scale of one micro-batch's loss: its rows over its mini-batch's."""
    return micro["responses"].shape[0] / mini["responses"].shape[0]


def _forward_logits(model: torch.nn.Module, mb: Batch, response_length: int) -> torch.Tensor:
    out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"])
    # logits at position t predict token t+1: the response tokens are predicted by [-R-1, -1)
    return out.logits[:, -response_length - 1 : -1, :]


def forward_log_prob(
    model: torch.nn.Module, mb: Batch, *, temperature: float, calculate_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``(b, R)`` of ``mb["responses"]`` under ``model``, and entropy ``(b, R)`` if asked.

    Logits are divided by ``temperature`` and taken in fp32 (verl ``DataParallelPPOActor._forward_micro_batch``).
    """
    # float(): an L1 dump records div's argument with its type, and goldens hold a float for any temperature
    logits = _forward_logits(model, mb, mb["responses"].shape[1]).float().div(float(temperature))
    log_probs = core_algos.logprobs_from_logits(logits, mb["responses"])
    entropy = core_algos.entropy_from_logits(logits) if calculate_entropy else None
    return log_probs, entropy


@torch.no_grad()
@dp.dp_compute
def compute_log_prob(
    model: torch.nn.Module, batch: Batch, *, micro_batch_size: int, temperature: float, calculate_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Micro-batched no-grad log-probs (and entropy), ``(B, R)`` each (verl ``compute_log_prob``)."""
    keys = ("input_ids", "attention_mask", "position_ids", "responses")
    lps, ents = [], []
    for mb in split({k: batch[k] for k in keys}, micro_batch_size):
        lp, ent = forward_log_prob(model, mb, temperature=temperature, calculate_entropy=calculate_entropy)
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), (torch.cat(ents) if calculate_entropy else None)


@torch.no_grad()
@dp.dp_compute
def compute_values(critic: torch.nn.Module, batch: Batch, *, micro_batch_size: int) -> torch.Tensor:
    """Values ``(B, R)`` from the critic's value head, zero outside ``response_mask`` (verl ``compute_values``)."""
    keys = ("input_ids", "attention_mask", "position_ids", "responses")
    values = [
        _forward_logits(critic, mb, mb["responses"].shape[1]).squeeze(-1).float()
        for mb in split({k: batch[k] for k in keys}, micro_batch_size)
    ]
    return torch.cat(values) * batch["response_mask"]


@torch.no_grad()
@dp.dp_compute
def compute_rm_score(reward_model: torch.nn.Module, batch: Batch, *, micro_batch_size: int) -> torch.Tensor:
    """Sequence scores ``(B,)`` from the reward model's last non-pad token.

    Source: verl ``RewardModelWorker.compute_rm_score``."""
    keys = ("input_ids", "attention_mask", "position_ids")
    scores = [
        reward_model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"])
        .logits.squeeze(-1)
        .float()
        for mb in split({k: batch[k] for k in keys}, micro_batch_size)
    ]
    return torch.cat(scores)


def _mini_batches(batch: Batch, keys: tuple[str, ...], mini_seqs: int, epochs: int) -> Iterator[Batch]:
    data = {k: batch[k] for k in keys if k in batch}
    for _ in range(epochs):
        yield from split(data, mini_seqs)


def _step(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    dp.average_gradients(params)  # data parallel: mean over ranks before clipping (no-op with one rank)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=grad_clip)
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


def _scalar(x: torch.Tensor | float) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def _mean_metrics(acc: dict[str, list[float]]) -> dict[str, float]:
    return {k: float(sum(v) / len(v)) for k, v in acc.items()}


def _trace_calls(trace: dict[str, Any] | None, batch: Batch, keys: tuple[str, ...], metrics: dict[str, list]) -> None:
    """Give ``trace`` this rank's ``inputs`` (``keys`` of ``batch``) and ``per_call`` metrics, before averaging."""
    if trace is not None:
        trace["inputs"] = {k: batch[k] for k in keys if k in batch}
        trace["per_call"] = {k: list(v) for k, v in metrics.items()}


@dp.dp_update
def critic_update(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    cfg: dict[str, Any],
    *,
    n: int,
    trace: dict[str, Any] | None = None,
) -> dict[str, float]:
    """PPO value-function update (verl ``DataParallelPPOCritic.update_critic``).

    Reads ``values`` (old values), ``returns``, ``response_mask`` ``(B, R)``. Returns metrics
    ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean``, ``critic/grad_norm``.
    If ``trace`` is a dict, it receives ``inputs`` (this rank's ``values`` and ``returns``) and
    ``per_call`` (each metric per micro-batch, ``grad_norm`` per mini-batch, before averaging).
    """
    critic.train()
    mini_seqs, micro = dp.per_rank(cfg["ppo_mini_batch_size"] * n), cfg["ppo_micro_batch_size_per_gpu"]
    keys = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "values", "returns")
    metrics: dict[str, list[float]] = defaultdict(list)
    params = [p for p in critic.parameters() if p.requires_grad]
    for mini in _mini_batches(batch, keys, mini_seqs, cfg["ppo_epochs"]):
        for mb in split(mini, micro):
            vpreds = _forward_logits(critic, mb, mb["responses"].shape[1]).squeeze(-1).float()
            vf_loss, vf_clipfrac = core_algos.compute_value_loss(
                vpreds=vpreds,
                returns=mb["returns"],
                values=mb["values"],
                response_mask=mb["response_mask"],
                cliprange_value=cfg["cliprange_value"],
                loss_agg_mode=cfg["loss_agg_mode"],
            )
            (vf_loss * (mb["responses"].shape[0] / mini["responses"].shape[0])).backward()
            metrics["critic/vf_loss"].append(_scalar(vf_loss))
            metrics["critic/vf_clipfrac"].append(_scalar(vf_clipfrac))
            metrics["critic/vpred_mean"].append(core_algos.masked_mean(vpreds, mb["response_mask"]).item())
        metrics["critic/grad_norm"].append(_step(params, optimizer, cfg["grad_clip"]))
    _trace_calls(trace, batch, ("values", "returns"), metrics)
    return _mean_metrics(metrics)


#: the batch keys an actor update reads (those a scenario does not produce are left out by _mini_batches)
_ACTOR_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "old_log_probs",
    "advantages",
    "ref_log_prob",
    "rollout_is_weights",
)
#: the metrics of compute_policy_loss_vanilla's four returns, in its order
_PG_METRICS = ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")


def _policy_loss(
    mb: Batch,
    log_prob: torch.Tensor,
    entropy: torch.Tensor | None,
    cfg: dict[str, Any],
    loss_config: Any,
    metrics: dict[str, list[float]],
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """One micro-batch's policy loss (before the accumulation scale) and compute_policy_loss_vanilla's four
    returns ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``: the policy-gradient loss, minus
    ``entropy_coeff`` x the entropy bonus when ``entropy`` is given, plus ``kl_loss_coef`` x the KL loss when
    ``use_kl_loss``; those two terms' metrics are appended to ``metrics`` here, before the backward, as verl does.
    Source: verl ``DataParallelPPOActor.update_policy``. ``log_prob``, ``entropy``: ``(b, R)``."""
    mask = mb["response_mask"]
    pg_terms = core_algos.compute_policy_loss_vanilla(
        old_log_prob=mb["old_log_probs"],
        log_prob=log_prob,
        advantages=mb["advantages"],
        response_mask=mask,
        config=loss_config,
        rollout_is_weights=mb.get("rollout_is_weights"),
    )
    policy_loss = pg_terms[0]
    if entropy is not None:
        entropy_loss = core_algos.agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=cfg["loss_agg_mode"])
        policy_loss = policy_loss - cfg["entropy_coeff"] * entropy_loss
        metrics["actor/entropy_loss"].append(_scalar(entropy_loss))
    if cfg["use_kl_loss"]:
        kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=mb["ref_log_prob"], kl_penalty=cfg["kl_loss_type"])
        kl_loss = core_algos.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=cfg["loss_agg_mode"])
        policy_loss = policy_loss + kl_loss * cfg["kl_loss_coef"]
        metrics["actor/kl_loss"].append(_scalar(kl_loss))
    return policy_loss, tuple(pg_terms)


@dp.dp_update
def actor_update(
    actor: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    cfg: dict[str, Any],
    *,
    rollout: dict[str, Any],
    trace: dict[str, Any] | None = None,
) -> dict[str, float]:
    """PPO policy update with dual-clip loss, entropy bonus and optional KL loss.

    Source: verl ``DataParallelPPOActor.update_policy``. ``cfg`` is the scenario's
    ``actor_rollout_ref.actor`` section, ``rollout`` its ``actor_rollout_ref.rollout``: the ``n``
    responses per prompt (mini-batches count prompts, as verl's) and the sampling ``temperature``
    the log-probs are recomputed at.

    Reads ``old_log_probs``, ``advantages``, ``response_mask`` and, when used, ``ref_log_prob`` and
    ``rollout_is_weights``, all ``(B, R)``. Returns metrics ``actor/pg_loss``, ``actor/pg_clipfrac``,
    ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``, ``actor/entropy_loss`` (when ``entropy_coeff != 0``),
    ``actor/kl_loss`` (when ``use_kl_loss``), ``actor/grad_norm``.

    If ``trace`` is a dict, it receives ``first_mini_batch_log_prob`` ``(ppo_mini_batch_size x n, R)``:
    the log-probs the first mini-batch of the first epoch recomputes before any optimizer step. On
    policy they must equal ``old_log_probs`` of the same rows (verl issue #2996); and ``inputs`` (this
    rank's ``old_log_probs``, ``advantages``, ``ref_log_prob``, ``rollout_is_weights`` where present)
    and ``per_call`` (each metric per micro-batch, ``grad_norm`` per mini-batch, before averaging).
    """
    actor.train()
    n, temperature = rollout["n"], rollout["temperature"]
    mini_seqs, micro = dp.per_rank(cfg["ppo_mini_batch_size"] * n), cfg["ppo_micro_batch_size_per_gpu"]
    loss_config = core_algos.PolicyLossConfig.from_actor(cfg)
    metrics: dict[str, list[float]] = defaultdict(list)
    params = [p for p in actor.parameters() if p.requires_grad]
    first: list[torch.Tensor] = []
    losses: list[torch.Tensor] = []  #: the loss each micro-batch backpropagates (scaled by micro / mini)
    for index, mini in enumerate(_mini_batches(batch, _ACTOR_KEYS, mini_seqs, cfg["ppo_epochs"])):
        for mb in split(mini, micro):
            log_prob, entropy = forward_log_prob(
                actor, mb, temperature=temperature, calculate_entropy=cfg["entropy_coeff"] != 0
            )
            if index == 0:
                first.append(log_prob.detach())
            policy_loss, pg_terms = _policy_loss(mb, log_prob, entropy, cfg, loss_config, metrics)
            scaled = policy_loss * accumulation_scale(mb, mini)
            scaled.backward()
            losses.append(scaled)  # a reference: an op here would enter an L1 dump
            # after backward, as verl reads them: each .detach() is a call an L1 dump records, in this order
            for name, term in zip(_PG_METRICS, pg_terms, strict=True):
                metrics[name].append(_scalar(term))
        metrics["actor/grad_norm"].append(_step(params, optimizer, cfg["grad_clip"]))
    if trace is not None:
        trace["first_mini_batch_log_prob"] = torch.cat(first)
    _trace_calls(
        trace, batch, ("old_log_probs", "advantages", "ref_log_prob", "rollout_is_weights"), {"loss": losses, **metrics}
    )
    return _mean_metrics(metrics)
