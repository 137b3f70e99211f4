"""pytest -n 2 (pytest-xdist) gives the verdicts of a serial run; each scenario runs once; summaries merge."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from harness_testing import edit_scenario

pytestmark = pytest.mark.slow


def verdicts(junit: Path) -> dict[str, str]:
    """``{"tiny_ppo.yaml::actor_update[step_1]": "passed" | "failed" | "skipped"}`` from a JUnit XML report."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "").split("@", 1)[0]  # loadgroup suffixes node ids with @<group>
        state = (
            "failed"
            if case.find("failure") is not None or case.find("error") is not None
            else "skipped"
            if case.find("skipped") is not None
            else "passed"
        )
        out[f"{case.get('classname')}::{name}"] = state
    return out


def test_xdist_and_serial_agree_on_a_suite_with_one_drifted_scenario(project: pytest.Pytester) -> None:
    # a second scenario with the same structure shares tiny_ppo's golden, then drifts (a numeric setting changed)
    shutil.copy(project.path / "scenarios/tiny_ppo.yaml", project.path / "scenarios/tiny_drift.yaml")
    shutil.copytree(project.path / "golden/tiny_ppo", project.path / "golden/tiny_drift")
    edit_scenario(project, "lr: 1.0e-3", "lr: 3.0e-3", name="tiny_drift")

    serial = project.runpytest_subprocess("--junitxml", "serial.xml", "--precision-artifacts", ".precision/serial")
    parallel = project.runpytest_subprocess(
        "-n", "2", "--junitxml", "xdist.xml", "--precision-artifacts", ".precision/xdist"
    )

    s, p = verdicts(project.path / "serial.xml"), verdicts(project.path / "xdist.xml")
    assert len(s) == 22 and s == p
    failed = sorted(k for k, v in s.items() if v == "failed")
    assert failed and all("tiny_drift" in k for k in failed)
    assert all(v == "passed" for k, v in s.items() if "tiny_ppo" in k)

    # the controller's summary adds up the workers' (workeroutput), and matches the serial summary
    count = re.compile(r"22 precision items: .*, (\d+) failed")
    s_line = [ln for ln in serial.outlines if count.search(ln)]
    p_line = [ln for ln in parallel.outlines if count.search(ln)]
    assert s_line and p_line and s_line == p_line and count.search(p_line[0]).group(1) == str(len(failed))
    # loadgroup: each scenario ran exactly once, on one worker
    runs = [ln for ln in parallel.outlines if re.match(r"tiny_(ppo|drift) on cpu: run ", ln)]
    assert len(runs) == 2 and {ln.split()[0] for ln in runs} == {"tiny_ppo", "tiny_drift"}
    assert all(re.search(r"/run-gw[01]$", ln) for ln in runs)


def test_dash_n_defaults_to_loadgroup(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-n", "2", "--collect-only", "-q")
    assert result.ret == 0
    result = project.runpytest_subprocess("-n", "2", "-v", "-k", "actor_update and step_1")
    result.assert_outcomes(passed=1)  # workers deselect; the controller reports no deselected count
    result.stdout.fnmatch_lines(
        ["scheduling tests via LoadGroupScheduling", "*PASSED scenarios/tiny_ppo.yaml::actor_update?step_1?@tiny_ppo*"]
    )
    # the worker's summary note reaches the controller's summary, once
    assert result.outlines.count("tiny_ppo: run to step 1 of 2, as selected") == 1, result.outlines


def test_a_projects_own_xdist_group_stays_on_one_worker(pytester: pytest.Pytester) -> None:
    """Beside the gate, ``-n 2`` keeps a project's ``xdist_group`` tests on one worker (xdist 3.8 alone spreads
    them under pytest 9.2: pytest-dev/pytest-xdist#1386); ungrouped tests still spread.

    Each ungrouped test waits (up to 20 s after the first began) until ungrouped tests have run on two workers:
    loadgroup then hands the rest to the worker that finished the group, so "they spread" does not depend on which
    worker is quicker, and a scheduler that put them all in one group would time out and fail the assertion."""
    wait = (
        "    deadline = min(p.stat().st_mtime for p in pathlib.Path().glob('free_*')) + 20\n"
        "    while len({p.read_text() for p in pathlib.Path().glob('free_*')}) < 2 and time.time() < deadline:\n"
        "        time.sleep(0.05)\n"
    )
    body = "\n".join(
        f"{mark}def test_{prefix}_{i}(worker_id):\n    pathlib.Path('{prefix}_{i}').write_text(worker_id)\n"
        + (wait if prefix == "free" else "")
        for prefix, mark in (("grouped", "@pytest.mark.xdist_group('g')\n"), ("free", ""))
        for i in range(8)
    )
    pytester.makepyfile(test_groups="import pathlib\nimport time\n\nimport pytest\n\n" + body)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=16)
    workers = {prefix: {p.read_text() for p in pytester.path.glob(f"{prefix}_*")} for prefix in ("grouped", "free")}
    assert len(workers["grouped"]) == 1, workers
    assert workers["free"] == {"gw0", "gw1"}, workers
