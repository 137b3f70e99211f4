"""--precision-golden check | update | missing, end to end with real scenario runs (pytester)."""

from __future__ import annotations

import json

import pytest
from harness_testing import edit_scenario, make_project

pytestmark = pytest.mark.slow


def test_update_then_check_passes_identically(project: pytest.Pytester) -> None:
    """The recorded golden is reproduced byte for byte by a fresh run (determinism across processes)."""
    result = project.runpytest_subprocess()
    result.assert_outcomes(passed=11)
    result.stdout.fnmatch_lines(
        ["*11 precision items: 10 identical to golden, 1 within tolerance or compared, 0 failed*"]
    )


def test_update_twice_rewrites_nothing(project: pytest.Pytester) -> None:
    manifest = project.path / "golden/tiny_ppo/cpu/manifest.json"
    before = {p: p.stat().st_mtime_ns for p in (project.path / "golden").rglob("*") if p.is_file()}
    result = project.runpytest_subprocess("--precision-golden", "update")
    result.assert_outcomes(passed=11)
    result.stdout.fnmatch_lines(["golden unchanged: golden/tiny_ppo/cpu (* MB stored, +0.00 MB)"])
    after = {p: p.stat().st_mtime_ns for p in (project.path / "golden").rglob("*") if p.is_file()}
    assert after == before
    assert json.loads(manifest.read_text())["scenario"] == "tiny_ppo"


def test_missing_records_only_absent_goldens(project: pytest.Pytester) -> None:
    (project.path / "scenarios" / "tiny_two.yaml").write_text(
        (project.path / "scenarios" / "tiny_ppo.yaml").read_text()
    )
    before = (project.path / "golden/tiny_ppo/cpu/manifest.json").stat().st_mtime_ns
    result = project.runpytest_subprocess("--precision-golden", "missing")
    result.assert_outcomes(passed=22)
    result.stdout.fnmatch_lines(["golden recorded: golden/tiny_two/cpu (* MB stored, +* MB)"])
    assert (project.path / "golden/tiny_two/cpu/manifest.json").is_file()
    assert (project.path / "golden/tiny_ppo/cpu/manifest.json").stat().st_mtime_ns == before
    # the existing golden was checked, not re-recorded: its scenario was compared
    assert "golden recorded: golden/tiny_ppo" not in result.stdout.str()


def test_check_without_golden_fails_without_running(pytester: pytest.Pytester) -> None:
    make_project(pytester.path)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=11)
    result.stdout.fnmatch_lines(
        ["*no golden for scenario tiny_ppo on cpu; record it with: pytest *tiny_ppo.yaml --precision-golden missing*"]
    )
    assert not (pytester.path / ".precision/artifacts/tiny_ppo/run").exists()
    assert "Traceback" not in result.stdout.str()


def test_changed_learning_rate_fails_exactly_the_affected_stages(project: pytest.Pytester) -> None:
    """critic lr only moves the critic's second mini-batch at step 1, and what reads values at step 2."""
    edit_scenario(
        project,
        "critic:\n  ppo_mini_batch_size: 1\n  ppo_micro_batch_size_per_gpu: 2\n  optim:\n    lr: 1.0e-3",
        "critic:\n  ppo_mini_batch_size: 1\n  ppo_micro_batch_size_per_gpu: 2\n  optim:\n    lr: 3.0e-3",
    )
    result = project.runpytest_subprocess("-rf")
    result.assert_outcomes(passed=6, failed=5)
    result.stdout.fnmatch_lines_random(
        [
            "FAILED scenarios/tiny_ppo.yaml::critic_update[[]step_1[]]*",
            "FAILED scenarios/tiny_ppo.yaml::compute_values[[]step_2[]]*",
            "FAILED scenarios/tiny_ppo.yaml::critic_update[[]step_2[]]*",
            "FAILED scenarios/tiny_ppo.yaml::actor_update[[]step_2[]]*",
            "FAILED scenarios/tiny_ppo.yaml::metrics*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "critic_update @ step_1, rank0: * of * statistics beyond tolerance (fp32: rtol 1.3e-06, atol rtol x RMS)",
            # what explains the drift comes first: the setting, then where the change entered
            "  setting changed   critic.optim.lr: 0.001 -> 0.003",
            "  change entered    the change is upstream of critic_update: *",
            "  first divergence  *",
            "  artifacts         .precision/artifacts/tiny_ppo/step_1/critic_update/",
            '  rerun             pytest scenarios/tiny_ppo.yaml -k "critic_update and step_1"',
        ]
    )
    assert (project.path / ".precision/artifacts/tiny_ppo/step_1/critic_update/compare_result_rank0.csv").is_file()
    assert (project.path / ".precision/artifacts/tiny_ppo/step_1/critic_update/verdict.txt").is_file()


def test_rerun_one_stage_runs_the_scenario_once(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-k", "actor_update and step_2", "-v")
    result.assert_outcomes(passed=1, deselected=10)
    result.stdout.fnmatch_lines(["*tiny_ppo.yaml::actor_update[[]step_2[]] PASSED*", "tiny_ppo on cpu: run * s -> *"])
    assert result.stdout.str().count("tiny_ppo on cpu: run") == 1
