"""The public ``precision_run`` fixture: scenario runs shared with the gate, one-line errors.

Variants (``precision_run(name, overrides)``) are exercised by ``precision_tests/``.
"""

from __future__ import annotations

import textwrap

import pytest
from harness_testing import make_project

pytestmark = pytest.mark.slow

#: counts worker launches in the pytester session (the session's runner, wrapped)
COUNTING_CONFTEST = textwrap.dedent("""
    import pytest
    from pytest_precision import precision_session
    CALLS = []
    @pytest.hookimpl(trylast=True)
    def pytest_configure(config):
        session = precision_session(config)
        run = session.runner
        def counting(scenario, **kw):
            CALLS.append(scenario.name)
            return run(scenario, **kw)
        session.runner = counting
    def pytest_terminal_summary(terminalreporter):
        terminalreporter.write_line(f"WORKER-RUNS: {sorted(CALLS)}")
""")

INVARIANT_TEST = textwrap.dedent("""
    from precision_harness.check.tolerance import invariants as inv

    def test_on_policy(precision_run):
        run = precision_run("tiny_ppo")
        assert run is precision_run("tiny_ppo")
        for step in (1, 2):
            inv.check_on_policy(inv.log_probs_of(run.run_dir, step), where=f"step_{step}")
        assert inv.metrics_of(run.run_dir)[0]["training/global_step"] == 1
""")


def test_gate_and_invariants_share_one_run(project: pytest.Pytester) -> None:
    project.makeconftest(COUNTING_CONFTEST)
    project.makepyfile(test_invariant=INVARIANT_TEST)
    result = project.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["WORKER-RUNS: [[]'tiny_ppo'[]]"])


def test_runs_without_a_golden(pytester: pytest.Pytester) -> None:
    """Invariants need no golden: the fixture runs a scenario the gate would not run."""
    make_project(pytester.path)
    pytester.makeconftest(COUNTING_CONFTEST)
    pytester.makepyfile(test_invariant=INVARIANT_TEST)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "test_invariant.py")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["WORKER-RUNS: [[]'tiny_ppo'[]]"])


def test_unknown_scenario_and_bad_override_are_one_line(pytester: pytest.Pytester) -> None:
    make_project(pytester.path)
    pytester.makeconftest(COUNTING_CONFTEST)
    pytester.makepyfile(
        test_bad=textwrap.dedent("""
        def test_unknown(precision_run):
            precision_run("no_such_scenario")

        def test_bad_override(precision_run):
            precision_run("tiny_ppo", {"algorithm.rollout_is_levle": "token"})
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "test_bad.py")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        [
            "*no_such_scenario: no scenario file no_such_scenario.yaml under scenarios/ in *",
            "*variants/tiny_ppo.*.yaml: algorithm: Additional properties are not allowed "
            "('rollout_is_levle' was unexpected)*",
            "WORKER-RUNS: [[][]]",
        ]
    )
    assert "precision_harness/" not in result.stdout.str()
