"""Parity of precision_harness.runs.runner.algorithms / .rollout_is with verl 0.9.1 on CPU.

Identical seeded random batches (several shapes, right-padded masks, one fully padded row
where the function allows it) go to our function and to verl's; results must agree under
``torch.testing.assert_close`` fp32 defaults (rtol 1.3e-6, atol 1e-5).

Needs verl in the environment: ``make test`` installs the ``[verl]`` extra into ``.venv`` and runs with
``PRECISION_REQUIRE_VERL=1``, which turns the skip for a missing verl into an import error (CI runs ``make
test``, ``.ci/run``). By hand: ``PRECISION_REQUIRE_VERL=1 .venv/bin/pytest tests/test_verl_parity.py``.

Rollout IS: the spec of ``rollout_is.py`` is the PR that introduced
``verl/trainer/ppo/mismatch_helper.py``; verl 0.9.1 ships its successor
``rollout_corr_helper.compute_rollout_correction_and_rejection_mask`` (token|sequence levels,
TIS for a float threshold, IcePop = the PR's "clip" mode for a "lower_upper" string, metric
prefix ``rollout_corr/``, keys without ``mismatch_``, no veto, no geometric level). The
weights of every shared case and the metrics whose definition did not change are compared
directly; geometric is compared through verl's sequence level on ``log_ratio / length``;
veto is compared as verl's weights times the PR's veto rule. Metrics 0.9.1 redefined
(mean/max/min/std/ESS computed after truncation, std/ESS floored at 0 instead of ``lower``)
are compared only in a regime where no bound is active, where both definitions coincide.
"""

from __future__ import annotations

import importlib
import math
import os

import numpy as np
import pytest
import torch

if os.environ.get("PRECISION_REQUIRE_VERL"):
    # make test (and so CI): a broken verl install must fail, not skip
    for _module in (
        "verl",
        "verl.trainer.ppo.core_algos",
        "verl.utils.torch_functional",
        "verl.trainer.ppo.rollout_corr_helper",
    ):
        importlib.import_module(_module)

verl = pytest.importorskip(
    "verl",
    reason="verl==0.9.1 is not installed here (parity runs in a separate venv: "
    "pip install -c constraints/cpu.txt torch==2.13.0 verl==0.9.1)",
)
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl.trainer.ppo.core_algos does not import")
verl_F = pytest.importorskip("verl.utils.torch_functional", reason="verl.utils.torch_functional does not import")
rch = pytest.importorskip(
    "verl.trainer.ppo.rollout_corr_helper", reason="verl.trainer.ppo.rollout_corr_helper does not import"
)

from precision_harness.runs.runner import algorithms as ours  # noqa: E402
from precision_harness.runs.runner import rollout_is as ours_is  # noqa: E402

pytestmark = pytest.mark.verl_parity

SHAPES = [(2, 5), (4, 7), (8, 16), (3, 33)]
#: float32 rounding: ours and verl compute each quantity with the same float32 operations, up to their order
EPS32 = float(torch.finfo(torch.float32).eps)
#: float32 roundings a quantity may differ by (in units of its own scale): far tighter than assert_close's
#: fp32 atol 1e-5, which lets a quantity of order 1e-6 differ by its whole value
ROUNDINGS = 8


def _within_roundings(name: str, a, b) -> None:
    """Every comparison, on whichever xdist worker runs it: ``|ours - verl|`` within :data:`ROUNDINGS` float32
    roundings of the quantity's own scale (``ROUNDINGS x eps32 x max(1, max|verl|)``), which assert_close's fp32
    atol 1e-5 does not check for small quantities."""
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    finite = torch.isfinite(a) & torch.isfinite(b)
    d = (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0
    scale = b[finite].abs().max().item() if finite.any() else 0.0
    bound = ROUNDINGS * EPS32 * max(1.0, scale)
    assert d <= bound, f"{name}: |ours - verl| = {d:.3e} beyond {ROUNDINGS} float32 roundings ({bound:.3e})"


def check(name: str, actual, expected) -> None:
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected)
    if actual.dtype == torch.float64 and expected.dtype != torch.float64:
        actual = actual.to(expected.dtype)
    if expected.dtype == torch.float64 and actual.dtype != torch.float64:
        expected = expected.to(actual.dtype)
    _within_roundings(name, actual, expected)
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{name}: {m}")


def make_mask(bs: int, n: int, gen: torch.Generator, empty_row: bool = False) -> torch.Tensor:
    """Right-padded 0/1 float mask, every row >= 1 valid token (one empty row if asked)."""
    lengths = torch.randint(1, n + 1, (bs,), generator=gen)
    lengths[0] = n  # at least one full row
    mask = (torch.arange(n)[None, :] < lengths[:, None]).float()
    if empty_row and bs > 2:
        mask[-1] = 0.0
    return mask


def batch(shape, seed: int, empty_row: bool = False):
    bs, n = shape
    g = torch.Generator().manual_seed(seed)
    mask = make_mask(bs, n, g, empty_row)
    old = -torch.rand(bs, n, generator=g) * 3
    new = old + torch.randn(bs, n, generator=g) * 0.3
    ref = old + torch.randn(bs, n, generator=g) * 0.5
    adv = torch.randn(bs, n, generator=g)
    return g, mask, old, new, ref, adv


def actor_config(**kw):
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)


# ------------------------------------------------------------------ torch_functional
@pytest.mark.parametrize("shape", SHAPES)
def test_masked_stats(shape):
    _g, mask, old, *_ = batch(shape, 1, empty_row=True)
    vals = old * 7 + 1
    check("masked_sum", ours.masked_sum(vals, mask), verl_F.masked_sum(vals, mask))
    check("masked_mean", ours.masked_mean(vals, mask), verl_F.masked_mean(vals, mask))
    check("masked_mean_axis", ours.masked_mean(vals, mask, axis=-1), verl_F.masked_mean(vals, mask, axis=-1))
    for unbiased in (True, False):
        check("masked_var", ours.masked_var(vals, mask, unbiased), verl_F.masked_var(vals, mask, unbiased))
    for shift in (True, False):
        check("masked_whiten", ours.masked_whiten(vals, mask, shift), verl_F.masked_whiten(vals, mask, shift))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_entropy(shape, dtype):
    bs, n = shape
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(bs, n, 50, generator=g) * 4).to(dtype)
    labels = torch.randint(0, 50, (bs, n), generator=g)
    check(
        f"logprobs_from_logits[{dtype}]",
        ours.logprobs_from_logits(logits, labels),
        verl_F.logprobs_from_logits(logits, labels),
    )
    check(f"entropy_from_logits[{dtype}]", ours.entropy_from_logits(logits), verl_F.entropy_from_logits(logits))
    mask = make_mask(bs, n, g)
    for mode in ours.LOSS_AGG_MODES:
        check(
            "compute_entropy_loss",
            ours.compute_entropy_loss(logits.float(), mask, mode),
            core_algos.compute_entropy_loss(logits.float(), mask, mode),
        )


# ------------------------------------------------------------------ advantages
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae(shape, gamma, lam):
    g, mask, _old, *_ = batch(shape, 3)
    rewards = torch.randn(shape, generator=g) * mask
    values = torch.randn(shape, generator=g)
    a1, r1 = ours.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    a2, r2 = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    check("gae_advantages", a1, a2)
    check("gae_returns", r1, r2)


@pytest.mark.parametrize("shape", [(8, 5), (12, 9), (6, 16)])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo(shape, norm):
    bs, n = shape
    g, mask, *_ = batch(shape, 4)
    rewards = torch.zeros(bs, n)
    lengths = mask.sum(-1).long()
    outcome = torch.randint(0, 2, (bs,), generator=g).float() + torch.rand(bs, generator=g) * 0.1
    rewards[torch.arange(bs), lengths - 1] = outcome
    # groups of 3 and a singleton group at the end
    index = np.array([f"p{i // 3}" for i in range(bs - 1)] + ["solo"], dtype=object)
    a1, r1 = ours.compute_grpo_outcome_advantage(rewards.clone(), mask, index, norm_adv_by_std_in_grpo=norm)
    a2, r2 = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, index, norm_adv_by_std_in_grpo=norm)
    check("grpo_advantages", a1, a2)
    check("grpo_returns", r1, r2)
    # identical rewards in a group: std 0 -> advantages 0 (epsilon path)
    flat = torch.zeros(bs, n)
    check(
        "grpo_flat",
        ours.compute_grpo_outcome_advantage(flat.clone(), mask, index)[0],
        core_algos.compute_grpo_outcome_advantage(flat.clone(), mask, index)[0],
    )


def test_adv_registry_names_match_verl():
    for name in ours.ADV_ESTIMATORS:
        assert core_algos.get_adv_estimator_fn(name).__name__ == ours.get_adv_estimator_fn(name).__name__


# ------------------------------------------------------------------ kl
KL_NAMES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+", "abs+"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", KL_NAMES)
def test_kl_penalty(shape, name):
    _, mask, old, _new, ref, _ = batch(shape, 5)
    ref = ref.clone()
    ref[0, 0] = old[0, 0] + 25.0  # exercises the [-20, 20] / [-10, 10] clamps
    ref[-1, -1] = old[-1, -1] - 25.0
    lp1 = old.clone().requires_grad_()
    lp2 = old.clone().requires_grad_()
    k1 = ours.kl_penalty(lp1, ref, name)
    k2 = core_algos.kl_penalty(lp2, ref, name)
    check(f"kl_penalty[{name}]", k1.detach(), k2.detach())
    (k1 * mask).sum().backward()
    (k2 * mask).sum().backward()
    check(f"kl_penalty_grad[{name}]", lp1.grad, lp2.grad)
    with pytest.raises(NotImplementedError):
        ours.kl_penalty(old, ref, "full")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["kl", "abs", "mse", "low_var_kl"])
@pytest.mark.parametrize("ctrl", ["fixed", "adaptive"])
def test_apply_kl_penalty(shape, name, ctrl):
    try:
        from verl.protocol import DataProto
        from verl.trainer.ppo.ray_trainer import apply_kl_penalty as verl_apply_kl_penalty
    except ImportError as exc:  # ray_trainer pulls serving deps (cachetools, uvicorn, fastapi)
        pytest.skip(f"verl.trainer.ppo.ray_trainer does not import: {exc}")
    g, mask, old, _, ref, _ = batch(shape, 6)
    scores = torch.randn(shape, generator=g) * mask
    if ctrl == "fixed":
        c1, c2 = ours.FixedKLController(0.05), core_algos.FixedKLController(0.05)
    else:
        c1 = ours.AdaptiveKLController(0.05, 0.01, 1000)
        c2 = core_algos.AdaptiveKLController(0.05, 0.01, 1000)
    r1, m1 = ours.apply_kl_penalty(scores, old, ref, mask, c1, kl_penalty=name)
    data = DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_scores": scores, "old_log_probs": old, "ref_log_prob": ref}
    )
    data, m2 = verl_apply_kl_penalty(data, c2, kl_penalty=name)
    check("apply_kl_penalty_rewards", r1, data.batch["token_level_rewards"])
    assert set(m1) == set(m2)
    for k in m1:
        check(f"apply_kl_penalty[{k}]", torch.tensor(m1[k]), torch.tensor(float(m2[k])))
    check("kl_ctrl_value", torch.tensor(float(c1.value)), torch.tensor(float(c2.value)))


# ------------------------------------------------------------------ losses
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_agg_loss(shape, mode):
    g, mask, *_ = batch(shape, 7, empty_row=True)
    loss_mat = torch.randn(shape, generator=g)
    check(f"agg_loss[{mode}]", ours.agg_loss(loss_mat, mask, mode), core_algos.agg_loss(loss_mat, mask, mode))
    kw = {"batch_num_tokens": 37, "global_batch_size": 11, "loss_scale_factor": 5}
    check(
        f"agg_loss_global[{mode}]",
        ours.agg_loss(loss_mat, mask, mode, **kw),
        core_algos.agg_loss(loss_mat, mask, mode, **kw),
    )


CLIPS = [
    dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0),
    dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=1.5),  # DAPO clip-higher
    dict(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=2.0),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("clip", range(len(CLIPS)))
@pytest.mark.parametrize("with_is", [False, True])
def test_policy_loss_vanilla(shape, mode, clip, with_is):
    g, mask, old, _, _, adv = batch(shape, 8)
    new = old + torch.randn(shape, generator=g) * 1.0  # large moves: both clips fire
    adv = adv.clone()
    new[0, 0], adv[0, 0] = old[0, 0] + 2.0, -1.0  # ratio e^2 > clip_ratio_c with A < 0: dual clip fires
    is_w = torch.rand(shape, generator=g) * 2 * mask if with_is else None
    kw = CLIPS[clip]
    lp1 = new.clone().requires_grad_()
    lp2 = new.clone().requires_grad_()
    loss1, clipfrac, ppo_kl, clipfrac_lower = ours.compute_policy_loss_vanilla(
        old, lp1, adv, mask, ours.PolicyLossConfig(loss_agg_mode=mode, **kw), rollout_is_weights=is_w
    )
    fn = core_algos.get_policy_loss_fn("vanilla")
    loss2, metrics = fn(old, lp2, adv, mask, loss_agg_mode=mode, config=actor_config(**kw), rollout_is_weights=is_w)
    check("pg_loss", loss1.detach(), loss2.detach())
    loss1.backward()
    loss2.backward()
    check("pg_loss_grad", lp1.grad, lp2.grad)
    check("pg_clipfrac", clipfrac, torch.tensor(metrics["actor/pg_clipfrac"]))
    check("ppo_kl", ppo_kl, torch.tensor(metrics["actor/ppo_kl"]))
    check("pg_clipfrac_lower", clipfrac_lower, torch.tensor(metrics["actor/pg_clipfrac_lower"]))
    assert metrics["actor/pg_clipfrac_lower"] > 0  # dual clip actually exercised


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "mode", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
@pytest.mark.parametrize("cliprange_value", [0.2, 0.5])
def test_value_loss(shape, mode, cliprange_value):
    g, mask, *_ = batch(shape, 9)
    values = torch.randn(shape, generator=g)
    vpreds = values + torch.randn(shape, generator=g) * 0.5
    returns = values + torch.randn(shape, generator=g)
    v1, c1 = ours.compute_value_loss(vpreds, returns, values, mask, cliprange_value, mode)
    v2, c2 = core_algos.compute_value_loss(vpreds, returns, values, mask, cliprange_value, mode)
    check("vf_loss", v1, v2)
    check("vf_clipfrac", c1, c2)


# ------------------------------------------------------------------ rollout IS
# PR metric name -> verl 0.9.1 rollout_corr name, for definitions unchanged between the two.
MISMATCH_KEYS = [
    "kl",
    "k3_kl",
    "training_ppl",
    "training_log_ppl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
]
SHARED_IS_KEYS = [
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
    "rollout_is_seq_fraction_high",
    "rollout_is_seq_fraction_low",
]
SHARED_IS_KEYS_SEQUENCE = ["rollout_is_max", "rollout_is_min"]
# Equal only when neither bound is active (0.9.1 measures them after truncation/clamps at 0).
UNBOUNDED_IS_KEYS = [
    "rollout_is_mean",
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_std",
    "rollout_is_eff_sample_size",
    "rollout_is_seq_mean",
    "rollout_is_seq_std",
    "rollout_is_seq_max",
    "rollout_is_seq_min",
    "rollout_is_seq_max_deviation",
]


def is_batch(shape, seed, scale):
    g, mask, old, *_ = batch(shape, seed)
    rollout = old + torch.randn(shape, generator=g) * scale
    # Row 0 on-policy (ratio 1, inside every bound): verl 0.9.1's compute_is_metrics divides by
    # zero (ZeroDivisionError in the ESS) when IcePop zeroes every weight of the batch.
    rollout[0] = old[0]
    return mask, old, rollout


def verl_is(old, rollout, mask, level, mode, upper, lower):
    if mode == "truncate":
        spec: float | str = float(upper)
    else:
        spec = f"{lower!r}_{float(upper)!r}"
    proto, new_mask, metrics = rch.compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, rollout_is=level, rollout_is_threshold=spec
    )
    torch.testing.assert_close(new_mask, mask)
    return proto.batch["rollout_is_weights"], metrics


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "clip"])
@pytest.mark.parametrize("upper,lower", [(2.0, None), (1.5, 0.8), (5.0, 0.5)])
@pytest.mark.parametrize("scale", [0.05, 0.6])
def test_rollout_is_weights_and_metrics(shape, level, mode, upper, lower, scale):
    mask, old, rollout = is_batch(shape, 10, scale)
    eff_lower = 1.0 / upper if lower is None else lower
    w1, m1 = ours_is.compute_rollout_importance_weights(
        old,
        rollout,
        mask,
        ours_is.RolloutISConfig(
            rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=upper, rollout_is_threshold_lower=lower
        ),
    )
    w2, m2 = verl_is(old, rollout, mask, level, mode, upper, eff_lower)
    check(f"rollout_is_weights[{level},{mode}]", w1, w2)
    for k in MISMATCH_KEYS:
        check(f"mismatch/{k}", torch.tensor(m1[f"mismatch/mismatch_{k}"]), torch.tensor(m2[f"rollout_corr/{k}"]))
    keys = SHARED_IS_KEYS + (SHARED_IS_KEYS_SEQUENCE if level == "sequence" else [])
    if mode == "truncate" and lower is not None:
        # a float (TIS) spec in 0.9.1 cannot carry a lower bound: its *_fraction_low use 1/upper
        keys = [k for k in keys if not k.endswith("_fraction_low")]
    for k in keys:
        check(f"mismatch/{k}[{level}]", torch.tensor(m1[f"mismatch/{k}"]), torch.tensor(m2[f"rollout_corr/{k}"]))
    # the same weights enter the policy loss identically
    g = torch.Generator().manual_seed(11)
    adv = torch.randn(shape, generator=g)
    new = old + torch.randn(shape, generator=g) * 0.3
    l1 = ours.compute_policy_loss_vanilla(old, new, adv, mask, rollout_is_weights=w1)[0]
    l2 = core_algos.compute_policy_loss_vanilla(old, new, adv, mask, config=actor_config(), rollout_is_weights=w2)[0]
    check("pg_loss_with_rollout_is", l1, l2)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "clip"])
def test_rollout_is_unbounded_metrics(shape, level, mode):
    mask, old, rollout = is_batch(shape, 12, 0.01)
    upper, lower = 1e6, 1e-6  # no bound active: both metric definitions coincide
    w1, m1 = ours_is.compute_rollout_importance_weights(
        old,
        rollout,
        mask,
        ours_is.RolloutISConfig(
            rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=upper, rollout_is_threshold_lower=lower
        ),
    )
    w2, m2 = verl_is(old, rollout, mask, level, mode, upper, lower)
    check("rollout_is_weights_unbounded", w1, w2)
    for k in UNBOUNDED_IS_KEYS:
        check(
            f"mismatch/{k}[{level},unbounded]", torch.tensor(m1[f"mismatch/{k}"]), torch.tensor(m2[f"rollout_corr/{k}"])
        )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["truncate", "clip"])
@pytest.mark.parametrize("scale", [0.05, 0.6])
def test_rollout_is_geometric_via_verl_sequence(shape, mode, scale):
    # geometric weight exp(mean lr) == verl sequence weight on lr / length
    mask, old, rollout = is_batch(shape, 13, scale)
    upper = 1.3
    w1, m1 = ours_is.compute_rollout_importance_weights(
        old,
        rollout,
        mask,
        ours_is.RolloutISConfig(rollout_is_level="geometric", rollout_is_mode=mode, rollout_is_threshold=upper),
    )
    length = mask.sum(-1, keepdim=True)
    old_scaled = rollout + (old - rollout) / length
    w2, m2 = verl_is(old_scaled, rollout, mask, "sequence", mode, upper, 1.0 / upper)
    check(f"rollout_is_weights[geometric,{mode}]", w1, w2)
    for k in SHARED_IS_KEYS_SEQUENCE:
        check(f"mismatch/{k}[geometric]", torch.tensor(m1[f"mismatch/{k}"]), torch.tensor(m2[f"rollout_corr/{k}"]))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "clip"])
def test_rollout_is_veto(shape, level, mode):
    mask, old, rollout = is_batch(shape, 14, 0.3)
    old = old.clone()
    old[1, 0] = rollout[1, 0] - 12.0  # ratio 6e-6 on a valid token (column 0 always valid)
    n = shape[1]
    pad_rows = (mask.sum(-1) < n).nonzero().flatten()
    if len(pad_rows):  # a catastrophic ratio on padding must not veto
        r = int(pad_rows[0])
        old[r, -1] = rollout[r, -1] - 12.0
    veto = 1e-4
    w1, m1 = ours_is.compute_rollout_importance_weights(
        old,
        rollout,
        mask,
        ours_is.RolloutISConfig(
            rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=2.0, rollout_is_veto_threshold=veto
        ),
    )
    w2, _ = verl_is(old, rollout, mask, level, mode, 2.0, 0.5)
    catastrophic = ((old - rollout) < math.log(veto)) & mask.bool()
    keep = (~catastrophic.any(-1, keepdim=True)).float()
    check(f"rollout_is_weights_veto[{level},{mode}]", w1, w2 * keep)
    assert torch.all(w1[1] == 0)
    check("rollout_is_veto_fraction", torch.tensor(m1["mismatch/rollout_is_veto_fraction"]), (1 - keep).mean())
