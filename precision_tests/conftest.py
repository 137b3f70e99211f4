"""Invariant suite fixtures: scenario runs by name, read as JSON (this process never imports torch).

Runs come from the plugin's ``precision_run`` fixture, so a scenario the gate already ran in this
session is not run again.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from precision_harness.invariants import load_suite

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


@pytest.fixture(scope="session", autouse=True)
def _start_suite_runs(precision_run) -> None:
    """Queue every scenario's run at once, so runs overlap when the gate has not started them."""
    for scenario in load_suite(SCENARIOS):
        precision_run.start(scenario.name)


@pytest.fixture(scope="session")
def run_dir(precision_run):
    """``run_dir(name, overrides=None)``: the run directory of a scenario (or of a variant of it)."""

    def get(name: str, overrides: dict | None = None) -> Path:
        return precision_run(name, overrides).run_dir

    return get
