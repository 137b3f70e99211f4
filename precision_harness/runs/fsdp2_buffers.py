"""FSDP2's all-gather buffer zero-filled in every verl process, on every device: the one patch of torch internals.

Why: with two or more ranks, FSDP2's ``all_gather_copy_in`` takes ``Tensor.narrow`` of a buffer that
``DefaultAllocMixin.allocate`` (``torch.distributed.fsdp._fully_shard._fsdp_collectives``) has just made with
``torch.empty``, before anything is copied in. msprobe's L1 dump records that call, so every multi-rank L1 dump
held statistics of uninitialised memory: on the CPU, 189 ``Tensor.narrow`` rows differed between two otherwise
identical runs, NaN and 3e38 among them; on a GPU or NPU the same rows read whatever the caching allocator
handed back, a flaky gate. Allocated with ``torch.zeros`` instead, those rows read zeros, on every device (the
cost is one fill of each all-gather buffer, small beside the all-gather itself). What the all-gather computes is
unchanged. Excluding those rows from the compare instead (read from msprobe's stack) would leave the dump
holding garbage and the compare a special case; the fill keeps the dump true.

The version guard: the patch was read against torch :data:`CHECKED_TORCH`. Under another torch it is refused in
one line (the gate, before a verl run starts, and the verl process, should it run with another torch than the
gate's) unless :data:`ALLOW_ENV` is ``1``: then it is applied as it stands, where ``DefaultAllocMixin.allocate``
still exists. Only ``DefaultAllocMixin`` is patched: verl 0.9.1 selects neither FSDP2's process-group nor its
symmetric-memory allocation.

:mod:`precision_harness.runs.verl_fsdp2_buffers` registers :func:`zero_fill` for when the module is first
imported (:func:`~precision_harness.runs.verl_stages.on_import.when_imported`: most verl processes never import
it). This module imports torch only inside the patch, so the gate reads :func:`refusal` without importing torch.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Mapping
from typing import Any

#: the torch versions the patch was read against
CHECKED_TORCH = ("2.13.0",)
#: set to 1 to apply the patch under a torch it was not checked with (each verl process inherits it)
ALLOW_ENV = "PRECISION_ALLOW_UNCHECKED_TORCH"
MODULE = "torch.distributed.fsdp._fully_shard._fsdp_collectives"


def refusal(version: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The one line refusing the patch under torch ``version`` (None: not installed, nothing to patch), or None
    when ``version`` (its local part, ``+cpu``, ignored) was checked or ``environ[ALLOW_ENV]`` is ``1``."""
    env = os.environ if environ is None else environ
    if version is None or version.split("+")[0] in CHECKED_TORCH or env.get(ALLOW_ENV) == "1":
        return None
    return (
        f"torch {version}: the gate's zero-fill of FSDP2's all-gather buffer (precision_harness/runs/fsdp2_buffers.py) "
        f"was checked with torch {', '.join(CHECKED_TORCH)}; re-check it against this torch, or set {ALLOW_ENV}=1 "
        "to apply it as it stands"
    )


def installed_refusal(environ: Mapping[str, str] | None = None) -> str | None:
    """:func:`refusal` for the torch installed here, read from its package metadata (torch is not imported)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return refusal(version, environ)


def _zeroed(original: Any) -> Any:
    import torch

    @functools.wraps(original)
    def allocate(self: Any, size: Any, *, dtype: Any, device: Any) -> Any:
        return torch.zeros(*size, dtype=dtype, device=device)

    allocate.__precision_patched__ = True
    return allocate


def zero_fill(collectives: Any) -> None:
    """The patch, on the imported ``_fsdp_collectives`` module; idempotent.

    Raises:
        RuntimeError: torch is not a checked version and :data:`ALLOW_ENV` is not 1, or the allowed torch has no
            ``DefaultAllocMixin.allocate`` (one line each).
    """
    import torch

    why = refusal(torch.__version__)
    if why is not None:
        raise RuntimeError(why)
    mixin = getattr(collectives, "DefaultAllocMixin", None)
    if mixin is None or not hasattr(mixin, "allocate"):
        raise RuntimeError(
            f"torch {torch.__version__}: {MODULE} has no DefaultAllocMixin.allocate; the gate's zero-fill of FSDP2's "
            "all-gather buffer cannot be applied (precision_harness/runs/fsdp2_buffers.py must be re-read)"
        )
    if not getattr(mixin.allocate, "__precision_patched__", False):
        mixin.allocate = _zeroed(mixin.allocate)
