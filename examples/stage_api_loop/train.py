"""A training loop of your own, gated with the stage API (``precision_harness.stage``), no verl needed.

Each verl stage the loop runs is wrapped in ``precision_harness.stage(name, step=..., model=...)``.
Run by the gate (``scenarios/stage_loop.yaml``), the wrapped stages are dumped in verl's layout under
``$PRECISION_DUMP_DIR``; run on its own, the same loop trains and dumps nothing.
"""

from __future__ import annotations

import json
import os

import torch

import precision_harness

VOCAB, HIDDEN, BATCH, LENGTH, STEPS = 32, 16, 4, 6, 2


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    actor = torch.nn.Sequential(torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB))
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-2, foreach=False)
    generator = torch.Generator().manual_seed(1)
    metrics_path = os.environ.get("PRECISION_METRICS")
    rows = []
    for step in range(1, STEPS + 1):
        tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
        advantages = torch.randn(BATCH, LENGTH, generator=generator)
        with precision_harness.stage("actor_compute_log_prob", step=step, model=actor), torch.no_grad():
            old = torch.log_softmax(actor(tokens), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        with precision_harness.stage("actor_update", step=step, model=actor):
            new = torch.log_softmax(actor(tokens), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            loss = -(torch.exp(new - old) * advantages).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        rows.append({"training/global_step": step, "actor/pg_loss": loss.item()})
    if metrics_path:
        with open(metrics_path, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
