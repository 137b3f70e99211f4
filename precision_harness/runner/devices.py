"""Device selection and determinism settings for a scenario worker.

:func:`determinism_env` is pure (no torch import): ``launch`` uses it to build the worker's
environment, because thread pools and BLAS dispatch are fixed when torch is first imported.
:func:`setup` runs inside the worker.
"""

from __future__ import annotations

import os
import platform
import random
from typing import Any

DEVICES = ("cpu", "cuda", "npu")
#: what torch.backends.cpu.get_cpu_capability() reports under ATEN_CPU_CAPABILITY=avx2
PORTABLE_CPU_CAPABILITY = "AVX2"
#: ``PRECISION_MKLDNN=0`` turns oneDNN off in a built-in worker (one of the portability check's settings)
MKLDNN_SWITCH = "PRECISION_MKLDNN"


def determinism_env(device: str, num_threads: int) -> dict[str, str]:
    """Environment variables a worker needs before ``import torch``.

    - all devices: OpenMP/MKL thread pools pinned to ``num_threads`` (msprobe's own ``torch.mean``
      on tensors of >= 65,536 elements changes with the thread count; docs/msprobe.md#determinism);
    - cpu: MKL conditional numerical reproducibility (``MKL_CBWR=AVX2``) and oneDNN's ISA capped at
      AVX2, so a golden does not depend on whether the recording machine had AVX-512;
    - cuda: ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (needed by ``torch.use_deterministic_algorithms``);
    - npu: ``HCCL_DETERMINISTIC=true`` and ``CLOSE_MATMUL_K_SHIFT=1`` (the flags msprobe's
      ``seed_all(mode=True)`` documents for Ascend).
    """
    env = {
        "OMP_NUM_THREADS": str(num_threads),
        "MKL_NUM_THREADS": str(num_threads),
        "PYTHONHASHSEED": "0",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TQDM_DISABLE": "1",
    }
    if device == "cpu":
        env.update({"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    elif device == "cuda":
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    elif device == "npu":
        env.update({"HCCL_DETERMINISTIC": "true", "CLOSE_MATMUL_K_SHIFT": "1"})
    return env


def setup(device: str, *, seed: int, num_threads: int, cpu_kernels: str = "portable") -> Any:
    """Seed python/numpy/torch, pin threads, turn on deterministic algorithms; return the torch device.

    On cpu with ``cpu_kernels="portable"`` (``trainer.cpu_kernels``) the matrix products run
    through :mod:`precision_harness.runner.cpu_kernels`, so a golden does not depend on the
    processor that recorded it; ``"vendor"`` keeps torch's MKL/oneDNN dispatch.

    Raises:
        RuntimeError: the requested device is not available (no CUDA, or torch_npu missing), or
            portable CPU kernels on a CPU where ATen cannot run its AVX2 kernels.
    """
    import numpy as np
    import torch

    if device == "npu":
        try:
            import torch_npu  # noqa: F401  (registers the npu device)
        except ImportError:
            raise RuntimeError(
                "device npu: torch_npu is not installed; "
                "pip install 'pytest-precision[npu]' or pick --precision-device cpu"
            ) from None
        try:
            from msprobe.pytorch import seed_all

            seed_all(seed=seed, mode=True)
        except ImportError:  # pragma: no cover - msprobe is checked before the run
            pass
    elif device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda: torch.cuda.is_available() is False; pick --precision-device cpu")
    elif device == "cpu" and cpu_kernels == "portable":
        _portable_cpu(torch)
    if os.environ.get(MKLDNN_SWITCH) == "0":
        torch.backends.mkldnn.enabled = False
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(num_threads)
    torch.use_deterministic_algorithms(True, warn_only=device != "cpu")
    if device == "cuda":
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return torch.device(device)


def _portable_cpu(torch: Any) -> None:
    """Install the portable kernels; refuse a CPU whose ATen kernels are not the pinned AVX2 ones.

    Every element-wise op and reduction (msprobe's own Mean included) runs ATen's kernel for
    ``ATEN_CPU_CAPABILITY``; a CPU without AVX2 silently runs another one, whose transcendental
    functions round differently, so its dumps could never match a golden: say so instead.
    """
    from precision_harness.runner import cpu_kernels

    capability = torch.backends.cpu.get_cpu_capability()
    if capability != PORTABLE_CPU_CAPABILITY:
        raise RuntimeError(
            f"CPU goldens are recorded with ATen's {PORTABLE_CPU_CAPABILITY} kernels, but this CPU runs "
            f"{capability} ({platform.machine()}): its dumps cannot match them; record goldens for it "
            "in a project of its own"
        )
    cpu_kernels.install()


def fingerprint(device: str, num_threads: int) -> dict[str, Any]:
    """What a golden depends on: library versions, device, threads, CPU capability."""
    import importlib.metadata as md

    import torch

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "mindstudio-probe": version("mindstudio-probe"),
        "numpy": version("numpy"),
        "device": device,
        "num_threads": num_threads,
        "machine": platform.machine(),
    }
    if device == "cpu":
        env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    elif device == "cuda":
        env["cuda"] = torch.version.cuda
        env["gpu"] = torch.cuda.get_device_name(0)
    elif device == "npu":
        env["torch_npu"] = version("torch_npu")
        env["cann"] = os.environ.get("ASCEND_TOOLKIT_HOME")
    return env
