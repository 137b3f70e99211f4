"""The rollout engine's copy of the actor's weights: the sync after each update and its digest record.

verl keeps the inference engine's weights apart from the training engine's and copies them over
before each rollout (its sharding manager, ``FSDPVLLMShardingManager.__enter__``). The built-in loop
does the same with :func:`sync_weights`, and :func:`sync_record` writes what the gate's
``weight_sync`` invariant reads (``precision_harness.check.tolerance.consistency``): per parameter, by name, the
sha256 of the actor's tensor cast to the rollout dtype and of the rollout model's tensor.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

#: ``step_<n>/weight_sync.json``: the record of the sync before that step's rollout
WEIGHT_SYNC_FILE = "weight_sync.json"


@torch.no_grad()
def sync_weights(actor: torch.nn.Module, rollout_model: torch.nn.Module) -> None:
    """Copy every actor parameter into the rollout model's parameter of the same name, cast to its dtype.

    The cast is ``Tensor.to(dtype)``, the one ``Module.to(dtype)`` applies, so a synced rollout model
    holds the same bytes as a fresh ``copy.deepcopy(actor).to(rollout_dtype)``.

    Raises:
        KeyError: the rollout model has no parameter of an actor parameter's name.
    """
    rollout_params = dict(rollout_model.named_parameters())
    for name, param in actor.named_parameters():
        target = rollout_params[name]
        target.copy_(param.detach().to(target.dtype))


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (row-major, on the CPU), as hex: equal digests mean bit-identical tensors."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def sync_record(actor: torch.nn.Module, rollout_model: torch.nn.Module, *, step: int, dtype: torch.dtype) -> dict:
    """What the rollout model holds against the actor's weights cast to ``dtype``, parameter by parameter.

    Returns ``{"step", "rollout_dtype", "parameters": [{"name", "shape", "actor", "rollout",
    "rollout_tensor_dtype"}]}`` in the actor's ``named_parameters`` order, then any parameter only the
    rollout model has (its ``actor`` digest None); ``actor`` is None too for a name the rollout lacks
    the other way round (``rollout`` None).
    """
    rollout_params = dict(rollout_model.named_parameters())
    rows: list[dict[str, Any]] = []
    for name, param in actor.named_parameters():
        held = rollout_params.pop(name, None)
        rows.append(
            {
                "name": name,
                "shape": list(param.shape),
                "actor": tensor_digest(param.to(dtype)),
                "rollout": None if held is None else tensor_digest(held),
                "rollout_tensor_dtype": None if held is None else str(held.dtype).removeprefix("torch."),
            }
        )
    for name, held in rollout_params.items():
        rows.append(
            {
                "name": name,
                "shape": list(held.shape),
                "actor": None,
                "rollout": tensor_digest(held),
                "rollout_tensor_dtype": str(held.dtype).removeprefix("torch."),
            }
        )
    return {"step": step, "rollout_dtype": str(dtype).removeprefix("torch."), "parameters": rows}


def write_sync_record(step_dir: Path, record: dict) -> Path:
    """Write ``record`` to ``step_dir/weight_sync.json`` (created)."""
    step_dir.mkdir(parents=True, exist_ok=True)
    path = step_dir / WEIGHT_SYNC_FILE
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return path
