"""Every error a user can cause is one clear line: no traceback, the file and field named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness_testing import edit_scenario, make_project


def assert_one_line_error(result: pytest.RunResult, pattern: str) -> None:
    out = result.stdout.str()
    assert "Traceback" not in out and "precision_harness/" not in out, out
    result.stdout.fnmatch_lines([pattern])


def test_malformed_yaml(pytester: pytest.Pytester) -> None:
    make_project(pytester.path, "seed: 1\nmodel: {hidden_size: 8\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert_one_line_error(result, "*tiny_ppo.yaml: malformed YAML: line *, column *")


def test_schema_violation_names_field(pytester: pytest.Pytester) -> None:
    make_project(pytester.path, "actor_rollout_ref:\n  actor:\n    optim:\n      lr: -1\n")
    result = pytester.runpytest_subprocess()
    assert_one_line_error(
        result, "*tiny_ppo.yaml: actor_rollout_ref.actor.optim.lr: -1 is less than or equal to the minimum of 0"
    )


def test_unknown_stage_strict(pytester: pytest.Pytester) -> None:
    make_project(
        pytester.path,
        "global_profiler:\n  global_tool_config:\n    precision_debugger:\n"
        "      strict: true\n      stages: [actor_updat]\n",
    )
    result = pytester.runpytest_subprocess("--collect-only")
    assert_one_line_error(result, "*unknown stage 'actor_updat' (strict: true); expected one of *")


def test_unknown_stage_not_strict_warns(pytester: pytest.Pytester) -> None:
    make_project(
        pytester.path,
        "global_profiler:\n  global_tool_config:\n    precision_debugger:\n      stages: [actor_update, actor_updat]\n",
    )
    result = pytester.runpytest_subprocess("--collect-only", "-q")
    result.stdout.fnmatch_lines(["*tiny_ppo.yaml::actor_update[[]step_1[]]*"])
    result.stdout.fnmatch_lines(
        [
            "*PytestWarning: precision_debugger.stages: 'actor_updat' is unknown or never runs in this scenario; "
            "ignored (strict: false)"
        ]
    )


@pytest.mark.parametrize("name", ["..", "."])
def test_scenario_name_cannot_leave_golden(pytester: pytest.Pytester, name: str) -> None:
    """``name: ..`` once wrote the golden to ``<rootdir>/cpu`` and replaced what was there: now nothing is written."""
    make_project(pytester.path, f"name: {json.dumps(name)}\n")
    mine = pytester.path / "cpu" / "keep.txt"
    mine.parent.mkdir()
    mine.write_text("mine")
    result = pytester.runpytest_subprocess("--precision-golden", "update")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert_one_line_error(result, f"*tiny_ppo.yaml: name: {name!r} is not a valid scenario name*")
    assert mine.read_text() == "mine" and sorted(p.name for p in mine.parent.iterdir()) == ["keep.txt"]
    assert not (pytester.path / "golden").exists() and not (pytester.path / ".precision").exists()


def test_corrupt_golden_file_named(project: pytest.Pytester) -> None:
    dump = project.path / "golden/tiny_ppo/cpu/step_1/actor_update/step0/rank0/dump.json.zst"
    dump.write_bytes(dump.read_bytes()[:-8])  # truncated
    result = project.runpytest_subprocess("-k", "actor_update and step_1")
    result.assert_outcomes(failed=1, deselected=10)
    assert_one_line_error(
        result, "*golden/tiny_ppo/cpu/step_1/actor_update/step0/rank0/dump.json.zst: sha256 differs from manifest.json*"
    )


def test_corrupt_manifest_named(project: pytest.Pytester) -> None:
    (project.path / "golden/tiny_ppo/cpu/manifest.json").write_text("{]")
    result = project.runpytest_subprocess()
    result.assert_outcomes(failed=11)
    assert_one_line_error(
        result,
        "golden/tiny_ppo/cpu/manifest.json: unreadable manifest*"
        "re-record with: pytest scenarios/tiny_ppo.yaml --precision-golden update",
    )


def test_stale_golden_says_rerecord(project: pytest.Pytester) -> None:
    edit_scenario(project, "level: L1", "level: mix")
    result = project.runpytest_subprocess()
    result.assert_outcomes(failed=11)
    assert_one_line_error(
        result,
        "golden/tiny_ppo/cpu/manifest.json: golden is stale, recorded under msprobe level L1 (now mix); "
        "re-record with: pytest scenarios/tiny_ppo.yaml --precision-golden update",
    )
    assert not (project.path / ".precision/artifacts/tiny_ppo/run").exists()


def test_stale_golden_structural_change(project: pytest.Pytester) -> None:
    edit_scenario(project, "hidden_size: 16", "hidden_size: 24")
    result = project.runpytest_subprocess()
    assert_one_line_error(
        result,
        "*golden is stale, recorded under scenario hash * (now *: model.hidden_size: 16 -> 24); re-record with*",
    )


def test_golden_missing_a_stage(project: pytest.Pytester) -> None:
    manifest_path = project.path / "golden/tiny_ppo/cpu/manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if not k.startswith("step_2/actor_update/")}
    manifest_path.write_text(json.dumps(manifest))
    result = project.runpytest_subprocess("-k", "actor_update and step_2")
    assert_one_line_error(
        result, "*no dump for actor_update @ step_2; the golden predates this step/stage, re-record with*"
    )


def _actor_update_step_1(project: pytest.Pytester, site: Path) -> subprocess.CompletedProcess:
    """The project's ``actor_update`` item of step 1, checked in a pytest process with ``site`` first on
    ``PYTHONPATH`` (a stand-in for what is installed)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-k", "actor_update and step_1"],
        cwd=project.path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        timeout=300,
    )


def test_msprobe_not_installed(project: pytest.Pytester) -> None:
    fake = project.path / "fake_site" / "msprobe"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'msprobe' (simulated)\")\n")
    proc = _actor_update_step_1(project, project.path / "fake_site")
    assert proc.returncode == 1, proc.stdout
    assert "mindstudio-probe (msprobe) is not installed; pip install mindstudio-probe" in proc.stdout
    assert "Traceback" not in proc.stdout


def test_an_msprobe_that_cannot_dump_under_numpy_2_is_one_line(project: pytest.Pytester) -> None:
    """The 8.x line (CANN images ship it) imports np.unicode_, which numpy 2 removed: the run is refused before it
    starts, in one line naming the release, numpy, the supported range and what to install; no worker dies."""
    import numpy

    site = project.path / "fake_site" / "mindstudio_probe-8.3.3.dist-info"  # found before the installed release
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: mindstudio-probe\nVersion: 8.3.3\n")
    proc = _actor_update_step_1(project, site.parent)
    assert proc.returncode == 1, proc.stdout
    line = (
        f"mindstudio-probe 8.3.3 cannot run under numpy {numpy.__version__}: it uses np.unicode_, which numpy 2 "
        "removed (the 8.x line runs the gate under numpy < 2, without verl, whose 0.9.1 needs numpy 2: "
        "docs/stacks.md); the gate is checked with mindstudio-probe 26.0.0 to 26.2.x: "
        "pip install 'mindstudio-probe>=26.1.0'"
    )
    assert line in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout and "EOFError" not in proc.stdout


def test_worker_failure_is_one_line_with_log(project: pytest.Pytester) -> None:
    # a prompt longer than max_prompt_length fails inside the worker
    edit_scenario(project, "max_prompt_length: 10", "max_prompt_length: 3")
    result = project.runpytest_subprocess("--precision-golden", "update", "-k", "metrics")
    result.assert_outcomes(failed=1, deselected=10)
    assert_one_line_error(
        result,
        "*tiny_ppo.yaml: scenario run failed: ValueError: data.max_prompt_length: prompt * needs more than 3 tokens "
        "(log: *worker.log)",
    )


def test_artifacts_path_msprobe_rejects(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("--precision-artifacts", "out dir", "-k", "metrics")
    assert_one_line_error(result, "*msprobe rejects dump path * only [[]A-Za-z0-9_.:/-[]] are allowed*")


def test_collect_only_imports_no_torch(pytester: pytest.Pytester) -> None:
    make_project(pytester.path)
    pytester.makeconftest(
        textwrap.dedent("""
        import sys
        def pytest_collection_finish(session):
            heavy = sorted(m for m in ("torch", "transformers", "msprobe.pytorch") if m in sys.modules)
            print("HEAVY-MODULES:", heavy)
    """)
    )
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-s")
    result.stdout.fnmatch_lines(["HEAVY-MODULES: []", "*11 tests collected*"])
