"""--precision-device and --precision-golden-device: clear errors (opted-in skips) for missing devices, cross-device
goldens."""

from __future__ import annotations

import json
import shutil

import pytest
from harness_testing import make_project, replace_payload

from precision_harness.goldens.golden import Golden
from precision_harness.runs.host import device_availability


def _assert_one_line_usage_error(result: pytest.RunResult, pattern: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([pattern])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


@pytest.mark.skipif(device_availability._has_module("torch_npu"), reason="torch_npu is installed here")
def test_npu_without_torch_npu_is_a_usage_error_naming_the_fix(pytester: pytest.Pytester) -> None:
    make_project(pytester.path)
    result = pytester.runpytest_subprocess("--precision-device", "npu")
    _assert_one_line_usage_error(
        result,
        "ERROR: --precision-device npu: torch_npu is not installed; "
        "install the torch_npu release that matches your CANN and torch, or use --precision-device cpu",
    )


def test_cuda_without_a_gpu_is_a_usage_error(pytester: pytest.Pytester) -> None:
    if device_availability.unavailable_reason("cuda") is None:
        pytest.skip("CUDA is available here")
    make_project(pytester.path)
    result = pytester.runpytest_subprocess("--precision-device", "cuda")
    _assert_one_line_usage_error(
        result, "ERROR: --precision-device cuda: torch.cuda.is_available() is False*; install a CUDA build of torch*"
    )


@pytest.mark.skipif(device_availability._has_module("torch_npu"), reason="torch_npu is installed here")
def test_scenario_device_npu_fails_under_auto_or_skips_when_allowed(pytester: pytest.Pytester) -> None:
    """A suite written for Ascend, run on a CPU box: its items fail naming the reason (a CANN upgrade that broke
    ``import torch_npu`` must not go green); ``--precision-allow-skip`` skips them."""
    make_project(pytester.path)
    path = pytester.path / "scenarios/tiny_ppo.yaml"
    path.write_text("device: npu\n" + path.read_text())
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=11)
    result.stdout.fnmatch_lines(["tiny_ppo: device npu: torch_npu is not installed; *"])
    allowed = pytester.runpytest_subprocess("-rs", "--precision-allow-skip")
    allowed.assert_outcomes(skipped=11)
    allowed.stdout.fnmatch_lines(["SKIPPED [[]*[]] *: tiny_ppo: device npu: torch_npu is not installed; *"])
    assert not (pytester.path / ".precision/artifacts/tiny_ppo/run").exists()


def test_golden_device_cannot_be_combined_with_update(pytester: pytest.Pytester) -> None:
    make_project(pytester.path)
    result = pytester.runpytest_subprocess("--precision-golden-device", "npu", "--precision-golden", "update")
    _assert_one_line_usage_error(
        result,
        "ERROR: --precision-golden-device npu compares against another device's golden; "
        "it cannot be combined with --precision-golden update*",
    )


@pytest.mark.slow
def test_golden_device_compares_against_the_other_devices_golden(project: pytest.Pytester) -> None:
    """A CPU run checked against the 'npu' golden (here: a copy of the CPU one) uses tolerance.cross_device."""
    result = project.runpytest_subprocess("--precision-golden-device", "npu", "-k", "metrics")
    result.assert_outcomes(failed=1, deselected=10)
    result.stdout.fnmatch_lines(["*golden/tiny_ppo/npu/: no golden for scenario tiny_ppo on npu; record it with*"])

    # the "npu" golden: the CPU one with one output Norm moved by 1e-4 relative (as another device's kernels would)
    shutil.copytree(project.path / "golden/tiny_ppo/cpu", project.path / "golden/tiny_ppo/npu")
    npu = project.path / "golden/tiny_ppo/npu"
    rel = "step_1/actor_update/step0/rank0/dump.json"
    dump = json.loads(Golden.from_dir(npu).read(rel))
    first = next(iter(dump["data"].values()))["output"][0]
    first["Norm"] *= 1 + 1e-4
    replace_payload(npu, rel, json.dumps(dump, indent=1).encode())
    manifest = json.loads((npu / "manifest.json").read_text())
    manifest["device"] = "npu"
    (npu / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    cross = project.runpytest_subprocess("--precision-golden-device", "npu", "-k", "step_1")
    cross.assert_outcomes(passed=5, deselected=6)  # default cross-device fp32 rtol 1e-3
    path = project.path / "scenarios/tiny_ppo.yaml"
    path.write_text(path.read_text() + "tolerance:\n  cross_device: {mode: exact}\n")
    strict = project.runpytest_subprocess("--precision-golden-device", "npu", "-k", "actor_update and step_1")
    strict.assert_outcomes(failed=1, deselected=10)
    strict.stdout.fnmatch_lines(["actor_update @ step_1, rank0: 1 of * statistics beyond tolerance (exact)"])
