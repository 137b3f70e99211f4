"""FSDP2's all-gather buffer allocation as each torch release lays it out, for tests/test_fsdp2_buffers.py.

Each entry of :data:`LAYOUTS` is the part of that release's ``_fsdp_collectives.py`` that makes the buffer and
narrows it (copied from the release's wheel, trimmed to those functions), and the call ``foreach_all_gather`` makes.
Run as a script (``python fsdp2_layouts.py``, torch imported here, never in pytest's process), it builds each as a
module, keeps the kernel as torch's dispatcher keeps it (a reference taken before the patch), applies
``zero_fill`` and prints, per release, the layout found, whether the kernel is marked patched, and whether the
buffer the copy-in returns is all zeros outside this rank's part (where ``torch.empty`` leaves memory as it was).
"""

from __future__ import annotations

import json
import sys
import types

COPY_IN_2_6 = """
import torch
from typing import List, Tuple

def all_gather_copy_in_cuda(
    all_gather_inputs: List[torch.Tensor],
    inp_split_sizes: List[int],
    all_gather_input_numel: int,
    world_size: int,
    rank: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Tuple[torch.Tensor, torch.Tensor]:
    all_gather_output = torch.empty(
        (all_gather_input_numel * world_size,), dtype=dtype, device=device
    )
    all_gather_input = all_gather_output.narrow(
        0, all_gather_input_numel * rank, all_gather_input_numel
    )
    foreach_copy_dsts = torch.split(all_gather_input, inp_split_sizes)
    with torch.no_grad():
        torch._foreach_copy_(foreach_copy_dsts, all_gather_inputs)
    return all_gather_input, all_gather_output

def call(kernel, inputs, sizes, numel, world, rank):
    return kernel(inputs, sizes, numel, world, rank, torch.float32, torch.device("cpu"))
"""

ALLOCATE_MEMORY_2_8 = """
import torch
import torch.distributed as dist

def allocate_memory(
    size: int,
    dtype: torch.dtype,
    device: torch.device,
    group: dist.ProcessGroup,
    from_process_group: bool,
) -> torch.Tensor:
    if from_process_group:
        backend = group._get_backend(device)
        if backend.supports_tensor_alloc(device):
            return backend.allocate_tensor(size, dtype=dtype, device=device)
    return torch.empty((size,), dtype=dtype, device=device)

def all_gather_copy_in_cuda(
    all_gather_inputs: list[torch.Tensor],
    inp_split_sizes: list[int],
    all_gather_input_numel: int,
    world_size: int,
    rank: int,
    dtype: torch.dtype,
    device: torch.device,
    group_name: str,
    allocate_memory_from_process_group: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    all_gather_output = allocate_memory(
        all_gather_input_numel * world_size,
        dtype=dtype,
        device=device,
        group=None,
        from_process_group=allocate_memory_from_process_group,
    )
    all_gather_input = all_gather_output.narrow(
        0, all_gather_input_numel * rank, all_gather_input_numel
    )
    foreach_copy_dsts = torch.split(all_gather_input, inp_split_sizes)
    with torch.no_grad():
        torch._foreach_copy_(foreach_copy_dsts, all_gather_inputs)
    return all_gather_input, all_gather_output

def call(kernel, inputs, sizes, numel, world, rank):
    return kernel(inputs, sizes, numel, world, rank, torch.float32, torch.device("cpu"), "", False)
"""

MIXIN_2_14 = """
import torch
from collections.abc import Sequence

class DefaultAllocMixin:
    def allocate(
        self,
        size: Sequence[int | torch.SymInt],
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

class DefaultAllGather(DefaultAllocMixin):
    pass

def all_gather_copy_in_cuda(
    all_gather_inputs: list[torch.Tensor],
    all_gather_output: torch.Tensor,
    inp_split_sizes: list[int],
    all_gather_input_numel: int,
    rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    all_gather_input = all_gather_output.narrow(
        0, all_gather_input_numel * rank, all_gather_input_numel
    )
    foreach_copy_dsts = torch.split(all_gather_input, inp_split_sizes)
    with torch.no_grad():
        torch._foreach_copy_(foreach_copy_dsts, all_gather_inputs)
    return all_gather_input, all_gather_output

def call(kernel, inputs, sizes, numel, world, rank):
    output = DefaultAllGather().allocate((numel * world,), dtype=torch.float32, device=torch.device("cpu"))
    return kernel(inputs, output, sizes, numel, rank)
"""

#: a layout the patch does not know (torch 2.4.1's is another: foreach_all_gather allocates the buffer inline)
UNKNOWN = """
import torch

class BufferPool:
    def take(self, numel: int) -> torch.Tensor:
        return torch.empty((numel,), dtype=torch.float32)

def all_gather_copy_in_cuda(all_gather_inputs: list[torch.Tensor], numel: int, world: int, rank: int):
    output = BufferPool().take(numel * world)
    all_gather_input = output.narrow(0, numel * rank, numel)
    with torch.no_grad():
        torch._foreach_copy_(torch.split(all_gather_input, [t.numel() for t in all_gather_inputs]), all_gather_inputs)
    return all_gather_input, output

def call(kernel, inputs, sizes, numel, world, rank):
    return kernel(inputs, numel, world, rank)
"""

#: release -> (module name, source): 2.5.1's kernel is 2.6.0's, at the older path
LAYOUTS = {
    "2.5.1": ("torch.distributed._composable.fsdp._fsdp_collectives", COPY_IN_2_6),
    "2.6.0": ("torch.distributed.fsdp._fully_shard._fsdp_collectives", COPY_IN_2_6),
    "2.8.0": ("torch.distributed.fsdp._fully_shard._fsdp_collectives", ALLOCATE_MEMORY_2_8),
    "2.14.1": ("torch.distributed.fsdp._fully_shard._fsdp_collectives", MIXIN_2_14),
    "unknown": ("torch.distributed.fsdp._fully_shard._fsdp_collectives", UNKNOWN),
}


def check(name: str, source: str) -> dict[str, object]:
    import torch

    from precision_harness.runs.verl import fsdp2_buffers

    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    kernel = module.all_gather_copy_in_cuda  # as torch.library's dispatcher holds it
    layout = fsdp2_buffers.zero_fill(module)
    fsdp2_buffers.zero_fill(module)  # idempotent
    inputs = [torch.arange(1.0, 7.0), torch.arange(1.0, 3.0)]
    mine, output = module.call(kernel, inputs, [6, 2], 8, 2, 0)
    return {
        "layout": layout,
        "copied": mine.tolist() == [*range(1, 7), 1, 2],
        "others_zero": bool((output[8:] == 0).all()),
    }


def main() -> None:
    import torch

    layouts = {release: check(*layout) for release, layout in LAYOUTS.items()}
    print(json.dumps({"torch": torch.__version__, "layouts": layouts}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
