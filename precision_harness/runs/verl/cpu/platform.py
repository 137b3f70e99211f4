"""The CPU platform verl 0.9.1 lacks: ``precision_cpu``, registered with verl's ``PlatformRegistry``.

verl knows the nvidia, huawei and amd platforms; without an accelerator it falls back to nvidia and
its process groups fail with ``Distributed package doesn't have NCCL built in``. This platform names
the device ``cpu``, communicates over gloo, seeds torch's CPU generator, and answers the memory and
profiler calls with no-ops. ``current_device()`` is the string ``"cpu"`` (verl's base class says an
int): verl passes it straight to ``.to(...)``, ``torch.device(...)`` and FSDP, where an int means an
accelerator. Ray schedules verl's workers on a ``GPU`` resource (``use_gpu=True`` is hard-coded in its
single controller), so the gate declares one GPU resource to Ray (``ray_kwargs.ray_init.num_gpus``);
no process sees a GPU.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any

import torch

NAME = "precision_cpu"


class _CPUDeviceModule(types.ModuleType):
    """``torch.cpu`` plus no-ops for the ``torch.cuda`` calls verl makes on its device module."""

    def __init__(self) -> None:
        super().__init__("precision_cpu_device")

    def __getattr__(self, name: str) -> Any:
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
            return lambda *a, **k: 0
        if name == "mem_get_info":
            return lambda *a, **k: (0, 0)
        if name in ("empty_cache", "reset_peak_memory_stats", "set_device", "manual_seed", "manual_seed_all"):
            return lambda *a, **k: None
        if name == "get_device_name":
            return lambda *a, **k: "CPU"  # verl's flops counter: "CPU" has no peak figure (inf)
        if name == "is_initialized":
            return lambda: True
        raise AttributeError(f"precision_cpu device module has no {name!r}")


DEVICE_MODULE = _CPUDeviceModule()


class _CPUPlatform:
    """verl's platform interface on the CPU, with gloo (see the module docstring): the methods of the class
    :func:`register` builds on verl's ``PlatformBase``, which is imported only there."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: only VERL_PLATFORM=precision_cpu selects it

    def current_device(self) -> Any:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None

    def get_device_uuid(self, device_id: Any) -> str:
        return f"cpu-{device_id}"


def register() -> None:
    """Register ``precision_cpu`` with verl's public ``PlatformRegistry``."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform=NAME)
    class PlatformCPU(_CPUPlatform, PlatformBase):
        """verl's platform interface on the CPU, with gloo (see the module docstring)."""
