"""Invariants every committed scenario run must hold (no golden involved).

Each test reads a run's JSON files through ``precision_run`` (shared with the gate, one run per
scenario per session) and calls one check of :mod:`precision_harness.check.tolerance.invariants`;
``test_invariant_violations.py`` shows every check failing on a run built to break it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from precision_harness.check.tolerance import consistency
from precision_harness.check.tolerance import invariants as inv
from precision_harness.scenarios import invariant_declarations

SUITE = inv.load_suite(Path(__file__).resolve().parent.parent / "scenarios")
WITH_REFERENCE = [s for s in SUITE if inv.applies_same_weights(s)]
MISMATCHED = [s for s in SUITE if inv.applies_mismatch_health(s)]
#: the scenario whose actor_compute_log_prob is rerun at another micro-batch size
MICRO_BATCH_SCENARIO = "grpo_is_token_truncate"
MICRO_BATCH_OVERRIDE = {"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1}
#: an fp32 scenario rerun with its rollout log-probs recomputed over the whole sequence: bitwise parity
PARITY_SCENARIO = "grpo_tiny"
PARITY_OVERRIDE = {"actor_rollout_ref.rollout.log_prob_mode": "recompute"}
#: started at session start by conftest.py, so it overlaps with the other runs
PRECISION_VARIANTS = [(MICRO_BATCH_SCENARIO, MICRO_BATCH_OVERRIDE), (PARITY_SCENARIO, PARITY_OVERRIDE)]


def ids(scenarios: list) -> list[str]:
    return [s.name for s in scenarios]


def test_suite_covers_every_invariant() -> None:
    """The selections below are not empty: each invariant really runs on committed scenarios."""
    assert len(WITH_REFERENCE) >= 3 and len(MISMATCHED) >= 4
    assert MICRO_BATCH_SCENARIO in ids(SUITE)


@pytest.mark.parametrize("scenario", WITH_REFERENCE, ids=ids(WITH_REFERENCE))
def test_step1_actor_and_ref_see_identical_weights(scenario, run_dir) -> None:
    run = run_dir(scenario.name)
    checked = inv.check_same_weights(
        inv.dump_of(run, 1, "actor_compute_log_prob"),
        inv.dump_of(run, 1, "ref_compute_log_prob"),
        where=f"{scenario.name} step_1",
    )
    assert checked > 100


@pytest.mark.parametrize("scenario", SUITE, ids=ids(SUITE))
def test_first_mini_batch_is_on_policy(scenario, run_dir) -> None:
    run = run_dir(scenario.name)
    for step in range(1, scenario.config["trainer"]["total_training_steps"] + 1):
        inv.check_on_policy(inv.log_probs_of(run, step), where=f"{scenario.name} step_{step}")


def test_actor_log_prob_is_micro_batch_invariant(run_dir) -> None:
    base, other = run_dir(MICRO_BATCH_SCENARIO), run_dir(MICRO_BATCH_SCENARIO, MICRO_BATCH_OVERRIDE)
    for step in (1, 2):
        a, b = inv.log_probs_of(base, step), inv.log_probs_of(other, step)
        assert a["micro_batch_sizes"]["actor_compute_log_prob"] != b["micro_batch_sizes"]["actor_compute_log_prob"]
        inv.check_micro_batch_invariance(a, b, where=f"{MICRO_BATCH_SCENARIO} step_{step}")


@pytest.mark.parametrize("scenario", MISMATCHED, ids=ids(MISMATCHED))
def test_rollout_training_mismatch_is_healthy(scenario, run_dir) -> None:
    rows = inv.metrics_of(run_dir(scenario.name))
    assert inv.check_mismatch_health(rows, where=scenario.name) == 3 * len(rows)
    # the mismatch is real: bf16 vs fp32 log-probs are not identical
    assert all(row["mismatch/mismatch_log_ppl_abs_diff"] > 0 for row in rows)


@pytest.mark.parametrize("scenario", SUITE, ids=ids(SUITE))
def test_rollout_holds_the_actors_weights_after_every_sync(scenario, run_dir) -> None:
    run, exact = run_dir(scenario.name), invariant_declarations.Invariants(weight_sync=True)
    for step in range(1, scenario.total_steps + 1):
        verdict = consistency.check(run, step, invariant_declarations.WEIGHT_SYNC, exact)
        assert verdict.passed, verdict.text


def test_recomputed_rollout_log_probs_equal_old_log_prob_bit_for_bit(run_dir) -> None:
    """KV-free sampling is not bitwise (other matmul shapes); recomputing the sequence once is (docs/consistency.md)."""
    exact = invariant_declarations.Invariants(parity="exact")
    sampled, recomputed = run_dir(PARITY_SCENARIO), run_dir(PARITY_SCENARIO, PARITY_OVERRIDE)
    for step in (1, 2):
        verdict = consistency.check(
            recomputed, step, invariant_declarations.LOG_PROB_PARITY, exact, log_prob_mode="recompute"
        )
        assert verdict.passed, verdict.text
        # the same check tells apart the sampled log-probs, so it is not vacuous
        assert not consistency.check(sampled, step, invariant_declarations.LOG_PROB_PARITY, exact).passed
