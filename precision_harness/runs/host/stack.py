"""The software and accelerator stack a run ran on, read without importing torch.

A golden records it so that a failing check names the upgrade that moved it
(``torch_npu 2.5.1 -> 2.6.0; CANN 8.0.RC3 -> 8.1.RC1``, :mod:`precision_harness.check.environment`).
Everything here is read from files, package metadata and the vendors' command-line tools, never from
a device API: it runs in the gate's process (which never imports torch) and at start-up in each of
verl's rank processes (:mod:`precision_harness.runs.host.rank_env`), where touching a device before the
framework picks one would open a context on device 0.

What is read, and where from:

- package versions (:data:`PACKAGES`): ``importlib.metadata`` of the interpreter that reads them;
- CANN: :func:`cann_version`, from the toolkit's own files under ``$ASCEND_TOOLKIT_HOME``,
  ``$ASCEND_HOME_PATH`` or the default install roots. HCCL ships inside CANN and has no version of
  its own;
- the NPU driver: ``Version=`` of ``/usr/local/Ascend/driver/version.info``;
- the NPU chip model and count: the ``NPU Name`` rows of ``npu-smi info``;
- NCCL: the ``nvidia-nccl-cu1x`` wheel torch depends on;
- the NVIDIA driver: ``/proc/driver/nvidia/version``; the GPU model and count: ``nvidia-smi
  --query-gpu=name --format=csv,noheader``;
- the accelerator model under one key for both devices (:data:`MODEL_KEY`, :func:`model_name`): the chip
  or GPU name without its vendor's prefix, as a golden per model is named (docs/goldens.md, "Another
  accelerator model").

Every reader returns None (a key left out) rather than raising: a fingerprint never fails a run.
The Ascend and NVIDIA readers are tested against those tools' published output formats; they have
not run on an NPU or a GPU (none was available to this project).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: distributions whose versions a golden records when installed (the gate's own dependencies, the
#: device stack and the RL frameworks that drive it)
PACKAGES = (
    "torch",
    "torch_npu",
    "transformers",
    "mindstudio-probe",
    "numpy",
    "verl",
    "vllm",
    "vllm-ascend",
    "sglang",
    "ray",
)
#: NCCL's wheels, newest CUDA first (torch's CUDA builds depend on one of them)
NCCL_PACKAGES = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
ASCEND_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
NPU_DRIVER_INFO = Path("/usr/local/Ascend/driver/version.info")
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
#: seconds a vendor tool may take before it counts as unreadable
TOOL_TIMEOUT = 10.0
#: the ``env`` key of the accelerator model, one for every device (:func:`model_name` of its reading)
MODEL_KEY = "accelerator_model"
#: each device's own reading of its model: ``npu-smi``'s or torch_npu's chip name, ``nvidia-smi``'s or torch's GPU name
RAW_MODEL_KEYS = {"npu": "npu_chip", "cuda": "gpu"}
_COUNT_KEYS = {"npu": "npu_count", "cuda": "gpu_count"}
#: the vendor prefix one reading of a model has and another has not (torch_npu's ``Ascend910B3``, npu-smi's ``910B3``)
_VENDOR_PREFIX = {"npu": "Ascend", "cuda": "NVIDIA"}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """``{distribution: version}`` of those of ``names`` installed in this interpreter."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def key_value(text: str, key: str) -> str | None:
    """The value of the first ``key=value`` line of ``text`` (case-insensitive key), or None."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == key.lower() and value.strip():
            return value.strip()
    return None


def cann_version(environ: Mapping[str, str], arch: str | None = None) -> str | None:
    """CANN's toolkit version (``8.0.RC3``, ``8.1.RC1``, ``8.0.0``) read from the toolkit's files, or None.

    ``torch_npu.utils.get_cann_version`` answers only from CANN 8.1.RC1 on (torch_npu's docs: below
    it, an empty string), so this reader is what an older CANN is recorded by. The roots tried, in
    order: ``$ASCEND_TOOLKIT_HOME``, ``$ASCEND_HOME_PATH`` (both set by the toolkit's ``set_env.sh``),
    ``/usr/local/Ascend/ascend-toolkit/latest`` (CANN 8.0 to 8.3) and ``/usr/local/Ascend/cann``
    (CANN 8.5's layout). In each, the first file that answers:

    1. ``<root>/<arch>-linux/ascend_toolkit_install.info``, its ``version=`` line (every layout from
       CANN 8.0 on; CANN's install guide checks the version with ``cat .../latest/<arch>-linux/
       ascend_toolkit_install.info``; vllm-ascend's ``collect_env`` prints it: ``package_name=
       Ascend-cann-toolkit``, ``version=8.0.RC3``, ``innerversion=...``, ``path=...``); ``arm64-linux``
       is the older name of ``aarch64-linux``;
    2. ``<root>/version.cfg``, the CANN release after the colon of ``toolkit_running_version=
       [7.6.0.1.220:8.0.0]`` (or of ``runtime_running_version``, which HCCL's own version check
       reads): the CANN 8.0 toolkit root's summary of its components.

    Returns None when no root holds either (never the root's path: a path is not a version).
    """
    arch = arch or platform.machine()
    arch_dirs = [f"{arch}-linux", *(["arm64-linux"] if arch == "aarch64" else [])]
    roots = [environ.get("ASCEND_TOOLKIT_HOME"), environ.get("ASCEND_HOME_PATH"), *ASCEND_ROOTS]
    for root in dict.fromkeys(filter(None, roots)):
        version = _toolkit_info_version(Path(root), arch_dirs) or _version_cfg_release(Path(root))
        if version:
            return version
    return None


def _toolkit_info_version(root: Path, arch_dirs: list[str]) -> str | None:
    for arch_dir in arch_dirs:
        text = _read(root / arch_dir / "ascend_toolkit_install.info")
        if text is not None and key_value(text, "version"):
            return key_value(text, "version")
    return None


def _version_cfg_release(root: Path) -> str | None:
    """The CANN release of ``version.cfg``: ``8.0.0`` of ``toolkit_running_version=[7.6.0.1.220:8.0.0]``."""
    text = _read(root / "version.cfg")
    for key in ("toolkit_running_version", "runtime_running_version"):
        value = key_value(text or "", key)
        m = re.fullmatch(r"\[[^:\]]*:([^\]]+)\]", value or "")
        if m:
            return m.group(1).strip()
    return None


def parse_npu_smi(text: str) -> tuple[str, int] | None:
    """``(chip model, count)`` from ``npu-smi info``: each NPU's first row is ``| <id>  <Name>  | <Health> |``."""
    chips = re.findall(r"^\|\s*\d+\s+([0-9A-Za-z][\w.-]*)\s*\|\s*(?:OK|Warning|Alarm|Critical)", text, re.M)
    if not chips:
        return None
    return (chips[0] if len(set(chips)) == 1 else ", ".join(sorted(set(chips)))), len(chips)


def nvidia_driver_version(text: str) -> str | None:
    """The driver version in ``/proc/driver/nvidia/version`` (``NVRM version: ... Kernel Module  535.104.05 ...``)."""
    m = re.search(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)", text)
    return m.group(1) if m else None


def parse_nvidia_smi(text: str) -> tuple[str, int] | None:
    """``(GPU model, count)`` from ``nvidia-smi --query-gpu=name --format=csv,noheader`` (one name per line)."""
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        return None
    return (names[0] if len(set(names)) == 1 else ", ".join(sorted(set(names)))), len(names)


def model_name(device: str, name: object) -> str | None:
    """The accelerator model as :data:`MODEL_KEY` records it: ``name`` without its vendor's prefix and extra spaces.

    ``910B3`` of torch_npu's ``Ascend910B3`` and of npu-smi's ``910B3``; ``H100 80GB HBM3`` of ``NVIDIA H100 80GB
    HBM3`` (nvidia-smi's and torch's name); other names as they are. None for no name, or for a device without a
    model (cpu).
    """
    text = " ".join(str(name or "").split())
    prefix = _VENDOR_PREFIX.get(device)
    if prefix is None or not text:
        return None
    if text.lower().startswith(prefix.lower()) and len(text) > len(prefix):
        text = text[len(prefix) :].lstrip(" _-") or text
    return text


def model_of(env: Mapping[str, object]) -> str | None:
    """The accelerator model an ``env`` map records: its :data:`MODEL_KEY`, else :func:`model_name` of its device's
    own reading (``npu_chip``, ``gpu``: a golden recorded before the key), else None (cpu, or not recorded)."""
    recorded = env.get(MODEL_KEY)
    if recorded:
        return str(recorded)
    device = env.get("device")
    devices = [device] if device in RAW_MODEL_KEYS else list(RAW_MODEL_KEYS)
    return next(filter(None, (model_name(str(d), env.get(RAW_MODEL_KEYS[str(d)])) for d in devices)), None)


def with_model(env: dict[str, Any]) -> dict[str, Any]:
    """``env`` with :data:`MODEL_KEY` set where it records a model: the vendor tool's reading where it has one (the
    gate reads the same, to pick a golden per model), else :func:`model_of` its ``gpu``/``npu_chip`` (torch's)."""
    model = model_of(env)
    return {**env, MODEL_KEY: model} if model else env


def host_model(device: str) -> str | None:
    """This host's accelerator model for ``device`` (:func:`model_name` of its vendor tool's first row), or None:
    cpu, the tool missing or unreadable. A host of two models gives both (``910B1, 910B3``)."""
    reading = _models(device)
    return model_name(device, reading[0]) if reading else None


def _models(device: str) -> tuple[str, int] | None:
    if device == "npu":
        return parse_npu_smi(_tool(["npu-smi", "info"]) or "")
    if device == "cuda":
        return parse_nvidia_smi(_tool(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or "")
    return None


def accelerator_stack(device: str, environ: Mapping[str, str]) -> dict[str, str | int]:
    """The device stack of ``device`` (``npu``: CANN, driver, chips; ``cuda``: NCCL, driver, GPUs; cpu: none), with
    the model under :data:`MODEL_KEY` where the vendor tool answers."""
    out: dict[str, str | int] = {}
    if device == "npu":
        _put(out, "cann", cann_version(environ))
        driver = _read(NPU_DRIVER_INFO)
        _put(out, "npu_driver", key_value(driver, "version") if driver else None)
    elif device == "cuda":
        nccl = package_versions(NCCL_PACKAGES)
        _put(out, "nccl", next(iter(nccl.values()), None))
        driver = _read(NVIDIA_DRIVER)
        _put(out, "nvidia_driver", nvidia_driver_version(driver) if driver else None)
    models = _models(device)
    if models:
        out[RAW_MODEL_KEYS[device]], out[_COUNT_KEYS[device]] = models
        _put(out, MODEL_KEY, model_name(device, models[0]))
    return out


def software_stack(device: str, environ: Mapping[str, str] | None = None) -> dict[str, str | int]:
    """:func:`package_versions` and :func:`accelerator_stack` of ``device``, as one ``env`` map."""
    environ = os.environ if environ is None else environ
    return {**package_versions(), **accelerator_stack(device, environ)}


def _put(out: dict[str, str | int], key: str, value: str | None) -> None:
    if value:
        out[key] = value


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _tool(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None
