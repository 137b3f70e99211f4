"""What machine a run ran on, torch-free: CPU vendor, model and ISA flags, and torch's BLAS build line.

The worker's :func:`precision_harness.runs.numerics.devices.fingerprint` and a command scenario's
``run.json`` (written in the pytest process, which never imports torch) both record these, so a
golden says which machine recorded it; :mod:`precision_harness.check.environment` names what differs.
Every reader here returns ``"unknown"`` rather than raising: a fingerprint must never fail a run.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
UNKNOWN = "unknown"

#: ISA flags that change which CPU kernels torch, MKL and oneDNN pick (x86, then aarch64 ``Features``)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "asimd", "sve", "sve2", "bf16", "i8mm")

#: aarch64 ``CPU implementer`` codes of the vendors an RL cluster meets (Kunpeng hosts carry Ascend NPUs)
ARM_IMPLEMENTERS = {"0x41": "ARM", "0x48": "HiSilicon", "0x61": "Apple", "0xc0": "Ampere"}


def _fields(text: str) -> dict[str, str]:
    """``key: value`` lines of /proc/cpuinfo, keys lower-cased, the first value of each kept (every core
    reports the same model; older aarch64 kernels put ``Hardware`` in a trailing block)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    return fields


def parse_cpuinfo(text: str) -> dict[str, str]:
    """``{"cpu_vendor", "cpu_model", "cpu_flags"}`` from the text of /proc/cpuinfo (x86 or aarch64).

    ``cpu_flags`` is the space-separated subset of :data:`ISA_FLAGS` the CPU has, in that order;
    a field the text does not give is ``"unknown"``.
    """
    fields = _fields(text)
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    implementer = fields.get("cpu implementer", "")
    vendor = fields.get("vendor_id") or ARM_IMPLEMENTERS.get(implementer.lower(), implementer) or UNKNOWN
    model = fields.get("model name") or fields.get("hardware") or ""
    if not model and implementer:
        model = f"{vendor} part {fields.get('cpu part', '?')}"
    return {
        "cpu_vendor": vendor,
        "cpu_model": re.sub(r"\s+", " ", model) or UNKNOWN,
        "cpu_flags": " ".join(f for f in ISA_FLAGS if f in flags) if flags else UNKNOWN,
    }


def cpu_fingerprint(cpuinfo: Path = CPUINFO) -> dict[str, str]:
    """This machine's CPU: :func:`parse_cpuinfo` of /proc/cpuinfo, else ``platform.processor()``.

    Never raises: an unreadable /proc (not Linux, a sandbox) gives the platform's answer or ``"unknown"``.
    """
    try:
        return parse_cpuinfo(cpuinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return {"cpu_vendor": UNKNOWN, "cpu_model": platform.processor() or UNKNOWN, "cpu_flags": UNKNOWN}


def blas_line(config: str, *, mkl: bool) -> str:
    """The BLAS torch was built with, from ``torch.__config__.show()``: ``"mkl 2024.2"``, ``"openblas"``.

    ``mkl`` is ``torch.backends.mkl.is_available()``; MKL's version is added when torch names it.
    """
    m = re.search(r"BLAS_INFO=([^,\s]+)", config)
    blas = m.group(1) if m else ("mkl" if mkl else UNKNOWN)
    version = re.search(r"Math Kernel Library Version ([0-9][0-9.]*)", config)
    if blas == "mkl" and version:
        return f"mkl {version.group(1).rstrip('.')}"
    return blas


def onednn_line(config: str, *, available: bool, enabled: bool) -> str:
    """oneDNN (mkldnn) as torch reports it: ``"3.12.0 enabled"``, ``"3.12.0 disabled"`` or ``"unavailable"``."""
    if not available:
        return "unavailable"
    m = re.search(r"MKL-DNN v([0-9][0-9.]*)", config) or re.search(r"oneDNN v([0-9][0-9.]*)", config)
    state = "enabled" if enabled else "disabled"
    return f"{m.group(1)} {state}" if m else state
