"""--precision-allow-skip: a scenario that cannot run here (its device absent, verl missing, no golden in check
mode) fails the run, one line per item naming why; only the opt-in skips its items, and the summary says how
many were skipped and why. No scenario runs in these tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from harness_testing import make_project

from precision_harness.runs.host import device_availability
from precision_harness.runs.verl import engine as verl_engine

VERL_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "verl_cpu"
#: what the gate reads to know whether verl is installed (verl_engine.installed_version), answered "not installed"
NO_VERL_CONFTEST = """
from precision_harness.runs.verl import engine as verl_engine

verl_engine.installed_version = lambda: None
"""


def _cuda_scenario(pytester: pytest.Pytester) -> None:
    if device_availability.unavailable_reason("cuda") is None:
        pytest.skip("CUDA is available here")
    make_project(pytester.path)
    path = pytester.path / "scenarios/tiny_ppo.yaml"
    path.write_text("device: cuda\n" + path.read_text())


def test_absent_device_fails_the_run_naming_it(pytester: pytest.Pytester) -> None:
    """grpo_tiny's shape with ``device: cuda`` on a CPU host: before, 11 skipped and exit 0."""
    _cuda_scenario(pytester)
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=11)
    reason = "tiny_ppo: device cuda: torch.cuda.is_available() is False (torch without CUDA, or no GPU visible); "
    assert result.stdout.str().count(f"\n{reason}") == 11  # each item's failure is that one line
    assert not (pytester.path / ".precision/artifacts/tiny_ppo/run").exists()


@pytest.mark.parametrize("how", ["flag", "ini"])
def test_absent_device_skips_with_the_opt_in_and_the_summary_says_why(pytester: pytest.Pytester, how: str) -> None:
    _cuda_scenario(pytester)
    if how == "ini":
        ini = pytester.path / "pytest.ini"
        ini.write_text(ini.read_text() + "precision_allow_skip = true\n")
    result = pytester.runpytest_subprocess(*(["--precision-allow-skip"] if how == "flag" else []))
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(skipped=11)
    result.stdout.fnmatch_lines(
        [
            "11 precision items: 0 identical to golden, 0 within tolerance or compared, 0 failed, 11 skipped",
            "skipped (--precision-allow-skip): 11 items, not checked: tiny_ppo: device cuda: "
            "torch.cuda.is_available() is False*",
        ]
    )


def _verl_example_without_verl(pytester: pytest.Pytester) -> None:
    # the gate it starts sees only this test's setting, not a variable an earlier test of the session left set
    for key in [k for k in os.environ if k.startswith(("PRECISION_", "RAY_")) and k != "PRECISION_REQUIRE_VERL"]:
        pytester._monkeypatch.delenv(key)
    for name in ("scenarios", "golden", "data", "model", "pytest.ini", "reward.py"):
        src = VERL_EXAMPLE / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, pytester.path / name)
    (pytester.path / "conftest.py").write_text(NO_VERL_CONFTEST)


def test_verl_example_without_verl_fails_the_run_saying_to_install_verl(pytester: pytest.Pytester) -> None:
    """examples/verl_cpu where verl is not installed: before, its scenarios skipped at collection, exit 0."""
    _verl_example_without_verl(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] > 0 and set(outcomes) == {"failed"}, outcomes
    fix = f": engine: verl needs verl installed in this environment; {verl_engine.VERL_FIX}"
    # each item's failure section is that one line; the short summary repeats it after "FAILED <item> - ",
    # whole under CI=true (pytest truncates it to the terminal's width elsewhere), so it is not counted
    lines = [line for line in result.stdout.lines if not line.startswith("FAILED ")]
    scenarios = ("grpo_dp2_bf16_cpu", "ppo_critic_tiny_cpu")
    each = [sum(line.endswith(f"{sc}.yaml{fix}") for line in lines) for sc in scenarios]
    assert min(each) > 0 and sum(each) == outcomes["failed"], each


def test_verl_example_without_verl_skips_with_the_opt_in(pytester: pytest.Pytester) -> None:
    _verl_example_without_verl(pytester)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--precision-allow-skip")
    assert result.ret == pytest.ExitCode.OK
    skipped = result.parseoutcomes()["skipped"]
    assert skipped > 0 and set(result.parseoutcomes()) == {"skipped"}
    result.stdout.fnmatch_lines_random(
        [
            f"{skipped} precision items: *, 0 failed, {skipped} skipped",
            "skipped (--precision-allow-skip): * items, not checked: *grpo_dp2_bf16_cpu.yaml: engine: verl needs *",
            "skipped (--precision-allow-skip): * items, not checked: *ppo_critic_tiny_cpu.yaml: engine: verl needs *",
        ]
    )


def test_no_golden_skips_only_with_the_opt_in(pytester: pytest.Pytester) -> None:
    """Check mode without a golden fails (tests/test_option_precision_golden.py); the opt-in skips, saying so."""
    make_project(pytester.path)
    result = pytester.runpytest_subprocess("--precision-allow-skip")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(skipped=11)
    result.stdout.fnmatch_lines(
        [
            "skipped (--precision-allow-skip): 11 items, not checked: golden/tiny_ppo/cpu/: no golden for scenario "
            "tiny_ppo on cpu; record it with: pytest *tiny_ppo.yaml --precision-golden missing*"
        ]
    )
    assert not (pytester.path / ".precision/artifacts/tiny_ppo/run").exists()
