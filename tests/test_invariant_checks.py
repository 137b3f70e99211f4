"""precision_harness.check.tolerance.invariants on hand-made JSON: each check passes on good data and fails on bad."""

from __future__ import annotations

import copy

import pytest
from harness_testing import base_data

from precision_harness.check.tolerance import invariants as inv


def dump(data):
    return {"task": "statistics", "level": "L1", "data": data}


def test_same_weights_passes_and_ignores_requires_grad_and_actor_only_calls() -> None:
    actor, ref = base_data(), base_data()  # embedding, linear, softmax: what a forward pass always runs
    actor["Functional.linear.0.forward"]["input_args"][1]["requires_grad"] = True
    actor["Torch.logsumexp.0.forward"] = {"input_args": [], "input_kwargs": {}, "output": []}  # entropy, actor only
    assert inv.check_same_weights(dump(actor), dump(ref)) > 0


def test_same_weights_fails_on_one_statistic() -> None:
    actor, ref = base_data(), base_data()
    ref["Functional.linear.0.forward"]["input_args"][1]["Norm"] = 2.0000001
    with pytest.raises(
        inv.InvariantViolation,
        match=r"differ in 1 of \d+ statistics.*"
        r"Functional.linear.0.forward.input_args.1 Norm 2.0 \(actor\) vs 2.0000001 \(ref\)",
    ):
        inv.check_same_weights(dump(actor), dump(ref), where="s step_1")


def test_same_weights_fails_when_ref_runs_more_or_nothing_is_compared() -> None:
    actor, ref = base_data(), base_data()
    ref["Functional.linear.1.forward"] = copy.deepcopy(ref["Functional.linear.0.forward"])
    with pytest.raises(
        inv.InvariantViolation,
        match=r"ref_compute_log_prob calls Functional\.linear\.forward 2 times, actor_compute_log_prob 1",
    ):
        inv.check_same_weights(dump(actor), dump(ref))
    actor = base_data()
    actor["Functional.linear.1.forward"] = copy.deepcopy(actor["Functional.linear.0.forward"])
    with pytest.raises(inv.InvariantViolation, match=r"no Functional\.linear\.forward call to compare"):
        inv.check_same_weights(dump(actor), dump(base_data()))


def log_probs(old, first, mask=None, responses=None):
    mask = mask or [[1] * len(old[0]) for _ in old]
    return {
        "old_log_probs": old,
        "actor_update_first_mini_batch": first,
        "response_mask": mask,
        "responses": responses or [[5] * len(old[0]) for _ in old],
        "micro_batch_sizes": {"actor_compute_log_prob": 4, "actor_update": 2},
    }


def test_on_policy_is_exact_on_response_tokens_only() -> None:
    old = [[-1.0, -2.0], [-3.0, 0.0]]
    assert inv.check_on_policy(log_probs(old, [[-1.0, -2.0]])) == 2
    assert inv.check_on_policy(log_probs(old, [[-1.0, -9.0]], mask=[[1, 0], [1, 0]])) == 1  # padding ignored
    with pytest.raises(
        inv.InvariantViolation,
        match=r"differ from old_log_prob at 1 of 2 tokens \(max \|diff\| 5.96e-08 at row 0, token 1; "
        r"micro-batches: actor_compute_log_prob 4, actor_update 2\)",
    ):
        inv.check_on_policy(log_probs(old, [[-1.0, -2.0 + 5.96e-8]]), where="s step_1")


def test_micro_batch_invariance_uses_fp32_tolerance() -> None:
    a = log_probs([[-1.0, -2.0]], [[-1.0, -2.0]])
    assert inv.check_micro_batch_invariance(a, log_probs([[-1.0 + 1e-6, -2.0]], [[0, 0]])) == 2
    with pytest.raises(
        inv.InvariantViolation, match=r"at 1 of 2 tokens beyond rtol 1.3e-06, atol 1e-05 \(max \|diff\| 2e-05"
    ):
        inv.check_micro_batch_invariance(a, log_probs([[-1.0, -2.0 + 2e-5]], [[0, 0]]))
    with pytest.raises(inv.InvariantViolation, match="sampled different responses"):
        inv.check_micro_batch_invariance(a, log_probs([[-1.0, -2.0]], [[0, 0]], responses=[[5, 6]]))


HEALTHY = {
    "training/global_step": 1,
    "mismatch/rollout_is_eff_sample_size": 0.99,
    "mismatch/rollout_is_veto_fraction": 0.0,
    "mismatch/rollout_is_mean": 1.001,
}


@pytest.mark.parametrize(
    "metric,value",
    [
        ("mismatch/rollout_is_eff_sample_size", 0.79),
        ("mismatch/rollout_is_veto_fraction", 0.125),
        ("mismatch/rollout_is_mean", 0.85),
        ("mismatch/rollout_is_mean", 1.2),
        ("mismatch/rollout_is_mean", float("nan")),
    ],
)
def test_mismatch_health_ranges(metric: str, value: float) -> None:
    assert inv.check_mismatch_health([HEALTHY]) == 3
    with pytest.raises(inv.InvariantViolation, match=f"step 1: {metric} = "):
        inv.check_mismatch_health([{**HEALTHY, metric: value}])


def test_mismatch_health_needs_rollout_is_metrics() -> None:
    with pytest.raises(
        inv.InvariantViolation,
        match=r"mismatch/rollout_is_eff_sample_size missing \(is algorithm.rollout_is_threshold set\?\)",
    ):
        inv.check_mismatch_health([{"training/global_step": 1}])
