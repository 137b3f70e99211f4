"""The judgement's rule (check/verdicts/judgement.py) on hand-made tensors at each dtype.

One linear, ``x [64, 96] @ w[48, 96].T``, per dtype. Its float64 replay is the reference; the baseline is
torch's own CPU linear in the dtype (fp32 accumulation, one rounding). Hand-made outputs:

- ``bad``: a regression of the kind an upgrade brings: the product computed from inputs rounded to a
  narrower format (fp32 from bf16, as a bf16 GEMM mode; bf16/fp16 from float8 e5m2, as an fp8 GEMM mode);
- ``bad2``: another regression (fp32 from fp16-rounded inputs; bf16/fp16 accumulated in the low dtype
  itself, one rounding per term);
- ``alt``: the same sums in another order, rounded once (a summation order change).

The figures are computed the way the replay worker computes them (runs/api_replay/figures.py, torch and
msprobe's standards) in one subprocess; the rule itself is pure and runs here. A golden's statistics are
msprobe's: Max/Min of the tensor, Mean/Norm computed in its own dtype.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from precision_harness.check.verdicts.judgement import Verdict, golden_bounds, held_back, judge

DTYPES = ("float32", "bfloat16", "float16")

FIGURES = r"""
import json, sys, torch
import torch.nn.functional as F
from precision_harness.runs.api_replay.figures import output_figures

def sequential(x, w, dtype, reverse=False):
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=dtype)
    terms = range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])
    for p in terms:
        acc = acc + (x[:, p : p + 1].float() * w[:, p].float()).to(dtype)
    return acc

def stats(t):  # msprobe's get_stat_info: Max/Min, and Mean/Norm in the tensor's own dtype
    return {"Max": float(t.max()), "Min": float(t.min()), "Mean": float(torch.mean(t)), "Norm": float(torch.norm(t))}

out = {}
for name in sys.argv[1:]:
    dtype = getattr(torch, name)
    torch.manual_seed(4)
    x, w = torch.randn(64, 96).to(dtype), (torch.randn(48, 96) * 0.1).to(dtype)
    ref = F.linear(x.double(), w.double())
    outputs = {"base": F.linear(x, w)}
    if dtype == torch.float32:
        outputs["bad"] = F.linear(x.bfloat16().float(), w.bfloat16().float())
        outputs["bad2"] = F.linear(x.half().float(), w.half().float())
    else:
        fp8 = torch.float8_e5m2
        outputs["bad"] = F.linear(x.to(fp8).to(dtype), w.to(fp8).to(dtype))
        outputs["bad2"] = sequential(x, w, dtype)
    outputs["alt"] = (x.float().unsqueeze(1) * w.float()).flip(-1).sum(-1).to(dtype)
    out[name] = {
        "figures": {k: output_figures("linear", v, outputs["base"], ref) for k, v in outputs.items()},
        "stats": {k: stats(v) for k, v in outputs.items()},
    }
seeds = []
for seed in range(6):  # a golden recorded with the fp8 regression, in bf16, over several draws
    torch.manual_seed(seed)
    x, w = torch.randn(64, 96).bfloat16(), (torch.randn(48, 96) * 0.1).bfloat16()
    base, ref = F.linear(x, w), F.linear(x.double(), w.double())
    bad = F.linear(x.to(torch.float8_e5m2).bfloat16(), w.to(torch.float8_e5m2).bfloat16())
    seeds.append([output_figures("linear", base, base, ref), stats(bad)])
out["bfloat16_seeds"] = seeds
# eager attention's softmax(x, dim=-1, dtype=torch.float32) on bf16 x, computed in bf16 (a kernel that ignores the
# upcast): judged by its own dtype's standard (as before) and by the golden's, float32 (a narrowing)
torch.manual_seed(5)
x = (torch.randn(4, 4, 18, 18) * 2).bfloat16()
ref = F.softmax(x.double(), dim=-1)
golden = F.softmax(x, dim=-1, dtype=torch.float32)
new = F.softmax(x, dim=-1)
narrowed = output_figures("softmax", new, golden, ref, dtype=torch.float32)
narrowed["narrowed"] = {"golden": "torch.float32", "new": "torch.bfloat16"}
out["softmax"] = {
    "own": output_figures("softmax", new, F.softmax(x, dim=-1, dtype=torch.bfloat16), ref),
    "narrowed": narrowed,
    "golden": stats(golden),
}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def linear() -> dict:
    """``{dtype: {"figures": {output: figures as new output}, "stats": {output: msprobe's statistics}}}``."""
    proc = subprocess.run(
        [sys.executable, "-c", FIGURES, *DTYPES], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _judge(linear: dict, dtype: str, new: str, golden: str) -> Verdict:
    case = linear[dtype]
    return judge("Functional.linear.0.forward", case["figures"][new], case["stats"][golden]).verdict


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_regression_is_named_with_its_cost(linear: dict, dtype: str) -> None:
    """The new output fails its dtype's standard; the golden (the baseline itself) shows no error."""
    case = linear[dtype]
    judgement = judge("Functional.linear.0.forward", case["figures"]["bad"], case["stats"]["base"])
    assert judgement.verdict is Verdict.REGRESSION, judgement.reason
    standard = case["figures"]["bad"]["standard"]
    assert not standard["passed"] and standard["k"] > standard["multiplier"]
    assert judgement.reason.startswith(f"error = {standard['k']:.3g} x what this op costs in {dtype}")
    assert judgement.line.startswith("regression at API Functional.linear.0.forward: error = ")


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_golden_recorded_with_the_regression_reads_as_an_improvement(linear: dict, dtype: str) -> None:
    case = linear[dtype]
    judgement = judge("Functional.linear.0.forward", case["figures"]["base"], case["stats"]["bad"])
    assert judgement.verdict is Verdict.IMPROVEMENT, judgement.reason
    proven = [b for b in golden_bounds(case["figures"]["base"], case["stats"]["bad"]) if b.proves_improvement]
    assert proven and all(b.lower_bound > 2 * b.twice_new / 2 for b in proven)
    assert "Review and re-record the golden (inputs matched by statistics)" in judgement.reason


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_summation_order_change_is_equivalent(linear: dict, dtype: str) -> None:
    for new, golden in (("alt", "base"), ("base", "alt"), ("base", "base")):
        judgement = judge("Functional.linear.0.forward", linear[dtype]["figures"][new], linear[dtype]["stats"][golden])
        assert judgement.verdict is Verdict.EQUIVALENT, (new, golden, judgement.reason)
        assert judgement.reason.endswith("the stage's later divergences were not judged (inputs matched by statistics)")
        assert "too tight" not in judgement.reason and "re-record" not in judgement.reason


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_regressions_against_each_other_are_undecided(linear: dict, dtype: str) -> None:
    judgement = judge("Functional.linear.0.forward", linear[dtype]["figures"]["bad2"], linear[dtype]["stats"]["bad"])
    assert judgement.verdict is Verdict.UNDECIDED
    assert judgement.reason.startswith(f"both sides are farther from float64 than {dtype} allows")


FIGURES_BY_HAND = {
    "dtype": "torch.float32",
    "new": {"max_abs": 1e-6, "mean_abs": 1e-7, "l2": 1e-5, "rmse": 1e-7},
    "baseline": {"max_abs": 1e-6, "mean_abs": 1e-7, "l2": 1e-5, "rmse": 1e-7},
    "floor": {"max_abs": 1e-6, "mean_abs": 1e-7, "l2": 1e-5, "rmse": 1e-7},
    "reference": {"Max": 4.0, "Min": -4.0, "Mean": 0.0, "Norm": 100.0},
    "delta": {"Max": 0.0, "Min": 0.0, "Mean": 1e-8, "Norm": 1e-5},
    "standard": {"passed": True, "failed": [], "k": 1.0, "multiplier": 2.0, "msprobe": {"benchmark": "pass"}},
}


def test_only_what_the_golden_records_is_bounded() -> None:
    """msprobe records no Mean/Norm for float64 (and with precision: high): those statistics prove nothing."""
    bounds = golden_bounds(FIGURES_BY_HAND, {"Max": 4.5, "Min": -4.0, "Mean": None, "Norm": None})
    assert [b.statistic for b in bounds] == ["Max", "Min"]
    assert judge("A.x.0.forward", FIGURES_BY_HAND, {"Max": 4.5, "Mean": None}).verdict is Verdict.IMPROVEMENT


def test_a_golden_off_by_less_than_twice_the_new_error_is_undecided() -> None:
    """Beyond what the dtype allows (3e-6) but within 2 x the new error (4e-6): neither side shown better."""
    figures = {**FIGURES_BY_HAND, "new": {**FIGURES_BY_HAND["new"], "max_abs": 2e-6}}
    judgement = judge("A.x.0.forward", figures, {"Max": 4.0 + 3.5e-6})
    assert judgement.verdict is Verdict.UNDECIDED and "neither side is shown better" in judgement.reason


def test_the_statistics_own_noise_is_taken_off_the_bound() -> None:
    """A Norm 2e-5 off with msprobe's Norm computation good to 1e-5 bounds the golden's error by 1e-5 only."""
    (bound,) = golden_bounds(FIGURES_BY_HAND, {"Norm": 100.0 + 2e-5})
    assert bound.lower_bound == pytest.approx(1e-5)
    assert bound.allowance == pytest.approx(2 * 1e-5 + 1e-5)


def test_a_narrowed_output_is_held_to_the_goldens_dtype_and_never_acquitted(linear: dict) -> None:
    """Issue 36: softmax asked for float32 and computed in bf16. By its own dtype's standard it read "equivalent"
    (the baseline built in the narrower dtype); held to float32's, it is a regression, with the figure."""
    case = linear["softmax"]
    before = judge("Functional.softmax.0.forward", case["own"], case["golden"])
    assert before.verdict is Verdict.EQUIVALENT, before.reason  # what the judgement said before this check
    judgement = judge("Functional.softmax.0.forward", case["narrowed"], case["golden"])
    assert judgement.verdict is Verdict.REGRESSION, judgement.reason
    assert judgement.reason.startswith(
        "the output narrowed from float32 to bfloat16, held to float32's standard: error = "
    )
    assert case["narrowed"]["standard"]["k"] > 100


def test_a_narrowed_output_that_meets_the_wider_standard_is_undecided_never_equivalent() -> None:
    narrowed = {**FIGURES_BY_HAND, "narrowed": {"golden": "torch.float64", "new": "torch.float32"}}
    for golden in ({"Max": 4.0}, {"Max": 4.5}):  # equivalent, improvement, without the narrowing
        assert judge("A.x.0.forward", FIGURES_BY_HAND, golden).verdict in (Verdict.EQUIVALENT, Verdict.IMPROVEMENT)
        judgement = judge("A.x.0.forward", narrowed, golden)
        assert judgement.verdict is Verdict.UNDECIDED, judgement.reason
        assert judgement.reason.startswith("the output narrowed from float64 to float32, held to float64's standard")


def test_an_unproven_side_by_side_verdict_is_held_back_a_regression_stands() -> None:
    why = "its input X.index is torch.int64, which msprobe records by Max and Min only"
    for golden in ({"Max": 4.0}, {"Max": 4.5}):
        held = held_back(judge("A.x.0.forward", FIGURES_BY_HAND, golden), why)
        assert held.verdict is Verdict.UNDECIDED and held.reason.startswith(why), held.reason
    failing = {**FIGURES_BY_HAND, "standard": {**FIGURES_BY_HAND["standard"], "passed": False, "failed": ["rmse"]}}
    held = held_back(judge("A.x.0.forward", failing, {"Max": 4.0}), why)
    assert held.verdict is Verdict.REGRESSION and held.reason.endswith(why)


def test_bf16_statistics_can_miss_a_golden_regression_but_never_invert_it(linear: dict) -> None:
    """Statistics are lossy, and bf16's are coarse (a Norm of 53 rounds to 0.25): a golden recorded with a
    regression is proven worse only where its Max, Min, Mean or Norm shows it. Over six draws it reads as an
    improvement or, where nothing shows, as equivalent; never as a regression of the new (clean) output."""
    verdicts = [
        judge("Functional.linear.0.forward", figures, golden).verdict for figures, golden in linear["bfloat16_seeds"]
    ]
    assert set(verdicts) == {Verdict.IMPROVEMENT, Verdict.EQUIVALENT}, verdicts
