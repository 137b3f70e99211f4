"""FSDP2's all-gather buffer zero-filled in every verl process, on every device: the one patch of torch internals.

Why: with two or more ranks, FSDP2's ``all_gather_copy_in`` takes ``Tensor.narrow`` of a buffer that was just
made with ``torch.empty``, before anything is copied in. msprobe's L1 dump records that call, so every multi-rank
L1 dump held statistics of uninitialised memory: on the CPU, 189 ``Tensor.narrow`` rows differed between two
otherwise identical runs, NaN and 3e38 among them; on a GPU or NPU the same rows read whatever the caching
allocator handed back, a flaky gate. Allocated with ``torch.zeros`` instead, those rows read zeros, on every device
(the cost is one fill of each all-gather buffer, small beside the all-gather itself). What the all-gather computes
is unchanged. Excluding those rows from the compare instead (read from msprobe's stack) would leave the dump holding
garbage and the compare a special case; the fill keeps the dump true.

The version guard: where the buffer is allocated moved between torch releases, so the patch point is chosen by what
the imported ``_fsdp_collectives`` module has (:func:`fill_point`), each layout read in torch's source:

- :data:`ALLOC_MIXIN` (torch 2.9 to 2.14.1, read in 2.9.1, 2.10.0, 2.11.0, 2.12.1, 2.13.0, 2.14.1):
  ``foreach_all_gather`` asks its ``AllGather`` for the buffer, and FSDP2's default one, ``DefaultAllGather``,
  allocates it in ``DefaultAllocMixin.allocate``. That method is replaced. verl 0.9.1 selects neither FSDP2's
  process-group nor its symmetric-memory allocation, so their mixins are left alone.
- :data:`ALLOCATE_MEMORY` (torch 2.8, read in 2.8.0): the copy-in kernel calls the module's
  ``allocate_memory(size, dtype, device, group, from_process_group)``, looked up at each call. The module's name is
  rebound to one that allocates with ``torch.zeros`` (the process-group branch, which verl does not select, is
  torch's own); the reduce-scatter buffers it also allocates are filled too, a fill that changes nothing they hold.
- :data:`COPY_IN_KERNEL` (torch 2.5 to 2.7, read in 2.5.1 at ``torch.distributed._composable.fsdp``,
  2.6.0 and 2.7.1 at ``torch.distributed.fsdp._fully_shard``): the CPU/CUDA kernel of ``fsdp::all_gather_copy_in``,
  ``all_gather_copy_in_cuda(all_gather_inputs, inp_split_sizes, all_gather_input_numel, world_size, rank, dtype,
  device)``, allocates the buffer itself. torch's dispatcher holds that function object and ``torch.library``
  refuses a second Python kernel for the key, so the function's code is replaced by
  :func:`_all_gather_copy_in_zeroed`, torch's body with ``torch.zeros``, run in the torch module's globals (msprobe's
  stack then names this module's frame, ``in _all_gather_copy_in_zeroed``, as the code that ran).
- any other layout (torch 2.4, read in 2.4.1: ``foreach_all_gather`` itself allocates the buffer, inline, and
  narrows it; and any later release that moves it again): nothing is patched and the run proceeds; :func:`not_filled`
  says which rows go unchecked and why, in the verl process's log and in the gate's header. Each verl rank records
  the fill in its ``env`` (:func:`fill_record`, then run.json and the golden's manifest), and the compare leaves
  those rows out, counted and named with :func:`unfilled_reason` (:mod:`precision_harness.check.compare.unfilled`).

The releases :data:`CHECKED_TORCH` were each run with two identical 2-rank gloo all-gathers giving identical buffers
(``benchmarks/torch_releases.py``). A verl run is refused only under a torch the gate cannot run at all (older than
:data:`OLDEST_TORCH`, the project's floor), in one line that says what to install (:func:`refusal`).

:mod:`precision_harness.runs.verl.fsdp2_fill` registers :func:`zero_fill` for when either module is first
imported (:func:`~precision_harness.runs.verl.stages.on_import.when_imported`: most verl processes never import
it). This module imports torch only inside the patch, so the gate reads :func:`refusal` and :func:`installed_layout`
without importing torch.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from precision_harness.runs.host.package_versions import installed, release

if TYPE_CHECKING:
    import torch

#: FSDP2's collectives module: torch 2.6 and later, then torch 2.4 and 2.5
MODULES = (
    "torch.distributed.fsdp._fully_shard._fsdp_collectives",
    "torch.distributed._composable.fsdp._fsdp_collectives",
)
#: the torch releases the fill was run on, two identical 2-rank all-gathers each (benchmarks/torch_releases.py)
CHECKED_TORCH = ("2.6.0", "2.8.0", "2.13.0", "2.14.1")
#: the oldest torch the gate runs under (pyproject.toml's floor; the CPU kernels need torch.library)
OLDEST_TORCH = (2, 1)
#: the layouts :func:`fill_point` knows
ALLOC_MIXIN, ALLOCATE_MEMORY, COPY_IN_KERNEL = (
    "DefaultAllocMixin.allocate",
    "allocate_memory",
    "all_gather_copy_in_cuda",
)
#: the parameters of torch 2.8's module-level allocation
ALLOCATE_MEMORY_PARAMETERS = ("size", "dtype", "device", "group", "from_process_group")
#: the parameters of the copy-in kernel that allocates its own buffer (torch 2.5 to 2.7)
COPY_IN_PARAMETERS = (
    "all_gather_inputs",
    "inp_split_sizes",
    "all_gather_input_numel",
    "world_size",
    "rank",
    "dtype",
    "device",
)
#: the rows the fill would have made deterministic, named where it cannot apply
UNFILLED_ROWS = "the Tensor.narrow rows of FSDP2's all-gather buffer (msprobe's stack: all_gather_copy_in)"
#: the ``env`` keys a verl rank records its fill under (:func:`fill_record`): FSDP2's collectives module, and the
#: layout zero-filled there or :data:`NOT_FILLED`
ENV_MODULE, ENV_FILL = "fsdp2_collectives", "fsdp2_fill"
NOT_FILLED = "none"
_PATCHED = "__precision_patched__"


def refusal(version: str | None) -> str | None:
    """The one line refusing a verl run under torch ``version`` (None: not installed, or one the gate runs under).

    Only a torch the gate cannot run under at all is refused: one older than :data:`OLDEST_TORCH`, or a version
    that does not read as ``major.minor``. Any other torch runs, its all-gather buffer zero-filled where
    :func:`fill_point` knows the layout.
    """
    if version is None:
        return None
    if release(version, 2) >= OLDEST_TORCH:
        return None
    oldest = ".".join(map(str, OLDEST_TORCH))
    return (
        f"torch {version} is not supported by the precision gate (supported: torch {oldest} and later; FSDP2's "
        f"all-gather buffer zero-filled on torch 2.5 and later, run on {', '.join(CHECKED_TORCH)}); "
        f"install one: pip install 'torch>={CHECKED_TORCH[0]}'"
    )


def installed_version() -> str | None:
    """The installed torch's version, read from its package metadata (torch is not imported); None: none installed."""
    return installed("torch")


def installed_refusal() -> str | None:
    """:func:`refusal` for the torch installed here."""
    return refusal(installed_version())


def source_layout(source: str) -> str | None:
    """The layout of a ``_fsdp_collectives.py`` read as text (the gate does not import torch), as :func:`fill_point`
    would find it imported: :data:`ALLOC_MIXIN`, :data:`ALLOCATE_MEMORY`, :data:`COPY_IN_KERNEL` or None."""
    if re.search(r"^class DefaultAllocMixin\b[^\n]*\n(?:[ \t]+[^\n]*\n|\n)*?[ \t]+def allocate\(", source, re.M):
        return ALLOC_MIXIN
    if _source_parameters(source, ALLOCATE_MEMORY) == ALLOCATE_MEMORY_PARAMETERS:
        return ALLOCATE_MEMORY
    if _source_parameters(source, COPY_IN_KERNEL) == COPY_IN_PARAMETERS:
        return COPY_IN_KERNEL
    return None


def _source_parameters(source: str, name: str) -> tuple[str, ...] | None:
    """The parameter names of the module-level ``def name(...)`` in ``source`` (annotated, as torch writes them)."""
    found = re.search(rf"^def {name}\((?P<params>[^)]*)\)", source, re.M)
    return tuple(re.findall(r"(\w+)\s*:", found["params"])) if found else None


def installed_layout() -> tuple[str, str | None] | None:
    """``(module, layout)`` of the installed torch's FSDP2 collectives, read from its files (not imported), layout
    None where :func:`source_layout` knows none; None where torch, or its FSDP2, is not installed."""
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    for module in MODULES:
        path = dist.locate_file(module.replace(".", "/") + ".py")
        try:
            return module, source_layout(path.read_text(encoding="utf-8"))
        except OSError:
            continue
    return None


def not_filled(version: str, module: str) -> str:
    """The one line saying the fill does not apply under torch ``version`` and which rows go unchecked."""
    return (
        f"torch {version}: {module} allocates FSDP2's all-gather buffer in none of {ALLOC_MIXIN}, "
        f"{ALLOCATE_MEMORY} nor {COPY_IN_KERNEL}; the buffer is not zero-filled, so {UNFILLED_ROWS} are unchecked "
        "by it: they hold uninitialised memory, and a difference there is no numeric change "
        "(precision_harness/runs/verl/fsdp2_buffers.py knows torch 2.5 to 2.14.1)"
    )


def fill_record() -> dict[str, str]:
    """The fill as a verl rank records it in its ``env`` (``env/rank<r>.json``, read without importing torch):
    ``{ENV_MODULE: module, ENV_FILL: layout}``, the layout :data:`NOT_FILLED` where :func:`source_layout` knows none;
    ``{}`` where torch, or its FSDP2, is not installed (nothing to fill)."""
    found = installed_layout()
    if found is None:
        return {}
    module, layout = found
    return {ENV_MODULE: module, ENV_FILL: layout or NOT_FILLED}


def unfilled_reason(env: Mapping[str, Any] | None) -> str | None:
    """:func:`not_filled`'s line for a run whose ``env`` (run.json's, a golden manifest's) records its all-gather
    buffer not zero-filled (:func:`fill_record`); None where it was filled, or where ``env`` does not say (a golden
    recorded before the record was kept, under a torch the fill knows)."""
    if not env or env.get(ENV_FILL) != NOT_FILLED:
        return None
    return not_filled(str(env.get("torch", "not recorded")), str(env.get(ENV_MODULE, "FSDP2's _fsdp_collectives")))


def fill_line() -> str:
    """The run log's line: where the installed torch's all-gather buffer is zero-filled, or which rows go unchecked."""
    version, found = installed_version(), installed_layout()
    if found is None:
        return f"precision gate: torch {version}: no FSDP2 installed, no all-gather buffer to fill"
    module, layout = found
    if layout is None:
        return f"precision gate: {not_filled(str(version), module)}"
    return f"precision gate: torch {version}: FSDP2's all-gather buffer zero-filled in {module}.{layout}"


def _zeroed_allocate(original: Any) -> Any:
    import torch

    @functools.wraps(original)
    def allocate(self: Any, size: Any, *, dtype: Any, device: Any) -> Any:
        return torch.zeros(*size, dtype=dtype, device=device)

    setattr(allocate, _PATCHED, True)
    return allocate


def _zeroed_allocate_memory(original: Any) -> Any:
    import torch

    @functools.wraps(original)
    def allocate_memory(size: Any, dtype: Any, device: Any, group: Any, from_process_group: bool) -> Any:
        if from_process_group:  # the process group's own memory: not selected by verl, left as torch has it
            return original(size, dtype, device, group, from_process_group)
        return torch.zeros((size,), dtype=dtype, device=device)

    setattr(allocate_memory, _PATCHED, True)
    return allocate_memory


def _all_gather_copy_in_zeroed(  # noqa: PLR0913  (torch's kernel's parameters, one for one: its code replaces the kernel's)
    all_gather_inputs: list[torch.Tensor],
    inp_split_sizes: list[int],
    all_gather_input_numel: int,
    world_size: int,
    rank: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch 2.5-2.7's ``all_gather_copy_in_cuda`` with its buffer made by ``torch.zeros``; its code runs as that
    kernel's, in the torch module's globals (``torch`` is that module's name, never imported here)."""
    all_gather_output = torch.zeros((all_gather_input_numel * world_size,), dtype=dtype, device=device)
    all_gather_input = all_gather_output.narrow(0, all_gather_input_numel * rank, all_gather_input_numel)
    foreach_copy_dsts = torch.split(all_gather_input, inp_split_sizes)
    with torch.no_grad():
        torch._foreach_copy_(foreach_copy_dsts, all_gather_inputs)
    return all_gather_input, all_gather_output


def fill_point(collectives: Any) -> str | None:
    """Where the imported ``_fsdp_collectives`` module allocates the all-gather buffer: :data:`ALLOC_MIXIN`,
    :data:`ALLOCATE_MEMORY` (its parameters :data:`ALLOCATE_MEMORY_PARAMETERS`), :data:`COPY_IN_KERNEL` (its
    parameters :data:`COPY_IN_PARAMETERS`, a function without closure), or None (unknown)."""
    mixin = getattr(collectives, "DefaultAllocMixin", None)
    if mixin is not None and callable(getattr(mixin, "allocate", None)):
        return ALLOC_MIXIN
    if _parameters(getattr(collectives, ALLOCATE_MEMORY, None)) == ALLOCATE_MEMORY_PARAMETERS:
        return ALLOCATE_MEMORY
    kernel = getattr(collectives, COPY_IN_KERNEL, None)
    if inspect.isfunction(kernel) and not kernel.__code__.co_freevars and _parameters(kernel) == COPY_IN_PARAMETERS:
        return COPY_IN_KERNEL
    return None


def _parameters(function: Any) -> tuple[str, ...] | None:
    return tuple(inspect.signature(function).parameters) if inspect.isfunction(function) else None


def zero_fill(collectives: Any) -> str | None:
    """The patch, on the imported ``_fsdp_collectives`` module; idempotent. Returns the layout patched, or None where
    :func:`fill_point` knows none: then nothing is patched and :func:`not_filled`'s line goes to standard error (the
    run proceeds)."""
    point = fill_point(collectives)
    if point == ALLOC_MIXIN:
        mixin = collectives.DefaultAllocMixin
        if not getattr(mixin.allocate, _PATCHED, False):
            mixin.allocate = _zeroed_allocate(mixin.allocate)
    elif point == ALLOCATE_MEMORY:
        original = getattr(collectives, ALLOCATE_MEMORY)
        if not getattr(original, _PATCHED, False):
            setattr(collectives, ALLOCATE_MEMORY, _zeroed_allocate_memory(original))
    elif point == COPY_IN_KERNEL:
        kernel = getattr(collectives, COPY_IN_KERNEL)
        if not getattr(kernel, _PATCHED, False):
            kernel.__code__ = _all_gather_copy_in_zeroed.__code__  # the dispatcher holds this function object
            setattr(kernel, _PATCHED, True)
    else:
        import torch

        print(f"precision gate: {not_filled(torch.__version__, collectives.__name__)}", file=sys.stderr)
    return point
