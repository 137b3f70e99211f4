"""Device selection and determinism settings for a scenario worker.

:func:`determinism_env` is pure (no torch import): ``launch`` uses it to build the worker's
environment, because thread pools and BLAS dispatch are fixed when torch is first imported.
:func:`setup` runs inside the worker.
"""

from __future__ import annotations

import os
import platform
import random
from collections.abc import Callable, Mapping
from typing import Any

DEVICES = ("cpu", "cuda", "npu")
#: what torch.backends.cpu.get_cpu_capability() reports under ATEN_CPU_CAPABILITY=avx2
PORTABLE_CPU_CAPABILITY = "AVX2"
#: MKL's reproducibility branch on cpu. Of MKL's branches only ``COMPATIBLE`` and ``AUTO`` run on a processor not
#: made by Intel (oneMKL developer reference, "Named Constants for CNR Control"; another is replaced by ``AUTO``
#: there), and ``AUTO`` picks its code by the processor
MKL_BRANCH = "COMPATIBLE"
#: ``PRECISION_MKLDNN=0`` turns oneDNN off in a built-in worker (one of the portability check's settings)
MKLDNN_SWITCH = "PRECISION_MKLDNN"


def determinism_env(device: str, num_threads: int) -> dict[str, str]:
    """Environment variables a worker needs before ``import torch``.

    - all devices: OpenMP/MKL thread pools pinned to ``num_threads`` (msprobe's own ``torch.mean``
      on tensors of >= 65,536 elements changes with the thread count; docs/msprobe.md#determinism);
    - cpu: MKL's ``COMPATIBLE`` reproducibility branch (``MKL_CBWR``: one SSE2 code path without the
      approximation instructions ``rcpps``/``rsqrtps``, which Intel documents as the one branch every
      x86-64 processor, Intel or not, runs alike; ``AVX2`` is honoured on Intel only, and an AMD
      processor takes its own branch instead), oneDNN's ISA capped at AVX2 and ATen's kernels at AVX2,
      so a golden does not depend on the processor that recorded it (docs/tolerance.md, "CPU
      portability": ATen's ``exp``, ``log``, ``sqrt``, ``sin``, ``cos`` and ``erf`` of fp32 and fp64
      tensors call MKL's vector math library);
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
        env.update({"MKL_CBWR": MKL_BRANCH, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    elif device == "cuda":
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    elif device == "npu":
        env.update({"HCCL_DETERMINISTIC": "true", "CLOSE_MATMUL_K_SHIFT": "1"})
    return env


def setup(device: str, *, seed: int, num_threads: int, cpu_kernels: str = "portable") -> Any:
    """Seed python/numpy/torch, pin threads, turn on deterministic algorithms; return the torch device.

    On cpu with ``cpu_kernels="portable"`` (``trainer.cpu_kernels``) the matrix products run
    through :mod:`precision_harness.runs.numerics.cpu_kernels`, so a golden does not depend on the
    processor that recorded it; ``"vendor"`` keeps torch's MKL/oneDNN dispatch.

    Raises:
        RuntimeError: the requested device is not available (no CUDA, or torch_npu missing), or
            portable CPU kernels on a CPU where ATen cannot run its AVX2 kernels.
    """
    import torch

    if device == "npu":
        try:
            import torch_npu  # noqa: F401  (registers the npu device)
        except ImportError:
            raise RuntimeError(
                "device npu: torch_npu is not installed; install the torch_npu release that matches "
                "your CANN and torch, or pick --precision-device cpu"
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
    _seed_all(seed)
    torch.set_num_threads(num_threads)
    torch.use_deterministic_algorithms(True, warn_only=device != "cpu")
    if device == "cuda":
        _cuda_no_benchmark_no_tf32(torch)
    return torch.device(device)


def _seed_all(seed: int) -> None:
    """python's, numpy's and torch's generators (every device's: ``torch.manual_seed``) seeded with ``seed``."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _cuda_no_benchmark_no_tf32(torch: Any) -> None:
    """cuDNN's autotuner off, and no TF32 in fp32 products (matmul and cuDNN)."""
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


#: the seed of python's, numpy's and torch's generators in a verl process of a gate run (msprobe's ``seed_all``
#: default); verl reseeds what it seeds itself after the gate's hook has run
WORKER_SEED = 1234


def worker_determinism(device: str) -> dict[str, str]:
    """Apply ``device``'s deterministic settings in a process the gate did not start (a verl rank, its rollout and
    reward workers), as :func:`setup` does in its own worker, and say what was applied: the record's
    ``deterministic_algorithms`` (on / warn only), ``seeds`` and, on cuda, ``cudnn``.

    python's, numpy's and torch's generators (every device's, ``torch.manual_seed``) seeded with
    :data:`WORKER_SEED`: without it each process of a verl run starts torch from a seed of its own (measured on
    the CPU: a different one per rank and per run); torch's deterministic algorithms (strict on cpu, warn only
    elsewhere, as :func:`setup`); cuda: cuDNN deterministic, no benchmark, no TF32. npu's variables
    (``HCCL_DETERMINISTIC``, ``CLOSE_MATMUL_K_SHIFT``, :func:`determinism_env`) reach every process through the
    run's environment and are recorded by the gate as ``determinism_env``. Touches no device context. Never
    raises: a switch that fails reads ``failed: <why>``.
    """
    import torch

    _seed_all(WORKER_SEED)
    record = {"seeds": f"python, numpy, torch: {WORKER_SEED}"}
    try:
        torch.use_deterministic_algorithms(True, warn_only=device != "cpu")
        record["deterministic_algorithms"] = _deterministic_algorithms(torch)
    except Exception as exc:  # a torch without the switch: said, not raised
        record["deterministic_algorithms"] = f"failed: {exc}"
    if device == "cuda":
        _cuda_no_benchmark_no_tf32(torch)
        torch.backends.cudnn.deterministic = True
        record["cudnn"] = "deterministic, no benchmark, no TF32"
    return record


def _portable_cpu(torch: Any, *, split_k: int | None = None) -> None:
    """Install the portable kernels (``split_k``: :func:`.cpu_kernels.install`'s); refuse a CPU whose ATen
    kernels are not the pinned AVX2 ones.

    Every element-wise op and reduction (msprobe's own Mean included) runs ATen's kernel for
    ``ATEN_CPU_CAPABILITY``; a CPU without AVX2 silently runs another one, whose transcendental
    functions round differently, so its dumps could never match a golden: say so instead.
    """
    from precision_harness.runs.numerics import cpu_kernels

    capability = torch.backends.cpu.get_cpu_capability()
    if capability != PORTABLE_CPU_CAPABILITY:
        raise RuntimeError(
            f"CPU goldens are recorded with ATen's {PORTABLE_CPU_CAPABILITY} kernels, but this CPU runs "
            f"{capability} ({platform.machine()}): its dumps cannot match them; record goldens for it "
            "in a project of its own"
        )
    cpu_kernels.install(split_k=split_k)


#: determinism_env variables that cannot change a number (offline switches, progress bars); thread
#: counts are recorded as ``num_threads``
_NOT_NUMERIC = frozenset(
    (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TQDM_DISABLE",
    )
)


def determinism_settings(device: str, num_threads: int, environ: Mapping[str, str]) -> str:
    """The numeric determinism variables of :func:`determinism_env` as ``environ`` has them (pure).

    ``"ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 PYTHONHASHSEED=0"``, sorted; a
    variable missing from ``environ`` reads ``unset``. What the worker really ran with, so a golden
    recorded before the gate pinned a variable (or by a process that lost it) says so.
    """
    names = sorted(k for k in determinism_env(device, num_threads) if k not in _NOT_NUMERIC)
    return " ".join(f"{k}={environ.get(k, 'unset')}" for k in names)


def _guarded(call: Callable[[], Any]) -> str | None:
    """``str(call())``, or None when it raises or answers nothing (a fingerprint never fails a run)."""
    try:
        value = call()
    except Exception:  # any driver or binding error means "not known here"
        return None
    return None if value in (None, "") else str(value)


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def fingerprint(device: str, num_threads: int) -> dict[str, Any]:
    """What a golden depends on: library versions, the machine, BLAS backends, determinism settings.

    Imports torch: call it in the worker only (after :func:`setup`, so threads and deterministic
    algorithms are the ones in force). Keys (all strings or integers, ``None`` where unknown):

    - versions: ``python``, ``torch``, ``transformers``, ``mindstudio-probe``, ``numpy``;
    - the machine: ``machine``, ``cpu_vendor``, ``cpu_model``, ``cpu_flags``
      (:mod:`precision_harness.runs.host.machine`), ``cpu_capability`` (torch's CPU dispatch level, capped at AVX2
      on cpu by :func:`determinism_env`);
    - BLAS: ``blas`` (``BLAS_INFO`` of ``torch.__config__.show()``, MKL's version), ``onednn``;
      on cpu ``cpu_kernels`` (``portable``: :mod:`precision_harness.runs.numerics.cpu_kernels` ran the
      matrix products; ``vendor``: torch's own);
    - determinism: ``num_threads`` (torch's, in force), ``deterministic_algorithms`` (on / warn only /
      off), ``determinism_env`` (:func:`determinism_settings`);
    - the rest of the device stack where readable (:func:`precision_harness.runs.host.stack.accelerator_stack`):
      cuda ``nccl``, ``nvidia_driver``, ``gpu_count``; npu ``npu_count`` (and ``cann``, ``npu_driver``,
      ``npu_chip`` from files and ``npu-smi`` where torch_npu does not answer);
    - cuda: ``gpu`` (device name), ``gpu_capability`` (``"9.0"``), ``cuda`` (runtime), ``cudnn``,
      ``cuda_driver``, ``tf32`` (``"matmul off, cudnn off"``: TF32 for fp32 products, as in force);
      npu: ``npu_chip`` (``torch_npu.npu.get_device_name``), ``torch_npu``, ``cann`` and ``npu_driver``
      (``torch_npu.utils.get_cann_version``, CANN >= 8.1; ``cann`` falls back to the toolkit's files,
      :func:`precision_harness.runs.host.stack.cann_version`);
    - cuda and npu: ``accelerator_model`` (:func:`precision_harness.runs.host.stack.model_name` of ``nvidia-smi``'s or
      ``npu-smi``'s first row, else of ``gpu`` or ``npu_chip``): the model a golden per model is kept for.

    Every device call is guarded and gives None when it fails. The cuda and npu keys were written
    against the libraries' documentation and have not run on a GPU or an NPU (none was available).
    """
    import torch

    from precision_harness.runs.host import stack

    env = _versions_machine_blas(torch, device, num_threads)
    if device == "cpu":
        from precision_harness.runs.numerics import cpu_kernels

        env["cpu_kernels"] = "portable" if cpu_kernels.installed() else "vendor"
    if device == "cuda":
        env.update(_cuda_fingerprint(torch))
    elif device == "npu":
        env.update(_npu_fingerprint())
    # the rest of the device stack (NCCL, drivers, chip counts); torch's own answer wins where it has one
    merged: dict[str, Any] = stack.accelerator_stack(device, os.environ)
    merged.update({k: v for k, v in env.items() if v is not None or k not in merged})
    return stack.with_model(merged)


def _versions_machine_blas(torch: Any, device: str, num_threads: int) -> dict[str, Any]:
    """:func:`fingerprint`'s versions, machine, BLAS and determinism keys (torch imported)."""
    from precision_harness.runs.host import machine

    config = _guarded(torch.__config__.show) or ""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "mindstudio-probe": _version("mindstudio-probe"),
        "numpy": _version("numpy"),
        "device": device,
        "num_threads": torch.get_num_threads() or num_threads,
        "machine": platform.machine(),
        **machine.cpu_fingerprint(),
        "cpu_capability": _guarded(torch.backends.cpu.get_cpu_capability),
        "blas": machine.blas_line(config, mkl=_guarded(torch.backends.mkl.is_available) == "True"),
        "onednn": machine.onednn_line(
            config,
            available=_guarded(torch.backends.mkldnn.is_available) == "True",
            enabled=bool(torch.backends.mkldnn.enabled),
        ),
        "deterministic_algorithms": _deterministic_algorithms(torch),
        "determinism_env": determinism_settings(device, num_threads, os.environ),
    }


def _deterministic_algorithms(torch: Any) -> str:
    if not torch.are_deterministic_algorithms_enabled():
        return "off"
    return "warn only" if torch.is_deterministic_algorithms_warn_only_enabled() else "on"


def _cuda_fingerprint(torch: Any) -> dict[str, Any]:
    """GPU model, compute capability, CUDA runtime, cuDNN, driver and TF32 (untested on hardware; guarded)."""
    return {
        "cuda": torch.version.cuda,
        "gpu": _guarded(lambda: torch.cuda.get_device_name(0)),
        "gpu_capability": _guarded(lambda: ".".join(map(str, torch.cuda.get_device_capability(0)))),
        "cudnn": _guarded(torch.backends.cudnn.version),
        # torch has no public driver query; this private binding exists in CUDA builds (12040 = 12.4)
        "cuda_driver": _guarded(lambda: torch._C._cuda_getDriverVersion()),
        # fp32 products on TF32 tensor cores round their inputs to 10 mantissa bits: a golden says which it had
        "tf32": _guarded(
            lambda: f"matmul {_on(torch.backends.cuda.matmul.allow_tf32)}, cudnn {_on(torch.backends.cudnn.allow_tf32)}"
        ),
    }


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _npu_fingerprint() -> dict[str, Any]:
    """Ascend chip, torch_npu, CANN and driver versions (untested on hardware; every call guarded).

    ``cann`` is ``torch_npu.utils.get_cann_version(module="CANN")`` where it answers (CANN >= 8.1.RC1),
    else :func:`precision_harness.runs.host.stack.cann_version` from the toolkit's files (None when none
    is found, so the stack's own reading is not overridden).
    """
    from precision_harness.runs.host import stack

    try:
        import torch_npu
    except ImportError:
        return {"torch_npu": None}
    get_cann = getattr(getattr(torch_npu, "utils", None), "get_cann_version", None)
    return {
        "torch_npu": _version("torch_npu"),
        "npu_chip": _guarded(lambda: torch_npu.npu.get_device_name(0)),
        # torch_npu answers "" below CANN 8.1.RC1: the toolkit's files say which CANN it is
        "cann": _guarded(lambda: get_cann(module="CANN")) or stack.cann_version(os.environ),
        "npu_driver": _guarded(lambda: get_cann(module="DRIVER")),
    }
