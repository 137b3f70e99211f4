"""How far one API output is from exact: the new tensor and the baseline against the float64 replay.

Three tensors of one output, all of the same shape:

- ``new``: what the checked run computed (msprobe's ``task: tensor`` capture), in its dtype;
- ``baseline``: the same op replayed on the CPU with its inputs in the output's dtype, what the op
  costs in that dtype (FlashAttention's ``out_pt``, "the same math in the low dtype";
  ``tests/test_flash_attn.py``);
- ``reference``: the op replayed with its inputs in float64 (torch._dynamo's ``fp64_ref``).

:func:`output_figures` returns, as plain JSON, the errors of ``new`` and ``baseline`` in three norms
(max, mean and L2 of ``|x - reference|``), the reference's Max/Min/Mean/Norm, how far msprobe's own
statistic computation may be off (``delta``), the rounding floors of the dtype and whether ``new``
meets its dtype's standard. The judgement over them and the golden's statistics is
:func:`precision_harness.check.verdicts.judgement.judge`; this module only measures.

The standard (all must hold; ``k`` is how many times the baseline's error the new one is):

- RMSE: ``rmse(new) <= m * rmse(baseline) + u * rms(reference)``, torch._dynamo.utils.same's
  ``res_error <= multiplier * ref_error + tol / 10`` with the dtype's rounding for the tolerance;
  ``m`` is :func:`multiplier`;
- max abs error: ``max|new - ref| <= m * max|baseline - ref| + ulp(max|ref|)``, FlashAttention's
  ``(out - out_ref).abs().max() <= 2 * (out_pt - out_ref).abs().max()`` with hopper's rounding floor;
- msprobe's own standards for the API (:func:`~precision_harness.runs.api_replay.msprobe_acc.standards`):
  benchmark for every float output, ULP for matrix products, absolute threshold for element-wise ops;
- NaN and Inf where the reference has them, and only there.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from precision_harness.runs.api_replay import msprobe_acc

#: unit roundoff (half an ulp at 1) and stored mantissa bits of each float dtype
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
MANTISSA_BITS = {torch.float64: 52, torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}
#: torch._dynamo.utils.same: 3 for fp16/bf16 (AMP, pytorch#109097) and for tensors under 1000 elements, else 2
LOW_PRECISION, SMALL_TENSOR = (torch.float16, torch.bfloat16), 1000


def multiplier(dtype: torch.dtype, numel: int) -> float:
    """How many times the baseline's error the new output may have (torch._dynamo.utils.same)."""
    return 3.0 if dtype in LOW_PRECISION or numel < SMALL_TENSOR else 2.0


def ulp(x: float, dtype: torch.dtype) -> float:
    """One unit in the last place of ``dtype`` at magnitude ``|x|`` (at 0: the smallest normal's)."""
    bits = MANTISSA_BITS[dtype]
    if x == 0 or not math.isfinite(x):
        return torch.finfo(dtype).tiny
    return 2.0 ** (math.floor(math.log2(abs(x))) - bits)


def errors(x: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """``max_abs``, ``mean_abs``, ``l2`` and ``rmse`` of ``x - reference`` in float64, over the elements finite
    on both sides (shapes: equal)."""
    diff = x.double() - reference
    finite = torch.isfinite(diff)
    diff = diff[finite].abs()
    n = max(diff.numel(), 1)
    l2 = float(diff.norm()) if diff.numel() else 0.0
    return {
        "max_abs": float(diff.max()) if diff.numel() else 0.0,
        "mean_abs": float(diff.sum()) / n,
        "l2": l2,
        "rmse": l2 / math.sqrt(n),
    }


def reference_statistics(reference: torch.Tensor) -> dict[str, float]:
    """Max/Min/Mean/Norm of the float64 reference (the statistics msprobe records, computed exactly)."""
    return {
        "Max": float(reference.max()),
        "Min": float(reference.min()),
        "Mean": float(reference.mean()),
        "Norm": float(reference.norm()),
    }


def statistic_noise(new: torch.Tensor) -> dict[str, float]:
    """How far msprobe's own statistics may be from exact, per statistic (a golden's, computed the same way).

    msprobe computes Mean and Norm in the tensor's dtype (``torch.mean``, ``torch.norm``:
    ``pytorch_processor.get_stat_info``); twice the gap on the new tensor, plus one ulp of the
    statistic, bounds what that costs. Max and Min select an element: exact.
    """
    exact = new.double()
    noise = {"Max": 0.0, "Min": 0.0}
    for name, low, high in (("Mean", torch.mean(new), exact.mean()), ("Norm", torch.norm(new), exact.norm())):
        noise[name] = 2 * abs(float(low) - float(high)) + ulp(float(high), new.dtype)
    return noise


def floors(reference: torch.Tensor, dtype: torch.dtype) -> dict[str, float]:
    """The error of a correctly rounded output, per norm: what the dtype allows with no arithmetic error at all."""
    u = UNIT_ROUNDOFF[dtype]
    finite = reference[torch.isfinite(reference)]
    rms = float(finite.norm()) / math.sqrt(max(finite.numel(), 1))
    top = float(finite.abs().max()) if finite.numel() else 0.0
    return {"max_abs": ulp(top, dtype), "mean_abs": u * rms, "l2": u * float(finite.norm()), "rmse": u * rms}


def nonfinite_mismatch(x: torch.Tensor, reference: torch.Tensor) -> int:
    """Elements where ``x`` and the reference disagree on NaN or Inf (a NaN for a number, or the reverse)."""
    x = x.double()
    same = (torch.isnan(x) & torch.isnan(reference)) | (torch.isinf(x) & (x == reference))
    return int((~torch.isfinite(x) | ~torch.isfinite(reference)).logical_and(~same).sum())


def standard(
    api_name: str, new: torch.Tensor, baseline: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype
) -> dict[str, Any]:
    """Whether ``new`` meets ``dtype``'s standard (module docstring), ``k`` and which checks failed; ``dtype`` is
    the baseline's: the new output's own, or the golden's wider one where the output narrowed."""
    m = multiplier(dtype, new.numel())
    e_n, e_b, floor = errors(new, reference), errors(baseline, reference), floors(reference, dtype)
    failed = [
        name for name, key in (("rmse", "rmse"), ("max abs error", "max_abs")) if e_n[key] > m * e_b[key] + floor[key]
    ]
    if nonfinite_mismatch(new, reference):
        failed.append("NaN/Inf where float64 has none")
    wide = [t.detach().to(torch.float32 if t.dtype != torch.float64 else t.dtype).numpy() for t in (new, baseline)]
    msprobe = msprobe_acc.standards(api_name, reference.numpy(), (wide[0], wide[1]), dtype)
    failed += [f"msprobe {name}" for name, status in msprobe.items() if status == "error"]
    k = max(e_n[key] / max(e_b[key], floor[key]) for key in ("rmse", "max_abs"))
    return {"passed": not failed, "failed": failed, "k": k, "multiplier": m, "msprobe": msprobe}


def output_figures(
    api_name: str, new: torch.Tensor, baseline: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """Everything :func:`precision_harness.check.verdicts.judgement.judge` needs about one output, as plain JSON.

    Args:
        api_name: the API without prefix or call number (``linear``), for msprobe's standards.
        new: the captured output, any float dtype. baseline: the replay in ``dtype``.
        reference: the float64 replay. All three of one shape.
        dtype: the standard's dtype (default ``new``'s): the golden's, where the new output narrowed from it.
            The floors, the multiplier and msprobe's thresholds are that dtype's; ``delta`` is the noise of the
            golden's statistics, computed in it.
    """
    dtype = new.dtype if dtype is None else dtype
    reference = reference.detach().double()
    new, baseline = new.detach(), baseline.detach().to(dtype)
    return {
        "dtype": str(dtype),
        "numel": new.numel(),
        "new": errors(new, reference),
        "baseline": errors(baseline, reference),
        "floor": floors(reference, dtype),
        "reference": reference_statistics(reference),
        "delta": statistic_noise(new.to(dtype)),
        "standard": standard(api_name, new, baseline, reference, dtype),
    }
