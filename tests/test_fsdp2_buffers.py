"""Patch 6 applies on the user's torch (issues 36 and 52): FSDP2's all-gather buffer is zero-filled in each verl
process on cpu, cuda and npu alike, at the point where that torch release allocates it (DefaultAllocMixin.allocate,
torch 2.8's allocate_memory, or the copy-in kernel of 2.5-2.7); under a layout the patch does not know the run
proceeds and says which rows go unchecked; only a torch the gate cannot run under is refused, in one line.

torch is imported only in subprocesses (tests/fsdp2_layouts.py, benchmarks/torch_releases.py)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from precision_harness.errors import ScenarioError
from precision_harness.runs import kind_runners
from precision_harness.runs.verl import engine as verl_engine
from precision_harness.runs.verl import fsdp2_buffers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import fsdp2_layouts  # noqa: E402

REFUSED = (
    "torch 2.0.1 is not supported by the precision gate (supported: torch 2.1 and later; FSDP2's all-gather buffer "
    "zero-filled on torch 2.5 and later, run on 2.6.0, 2.8.0, 2.13.0, 2.14.1); install one: pip install 'torch>=2.6.0'"
)
#: release -> where it allocates the buffer (read in its wheel's _fsdp_collectives.py)
EXPECTED = {
    "2.5.1": "all_gather_copy_in_cuda",
    "2.6.0": "all_gather_copy_in_cuda",
    "2.8.0": "allocate_memory",
    "2.14.1": "DefaultAllocMixin.allocate",
}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("version", ["2.1.0", "2.4.1", "2.5.1", "2.6.0", "2.8.0", "2.13.0+cpu", "2.14.1", "2.99.0"])
def test_no_torch_the_gate_runs_under_is_refused(version: str) -> None:
    assert fsdp2_buffers.refusal(version) is None


def test_a_torch_the_gate_cannot_run_under_is_refused_in_one_line_saying_what_to_install() -> None:
    assert fsdp2_buffers.refusal("2.0.1") == REFUSED
    assert "\n" not in REFUSED and fsdp2_buffers.refusal(None) is None  # torch not installed: nothing to fill


@pytest.mark.parametrize("device", ["cpu", "cuda", "npu"])
def test_every_verl_process_loads_the_patch_on_every_device(device: str) -> None:
    modules = verl_engine.external_modules(device, {})["VERL_USE_EXTERNAL_MODULES"].split(",")
    assert verl_engine.FSDP2_BUFFERS_MODULE in modules


@pytest.mark.parametrize("release", sorted(fsdp2_layouts.LAYOUTS))
def test_the_gate_reads_each_releases_layout_from_its_source_without_importing_torch(release: str) -> None:
    assert fsdp2_buffers.source_layout(fsdp2_layouts.LAYOUTS[release][1]) == EXPECTED.get(release)


@pytest.fixture(scope="module")
def patched() -> dict[str, Any]:
    """Each release's layout built as a module, patched and run (tests/fsdp2_layouts.py, one subprocess)."""
    helper = Path(__file__).with_name("fsdp2_layouts.py")
    proc = subprocess.run([sys.executable, str(helper)], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {"results": json.loads(proc.stdout), "stderr": proc.stderr}


@pytest.mark.parametrize("release", sorted(EXPECTED))
def test_each_releases_buffer_is_zero_filled_where_that_release_allocates_it(
    release: str, patched: dict[str, Any]
) -> None:
    # the kernel was taken before the patch, as torch's dispatcher holds it: the fill reaches it all the same
    assert patched["results"]["layouts"][release] == {"layout": EXPECTED[release], "copied": True, "others_zero": True}


def test_an_unknown_layout_proceeds_and_names_the_rows_left_unchecked(patched: dict[str, Any]) -> None:
    unknown = patched["results"]["layouts"]["unknown"]
    assert unknown["layout"] is None and unknown["copied"]  # not patched, and the copy-in ran
    line = fsdp2_buffers.not_filled(patched["results"]["torch"], fsdp2_layouts.LAYOUTS["unknown"][0])
    assert f"precision gate: {line}" in patched["stderr"].splitlines()
    assert f"so {fsdp2_buffers.UNFILLED_ROWS} are unchecked" in line


def test_the_gate_starts_a_verl_run_under_any_torch_it_runs_under(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("verl", reason="the [verl] extra installs verl 0.9.1")
    scenario = kind_runners.load_scenario(ROOT / "examples" / "verl_cpu" / "scenarios" / "ppo_critic_tiny_cpu.yaml")
    real = importlib.metadata.version
    torch_version = {"torch": "2.99.0"}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: torch_version.get(name) or real(name))
    module = fsdp2_buffers.MODULES[0]
    monkeypatch.setattr(fsdp2_buffers, "installed_layout", lambda: (module, None))
    header = kind_runners.command_spec(scenario, tmp_path, device="cpu").header  # a layout it does not know: runs
    assert header[-1] == f"precision gate: {fsdp2_buffers.not_filled('2.99.0', module)}"
    torch_version["torch"] = "2.0.1"
    with pytest.raises(ScenarioError) as err:
        kind_runners.command_spec(scenario, tmp_path, device="cpu")
    assert str(err.value) == f"{scenario.path}: {REFUSED}"


def test_the_run_log_names_where_the_installed_torch_is_filled() -> None:
    module, layout = fsdp2_buffers.installed_layout() or ("", None)
    assert layout == fsdp2_buffers.ALLOC_MIXIN  # torch 2.13.0, the pinned environment
    assert fsdp2_buffers.fill_line().endswith(f"FSDP2's all-gather buffer zero-filled in {module}.{layout}")


@pytest.mark.slow
def test_two_identical_two_rank_runs_under_the_installed_torch_give_identical_all_gather_buffers() -> None:
    argv = [sys.executable, str(ROOT / "benchmarks" / "torch_releases.py"), "--python", sys.executable]
    proc = subprocess.run([*argv, "--json", "--no-control"], env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["error"] is None and row["layout"] == fsdp2_buffers.ALLOC_MIXIN
    assert row["calls"] >= 6  # three sharded modules, forward and backward, on each of two ranks
    assert row["identical"] and row["zero_before_copy"]
