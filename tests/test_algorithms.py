"""Hand-computed unit tests for precision_harness.runs.runner.algorithms and .rollout_is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from precision_harness.runs.runner import algorithms as A
from precision_harness.runs.runner.rollout_is import (
    RolloutISConfig,
    compute_mismatch_metrics,
    compute_rollout_importance_weights,
)


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


def close(actual, expected, **kw):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float32), torch.as_tensor(expected, dtype=torch.float32), **kw
    )


# ------------------------------------------------------------------ masked statistics
def test_masked_mean_sum_var_whiten():
    v = t([[1.0, 2.0, 100.0], [3.0, float("nan"), 7.0]])
    m = t([[1, 1, 0], [1, 0, 1]])
    close(A.masked_sum(v, m), 1 + 2 + 3 + 7)  # NaN outside the mask does not leak
    close(A.masked_mean(v, m), 13 / 4)
    close(A.masked_mean(v, m, axis=-1), [1.5, 5.0])
    vals = [1.0, 2.0, 3.0, 7.0]
    mean = sum(vals) / 4
    var_b = sum((x - mean) ** 2 for x in vals) / 4
    close(A.masked_var(v.nan_to_num(), m, unbiased=False), var_b)
    close(A.masked_var(v.nan_to_num(), m), var_b * 4 / 3)
    w = A.masked_whiten(v.nan_to_num(), m)
    close(w[0, 0], (1.0 - mean) / math.sqrt(var_b * 4 / 3 + 1e-8))
    w2 = A.masked_whiten(v.nan_to_num(), m, shift_mean=False)
    close(w2[0, 0], (1.0 - mean) / math.sqrt(var_b * 4 / 3 + 1e-8) + mean)
    assert A.masked_mean(v, torch.zeros_like(m)).item() == 0.0  # empty mask -> 0, not NaN
    with pytest.raises(ValueError):
        A.masked_var(v, t([[1, 0, 0], [0, 0, 0]]))


def test_logprobs_and_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11) * 30  # large logits: must not overflow
    labels = torch.randint(0, 11, (2, 3))
    ref = torch.log_softmax(logits.double(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    lp = A.logprobs_from_logits(logits, labels)
    assert lp.shape == (2, 3) and lp.dtype == torch.float32
    torch.testing.assert_close(lp.double(), ref, rtol=1e-5, atol=1e-5)
    close(A.entropy_from_logits(torch.zeros(2, 5)), [math.log(5)] * 2)
    p = torch.softmax(logits.double(), -1)
    torch.testing.assert_close(
        A.entropy_from_logits(logits).double(), -(p * p.clamp_min(1e-300).log()).sum(-1), rtol=1e-4, atol=1e-4
    )
    bf = A.logprobs_from_logits(logits.bfloat16(), labels)
    assert bf.dtype == torch.bfloat16


# ------------------------------------------------------------------ advantages
def test_gae_1x3_by_hand():
    r = t([[0.0, 0.0, 1.0]])
    v = t([[0.5, 0.6, 0.7]])
    m = t([[1, 1, 1]])
    gamma, lam = 0.9, 0.8
    # t=2: delta = 1 - 0.7 = 0.3                 A2 = 0.3
    # t=1: delta = 0.9*0.7 - 0.6 = 0.03          A1 = 0.03 + 0.72*0.3   = 0.246
    # t=0: delta = 0.9*0.6 - 0.5 = 0.04          A0 = 0.04 + 0.72*0.246 = 0.21712
    raw = [0.21712, 0.246, 0.3]
    adv, ret = A.compute_gae_advantage_return(r, v, m, gamma=gamma, lam=lam)
    close(ret, [[0.71712, 0.846, 1.0]])
    mean = sum(raw) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 2 + 1e-8)
    close(adv, [[(x - mean) / std for x in raw]])


def test_gae_padding_is_skipped():
    # the padded third position (mask 0) must not influence the valid ones
    r1, v1 = t([[0.0, 1.0, 5.0]]), t([[0.5, 0.6, 9.0]])
    m = t([[1, 1, 0]])
    _, ret = A.compute_gae_advantage_return(r1, v1, m, gamma=1.0, lam=1.0)
    # t=1: delta = 1 - 0.6 = 0.4 ; t=0: delta = 0.6 - 0.5 = 0.1, A0 = 0.5
    close(ret[0, :2], [1.0, 1.0])


def test_grpo_group_normalisation():
    r = t([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0], [0.0, 2.0], [0.0, 4.0]])
    m = t([[1, 1]] * 5)
    index = np.array(["a", "a", "b", "b", "c"], dtype=object)
    adv, ret = A.compute_grpo_outcome_advantage(r, m, index)
    s = 1 / (math.sqrt(0.5) + 1e-6)  # group {1, 0}: mean .5, unbiased std sqrt(.5)
    expected = [0.5 * s, -0.5 * s, 0.5 * s, -0.5 * s, 4.0 / (1.0 + 1e-6)]  # singleton: mean 0, std 1
    close(adv[:, 0], expected)
    close(adv[:, 1], expected)
    assert adv is ret
    adv2, _ = A.compute_grpo_outcome_advantage(r, m, list(index), norm_adv_by_std_in_grpo=False)
    close(adv2[:, 0], [0.5, -0.5, 0.5, -0.5, 4.0])
    adv3, _ = A.compute_grpo_outcome_advantage(r, t([[1, 0]] * 5), list(index))
    assert torch.all(adv3[:, 1] == 0)


def test_adv_registry():
    assert A.get_adv_estimator_fn("gae") is A.compute_gae_advantage_return
    assert A.get_adv_estimator_fn("grpo") is A.compute_grpo_outcome_advantage
    with pytest.raises(ValueError, match="gae, grpo"):
        A.get_adv_estimator_fn("rloo")


# ------------------------------------------------------------------ kl
@pytest.mark.parametrize(
    "name,expected",
    [
        ("kl", 1.0),
        ("k1", 1.0),
        ("abs", 1.0),
        ("mse", 0.5),
        ("k2", 0.5),
        ("low_var_kl", math.exp(-1) + 1 - 1),
        ("k3", math.exp(-1)),
    ],
)
def test_kl_penalty_types(name, expected):
    lp, ref = t([[-1.0, -2.0]]), t([[-2.0, -2.0]])
    close(A.kl_penalty(lp, ref, name), [[expected, 0.0]])


def test_kl_penalty_abs_sign_and_k3_clamp():
    lp, ref = t([[-2.0, -40.0, 0.0]]), t([[-1.0, 0.0, -40.0]])
    close(A.kl_penalty(lp, ref, "kl"), [[-1.0, -40.0, 40.0]])
    close(A.kl_penalty(lp, ref, "abs"), [[1.0, 40.0, 40.0]])
    k3 = A.kl_penalty(lp, ref, "low_var_kl")
    close(k3[0, 0], math.exp(1) - 1 - 1)
    close(k3[0, 1:], [10.0, 10.0])  # clamp of the result to [-10, 10]
    with pytest.raises(NotImplementedError):
        A.kl_penalty(lp, ref, "full")
    # "+" suffix: k3 forward value, k2 gradient (d/dlp 0.5 (lp-ref)^2 = lp - ref)
    lpg = t([[-1.0]]).requires_grad_()
    out = A.kl_penalty(lpg, t([[-2.0]]), "k3+")
    close(out.detach(), [[math.exp(-1)]])
    out.sum().backward()
    close(lpg.grad, [[1.0]])


def test_kl_controllers_and_apply_kl_penalty():
    fixed = A.FixedKLController(0.1)
    fixed.update(100.0, 10)
    assert fixed.value == 0.1
    ada = A.AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ada.update(current_kl=12.0, n_steps=100)  # error clipped to +0.2
    assert ada.value == pytest.approx(0.1 * (1 + 0.2 * 100 / 10000))
    ada.update(current_kl=5.4, n_steps=100)  # error -0.1
    assert ada.value == pytest.approx(0.1 * 1.002 * (1 - 0.1 * 100 / 10000))

    scores = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -3.0]])
    ref = t([[-2.0, -1.0, -0.5], [-1.5, -1.0, -1.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    ctrl = A.AdaptiveKLController(0.5, 1.0, 10)
    rewards, metrics = A.apply_kl_penalty(scores, old, ref, mask, ctrl, kl_penalty="kl")
    # kl = [[1, 0, -0.5], [0.5, 0, (padding: zeroed)]]
    close(rewards, [[-0.5, 0.0, 1.25], [-0.25, 2.0, 0.0]])
    current = ((0.5 / 3) + (0.5 / 2)) / 2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current, rel=1e-6)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    assert ctrl.value == pytest.approx(0.5 * (1 + max(-0.2, current - 1) * 2 / 10))


# ------------------------------------------------------------------ aggregation / losses
LOSS = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = t([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # third sequence fully masked


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 7 / 3),
        ("token-sum", 7.0),
        ("seq-mean-token-sum", (3 + 4) / 2),
        ("seq-mean-token-mean", (1.5 + 4) / 2),
        ("seq-mean-token-sum-norm", (3 + 4) / 2 / 3),
    ],
)
def test_agg_loss_modes(mode, expected):
    close(A.agg_loss(LOSS, MASK, mode), expected)


def test_agg_loss_global_normalisers_and_errors():
    close(A.agg_loss(LOSS, MASK, "token-mean", batch_num_tokens=14), 0.5)
    close(A.agg_loss(LOSS, MASK, "seq-mean-token-sum", global_batch_size=7), 1.0)
    close(A.agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7), 0.5)
    with pytest.raises(ValueError, match="token-mean"):
        A.agg_loss(LOSS, MASK, "mean")


def test_policy_loss_dual_clip_only_for_negative_advantage():
    old = t([[0.0, 0.0, 0.0, 0.0]])
    lp = t([[math.log(5.0), math.log(5.0), math.log(1.1), math.log(0.5)]])
    adv = t([[-1.0, 1.0, -1.0, 1.0]])
    mask = t([[1, 1, 1, 1]])
    loss, clipfrac, ppo_kl, clipfrac_lower = A.compute_policy_loss_vanilla(
        old, lp, adv, mask, A.PolicyLossConfig(clip_ratio=0.2, clip_ratio_c=3.0)
    )
    # token0: A<0, ratio 5: max(5, 1.2)=5, dual clip -> min(5, 3) = 3
    # token1: A>0, ratio 5: max(-5, -1.2) = -1.2 (clipped, no dual clip)
    # token2: A<0, ratio 1.1: max(1.1, 1.1) = 1.1
    # token3: A>0, ratio .5: max(-0.5, -0.8) = -0.5
    close(loss, (3 - 1.2 + 1.1 - 0.5) / 4)
    close(clipfrac, 1 / 4)
    close(clipfrac_lower, 1 / 4)
    close(ppo_kl, -(2 * math.log(5.0) + math.log(1.1) + math.log(0.5)) / 4)
    # asymmetric clip_ratio_high lets token1 go to 1.5 only
    loss2, *_ = A.compute_policy_loss_vanilla(
        old, lp, adv, mask, A.PolicyLossConfig(clip_ratio_high=0.5, clip_ratio_c=10.0)
    )
    close(loss2, (5 - 1.5 + 1.1 - 0.5) / 4)
    # rollout IS weights multiply the per-token loss before aggregation
    w = t([[0.0, 1.0, 2.0, 0.5]])
    loss3, *_ = A.compute_policy_loss_vanilla(old, lp, adv, mask, rollout_is_weights=w)
    close(loss3, (0 - 1.2 + 2.2 - 0.25) / 4)
    with pytest.raises(ValueError):
        A.compute_policy_loss_vanilla(old, lp, adv, mask, A.PolicyLossConfig(clip_ratio_c=1.0))


def test_value_loss_by_hand():
    vpreds = t([[1.5, 1.0, 9.0]])
    values = t([[1.0, 1.0, 0.0]])
    returns = t([[2.0, 0.0, 0.0]])
    mask = t([[1, 1, 0]])
    vf_loss, vf_clipfrac = A.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # tok0: clipped 1.2 -> max(.25, .64) = .64 ; tok1: max(1, 1) = 1
    close(vf_loss, 0.5 * (0.64 + 1.0) / 2)
    close(vf_clipfrac, 0.5)


def test_entropy_loss():
    logits = torch.zeros(1, 2, 4)
    close(A.compute_entropy_loss(logits, t([[1, 0]]), "token-mean"), math.log(4))


# ------------------------------------------------------------------ rollout IS
LR = [math.log(3.0), math.log(0.25), math.log(1.5)]


def _is(level="token", mode="truncate", lr=None, mask=None, **kw):
    lr = t([lr or LR])
    rollout = t([[-1.0, -2.0, -0.5]])
    old = rollout + lr
    mask = t([[1, 1, 1]]) if mask is None else t([mask])
    return compute_rollout_importance_weights(
        old, rollout, mask, RolloutISConfig(rollout_is_level=level, rollout_is_mode=mode, **kw)
    )


def test_is_token_truncate_vs_clip():
    w_tr, m_tr = _is(mode="truncate", rollout_is_threshold=2.0)
    close(w_tr, [[2.0, 0.25, 1.5]])  # truncate caps the upper side only
    w_cl, m_cl = _is(mode="clip", rollout_is_threshold=2.0)
    close(w_cl, [[0.0, 0.0, 1.5]])  # clip zeroes outside [1/2, 2]
    assert m_tr["mismatch/rollout_is_threshold_lower"] == 0.5  # default lower = 1/upper
    assert m_cl["mismatch/rollout_is_clipped_fraction"] == pytest.approx(2 / 3)
    assert m_cl["mismatch/rollout_is_seq_clipped_fraction"] == 1.0
    assert "mismatch/rollout_is_clipped_fraction" not in m_tr
    # metrics describe the raw weights (before truncation)
    assert m_tr["mismatch/rollout_is_max"] == pytest.approx(3.0)
    assert m_tr["mismatch/rollout_is_min"] == pytest.approx(0.25)
    assert m_tr["mismatch/rollout_is_mean"] == pytest.approx((3 + 0.25 + 1.5) / 3)
    assert m_tr["mismatch/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)
    assert m_tr["mismatch/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)
    w_lo, _ = _is(mode="clip", rollout_is_threshold=2.0, rollout_is_threshold_lower=0.2)
    close(w_lo, [[0.0, 0.25, 1.5]])
    assert not w_tr.requires_grad


def test_is_sequence_and_geometric_levels():
    w_seq, _m_seq = _is(level="sequence", rollout_is_threshold=2.0)
    close(w_seq, [[1.125] * 3])  # 3 * .25 * 1.5 = 1.125 (< 2, untouched)
    w_seq_pad, _ = _is(level="sequence", rollout_is_threshold=2.0, mask=[1, 1, 0])
    close(w_seq_pad, [[0.75, 0.75, 0.0]])  # product over valid tokens, zero on padding
    w_geo, _m_geo = _is(level="geometric", rollout_is_threshold=2.0)
    close(w_geo, [[1.125 ** (1 / 3)] * 3])
    w_big, m_big = _is(level="sequence", rollout_is_threshold=2.0, lr=[math.log(3.0), math.log(3.0), 0.0])
    close(w_big, [[2.0] * 3])
    assert m_big["mismatch/rollout_is_max"] == pytest.approx(9.0, rel=1e-5)  # unclamped in log space
    w_big_clip, _ = _is(level="sequence", mode="clip", rollout_is_threshold=2.0, lr=[math.log(3.0), math.log(3.0), 0.0])
    close(w_big_clip, [[0.0] * 3])


def test_is_veto_zeroes_whole_sequence():
    rollout = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    old = rollout + t([[0.0, -12.0, 0.1], [0.1, 0.0, -0.1]])  # exp(-12) ~ 6e-6 < 1e-4
    mask = t([[1, 1, 1], [1, 1, 1]])
    w, m = compute_rollout_importance_weights(
        old, rollout, mask, RolloutISConfig(rollout_is_threshold=2.0, rollout_is_veto_threshold=1e-4)
    )
    assert torch.all(w[0] == 0)
    close(w[1], torch.exp(t([0.1, 0.0, -0.1])))
    assert m["mismatch/rollout_is_veto_fraction"] == 0.5
    assert m["mismatch/rollout_is_catastrophic_token_fraction"] == pytest.approx(1 / 6)
    # the veto ignores padding positions
    w2, m2 = compute_rollout_importance_weights(
        old,
        rollout,
        t([[1, 0, 1], [1, 1, 1]]),
        RolloutISConfig(rollout_is_threshold=2.0, rollout_is_veto_threshold=1e-4),
    )
    assert m2["mismatch/rollout_is_veto_fraction"] == 0.0 and w2[0, 0] > 0
    w3, m3 = compute_rollout_importance_weights(old, rollout, mask, RolloutISConfig(rollout_is_threshold=2.0))
    assert m3["mismatch/rollout_is_veto_fraction"] == 0.0 and w3[0, 0] > 0


SEED_IS_KEYS = {
    "rollout_is_eff_sample_size",
    "rollout_is_mean",
    "rollout_is_std",
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_p25",
    "rollout_is_p50",
    "rollout_is_p75",
    "rollout_is_p95",
    "rollout_is_p99",
    "rollout_is_veto_fraction",
    "rollout_is_catastrophic_token_fraction",
    "rollout_is_seq_mean",
    "rollout_is_seq_std",
    "rollout_is_seq_max",
    "rollout_is_seq_min",
}
SEED_MISMATCH_KEYS = {
    "mismatch_kl",
    "mismatch_k3_kl",
    "mismatch_training_ppl",
    "mismatch_rollout_ppl",
    "mismatch_ppl_ratio",
    "mismatch_log_ppl_diff",
    "mismatch_log_ppl_abs_diff",
    "mismatch_log_ppl_diff_max",
    "mismatch_log_ppl_diff_min",
    "mismatch_training_log_ppl",
    "mismatch_rollout_log_ppl",
}


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "clip"])
def test_is_metric_keys_are_floats(level, mode):
    _, m = _is(level=level, mode=mode, rollout_is_threshold=2.0, rollout_is_veto_threshold=1e-4)
    expected = {f"mismatch/{k}" for k in SEED_IS_KEYS | SEED_MISMATCH_KEYS}
    if mode == "clip":
        expected |= {"mismatch/rollout_is_clipped_fraction"}
    assert expected <= set(m), expected - set(m)
    assert all(type(v) is float for v in m.values())


def test_is_disabled_and_bad_args():
    assert _is(rollout_is_threshold=None) == (None, {})
    with pytest.raises(ValueError):
        _is(level="tok", rollout_is_threshold=2.0)
    with pytest.raises(ValueError):
        _is(mode="mask", rollout_is_threshold=2.0)


def test_mismatch_metrics_by_hand():
    old = t([[-1.0, -2.0], [-1.0, -1.0]])
    roll = t([[-1.5, -2.0], [-1.0, -3.0]])
    mask = t([[1, 1], [1, 0]])
    m = compute_mismatch_metrics(old, roll, mask)
    # valid tokens: (old, roll) = (-1,-1.5), (-2,-2), (-1,-1)
    assert m["mismatch/mismatch_kl"] == pytest.approx(-0.5 / 3, rel=1e-5)
    assert m["mismatch/mismatch_k3_kl"] == pytest.approx((math.exp(0.5) - 0.5 - 1) / 3, rel=1e-5)
    m_train, m_roll = [-1.5, -1.0], [-1.75, -1.0]
    assert m["mismatch/mismatch_training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(1.0)) / 2, rel=1e-5)
    assert m["mismatch/mismatch_training_log_ppl"] == pytest.approx(1.25, rel=1e-5)
    assert m["mismatch/mismatch_rollout_ppl"] == pytest.approx((math.exp(1.75) + math.exp(1.0)) / 2, rel=1e-5)
    diffs = [r - tr for r, tr in zip(m_roll, m_train, strict=True)]
    assert m["mismatch/mismatch_log_ppl_diff"] == pytest.approx(sum(diffs) / 2, rel=1e-5)
    assert m["mismatch/mismatch_log_ppl_abs_diff"] == pytest.approx(0.125, rel=1e-5)
    assert m["mismatch/mismatch_log_ppl_diff_min"] == pytest.approx(-0.25, rel=1e-5)
    assert m["mismatch/mismatch_log_ppl_diff_max"] == pytest.approx(0.0, abs=1e-6)
    assert m["mismatch/mismatch_ppl_ratio"] == pytest.approx((math.exp(-0.25) + 1) / 2, rel=1e-5)
    only_train = compute_mismatch_metrics(old, None, mask)
    assert set(only_train) == {"mismatch/mismatch_training_ppl", "mismatch/mismatch_training_log_ppl"}
