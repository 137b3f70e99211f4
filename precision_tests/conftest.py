"""Invariant suite fixtures: which scenarios an invariant applies to, and their runs as JSON.

Runs come from the plugin's ``precision_run`` fixture, so a scenario the gate already ran in this
session is not run again. Nothing here imports torch: dumps, metrics and log-probs are JSON files.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from precision_harness.scenario import Scenario

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def suite() -> list[Scenario]:
    """Every committed scenario (loaded at collection time: YAML + schema, no torch)."""
    return [Scenario.load(p) for p in sorted(SCENARIOS.glob("*.yaml"))]


def has_identical_reference(s: Scenario) -> bool:
    """The reference runs the actor's step-1 weights with the same micro-batches, both stages dumped at step 1."""
    ar = s.config["actor_rollout_ref"]
    return (
        s.use_reference and 1 in s.steps
        and {"actor_compute_log_prob", "ref_compute_log_prob"} <= set(s.stages)
        and ar["rollout"]["log_prob_micro_batch_size_per_gpu"] == ar["ref"]["log_prob_micro_batch_size_per_gpu"]
    )


def has_precision_mismatch(s: Scenario) -> bool:
    """Rollout IS is on and the rollout engine runs another dtype than training (a real mismatch)."""
    ar = s.config["actor_rollout_ref"]
    return s.config["algorithm"]["rollout_is_threshold"] is not None and ar["rollout"]["dtype"] != ar["actor"]["dtype"]


def ids(scenarios: list[Scenario]) -> list[str]:
    return [s.name for s in scenarios]


@pytest.fixture(scope="session")
def run_dir(precision_run):
    """``run_dir(name, overrides=None)``: the run directory of a scenario (or variant) run."""

    def get(name: str, overrides: dict | None = None) -> Path:
        return precision_run(name, overrides).run_dir

    return get


@pytest.fixture(scope="session", autouse=True)
def _start_suite_runs(precision_run) -> None:
    """Queue every scenario's run at once, so runs overlap when the gate has not started them."""
    for scenario in suite():
        precision_run.start(scenario.name)
