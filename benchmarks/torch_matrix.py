"""The stack matrix's torch rows (the hook benchmarks/stack_matrix.py calls): the gate under real torch releases.

A torch release is a whole environment, not a few wheels on ``PYTHONPATH``: each one is installed in a venv of its
own (:func:`torch_releases.venv_python`: the registry's default wheel, whose CUDA libraries load on a machine
without a GPU and run on the CPU), and the pinned environment then runs the gate with that release's torch, and
only it, first on ``PYTHONPATH`` (:func:`torch_releases.overlay`). So a row shows what that torch alone changes
against the committed goldens, as the msprobe and transformers rows do for theirs.

The releases are those whose FSDP2 all-gather fill benchmarks/torch_releases.py ran on (docs/scenarios.md):
one before ``DefaultAllocMixin`` (2.6.0, whose fill patches the copy-in kernel), one between (2.8.0,
``allocate_memory``) and the newest the registry serves here (2.14.1). Each pulls about 3 GB: they run from
``python benchmarks/stack_matrix.py``, never in ``make test``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stack_matrix
import torch_releases

#: the torch releases of the matrix's torch rows
TORCH_VERSIONS = ("2.6.0", "2.8.0", "2.14.1")


@dataclass(frozen=True)
class TorchStack(stack_matrix.Stack):
    """A torch row's stack: the folder that puts that release's torch first on ``PYTHONPATH``."""

    overlay: Path | None = None

    @property
    def target(self) -> Path | None:
        return self.overlay


def run_torch_row(version: str, settings: stack_matrix.MatrixSettings) -> stack_matrix.Row:
    """The gate (``settings.gate``) under torch ``version`` against the committed goldens: its row.

    Raises:
        subprocess.CalledProcessError: the release's venv could not be built (pip, the registry).
    """
    folder = torch_releases.overlay(torch_releases.venv_python(version))
    stack = TorchStack(f"torch-{version}", "torch", "torch", version, None, folder)
    return stack_matrix.run_gate(stack, settings)
