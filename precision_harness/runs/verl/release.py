"""The verl releases the gate was checked with, and its lines about the one installed (read without importing verl).

Its own module because verl's processes import it at start-up (the CPU support, the stage window): what they need
to refuse an unchecked verl, without the engine's imports.
"""

from __future__ import annotations

import importlib.metadata

_PD = "global_profiler.global_tool_config.precision_debugger"

CHECKED_VERSION = "0.9.1"
#: the verl versions the CPU support (precision_harness.runs.verl.cpu, its patches) was checked against
SUPPORTED_VERSIONS = ("0.9.1",)
#: what a missing verl asks for: verl itself, installed as verl's guide says for the device (on an NPU with
#: vllm-ascend and torch_npu); never the [verl] extra, which pins the CPU path's verl over a device stack
VERL_FIX = (
    f"install verl itself as verl's installation guide says for your device (the gate was checked with verl "
    f'{CHECKED_VERSION}), or on the CPU use the CPU path\'s environment (docs/scenarios.md, "verl on CPU")'
)


def installed_version() -> str | None:
    """The installed verl's version, read without importing it (None: not installed)."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def stage_window_version_message(version: str | None) -> str:
    """The one line for ``level: auto`` under a verl the stage window (its patch of verl's debugger) was not
    checked against."""
    return (
        f"{_PD}.level: auto: verl {version} is not supported; the stage window that records each stage's inputs "
        "and outputs from verl's batch wraps verl's PrecisionDebuggerProfiler (precision_harness/runs/verl/stages/"
        f"debugger.py), checked with verl {', '.join(SUPPORTED_VERSIONS)}: install that verl, or set level L0, L1 "
        "or mix"
    )


def unsupported_version_message(version: str | None) -> str:
    """The one line for a verl the CPU support was not checked against, naming what needs which version."""
    return (
        f"engine: verl on cpu: verl {version} is not supported; the CPU platform, rollout replica and the patches "
        "of verl internals in precision_harness/runs/verl/cpu/patches.py (process-group backend, reference "
        "offload, rollout registry, critic stages, value-head loader) were tested with verl "
        f"{', '.join(SUPPORTED_VERSIONS)}: pip install 'pytest-precision[verl]'"
    )


def version_line(device: str) -> str:
    """The run log's line naming the installed verl against the versions the gate's overrides were checked with."""
    version = installed_version()
    checked = ", ".join(SUPPORTED_VERSIONS)
    if version in SUPPORTED_VERSIONS:
        return f"precision gate: verl {version} on {device} (the gate's overrides were checked with verl {checked})"
    return (
        f"precision gate: verl {version} on {device}: the gate's overrides (profiler, pinning, logger keys) were "
        f"checked with verl {checked}; Hydra names any key this verl lacks before the trainer starts"
    )
