"""Statistics of a stage's own inputs and outputs (``level: auto``), written as ``stage_outputs.json``.

The format is described in :mod:`precision_harness.dumps.files`. Tensors are held while the stage runs and
reduced after msprobe's debugger has stopped, so no statistic op lands in the stage's dump.
Each tensor gets msprobe's ``Max/Min/Mean/Norm`` (over every element, in float32 as msprobe's
statistics of a float32 tensor), its dtype and shape; a Python float (a micro-batch loss, a
gradient norm) is a 0-d float32 tensor row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from precision_harness.dumps.files import STAGE_OUTPUTS, STAGE_PREFIX


def tensor_statistics(t: torch.Tensor) -> dict[str, Any]:
    """msprobe's statistics entry of ``t``: type, dtype, shape, Max, Min, Mean, Norm (2-norm), requires_grad."""
    x = t.detach().float()
    return {
        "type": "torch.Tensor",
        "dtype": str(t.dtype),
        "shape": list(t.shape),
        "Max": x.max().item(),
        "Min": x.min().item(),
        "Mean": x.mean().item(),
        "Norm": torch.linalg.vector_norm(x).item(),
        "requires_grad": False,
    }


class StageOutputs:
    """Collects one stage's inputs and outputs in the order the stage consumed and produced them."""

    def __init__(self) -> None:
        self._inputs: list[tuple[str, torch.Tensor]] = []
        self._outputs: list[tuple[str, torch.Tensor | float]] = []

    def input(self, name: str, value: torch.Tensor | None) -> None:
        """A tensor the stage reads that was computed outside every stage (advantages, returns...)."""
        if value is not None:
            self._inputs.append((name, value.detach()))

    def output(self, name: str, value: torch.Tensor | float | None) -> None:
        """A tensor or scalar the stage produces; repeated names are numbered in call order (micro-batches)."""
        if value is not None:
            self._outputs.append((name, value.detach() if isinstance(value, torch.Tensor) else float(value)))

    def outputs(self, name: str, values: list[torch.Tensor | float]) -> None:
        """One scalar per call (per micro-batch or mini-batch), in order."""
        for value in values:
            self.output(name, value)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        counts: dict[str, int] = {}
        inputs = []
        for kind, items in (("input_args", self._inputs), ("output", self._outputs)):
            for name, value in items:
                index = counts[name] = counts.get(name, -1) + 1
                api = f"{STAGE_PREFIX}.{name}.{index}.forward"
                t = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)
                data[api] = {kind: [tensor_statistics(t)]}
                if kind == "input_args":
                    inputs.append(api)
        return {"task": "statistics", "level": "auto", "framework": "pytorch", "inputs": inputs, "data": data}

    def write(self, rank_dir: Path) -> Path:
        """Write ``rank_dir/stage_outputs.json`` and return its path."""
        path = Path(rank_dir) / STAGE_OUTPUTS
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        return path
