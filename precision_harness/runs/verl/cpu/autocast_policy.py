"""CPU autocast with the op lists GPU and NPU autocast use, so verl's bf16 mixed precision computes as it does there.

verl runs every forward of the actor and reference under ``torch.autocast(device_type, dtype=bf16)``
(``FSDPEngine.forward_step``). On a GPU (and on an NPU, whose autocast follows the same lists) that
region computes softmax, log_softmax, logsumexp, exp, rsqrt, pow and sums in float32
(``AT_FORALL_FP32`` and ``AT_FORALL_FP32_SET_OPT_DTYPE`` in ``ATen/autocast_mode.h``); CPU autocast
has a much shorter float32 list (losses, linalg, pooling) and leaves those ops in bf16. verl's own
``logprobs_from_logits`` and ``entropy_from_logits`` take the Qwen2 logits in bf16, so on a stock CPU
``old_log_prob``, ``ref_log_prob``, the update's log-probs and the entropy are rounded to bf16
(about 3 significant digits), where every GPU and NPU run has them in float32. The train/rollout
mismatch that rollout correction measures would then be a CPU artifact.

:func:`install` registers, for the ``AutocastCPU`` dispatch key, the GPU's policy for every op of
those two lists (:data:`FP32_OPS`, :data:`FP32_SET_OPT_DTYPE_OPS`): bf16/fp16 tensor arguments are cast
to float32 (for the second list only when the caller gave no ``dtype``), then the op runs with
autocast excluded, exactly as ``autocast_mode.cpp``'s CUDA wrappers do. Ops not listed keep CPU
autocast's policy (its bf16 list matches the GPU's for every op a Qwen2 forward uses: ``linear``,
``matmul``, ``bmm``, ``scaled_dot_product_attention``). Outside an autocast region nothing changes.

Reaching into torch: the kernels are registered with ``torch.library.Library("aten", "IMPL")``, the
public API, over kernels torch registered (it warns once per op; silenced). Checked with torch
2.13.0 (:data:`CHECKED_TORCH`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

CHECKED_TORCH = "2.13.0"
# the entries of AT_FORALL_FP32 without an overload name
_FP32_PLAIN = (
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "group_norm",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
)
#: ``AT_FORALL_FP32``: (op, overload); "default" stands for the macro's overload-less entries
FP32_OPS = (
    *((op, "default") for op in _FP32_PLAIN),
    ("pow", "Tensor_Scalar"),
    ("pow", "Tensor_Tensor"),
    ("pow", "Scalar"),
    ("frobenius_norm", "dim"),
    ("nuclear_norm", "dim"),
)
#: ``AT_FORALL_FP32_SET_OPT_DTYPE``: float32 unless the caller passed a dtype
FP32_SET_OPT_DTYPE_OPS = (
    ("prod", "default"),
    ("prod", "dim_int"),
    ("softmax", "int"),
    ("log_softmax", "int"),
    ("cumprod", "default"),
    ("cumsum", "default"),
    ("linalg_vector_norm", "default"),
    ("linalg_matrix_norm", "default"),
    ("linalg_matrix_norm", "str_ord"),
    ("sum", "default"),
    ("sum", "dim_IntList"),
)
_REDUCED = (torch.bfloat16, torch.float16)
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_LIBRARY: Any = None


def _fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _REDUCED:
        return value.float()
    if isinstance(value, (list, tuple)):
        return type(value)(_fp32(v) for v in value)
    return value


def _cast_kernel(op: Any, *, opt_dtype: bool) -> Any:
    names = [a.name for a in op._schema.arguments]
    dtype_at = names.index("dtype") if opt_dtype else -1

    def kernel(*args: Any, **kwargs: Any) -> Any:
        given = kwargs.get("dtype") if "dtype" in kwargs else (args[dtype_at] if 0 <= dtype_at < len(args) else None)
        if opt_dtype and given is not None:
            args_out, kwargs_out = args, kwargs
        else:
            args_out, kwargs_out = _fp32(args), {k: _fp32(v) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args_out, **kwargs_out)

    return kernel


def install() -> None:
    """Register the GPU's float32 autocast policy for :data:`FP32_OPS` and :data:`FP32_SET_OPT_DTYPE_OPS` on CPU
    (idempotent)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        for ops, opt_dtype in ((FP32_OPS, False), (FP32_SET_OPT_DTYPE_OPS, True)):
            for name, overload in ops:
                packet = getattr(torch.ops.aten, name, None)
                if packet is None or overload not in packet.overloads():
                    continue  # an op this torch does not have
                op = getattr(packet, overload)
                qualified = name if overload == "default" else f"{name}.{overload}"
                library.impl(qualified, _cast_kernel(op, opt_dtype=opt_dtype), "AutocastCPU")
    _LIBRARY = library


def installed() -> bool:
    return _LIBRARY is not None
