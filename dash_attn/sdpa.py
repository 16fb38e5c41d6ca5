"""``torch.nn.functional.scaled_dot_product_attention``'s signature over ``dash_attn_func``.

A drop-in for code written against SDPA's ``(batch, heads, seqlen, headdim)`` layout: the
tensors are transposed (views, no copy) to dash-attn's ``(batch, seqlen, heads, headdim)``, the
output back. What SDPA can express and dash-attn cannot (an explicit mask, dropout, a top-left
causal mask when the lengths differ) is refused with an error naming the argument, never
approximated.
"""

from __future__ import annotations

import math

import torch

from .interface import dash_attn_func

__all__ = ["scaled_dot_product_attention"]


def _check_layout(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(
            f"{name} must be 4-D (batch, heads, seqlen, headdim) as in torch's "
            f"scaled_dot_product_attention, got {x.ndim}-D with shape {tuple(x.shape)}"
        )
    return x


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """SDPA with dash-attn's bitwise-reproducible backward; same arguments and layout as
    ``torch.nn.functional.scaled_dot_product_attention``.

    Args:
        query: ``(batch, heads, seqlen_q, headdim)``, fp16 or bf16.
        key, value: ``(batch, kv_heads, seqlen_k, headdim)``, same dtype and device.
        attn_mask: must be None: an explicit mask is not supported (NotImplementedError). For
            padding, pack the sequences and call ``dash_attn_varlen_func``; for a sliding window,
            ``dash_attn_func(..., window_size=(left, right))``.
        dropout_p: must be 0.0 (NotImplementedError otherwise).
        is_causal: causal mask. torch aligns it top-left; dash-attn bottom-right. The two agree
            only when ``seqlen_q == seqlen_k``, so other lengths are refused rather than given a
            different mask (use ``dash_attn_func(..., causal=True)`` for bottom-right).
        scale: softmax scale; default ``1 / sqrt(headdim)``, as torch.
        enable_gqa: as torch: query heads may be a multiple of the key/value heads only when
            True (query head ``h`` uses kv head ``h // (heads // kv_heads)``, as torch's
            ``repeat_interleave``); otherwise the head counts must be equal.

    Returns:
        ``(batch, heads, seqlen_q, headdim)``, like query (a transposed view of dash-attn's
        output: call ``.contiguous()`` where a contiguous tensor is needed).

    Raises:
        NotImplementedError: attn_mask given, dropout_p > 0, is_causal with seqlen_q != seqlen_k.
        RuntimeError: different head counts without enable_gqa (torch raises RuntimeError too).
        TypeError, ValueError: bad arguments (see ``dash_attn_func`` for the tensor contract).
    """
    query = _check_layout("query", query)
    key = _check_layout("key", key)
    value = _check_layout("value", value)
    if attn_mask is not None:
        raise NotImplementedError(
            "attn_mask is not supported by dash_attn.scaled_dot_product_attention (got a "
            f"{type(attn_mask).__name__}): use is_causal=True for a causal mask; for padding, "
            "pack the sequences and call dash_attn_varlen_func(q, k, v, cu_seqlens_q, "
            "cu_seqlens_k, ...); for a sliding window, dash_attn_func(..., window_size=(left, "
            "right))"
        )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p} is not supported by dash_attn.scaled_dot_product_attention: "
            "only dropout_p=0.0 (no attention dropout)"
        )
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    if is_causal and seqlen_q != seqlen_k:
        raise NotImplementedError(
            f"is_causal=True with seqlen_q={seqlen_q} != seqlen_k={seqlen_k}: torch's "
            "scaled_dot_product_attention aligns the causal mask top-left, dash-attn "
            "bottom-right (as flash-attn); the masks differ, so this call is refused. Use "
            "dash_attn_func(q, k, v, causal=True) in the (batch, seqlen, heads, headdim) layout "
            "for the bottom-right mask"
        )
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads and not enable_gqa:
        raise RuntimeError(
            f"query has {heads} heads and key {kv_heads}: different head counts need "
            "enable_gqa=True (as in torch's scaled_dot_product_attention)"
        )
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)
    ):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    if scale is not None and scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    # The shapes in this layout's names (dash_attn_func would name its own layout's axes).
    if value.shape[1] != kv_heads or value.shape[2] != key.shape[2]:
        raise ValueError(
            f"value must have key's heads and seqlen (batch, heads, seqlen, headdim): key "
            f"{tuple(key.shape)}, value {tuple(value.shape)}"
        )
    out = dash_attn_func(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        softmax_scale=None if scale is None else float(scale),
        causal=is_causal,
    )
    return out.transpose(1, 2)
