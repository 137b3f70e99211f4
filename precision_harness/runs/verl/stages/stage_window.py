"""One profiled verl stage on one rank, around verl's precision debugger: its clock and, at ``level: auto``, its I/O.

:func:`observe` wraps the call verl's ``PrecisionDebuggerProfiler`` makes (start the debugger, run the
stage, stop it; :mod:`.debugger`, patch 7, on every device), and the critic's stages the gate annotates on
the CPU (:mod:`precision_harness.runs.verl.cpu.patches`, patch 4). For a stage the debugger collects at this step:

- the stage is timed, with its time inside msprobe, into the run's timeline (:class:`.timeline.StageClock`);
- with ``PRECISION_STAGE_OUTPUTS=1`` (the gate sets it for a ``level: auto`` scenario), what the stage
  reads from verl's batch and what it produces (:data:`FEEDS`) are written, after the debugger has
  stopped, as ``step_<n>/<stage>/step0/rank<r>/stage_outputs.json``
  (:class:`precision_harness.runs.numerics.stage_outputs.StageOutputs`, the built-in runner's format):
  the log-probs and entropy a log-prob stage returns, the values, and for an update the advantages,
  old and reference log-probs, IS weights (or values and returns) it consumed, each micro-batch's loss
  (and, for the actor, its policy, entropy and KL terms) and each mini-batch's gradient norm. verl's
  batch holds them as nested (jagged) tensors; their statistics are over the valid tokens.

Inputs are copied before the debugger starts and every statistic is computed after it stopped, so
nothing here lands in the stage's dump. Importing this module imports torch; only verl's processes do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from precision_harness.runs.numerics.stage_outputs import StageOutputs
from precision_harness.runs.verl.engine import STAGE_OUTPUTS_ENV as ENV_STAGE_OUTPUTS
from precision_harness.runs.verl.stages.timeline import StageClock


@dataclass(frozen=True)
class Feed:
    """What one stage reads from verl's batch and produces, under the built-in runner's names."""

    #: ``(batch key, name)`` of the tensors the stage consumes that were computed between stages
    inputs: tuple[tuple[str, str], ...] = ()
    #: ``(key of the returned TensorDict, name)`` of the tensors the stage returns
    outputs: tuple[tuple[str, str], ...] = ()
    #: ``(loss function metric or "loss", name)`` recorded at every micro-batch of an update
    losses: tuple[tuple[str, str], ...] = ()
    #: the attribute of verl's worker holding the ``TrainingWorker`` whose ``loss_fn`` an update calls
    #: (``""``: the worker itself, the critic)
    trainer: str = "actor"


#: every stage verl's trainer dumps (the critic's on the CPU only), and what the gate takes from its batch at
#: ``level: auto``
FEEDS: dict[str, Feed] = {
    "actor_compute_log_prob": Feed(outputs=(("log_probs", "old_log_probs"), ("entropy", "entropy"))),
    "ref_compute_log_prob": Feed(outputs=(("log_probs", "ref_log_prob"),)),
    "compute_values": Feed(outputs=(("values", "values"),)),
    "critic_update": Feed(
        inputs=(("values", "values"), ("returns", "returns")), losses=(("loss", "vf_loss"),), trainer=""
    ),
    "actor_update": Feed(
        inputs=(
            ("old_log_probs", "old_log_probs"),
            ("advantages", "advantages"),
            ("ref_log_prob", "ref_log_prob"),
            ("rollout_is_weights", "rollout_is_weights"),
        ),
        losses=(
            ("loss", "loss"),
            ("actor/pg_loss", "pg_loss"),
            ("actor/entropy_loss", "entropy_loss"),
            ("kl_loss", "kl_loss"),
        ),
    ),
}


def flat(value: Any) -> torch.Tensor | None:
    """A tensor of verl's batch as one flat tensor of its valid elements (a nested tensor's values)."""
    if not isinstance(value, torch.Tensor):
        return None
    if value.is_nested:
        return value.values() if value.layout == torch.jagged else torch.cat([t.reshape(-1) for t in value.unbind()])
    return value


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


class LossRecorder:
    """Stands in for a ``TrainingWorker.loss_fn`` during one update: calls it, keeps what each micro-batch returned."""

    def __init__(self, loss_fn: Any) -> None:
        self.loss_fn = loss_fn
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        loss, metrics = self.loss_fn(*args, **kwargs)
        self.calls.append((loss, dict(metrics)))
        return loss, metrics

    def values(self, metric: str) -> list[Any]:
        """Per micro-batch: the loss itself (``"loss"``) or a metric's value (verl's ``Metric`` holds floats)."""
        out = []
        for loss, metrics in self.calls:
            value = loss if metric == "loss" else metrics.get(metric)
            held = getattr(value, "values", None)  # verl's Metric keeps its value(s) as floats in a list
            if isinstance(held, list):
                out.extend(held)
            elif value is not None:
                out.append(value)
        return out


class StageIO:
    """One stage's inputs (copied before the debugger starts), loss calls and outputs; written after it stopped."""

    def __init__(self, feed: Feed, worker: Any, data: Any) -> None:
        self.feed = feed
        self.inputs = []
        for key, name in feed.inputs:
            tensor = flat(data.get(key, None)) if hasattr(data, "get") else None
            if tensor is not None:
                self.inputs.append((name, tensor.detach().clone()))
        self.trainer, self.recorder = None, None
        if feed.losses:  # an update: its TrainingWorker's loss function records each micro-batch
            self.trainer = getattr(worker, feed.trainer) if feed.trainer else worker
            self.recorder = LossRecorder(self.trainer.loss_fn)
            self.trainer.loss_fn = self.recorder

    def restore(self) -> None:
        if self.recorder is not None:
            self.trainer.loss_fn = self.recorder.loss_fn

    def write(self, rank_dir: Path, result: Any) -> None:
        io = StageOutputs()
        for name, tensor in self.inputs:
            io.input(name, tensor)
        for key, name in self.feed.outputs:
            io.output(name, flat(result.get(key, None)) if result is not None else None)
        if self.recorder is not None:
            for metric, name in self.feed.losses:
                io.outputs(name, [float(v) for v in self.recorder.values(metric)])
            io.outputs("grad_norm", _grad_norms(result))
        io.write(rank_dir)


def _grad_norms(result: Any) -> list[float]:
    """Each mini-batch's gradient norm, from an update's returned ``metrics`` (verl's ``train_mini_batch``)."""
    if result is None:
        return []
    from verl.utils import tensordict_utils as tu

    norms = (tu.get(result, "metrics") or {}).get("grad_norm", [])
    return [float(n) for n in (norms if isinstance(norms, list) else [norms])]


@contextlib.contextmanager
def observe(profiler: Any, stage: str, worker: Any, args: tuple, kwargs: dict) -> Iterator[dict[str, Any]]:
    """Around one call of a stage verl's ``PrecisionDebuggerProfiler`` (``profiler``) dumps; the body stores the
    stage's return value under ``"result"`` of the yielded dict. Does nothing for a stage not collected now."""
    step = profiler._resolve_global_step(worker, args, kwargs)
    if not profiler._should_collect(stage, step):
        yield {}
        return
    rank = _rank()
    clock = StageClock(stage, step, rank)
    feed = FEEDS.get(stage)
    io = StageIO(feed, worker, args[0] if args else None) if feed and os.environ.get(ENV_STAGE_OUTPUTS) else None
    box: dict[str, Any] = {}
    try:
        yield box
    finally:
        if io is not None:
            io.restore()
    if io is not None and "result" in box:
        io.write(Path(profiler._dump_root) / f"step_{step}" / stage / "step0" / f"rank{rank}", box["result"])
    clock.finish()
