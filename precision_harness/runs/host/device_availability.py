"""Is a device usable here? Answered without importing torch into the calling (pytest) process.

- ``cpu``: always.
- ``npu``: ``torch_npu`` must be importable (checked with ``importlib.util.find_spec``: no import).
- ``cuda``: a short probe subprocess runs ``torch.cuda.is_available()`` (about 1-2 s, once per process),
  because importing torch here would break the "pytest never imports torch" rule.

Each function returns ``None`` when the device is usable, else one line saying what is missing and
what to do; the plugin turns it into a usage error (device asked for on the command line) or, for a
scenario's own ``device:`` key under ``--precision-device auto``, the failure of each of its items (a skip
under ``--precision-allow-skip``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from functools import cache

#: torch_npu is built per CANN and torch release (Ascend's version table), so no pip extra can pick it
NPU_FIX = "install the torch_npu release that matches your CANN and torch, or use --precision-device cpu"
CUDA_FIX = "install a CUDA build of torch on a machine with an NVIDIA GPU, or use --precision-device cpu"


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@cache
def unavailable_reason(device: str) -> str | None:
    """``None`` if ``device`` can run scenarios in a worker on this machine, else the one-line reason and fix."""
    if device == "cpu":
        return None
    if device == "npu":
        if not _has_module("torch_npu"):
            return f"device npu: torch_npu is not installed; {NPU_FIX}"
        return None
    if device == "cuda":
        probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
        try:
            proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120, check=False)
        except subprocess.TimeoutExpired:
            return f"device cuda: probing torch.cuda.is_available() timed out; {CUDA_FIX}"
        if proc.returncode == 3:
            return (
                f"device cuda: torch.cuda.is_available() is False (torch without CUDA, or no GPU visible); {CUDA_FIX}"
            )
        if proc.returncode != 0:
            return f"device cuda: cannot import torch in a worker; {CUDA_FIX}"
        return None
    return f"device {device!r}: unknown; expected one of cpu, cuda, npu"
