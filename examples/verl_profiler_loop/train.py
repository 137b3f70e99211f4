"""A small PPO-style loop instrumented with verl's own precision debugger profiler (verl 0.9.1).

It is what a team's training code looks like to the gate: verl's ``DistProfiler`` with
``tool=precision_debugger``, stage methods annotated as verl's workers annotate them
(``@DistProfiler.annotate(role="actor_update")``), started and stopped per profiled global step as
verl's trainer does. Run by a command scenario (``scenarios/verl_loop.yaml``), it reads what the
gate gives every command:

    PRECISION_DUMP_DIR        verl's global_profiler.save_path
    PRECISION_MSPROBE_CONFIG  precision_debugger.config_path
    PRECISION_STEPS           global_profiler.steps
    PRECISION_STAGES          precision_debugger.stages
    PRECISION_METRICS         where to write metrics.jsonl

``EXAMPLE_ADVANTAGE_SCALE`` (default 1) scales step 2's advantages: the numeric change the gate
must catch at ``actor_update @ step_2`` in this example's test.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from verl.utils.profiler import DistProfiler, ProfilerConfig
from verl.utils.profiler.config import PrecisionDebuggerToolConfig

VOCAB, HIDDEN, BATCH, LENGTH, TOTAL_STEPS = 32, 16, 4, 6, 2


def env_list(name: str) -> list[str]:
    return [x for x in os.environ.get(name, "").split(",") if x]


class Policy(torch.nn.Module):
    """Token policy: embedding -> MLP -> logits ``(batch, length, vocab)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, VOCAB))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(tokens))


def log_probs(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability of each token ``(batch, length)`` (verl's ``logprobs_from_logits``)."""
    logits = model(tokens)
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class ActorRolloutRefWorker:
    """The worker verl's profiler resolves models on: ``actor_module`` and ``ref_module``."""

    def __init__(self, profiler: DistProfiler) -> None:
        self.profiler = profiler
        self.actor_module = Policy()
        self.ref_module = copy.deepcopy(self.actor_module).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.actor_module.parameters(), lr=1e-2, foreach=False)
        self.global_step = 0

    @DistProfiler.annotate(role="actor_compute_log_prob")
    def compute_log_prob(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return log_probs(self.actor_module, tokens)

    @DistProfiler.annotate(role="ref_compute_log_prob")
    def compute_ref_log_prob(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return log_probs(self.ref_module, tokens)

    @DistProfiler.annotate(role="actor_update")
    def update_actor(self, tokens: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor) -> float:
        ratio = torch.exp(log_probs(self.actor_module, tokens) - old)
        loss = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dump_dir = Path(os.environ["PRECISION_DUMP_DIR"])
    dump_dir.mkdir(parents=True, exist_ok=True)
    # verl starts msprobe without a rank_id: a process group makes the folder rank0, not proc<pid>
    dist.init_process_group("gloo", init_method=f"file://{dump_dir / '.process_group'}", rank=0, world_size=1)
    steps = [int(s) for s in env_list("PRECISION_STEPS")]
    config = ProfilerConfig(tool="precision_debugger", enable=True, save_path=str(dump_dir), tool_config=None)
    tool = PrecisionDebuggerToolConfig(
        config_path=os.environ["PRECISION_MSPROBE_CONFIG"], stages=env_list("PRECISION_STAGES"), strict=True
    )
    worker = ActorRolloutRefWorker(DistProfiler(rank=0, config=config, tool_config=tool))
    generator = torch.Generator().manual_seed(1)
    with open(os.environ["PRECISION_METRICS"], "w", encoding="utf-8") as metrics:
        for step in range(1, TOTAL_STEPS + 1):
            tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
            advantages = torch.randn(BATCH, LENGTH, generator=generator)
            if step == 2:
                advantages = advantages * float(os.environ.get("EXAMPLE_ADVANTAGE_SCALE", "1"))
            worker.global_step = step
            if step in steps:
                worker.profiler.start(global_step=step)
            old = worker.compute_log_prob(tokens)
            ref = worker.compute_ref_log_prob(tokens)
            loss = worker.update_actor(tokens, old, advantages)
            if step in steps:
                worker.profiler.stop()
            row = {"training/global_step": step, "actor/pg_loss": loss, "actor/kl": (old - ref).mean().item()}
            metrics.write(json.dumps(row) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
