"""The short PPO loop: ``total_training_steps`` x (rollout -> stages -> metrics).

Order within a step is verl's ``RayPPOTrainer.fit``: weight sync -> generate (``rollout_generate``,
opt-in) -> reward (``compute_rm_score`` or the rule reward) -> ``actor_compute_log_prob`` ->
``ref_compute_log_prob`` -> ``compute_values`` -> advantage -> ``critic_update`` -> ``actor_update``.
Profiled (step, stage) pairs are dumped by :class:`StageProbe`; every stage is timed. Writes
``metrics.jsonl``, ``step_<n>/weight_sync.json``, ``step_<n>/log_probs.json`` (per-token log-probs
for the invariant checks of ``precision_tests/``) and ``run.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from precision_harness.dumps.sampled_tokens import SAMPLED_TOKENS
from precision_harness.dumps.sampled_tokens import payload as sampled_tokens_payload
from precision_harness.runs.numerics import devices, weight_sync
from precision_harness.runs.numerics.stage_outputs import StageOutputs
from precision_harness.runs.runner import algorithms as core_algos
from precision_harness.runs.runner import data as data_mod
from precision_harness.runs.runner import models, rollout, stages
from precision_harness.runs.runner.distributed import reduce_metrics
from precision_harness.runs.runner.rollout_is import (
    RolloutISConfig,
    compute_mismatch_metrics,
    compute_rollout_importance_weights,
)
from precision_harness.scenarios.profiling import ROLLOUT_GENERATE
from precision_harness.scenarios.scenario import Scenario

#: what actor_update's stage_outputs.json holds after its inputs: per micro-batch, then per mini-batch
ACTOR_LOSSES = ("loss", "actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/grad_norm")


@dataclass
class _Step:
    """What one step carries between its phases (kept out of ``batch``: stages micro-batch every batch key)."""

    step: int
    prompts: list[Any]
    batch: dict[str, torch.Tensor]
    metrics: dict[str, Any]
    scores: torch.Tensor | None = None  #: (B,) sequence scores
    token_level_scores: torch.Tensor | None = None  #: (B, R) scores on each sequence's last response token
    token_level_rewards: torch.Tensor | None = None  #: (B, R) scores, minus the KL penalty when in the reward
    advantages: torch.Tensor | None = None  #: (B, R), as computed (before the multi-rank test hook)
    returns: torch.Tensor | None = None  #: (B, R)


class Trainer:
    """Runs one :class:`~precision_harness.scenarios.scenario.Scenario` in this process.

    Which roles exist (critic, reference, reward model) and which (step, stage) pairs are profiled
    come from the Scenario, the same answers the plugin collects items from.
    """

    def __init__(self, scenario: Scenario, *, out_dir: Path, device: str) -> None:
        self.scenario, self.cfg, self.out_dir, self.device_name = scenario, scenario.config, Path(out_dir), device
        self.profiled_steps, self.profiled_stages = set(scenario.steps), set(scenario.stages)
        self.timings: dict[str, float] = {}
        #: a :class:`~precision_harness.runs.stage_api.StageProbe`, or None to run without dumps
        self.probe: Any = None
        #: the profiled stage's inputs and outputs while it runs (``level: auto``), else None
        self.io: StageOutputs | None = None

    # ------------------------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg = self.cfg
        trainer = cfg["trainer"]
        self.device = devices.setup(
            self.device_name,
            seed=cfg["seed"],
            num_threads=trainer["num_threads"],
            cpu_kernels=trainer["cpu_kernels"],
        )
        self.tok = models.ByteTokenizer()
        actor_cfg = cfg["actor_rollout_ref"]["actor"]
        self.actor_dtype = models.DTYPES[actor_cfg["dtype"]]
        self.rollout_dtype = models.DTYPES[cfg["actor_rollout_ref"]["rollout"]["dtype"]]
        self.actor = models.build_actor(cfg["model"], self.tok, seed=cfg["seed"]).to(self.device, self.actor_dtype)
        self.actor_optim = self._optimizer(self.actor, actor_cfg["optim"])
        #: the inference engine's own copy of the weights, synced from the actor before each rollout
        self.rollout_model = models.frozen_copy(self.actor, self.rollout_dtype)
        self.ref = models.frozen_copy(self.actor) if self.scenario.use_reference else None
        self.critic = self.critic_optim = self.reward_model = None
        if self.scenario.use_critic:
            self.critic = models.build_critic(cfg["model"], self.tok, seed=cfg["seed"]).to(self.device)
            self.critic_optim = self._optimizer(self.critic, cfg["critic"]["optim"])
        if self.scenario.use_reward_model:
            self.reward_model = models.frozen_copy(
                models.build_reward_model(cfg["model"], self.tok, seed=cfg["seed"]).to(self.device)
            )
        algo = cfg["algorithm"]
        kc = algo["kl_ctrl"]
        self.kl_ctrl = (
            core_algos.FixedKLController(kl_coef=kc["kl_coef"])
            if kc["type"] == "fixed"
            else core_algos.AdaptiveKLController(
                init_kl_coef=kc["kl_coef"], target_kl=kc["target_kl"], horizon=kc["horizon"]
            )
        )
        # a dedicated CPU generator: sampling is identical on every device
        self.generator = torch.Generator(device="cpu").manual_seed(cfg["seed"])

    @staticmethod
    def _optimizer(model: torch.nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            model.parameters(),
            lr=optim["lr"],
            betas=tuple(optim["betas"]),
            weight_decay=optim["weight_decay"],
            eps=optim["eps"],
            foreach=False,
        )

    # ------------------------------------------------------------------------------------ stages
    @contextmanager
    def stage(self, step: int, name: str, model: torch.nn.Module) -> Iterator[None]:
        """Time the body; dump it when (step, stage) is profiled, with ``stage_outputs.json`` at ``level: auto``."""
        profiled = self._profiled(step, name)
        self.io = StageOutputs() if profiled and self.scenario.localizes else None
        t0 = time.perf_counter()
        with self.probe.stage(step, name, model) if profiled else nullcontext() as dump_dir:
            yield
        if self.io is not None:  # after the debugger stopped: the statistics' ops stay out of the dump
            self.io.write(Path(dump_dir) / "step0" / f"rank{self.probe.rank}")
            self.io = None
        self.timings[f"step_{step}/{name}"] = round(time.perf_counter() - t0, 6)

    def _profiled(self, step: int, name: str) -> bool:
        return self.probe is not None and step in self.profiled_steps and name in self.profiled_stages

    def _output(self, name: str, value: torch.Tensor | None) -> None:
        if self.io is not None:
            self.io.output(name, value)

    def _record_update(self, trace: dict[str, Any], losses: tuple[str, ...]) -> None:
        """An update stage's inputs, then per micro-batch ``losses`` and per mini-batch ``grad_norm``."""
        if self.io is None:
            return
        for key, value in trace["inputs"].items():
            self.io.input(key, value)
        for metric in losses:
            self.io.outputs(metric.rsplit("/", 1)[-1], trace["per_call"].get(metric, []))

    def train_step(self, step: int) -> dict[str, Any]:
        """One PPO step in the order of verl's ``RayPPOTrainer.fit``; returns its metrics.

        generate -> reward -> old log-prob -> ref log-prob -> values -> rollout correction ->
        advantage -> update critic -> update actor. Profiled stages are dumped by :meth:`stage`.
        """
        st = self._generate_sequences(step)
        self._compute_reward(st)
        self._compute_old_log_prob(st)
        self._compute_ref_log_prob(st)
        self._compute_values(st)
        self._compute_rollout_correction(st)
        self._compute_advantage(st)
        self._update_critic(st)
        self._update_actor(st)
        return self._step_metrics(st)

    def _generate_sequences(self, step: int) -> _Step:
        """Rollout: weights synced into the inference engine (``rollout.dtype``), then sampling.

        Writes ``step_<n>/weight_sync.json`` (:func:`~precision_harness.runs.numerics.weight_sync.sync_record`).
        With ``rollout.log_prob_mode: recompute`` the rollout log-probs are recomputed over the whole
        sampled sequences (:func:`~precision_harness.runs.runner.rollout.recompute_log_probs`).
        """
        cfg, tok = self.cfg, self.tok
        rollout_cfg = cfg["actor_rollout_ref"]["rollout"]
        prompts = data_mod.arithmetic_prompts(seed=cfg["seed"], step=step, batch_size=cfg["data"]["train_batch_size"])
        encoded = rollout.encode_prompts(
            [p.text for p in prompts], tok, max_prompt_length=cfg["data"]["max_prompt_length"]
        )
        t0 = time.perf_counter()
        weight_sync.sync_weights(self.actor, self.rollout_model)
        record = weight_sync.sync_record(self.actor, self.rollout_model, step=step, dtype=self.rollout_dtype)
        weight_sync.write_sync_record(self.out_dir / f"step_{step}", record)
        # an opt-in stage: unprofiled, it is neither timed nor logged, as before it existed
        profiled = self._profiled(step, ROLLOUT_GENERATE)
        with self.stage(step, ROLLOUT_GENERATE, self.rollout_model) if profiled else nullcontext():
            batch = rollout.generate(
                self.rollout_model,
                encoded,
                n=rollout_cfg["n"],
                temperature=rollout_cfg["temperature"],
                limits=rollout.ResponseLimits(cfg["data"]["max_response_length"], tok.eos_token_id, tok.pad_token_id),
                generator=self.generator,
            )
            batch = {k: v.to(self.device) for k, v in batch.items()}
            if rollout_cfg.get("log_prob_mode", "sample") == "recompute":
                batch["rollout_log_probs"] = rollout.recompute_log_probs(
                    self.rollout_model,
                    batch,
                    micro_batch_size=rollout_cfg["log_prob_micro_batch_size_per_gpu"],
                    temperature=rollout_cfg["temperature"],
                )
            self._output("rollout_log_probs", batch["rollout_log_probs"])
        if profiled:
            rank_dir = self.out_dir / f"step_{step}" / ROLLOUT_GENERATE / "step0" / f"rank{self.probe.rank}"
            rank_dir.mkdir(parents=True, exist_ok=True)
            (rank_dir / SAMPLED_TOKENS).write_text(sampled_tokens_payload(batch["responses"].cpu().tolist()))
        self.timings[f"step_{step}/generate_sequences"] = round(time.perf_counter() - t0, 6)
        return _Step(step=step, prompts=prompts, batch=batch, metrics={"training/global_step": step})

    def _compute_reward(self, st: _Step) -> None:
        """Sequence scores (``compute_rm_score``, or the rule reward), placed on the last response token."""
        batch, mask, n = st.batch, st.batch["response_mask"], self.cfg["actor_rollout_ref"]["rollout"]["n"]
        if self.reward_model is not None:
            with self.stage(st.step, "compute_rm_score", self.reward_model):
                st.scores = stages.compute_rm_score(
                    self.reward_model, batch, micro_batch_size=self.cfg["reward_model"]["micro_batch_size_per_gpu"]
                )
                self._output("scores", st.scores)
        else:
            answers = [p.answer for p in st.prompts for _ in range(n)]
            texts = [self.tok.decode(row.tolist()) for row in batch["responses"].cpu()]
            rewards = [data_mod.rule_reward(t, a) for t, a in zip(texts, answers, strict=True)]
            st.scores = torch.tensor(rewards, dtype=torch.float32, device=self.device)
        last = (mask.sum(-1) - 1).clamp(min=0)
        st.token_level_scores = torch.zeros_like(batch["rollout_log_probs"])
        st.token_level_scores[torch.arange(mask.shape[0]), last] = st.scores

    def _compute_old_log_prob(self, st: _Step) -> None:
        """``actor_compute_log_prob``: the training engine's log-probs of the sampled tokens, and entropy."""
        rollout_cfg = self.cfg["actor_rollout_ref"]["rollout"]
        with self.stage(st.step, "actor_compute_log_prob", self.actor):
            self.actor.eval()
            old_log_probs, entropy = stages.compute_log_prob(
                self.actor,
                st.batch,
                micro_batch_size=rollout_cfg["log_prob_micro_batch_size_per_gpu"],
                temperature=rollout_cfg["temperature"],
                calculate_entropy=True,
            )
            self._output("old_log_probs", old_log_probs)
            self._output("entropy", entropy)
        st.batch["old_log_probs"] = old_log_probs
        st.metrics["actor/entropy"] = core_algos.masked_mean(entropy, st.batch["response_mask"]).item()

    def _compute_ref_log_prob(self, st: _Step) -> None:
        """``ref_compute_log_prob`` (when a reference policy runs)."""
        if self.ref is None:
            return
        ar = self.cfg["actor_rollout_ref"]
        with self.stage(st.step, "ref_compute_log_prob", self.ref):
            st.batch["ref_log_prob"], _ = stages.compute_log_prob(
                self.ref,
                st.batch,
                micro_batch_size=ar["ref"]["log_prob_micro_batch_size_per_gpu"],
                temperature=ar["rollout"]["temperature"],
                calculate_entropy=False,
            )
            self._output("ref_log_prob", st.batch["ref_log_prob"])

    def _compute_values(self, st: _Step) -> None:
        """``compute_values`` (when a critic runs)."""
        if self.critic is None:
            return
        with self.stage(st.step, "compute_values", self.critic):
            self.critic.eval()
            st.batch["values"] = stages.compute_values(
                self.critic, st.batch, micro_batch_size=self.cfg["critic"]["ppo_micro_batch_size_per_gpu"]
            )
            self._output("values", st.batch["values"])

    def _compute_rollout_correction(self, st: _Step) -> None:
        """Rollout importance sampling (verl's ``rollout_is_*``): mismatch metrics always, weights when enabled."""
        algo, batch = self.cfg["algorithm"], st.batch
        old, rollout_lp, mask = batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"]
        st.metrics.update(compute_mismatch_metrics(old_log_prob=old, rollout_log_prob=rollout_lp, response_mask=mask))
        if algo["rollout_is_threshold"] is None:
            return
        weights, is_metrics = compute_rollout_importance_weights(
            old_log_prob=old,
            rollout_log_prob=rollout_lp,
            response_mask=mask,
            config=RolloutISConfig.from_algorithm(algo),
        )
        st.metrics.update(is_metrics)
        if algo["rollout_is"]:
            batch["rollout_is_weights"] = weights

    def _compute_advantage(self, st: _Step) -> None:
        """KL penalty in the reward (``use_kl_in_reward``), then GAE or GRPO advantages and returns."""
        algo, batch, mask = self.cfg["algorithm"], st.batch, st.batch["response_mask"]
        st.token_level_rewards = st.token_level_scores
        if algo["use_kl_in_reward"]:
            st.token_level_rewards, kl_metrics = core_algos.apply_kl_penalty(
                token_level_scores=st.token_level_scores,
                old_log_probs=batch["old_log_probs"],
                ref_log_prob=batch["ref_log_prob"],
                response_mask=mask,
                kl_ctrl=self.kl_ctrl,
                kl_penalty=algo["kl_penalty"],
            )
            st.metrics.update(kl_metrics)
        if algo["adv_estimator"] == "gae":
            advantages, returns = core_algos.compute_gae_advantage_return(
                token_level_rewards=st.token_level_rewards,
                values=batch["values"],
                response_mask=mask,
                gamma=algo["gamma"],
                lam=algo["lam"],
            )
        else:
            uids = np.repeat(np.array([p.uid for p in st.prompts]), self.cfg["actor_rollout_ref"]["rollout"]["n"])
            advantages, returns = core_algos.compute_grpo_outcome_advantage(
                token_level_rewards=st.token_level_rewards,
                response_mask=mask,
                index=uids,
                norm_adv_by_std_in_grpo=algo["norm_adv_by_std_in_grpo"],
            )
        batch["advantages"], batch["returns"] = st.advantages, st.returns = advantages, returns

    def _update_critic(self, st: _Step) -> None:
        """``critic_update`` (when a critic runs)."""
        if self.critic is None:
            return
        n = self.cfg["actor_rollout_ref"]["rollout"]["n"]
        trace: dict[str, Any] = {}
        with self.stage(st.step, "critic_update", self.critic):
            st.metrics.update(
                stages.critic_update(self.critic, self.critic_optim, st.batch, self.cfg["critic"], n=n, trace=trace)
            )
            self._record_update(trace, ("critic/vf_loss", "critic/grad_norm"))

    def _update_actor(self, st: _Step) -> None:
        """``actor_update``; writes ``step_<n>/log_probs.json`` with its first mini-batch's log-probs."""
        ar = self.cfg["actor_rollout_ref"]
        trace: dict[str, Any] = {}
        with self.stage(st.step, "actor_update", self.actor):
            st.metrics.update(
                stages.actor_update(
                    self.actor, self.actor_optim, st.batch, ar["actor"], rollout=ar["rollout"], trace=trace
                )
            )
            self._record_update(trace, ACTOR_LOSSES)
        self._write_log_probs(st.step, st.batch, trace["first_mini_batch_log_prob"])

    @staticmethod
    def _step_metrics(st: _Step) -> dict[str, Any]:
        """The step's metrics with verl's data metrics (``critic/score/mean`` ...) added."""
        batch, mask = st.batch, st.batch["response_mask"]
        st.metrics.update(
            {
                "critic/score/mean": st.scores.mean().item(),
                "critic/rewards/mean": core_algos.masked_sum(st.token_level_rewards, mask).item() / mask.shape[0],
                "critic/advantages/mean": core_algos.masked_mean(st.advantages, mask).item(),
                "critic/returns/mean": core_algos.masked_mean(st.returns, mask).item(),
                "response_length/mean": mask.sum(-1).float().mean().item(),
            }
        )
        if "values" in batch:
            st.metrics["critic/values/mean"] = core_algos.masked_mean(batch["values"], mask).item()
        return st.metrics

    def _write_log_probs(self, step: int, batch: dict[str, torch.Tensor], first_mini_batch: torch.Tensor) -> None:
        """Write ``step_<n>/log_probs.json``: the per-token log-probs the invariant checks read.

        Plain JSON (``precision_tests/`` never imports torch), every tensor ``(B, R)`` as nested
        lists of floats (fp32 values are exact in JSON's float64), 0 outside ``response_mask``, with
        the sampled token ids ``responses`` and ``response_mask``:
        ``rollout_log_probs`` (rollout engine, ``rollout.dtype``), ``old_log_probs``
        (``actor_compute_log_prob``), ``ref_log_prob`` (when a reference runs) and
        ``actor_update_first_mini_batch`` (the first ``ppo_mini_batch_size x n`` rows, recomputed by
        ``actor_update`` before its first optimizer step), plus the micro-batch sizes that produced them.
        """
        ar = self.cfg["actor_rollout_ref"]
        mask = batch["response_mask"]

        def rows(t: torch.Tensor) -> list[list[float]]:
            return (t.detach().float() * mask[: t.shape[0]]).cpu().tolist()

        out: dict[str, Any] = {
            "step": step,
            "micro_batch_sizes": {
                "actor_compute_log_prob": ar["rollout"]["log_prob_micro_batch_size_per_gpu"],
                "ref_compute_log_prob": ar["ref"]["log_prob_micro_batch_size_per_gpu"],
                "actor_update": ar["actor"]["ppo_micro_batch_size_per_gpu"],
            },
            "responses": batch["responses"].cpu().tolist(),
            "response_mask": mask.cpu().tolist(),
            "rollout_log_probs": rows(batch["rollout_log_probs"]),
            "old_log_probs": rows(batch["old_log_probs"]),
            "actor_update_first_mini_batch": rows(first_mini_batch),
        }
        if "ref_log_prob" in batch:
            out["ref_log_prob"] = rows(batch["ref_log_prob"])
        step_dir = self.out_dir / f"step_{step}"
        step_dir.mkdir(parents=True, exist_ok=True)
        (step_dir / "log_probs.json").write_text(json.dumps(out, separators=(",", ":")) + "\n", encoding="utf-8")

    def fit(self) -> None:
        """Run every step, appending one JSON object per step to ``metrics.jsonl``."""
        with open(self.out_dir / "metrics.jsonl", "w", encoding="utf-8") as fh:
            for step in range(1, self.cfg["trainer"]["total_training_steps"] + 1):
                metrics = reduce_metrics(self.train_step(step))  # mean over ranks; unchanged with one rank
                fh.write(json.dumps(metrics, sort_keys=True) + "\n")
                fh.flush()
