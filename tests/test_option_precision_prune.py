"""Unused goldens (terminal summary) and --precision-prune: only a full, unfiltered run counts.

No scenario runs here: the project's own scenario has no golden, so its items fail fast.
"""

from __future__ import annotations

import json

import pytest
from harness_testing import make_project


@pytest.fixture
def stale_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """tiny_ppo (no golden) plus a golden for a scenario that no longer exists."""
    make_project(pytester.path)
    old = pytester.path / "golden" / "old_scenario" / "cpu"
    old.mkdir(parents=True)
    (old / "manifest.json").write_text(json.dumps({"scenario": "old_scenario"}))
    return pytester


def test_full_run_lists_unused(stale_project: pytest.Pytester) -> None:
    result = stale_project.runpytest_subprocess()
    result.stdout.fnmatch_lines(
        ["golden unused: golden/old_scenario/cpu (no collected scenario old_scenario; remove with --precision-prune)"]
    )
    assert (stale_project.path / "golden/old_scenario/cpu").is_dir()


def test_prune_removes_on_full_run(stale_project: pytest.Pytester) -> None:
    result = stale_project.runpytest_subprocess("--precision-prune")
    result.stdout.fnmatch_lines(["golden pruned: golden/old_scenario/cpu"])
    assert not (stale_project.path / "golden/old_scenario").exists()


@pytest.mark.parametrize(
    "args, why",
    [
        (("-k", "metrics"), "-k given; 11 items deselected"),
        (("--deselect", "scenarios/tiny_ppo.yaml::metrics"), "1 item deselected"),
        (("tests_elsewhere",), "scenario files not collected: scenarios/tiny_ppo.yaml"),
    ],
)
def test_partial_runs_never_count(stale_project: pytest.Pytester, args: tuple[str, ...], why: str) -> None:
    (stale_project.path / "tests_elsewhere").mkdir()
    (stale_project.path / "tests_elsewhere" / "test_x.py").write_text("def test_x():\n    pass\n")
    result = stale_project.runpytest_subprocess("--precision-prune", *args)
    result.stdout.fnmatch_lines([f"precision-prune: nothing removed, not a full run ({why})"])
    assert "golden unused" not in result.stdout.str()
    assert (stale_project.path / "golden/old_scenario/cpu").is_dir()


def test_collect_error_is_partial(stale_project: pytest.Pytester) -> None:
    (stale_project.path / "scenarios" / "broken.yaml").write_text("seed: [\n")
    result = stale_project.runpytest_subprocess("--precision-prune", "--continue-on-collection-errors")
    result.stdout.fnmatch_lines(["precision-prune: nothing removed, not a full run (broken.yaml failed to collect)"])
    assert (stale_project.path / "golden/old_scenario/cpu").is_dir()


def test_xdist_full_run_merges_workers(stale_project: pytest.Pytester) -> None:
    result = stale_project.runpytest_subprocess("-n", "2", "--precision-prune")
    result.stdout.fnmatch_lines(["golden pruned: golden/old_scenario/cpu"])


def test_xdist_shard_with_k_never_counts(stale_project: pytest.Pytester) -> None:
    result = stale_project.runpytest_subprocess("-n", "2", "-k", "step_1", "--precision-prune")
    result.stdout.fnmatch_lines(["precision-prune: nothing removed, not a full run (-k given*"])
    assert (stale_project.path / "golden/old_scenario/cpu").is_dir()


def test_every_shared_option_is_a_pytest_flag(pytester: pytest.Pytester) -> None:
    """precision_harness.options defines each option once; pytest shows each one (flag or ini key)."""
    from precision_harness.options import OPTIONS

    out = pytester.runpytest_subprocess("--help").stdout.str()
    for opt in OPTIONS:
        if opt.pytest in ("option", "both"):
            assert f"--precision-{opt.name}" in out, opt.name
        if opt.pytest in ("ini", "both"):
            assert f"precision_{opt.dest}" in out, opt.name
