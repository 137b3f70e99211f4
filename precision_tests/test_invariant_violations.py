"""Each invariant fails on a run built to break it: the checks of test_invariants.py can fail.

The violating runs are two variants of ``grpo_is_token_truncate`` (fp32 training, bf16 rollout),
started together so they overlap:

* attention dropout 0.1 (``actor_update`` runs in train mode, ``actor_compute_log_prob`` in eval
  mode, so the first mini-batch is no longer on-policy: one real cause of verl issue #2996) with
  veto threshold 0.999 (most sequences hold a token with ratio < 0.999 and are vetoed: > 5 %);
  the two settings act on different invariants (dropout is off in eval mode, where the IS inputs
  are computed; the veto only changes weights applied after the first mini-batch's log-probs);
* log-prob micro-batch 1 with a bf16 actor: log-probs move at bf16 precision, far past fp32 tolerance.

The same-weights check needs no extra run: at step 2 the actor has taken optimizer steps, the
reference has not.
"""

from __future__ import annotations

import pytest

from precision_harness.check.tolerance import invariants as inv

BASE = "grpo_is_token_truncate"
DROPOUT_AND_VETO = {"model.attention_dropout": 0.1, "algorithm.rollout_is_veto_threshold": 0.999}
BF16_MICRO_1 = {
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 1,
    "actor_rollout_ref.actor.dtype": "bfloat16",
}
#: started at session start by conftest.py, so they overlap with the other runs
PRECISION_VARIANTS = [(BASE, DROPOUT_AND_VETO), (BASE, BF16_MICRO_1)]


def test_same_weights_fails_once_the_actor_has_trained(run_dir) -> None:
    run = run_dir(BASE)
    with pytest.raises(
        inv.InvariantViolation,
        match=r"step_2: actor and reference log-prob stages differ in \d+ of \d+ statistics.*Functional\.",
    ):
        inv.check_same_weights(
            inv.dump_of(run, 2, "actor_compute_log_prob"),
            inv.dump_of(run, 2, "ref_compute_log_prob"),
            where=f"{BASE} step_2",
        )


def test_on_policy_fails_with_attention_dropout(run_dir) -> None:
    run = run_dir(BASE, DROPOUT_AND_VETO)
    with pytest.raises(
        inv.InvariantViolation,
        match=r"first mini-batch recomputes log-probs that differ from old_log_prob at \d+ of \d+ tokens",
    ):
        inv.check_on_policy(inv.log_probs_of(run, 1), where=f"{BASE}+dropout step_1")


def test_micro_batch_invariance_fails_on_bf16_numerics(run_dir) -> None:
    a, b = inv.log_probs_of(run_dir(BASE), 1), inv.log_probs_of(run_dir(BASE, BF16_MICRO_1), 1)
    with pytest.raises(
        inv.InvariantViolation,
        match=r"differs between micro-batch sizes 4 and 1 at \d+ of \d+ tokens beyond rtol 1.3e-06, atol 1e-05",
    ):
        inv.check_micro_batch_invariance(a, b, where=f"{BASE} vs bf16 micro-batch 1")


def test_mismatch_health_fails_when_the_veto_fires(run_dir) -> None:
    rows = inv.metrics_of(run_dir(BASE, DROPOUT_AND_VETO))
    with pytest.raises(
        # the first step the veto fires at depends on the sampled tokens: step 1 under torch 2.13, step 2 under 2.6
        inv.InvariantViolation,
        match=r"step \d+: mismatch/rollout_is_veto_fraction = [0-9.]+ outside \[-inf, 0.05\]",
    ):
        inv.check_mismatch_health(rows, where=f"{BASE}+veto")
