"""Invariant suite fixtures: scenario runs by name, read as JSON (this process never imports torch).

Runs come from the plugin's ``precision_run`` fixture, so a scenario the gate already ran in this
session is not run again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from precision_harness.check.tolerance.invariants import load_suite

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@pytest.fixture(scope="session", autouse=True)
def _start_runs(request: pytest.FixtureRequest, precision_run) -> None:
    """Queue every scenario's run and every variant a selected module lists in ``PRECISION_VARIANTS``
    (``[(scenario, overrides), ...]``) at once, so runs overlap (up to ``--precision-jobs``)."""
    for scenario in load_suite(SCENARIOS):
        precision_run.start(scenario.name)
    modules = {id(m): m for m in (getattr(item, "module", None) for item in request.session.items) if m is not None}
    for module in modules.values():
        for name, overrides in getattr(module, "PRECISION_VARIANTS", ()):
            precision_run.start(name, overrides)


@pytest.fixture(scope="session")
def run_dir(precision_run):
    """``run_dir(name, overrides=None)``: the run directory of a scenario (or of a variant of it)."""

    def get(name: str, overrides: dict | None = None) -> Path:
        return precision_run(name, overrides).run_dir

    return get
