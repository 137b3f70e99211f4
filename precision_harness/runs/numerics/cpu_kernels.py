"""CPU kernels whose results are set by the arithmetic and its order, not by the processor.

On CPU, torch hands matrix products to vendor libraries that pick their code by the processor
they run on: MKL's ``sgemm`` (fp32, fp64) and oneDNN (bf16/fp16 where the CPU has AVX-512 or
AMX). The oneDNN choice is made below any environment cap, and an MKL branch other than
``COMPATIBLE`` is the processor's own (docs/tolerance.md, "CPU portability": on this harness's
scenarios the fp32 ``Functional.linear`` outputs change with the MKL branch, and an AVX-512
BF16/AMX Xeon failed every bf16 golden recorded elsewhere). ATen's own
element-wise and reduction kernels, by contrast, are selected by ``ATEN_CPU_CAPABILITY`` (pinned
to ``avx2`` by ``devices.determinism_env``), which every x86-64 CPU with AVX2 honours; those of
them that call MKL's vector math (``exp``, ``log``, ``sqrt``, ``sin``, ``cos``, ``erf`` of fp32
and fp64 tensors) run its pinned ``COMPATIBLE`` branch.

:func:`install` therefore replaces the CPU kernels of the matrix products (``aten::mm``,
``addmm``, ``bmm``, ``baddbmm``, ``mv``, ``addmv``, ``dot`` and their ``out=``/in-place forms)
with one computation built from ATen's element-wise multiply and its ``sum`` reduction:

- every product ``a[i, p] * b[p, j]`` is formed in the accumulation dtype (fp32 for fp32, bf16
  and fp16 inputs, where the product of two bf16 or fp16 numbers is exact; the input dtype
  otherwise: fp64, integers);
- the products are summed over ``p`` by ATen's reduction in the accumulation dtype, whose order
  depends only on the shapes and the thread count (pinned per scenario);
- ``alpha``/``beta`` are applied in the accumulation dtype, then the result is rounded once to
  the output dtype.

It also turns oneDNN off (``torch.backends.mkldnn.enabled``) and the fused flash attention CPU
kernel (it calls BLAS from C++, under the matrix-product operators), so ``scaled_dot_product_attention``
takes its math path through the kernels above.

Reaching into torch: the kernels are registered with ``torch.library.Library("aten", "IMPL")``,
the public API for registering a kernel, over kernels torch already registered. torch warns
once that a kernel is overridden; that warning is expected here and silenced. Checked with torch
2.13.0 (:data:`CHECKED_TORCH`); :func:`install` refuses a torch older than 2.1 (``torch.library``
overrides of aten's CPU kernels are not supported there).

The kernels call ``torch.ops.aten`` directly: msprobe hooks ``torch``, ``torch.Tensor``,
``torch.nn.functional`` and ``torch._VF``, so a call through those from inside a backward pass
would appear in the dump as an API of its own.

Cost: the products are materialised, ``m * k * n`` elements per matrix (chunked to
:data:`CHUNK_ELEMENTS`); fine for the harness's tiny models, slow for real ones
(``trainer.cpu_kernels: vendor`` keeps torch's own kernels).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

#: torch version these overrides were checked against (docs/tolerance.md)
CHECKED_TORCH = "2.13.0"
#: products materialised at once; a larger matrix product is computed in row blocks
CHUNK_ELEMENTS = 1 << 22

_aten = torch.ops.aten
_LIBRARY: Any = None
#: ``install(split_k=...)``: the reduction over k is summed in blocks of this many products, then over the
#: blocks (None: one ordered sum over k)
_SPLIT_K: int | None = None


#: inputs accumulated in fp32: their products are exact in fp32 (bf16, fp16) or already fp32
_FP32_ACCUMULATED = (torch.float32, torch.bfloat16, torch.float16)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32/bf16/fp16; the dtype itself otherwise (fp64, and integers, whose sums are exact)."""
    return torch.float32 if dtype in _FP32_ACCUMULATED else dtype


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else _aten._to_copy.default(x, dtype=dtype)


def _products_summed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for ``a [..., m, k]`` and ``b [..., k, n]``: exact-dtype products, ATen's ordered sum over k
    (split into blocks of :data:`_SPLIT_K` products first when set)."""
    prod = _aten.mul.Tensor(_aten.unsqueeze.default(a, -1), _aten.unsqueeze.default(b, -3))
    k = prod.shape[-2]
    if _SPLIT_K is None or k <= _SPLIT_K:
        return _aten.sum.dim_IntList(prod, [-2])
    pad = -k % _SPLIT_K  # zero products are exact: padding changes no partial sum
    if pad:
        prod = _aten.constant_pad_nd.default(prod, [0, 0, 0, pad])
    blocks = _aten.reshape.default(prod, [*prod.shape[:-2], (k + pad) // _SPLIT_K, _SPLIT_K, prod.shape[-1]])
    return _aten.sum.dim_IntList(_aten.sum.dim_IntList(blocks, [-2]), [-2])


def matmul_acc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` in the accumulation dtype, for ``a [..., m, k]``, ``b [..., k, n]`` (batch dims equal).

    Rows are processed in blocks of at most :data:`CHUNK_ELEMENTS` products; the blocks depend
    only on the shapes, so the result does too.
    """
    acc = _acc_dtype(a.dtype)
    a, b = _as(a, acc), _as(b, acc)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = a.numel() // (m * k) if m * k else 1
    rows = max(1, CHUNK_ELEMENTS // max(batch * k * n, 1))
    if rows >= m:
        return _products_summed(a, b)
    blocks = [_products_summed(_aten.slice.Tensor(a, -2, i, i + rows), b) for i in range(0, m, rows)]
    return _aten.cat.default(blocks, -2)


def _scaled(product: torch.Tensor, base: torch.Tensor | None, beta: Any, alpha: Any) -> torch.Tensor:
    """``beta * base + alpha * product`` in the product's dtype; ``beta == 0`` ignores ``base`` (BLAS semantics)."""
    if alpha != 1:
        product = _aten.mul.Scalar(product, alpha)
    if base is None or beta == 0:
        return product
    base = _as(base, product.dtype)
    if beta != 1:
        base = _aten.mul.Scalar(base, beta)
    return _aten.add.Tensor(base, product)


def _mm(a, b):
    return _as(matmul_acc(a, b), a.dtype)


def _addmm(self, a, b, *, beta=1, alpha=1):
    return _as(_scaled(matmul_acc(a, b), self, beta, alpha), a.dtype)


def _mv(a, v):
    return _as(_aten.squeeze.dim(matmul_acc(a, _aten.unsqueeze.default(v, -1)), -1), a.dtype)


def _addmv(self, a, v, *, beta=1, alpha=1):
    product = _aten.squeeze.dim(matmul_acc(a, _aten.unsqueeze.default(v, -1)), -1)
    return _as(_scaled(product, self, beta, alpha), a.dtype)


def _dot(a, b):
    row, col = _aten.unsqueeze.default(a, 0), _aten.unsqueeze.default(b, -1)
    return _as(_aten.reshape.default(matmul_acc(row, col), []), a.dtype)


def _out(fn):
    """The ``out=`` form of a functional kernel: compute, then resize and copy into ``out``."""

    def kernel(*args, out, **kwargs):
        result = fn(*args, **kwargs)
        _aten.resize_.default(out, result.shape)
        return _aten.copy_.default(out, result)

    return kernel


def _inplace(fn):
    """The in-place form (``addmm_``): compute with ``self`` as the base, then copy into ``self``."""

    def kernel(self, *args, **kwargs):
        return _aten.copy_.default(self, fn(self, *args, **kwargs))

    return kernel


#: operator overload -> kernel; bmm/baddbmm are mm/addmm over a batch dimension
KERNELS = {
    "mm": _mm,
    "mm.out": _out(_mm),
    "addmm": _addmm,
    "addmm.out": _out(_addmm),
    "addmm_": _inplace(_addmm),
    "bmm": _mm,
    "bmm.out": _out(_mm),
    "baddbmm": _addmm,
    "baddbmm.out": _out(_addmm),
    "baddbmm_": _inplace(_addmm),
    "mv": _mv,
    "mv.out": _out(_mv),
    "addmv": _addmv,
    "addmv.out": _out(_addmv),
    "addmv_": _inplace(_addmv),
    "dot": _dot,
    "dot.out": _out(_dot),
}


def installed() -> bool:
    """Whether :func:`install` ran in this process."""
    return _LIBRARY is not None


def install(*, split_k: int | None = None) -> None:
    """Register the portable matrix-product kernels for the CPU and turn oneDNN and flash attention off.

    ``split_k``: sum each output's ``k`` products in blocks of ``split_k``, then sum the blocks, as split-K
    GEMMs do (the decode kernels of GPU inference engines). Another association of the same fp32 sums:
    as portable as the default, but rounded differently; the verl CPU rollout server uses it to stand in
    for a rollout engine's kernels (precision_harness/runs/verl/cpu/policy_server.py).

    Idempotent for one ``split_k``. Raises:
        RuntimeError: torch is older than 2.1, or installed before with another ``split_k``.
    """
    global _LIBRARY, _SPLIT_K
    if _LIBRARY is not None:
        if split_k != _SPLIT_K:
            raise RuntimeError(f"portable CPU kernels already installed with split_k={_SPLIT_K}, not {split_k}")
        return
    _SPLIT_K = split_k
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 1):
        raise RuntimeError(
            f"trainer.cpu_kernels: portable needs torch >= 2.1 (found {torch.__version__}); "
            "set trainer.cpu_kernels: vendor or upgrade torch"
        )
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # torch warns that each of these overrides its own CPU kernel: that is the point
        warnings.simplefilter("ignore")
        for name, kernel in KERNELS.items():
            library.impl(name, kernel, "CPU")
    torch.backends.mkldnn.enabled = False
    # the flag lives under torch.backends.cuda but also decides the CPU's sdpa backend
    torch.backends.cuda.enable_flash_sdp(False)
    _LIBRARY = library
