"""The machine a golden records (precision_harness.runs.host.machine, numerics.devices) and the environment diff a
verdict names first (precision_harness.check.environment): pure functions, no torch, no scenario run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from precision_harness.check.environment import Change, EnvironmentDiff, diff
from precision_harness.runs.host import machine
from precision_harness.runs.numerics.devices import determinism_env, determinism_settings

ROOT = Path(__file__).resolve().parents[1]

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma bmi2 avx512f avx512bw avx512_bf16 amx_tile amx_bf16 amx_int8

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma bmi2 avx512f avx512bw avx512_bf16 amx_tile amx_bf16 amx_int8
"""

KUNPENG_CPUINFO = """processor\t: 0
BogoMIPS\t: 200.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma dcpop asimddp
CPU implementer\t: 0x48
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd01
"""

#: a run's environment as numerics.devices.fingerprint writes it on a CPU box
RUN_ENV = {
    "python": "3.11.7",
    "torch": "2.13.0+cpu",
    "transformers": "5.10.4",
    "mindstudio-probe": "26.2.0",
    "numpy": "2.4.6",
    "device": "cpu",
    "num_threads": 1,
    "machine": "x86_64",
    "cpu_vendor": "AuthenticAMD",
    "cpu_model": "AMD EPYC 7B13",
    "cpu_flags": "avx2 fma",
    "cpu_capability": "AVX2",
    "blas": "mkl 2024.2",
    "onednn": "3.12.0 enabled",
    "deterministic_algorithms": "on",
    "determinism_env": "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 PYTHONHASHSEED=0",
}

XEON = {
    "cpu_vendor": "GenuineIntel",
    "cpu_model": "Intel Xeon",
    "cpu_flags": "avx2 fma avx512f avx512_bf16 amx_bf16",
}


# ------------------------------------------------------------------------------------- machine
def test_cpuinfo_x86_vendor_model_and_the_isa_flags_that_matter() -> None:
    assert machine.parse_cpuinfo(X86_CPUINFO) == {
        "cpu_vendor": "GenuineIntel",
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
        "cpu_flags": "avx2 fma avx512f avx512_bf16 amx_bf16",  # ISA_FLAGS order; sse2, amx_int8 ... left out
    }


def test_cpuinfo_aarch64_names_the_implementer() -> None:
    assert machine.parse_cpuinfo(KUNPENG_CPUINFO) == {
        "cpu_vendor": "HiSilicon",
        "cpu_model": "HiSilicon part 0xd01",
        "cpu_flags": "asimd",
    }


def test_cpuinfo_unreadable_says_unknown_rather_than_fail(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(machine.platform, "processor", lambda: "")
    assert machine.cpu_fingerprint(tmp_path / "no-cpuinfo") == {
        "cpu_vendor": "unknown",
        "cpu_model": "unknown",
        "cpu_flags": "unknown",
    }
    assert machine.parse_cpuinfo("") == {"cpu_vendor": "unknown", "cpu_model": "unknown", "cpu_flags": "unknown"}


def test_blas_and_onednn_from_torch_config() -> None:
    config = (
        "PyTorch built with:\n"
        "  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64\n"
        "  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71049cd69a3df32adcccb623b12cd7baa22)\n"
        "  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, LAPACK_INFO=mkl, USE_MKL=ON\n"
    )
    assert machine.blas_line(config, mkl=True) == "mkl 2024.2"
    assert machine.blas_line("  - Build settings: BLAS_INFO=open, BUILD_TYPE=Release", mkl=False) == "open"
    assert machine.blas_line("", mkl=False) == "unknown"
    assert machine.onednn_line(config, available=True, enabled=True) == "3.12.0 enabled"
    assert machine.onednn_line(config, available=True, enabled=False) == "3.12.0 disabled"
    assert machine.onednn_line(config, available=False, enabled=True) == "unavailable"


def test_determinism_settings_are_what_the_environment_has() -> None:
    pinned = determinism_env("cpu", 1)
    assert determinism_settings("cpu", 1, pinned) == RUN_ENV["determinism_env"]
    lost = {k: v for k, v in pinned.items() if k != "MKL_CBWR"}
    assert "MKL_CBWR=unset" in determinism_settings("cpu", 1, lost)
    assert determinism_settings("cuda", 1, {}) == "CUBLAS_WORKSPACE_CONFIG=unset PYTHONHASHSEED=unset"


def test_fingerprint_helpers_import_no_torch() -> None:
    """machine, environment and numerics.devices load in the pytest process: torch stays out."""
    code = (
        "import sys; import precision_harness.runs.host.machine, precision_harness.check.environment, "
        "precision_harness.runs.numerics.devices; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------- the diff
def test_same_environment_no_diff() -> None:
    env = EnvironmentDiff.between(RUN_ENV, dict(RUN_ENV))
    assert not env and env.headline() is None and diff(RUN_ENV, RUN_ENV) == []
    assert not EnvironmentDiff.between(RUN_ENV, None)  # a target without run.json: nothing known, nothing claimed
    # a command scenario's argv names this machine's interpreter: part of the scenario, not the environment
    assert not EnvironmentDiff.between(
        {**RUN_ENV, "command": "/a/python t.py"}, {**RUN_ENV, "command": "/b/python t.py"}
    )


def test_versions_changed() -> None:
    run = {**RUN_ENV, "torch": "2.14.0+cpu", "transformers": "5.11.0"}
    env = EnvironmentDiff.between(RUN_ENV, run)
    assert diff(RUN_ENV, run) == ["torch 2.13.0+cpu -> 2.14.0+cpu", "transformers 5.10.4 -> 5.11.0"]
    assert env.differs
    assert env.headline() == (
        "environment differs from the golden's: torch 2.13.0+cpu -> 2.14.0+cpu; transformers 5.10.4 -> 5.11.0"
    )


def test_cpu_model_and_the_flags_that_differ() -> None:
    assert diff(RUN_ENV, {**RUN_ENV, **XEON}) == ["CPU AMD EPYC 7B13 -> Intel Xeon (avx512f, avx512_bf16, amx_bf16)"]
    assert diff({**RUN_ENV, **XEON}, RUN_ENV) == ["CPU Intel Xeon (avx512f, avx512_bf16, amx_bf16) -> AMD EPYC 7B13"]
    # a VM that masks a flag on the same CPU model
    assert diff(RUN_ENV, {**RUN_ENV, "cpu_flags": "avx2"}) == ["CPU AMD EPYC 7B13 (fma) -> AMD EPYC 7B13"]


def test_threads_and_determinism_changed() -> None:
    run = {
        **RUN_ENV,
        "num_threads": 4,
        "deterministic_algorithms": "off",
        "determinism_env": RUN_ENV["determinism_env"].replace("MKL_CBWR=COMPATIBLE", "MKL_CBWR=unset"),
    }
    assert diff(RUN_ENV, run) == [
        "threads 1 -> 4",
        "deterministic algorithms on -> off",
        "MKL_CBWR COMPATIBLE -> unset",
    ]
    # a golden recorded before the gate pinned MKL's COMPATIBLE branch (AVX2, which an AMD processor replaces by
    # its own): the verdicts say so
    before = {**RUN_ENV, "determinism_env": RUN_ENV["determinism_env"].replace("=COMPATIBLE", "=AVX2")}
    assert diff(before, RUN_ENV) == ["MKL_CBWR AVX2 -> COMPATIBLE"]


#: the ``env`` of golden/grpo_tiny/cpu/manifest.json as recorded before the machine fields existed
OLD_GOLDEN_ENV = {
    "cpu_capability": "AVX2",
    "device": "cpu",
    "machine": "x86_64",
    "mindstudio-probe": "26.2.0",
    "num_threads": 1,
    "numpy": "2.4.6",
    "python": "3.11.7",
    "torch": "2.13.0+cpu",
    "transformers": "5.10.4",
}


def test_old_golden_without_the_new_fields_says_not_recorded() -> None:
    """A golden recorded before the machine fields: they read "not recorded" and do not alarm."""
    golden = OLD_GOLDEN_ENV
    env = EnvironmentDiff.between(golden, RUN_ENV)
    lines = [str(c) for c in env.changes]
    assert "CPU not recorded -> AMD EPYC 7B13 (avx2, fma)" in lines
    assert "BLAS not recorded -> mkl 2024.2" in lines
    assert not env.differs
    assert env.headline().startswith("environment not fully recorded: ")
    # with a real change as well, the change comes first
    changed = EnvironmentDiff.between(golden, {**RUN_ENV, "torch": "2.14.0+cpu"})
    assert changed.differs
    assert changed.headline().startswith(
        "environment differs from the golden's: torch 2.13.0+cpu -> 2.14.0+cpu; CPU not recorded -> AMD EPYC 7B13"
    )


def test_device_model_changed_is_named_and_flagged() -> None:
    """Faked identities: no GPU needed. A GPU model change is the device model; a CPU model change never is."""
    h100 = {**RUN_ENV, "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "gpu_capability": "9.0"}
    a100 = {**h100, "gpu": "NVIDIA A100-SXM4-40GB", "gpu_capability": "8.0"}
    env = EnvironmentDiff.between(h100, a100)
    assert env.device_model == Change("accelerator model", "H100 80GB HBM3", "A100-SXM4-40GB")
    assert diff(h100, a100) == ["accelerator model H100 80GB HBM3 -> A100-SXM4-40GB", "compute capability 9.0 -> 8.0"]
    assert EnvironmentDiff.between(h100, {**h100, **XEON}).device_model is None  # CPUs: goldens are portable
    npu = {**RUN_ENV, "device": "npu", "npu_chip": "Ascend910B3"}
    assert EnvironmentDiff.between(npu, {**npu, "npu_chip": "Ascend910_9392"}).device_model.what == "accelerator model"
    # another device type is cross-device already; an older golden without its model cannot be told apart
    assert EnvironmentDiff.between(RUN_ENV, a100).device_model is None
    old = {k: v for k, v in h100.items() if k not in ("gpu", "gpu_capability")}
    assert EnvironmentDiff.between(old, a100).device_model is None
    assert "accelerator model not recorded -> A100-SXM4-40GB" in diff(old, a100)


def test_json_round_trip() -> None:
    env = EnvironmentDiff.between(RUN_ENV, {**RUN_ENV, "torch": "2.14.0+cpu", "cpu_model": None})
    assert EnvironmentDiff.from_json(json.loads(json.dumps(env.to_json()))) == env
    assert env.to_json()[0] == {"what": "torch", "golden": "2.13.0+cpu", "run": "2.14.0+cpu"}


@pytest.mark.parametrize("missing", ["golden", "run"])
def test_a_side_without_a_field_is_not_recorded(missing: str) -> None:
    short = {k: v for k, v in RUN_ENV.items() if k != "blas"}
    golden, run = (short, RUN_ENV) if missing == "golden" else (RUN_ENV, short)
    (change,) = EnvironmentDiff.between(golden, run).changes
    assert not change.recorded and "not recorded" in str(change)
