"""Masked reductions and log-prob helpers over ``(bs, response_length)`` tensors: verl's
``verl/utils/torch_functional.py``, function for function.

``bs`` is the number of responses, ``response_length`` the padded number of response tokens;
``mask`` / ``response_mask`` is 1 for real response tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero.

    Args:
        values: any shape, typically ``(bs, response_length)``.
        mask: same shape as ``values``; bool or 0/1. NaN/inf in ``values`` outside the mask is
            replaced by 0 before multiplying, so padding garbage never leaks into the sum.
        axis: dimension(s) to reduce; ``None`` reduces everything to a 0-d tensor.

    Returns:
        ``values`` reduced over ``axis``; same units as ``values``.

    verl counterpart: ``verl.utils.torch_functional.masked_sum``.
    """
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Mean of ``values`` over the elements selected by ``mask``.

    ``masked_sum(values, mask, axis) / (mask.sum(axis) + 1e-8)``: an all-zero mask gives 0
    rather than NaN.

    Args:
        values: any shape, typically ``(bs, response_length)``.
        mask: same shape as ``values``; bool or 0/1.
        axis: dimension(s) to reduce (``-1`` gives one mean per sequence, shape ``(bs,)``);
            ``None`` gives a 0-d tensor.

    verl counterpart: ``verl.utils.torch_functional.masked_mean``.
    """
    s = masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the elements selected by ``mask`` (all elements pooled).

    Args:
        values: any shape, typically ``(bs, response_length)``.
        mask: same shape as ``values``.
        unbiased: apply Bessel's correction ``n / (n - 1)`` with ``n = mask.sum()``.

    Raises:
        ValueError: with ``unbiased=True`` when the mask selects 0 or 1 element (as verl).

    Returns:
        0-d tensor, units of ``values`` squared.

    verl counterpart: ``verl.utils.torch_functional.masked_var``.
    """
    mean = masked_mean(values, mask)
    centered_values = values - mean
    variance = masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        if mask_sum == 0:
            raise ValueError("At least one element in the mask has to be 1.")
        if mask_sum == 1:
            raise ValueError("The sum of the mask is one, which can cause a division by zero.")
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Whiten ``values`` with the masked mean and (unbiased) masked variance.

    ``(values - mean) * rsqrt(var + 1e-8)``; with ``shift_mean=False`` the mean is added back.
    Positions outside the mask are transformed too (they are not zeroed).

    Args:
        values: ``(bs, response_length)`` (any shape works).
        mask: same shape as ``values``; needs at least 2 selected elements.

    verl counterpart: ``verl.utils.torch_functional.masked_whiten``.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Element-wise clamp with tensor bounds: ``max(min(x, tensor_max), tensor_min)``.

    verl counterpart: ``verl.utils.torch_functional.clip_by_value``.
    """
    return torch.max(torch.min(x, tensor_max), tensor_min)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability (nats) of ``labels`` under ``softmax(logits)``.

    For float32/float64 logits this is ``logits[label] - logsumexp(logits)`` computed in the
    logits' own dtype (exact ``log_softmax`` + gather, no overflow for large logits). For
    lower precisions (bf16/fp16) it falls back to ``log_softmax`` in that dtype, exactly as
    verl's CPU path does (no silent upcast, so the precision gate sees what verl sees).

    Args:
        logits: ``(bs, response_length, vocab_size)`` or ``(N, vocab_size)``.
        labels: integer token ids, ``logits.shape[:-1]``.

    Returns:
        ``logits.shape[:-1]``, dtype of ``logits``.

    verl counterpart: ``verl.utils.torch_functional.logprobs_from_logits`` (its non-flash-attn,
    non-NPU branch ``logprobs_from_logits_v2``).
    """
    if logits.dtype in (torch.float32, torch.float64):
        logits_labels = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        logsumexp_values = torch.logsumexp(logits, dim=-1)
        return logits_labels - logsumexp_values
    logprobs = F.log_softmax(logits, dim=-1)
    return logprobs.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of ``softmax(logits)`` along the last dimension.

    ``logsumexp(logits) - sum(softmax(logits) * logits)``.

    Args:
        logits: ``(bs, response_length, vocab_size)`` (any ``(..., vocab_size)``).

    Returns:
        ``logits.shape[:-1]``, e.g. ``(bs, response_length)``.

    verl counterpart: ``verl.utils.torch_functional.entropy_from_logits``.
    """
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)
