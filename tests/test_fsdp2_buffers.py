"""Patch 6 enforces its version and applies on every device (issue 36): FSDP2's all-gather buffer is zero-filled
in each verl process on cpu, cuda and npu alike, and under a torch it was not checked with it is refused in one
line, by the gate before a verl run starts and by the verl process itself, unless PRECISION_ALLOW_UNCHECKED_TORCH=1."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from precision_harness.errors import ScenarioError
from precision_harness.runs import fsdp2_buffers, kind_runners, verl_engine

ROOT = Path(__file__).resolve().parents[1]
REFUSED = (
    "torch 2.99.0: the gate's zero-fill of FSDP2's all-gather buffer (precision_harness/runs/fsdp2_buffers.py) was "
    "checked with torch 2.13.0; re-check it against this torch, or set PRECISION_ALLOW_UNCHECKED_TORCH=1 to apply "
    "it as it stands"
)


def test_an_unchecked_torch_is_refused_in_one_line_unless_allowed() -> None:
    assert fsdp2_buffers.refusal("2.13.0+cpu", {}) is None and fsdp2_buffers.refusal("2.13.0", {}) is None
    assert fsdp2_buffers.refusal("2.99.0", {}) == REFUSED
    assert fsdp2_buffers.refusal("2.99.0", {fsdp2_buffers.ALLOW_ENV: "1"}) is None
    assert fsdp2_buffers.refusal("2.99.0", {fsdp2_buffers.ALLOW_ENV: "yes please"}) == REFUSED


@pytest.mark.parametrize("device", ["cpu", "cuda", "npu"])
def test_every_verl_process_loads_the_patch_on_every_device(device: str) -> None:
    modules = verl_engine.external_modules(device, {})["VERL_USE_EXTERNAL_MODULES"].split(",")
    assert verl_engine.FSDP2_BUFFERS_MODULE in modules


def test_the_gate_refuses_a_verl_run_under_an_unchecked_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    scenario = kind_runners.load_scenario(ROOT / "examples" / "verl_cpu" / "scenarios" / "ppo_critic_tiny_cpu.yaml")
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.99.0" if name == "torch" else real(name))
    monkeypatch.delenv(fsdp2_buffers.ALLOW_ENV, raising=False)
    with pytest.raises(ScenarioError) as err:
        kind_runners.command_spec(scenario, tmp_path, device="cpu")
    assert str(err.value) == f"{scenario.path}: {REFUSED}"
    monkeypatch.setenv(fsdp2_buffers.ALLOW_ENV, "1")
    kind_runners.command_spec(scenario, tmp_path, device="cpu")  # allowed: the run starts


CODE = """
import torch
torch.__version__ = {version!r}
import precision_harness.runs.verl_fsdp2_buffers  # as verl imports it (VERL_USE_EXTERNAL_MODULES)
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc
mixin = fc.DefaultAllocMixin
buffer = mixin().allocate((64, 64), dtype=torch.float32, device="cpu")
print(mixin.allocate.__precision_patched__, bool((buffer == 0).all()), tuple(buffer.shape))
"""


def _process(version: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != fsdp2_buffers.ALLOW_ENV}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")])
    code = CODE.format(version=version)
    return subprocess.run(
        [sys.executable, "-c", code], env={**environ, **env}, capture_output=True, text=True, timeout=300
    )


def test_a_verl_process_zero_fills_the_buffer_under_the_checked_torch() -> None:
    proc = _process("2.13.0+cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True", "(64,", "64)"]


def test_a_verl_process_under_an_unchecked_torch_stops_in_one_line_or_patches_when_allowed() -> None:
    refused = _process("2.99.0")
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1] == f"RuntimeError: {REFUSED}"
    allowed = _process("2.99.0", **{fsdp2_buffers.ALLOW_ENV: "1"})
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert allowed.stdout.split()[:2] == ["True", "True"]
