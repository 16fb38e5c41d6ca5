"""Attention forward: O and the log-sum-exp, one program per (Q tile, batch x head).

Glossary
--------
BLOCK_M      query rows per program (one Q tile)
BLOCK_N      key rows per inner-loop step
HEAD_DIM     the real head dimension; HEAD_DIM_PAD is the next power of two (tl.arange needs it)
causal_shift seqlen_k - seqlen_q: query row r sees key c iff c <= r + causal_shift (bottom-right)
qk_scale     softmax_scale * log2(e): the softmax runs in base 2 (exp2 is one instruction)
Grid         (cdiv(seqlen_q, BLOCK_M), batch * heads)

The forward is deterministic by construction (no cross-program reduction); only the backward needs
schedules. Rows that see no key (causal with seqlen_q > seqlen_k) get O = 0 and LSE = -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import _versions  # noqa: F401  (an unsupported Triton fails here, clearly)
from .utils import cdiv, next_power_of_2


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


_FWD_CONFIGS = {
    64: FwdConfig(128, 64, 4, 3),
    96: FwdConfig(128, 64, 8, 3),
    128: FwdConfig(128, 64, 8, 3),
    192: FwdConfig(64, 64, 4, 2),
    256: FwdConfig(64, 32, 4, 2),
}


def fwd_config(headdim: int) -> FwdConfig:
    return _FWD_CONFIGS[headdim]


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_ptrs,
    v_ptrs,
    stride_kn,
    stride_vn,
    offs_m,
    offs_d,
    lo,
    hi,
    seqlen_k,
    causal_shift,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    offs_n = tl.arange(0, BLOCK_N)
    d_mask = offs_d[None, :] < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASKED:
            kv_mask = (cols[:, None] < seqlen_k) & d_mask
        else:
            kv_mask = d_mask
        k = tl.load(k_ptrs + start_n * stride_kn, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if MASKED:
            keep = cols[None, :] < seqlen_k
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + causal_shift)
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # A row that has seen no key yet keeps m = -inf; subtract 0 instead to avoid inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start_n * stride_vn, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    stride_qb,
    stride_qm,
    stride_qh,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_ob,
    stride_om,
    stride_oh,
    heads,
    group_size,
    seqlen_q,
    seqlen_k,
    causal_shift,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    kvh = h // group_size
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d[None, :] < HEAD_DIM
    row_mask = offs_m[:, None] < seqlen_q

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_mask & d_mask, other=0.0)
    k_ptrs = K + b * stride_kb + kvh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + b * stride_vb + kvh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    # Keys this tile can see: all of them (full) or up to the last row's diagonal (causal).
    hi = seqlen_k
    if CAUSAL:
        hi = tl.minimum(seqlen_k, (start_m + 1) * BLOCK_M + causal_shift)
        hi = tl.maximum(hi, 0)
    # Blocks before mask_lo need no mask: inside seqlen_k and left of every row's diagonal.
    mask_lo = (seqlen_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        diag = start_m * BLOCK_M + causal_shift
        mask_lo = tl.minimum(mask_lo, tl.maximum(diag, 0) // BLOCK_N * BLOCK_N)
    mask_lo = tl.minimum(mask_lo, hi)
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_d,
        0, mask_lo, seqlen_k, causal_shift, qk_scale,
        BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, CAUSAL,
    )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_d,
        mask_lo, hi, seqlen_k, causal_shift, qk_scale,
        BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, CAUSAL,
    )  # fmt: skip

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    # Natural-log LSE for the API; -inf marks rows that saw no key.
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_mask & d_mask)
    tl.store(LSE + bh * seqlen_q + offs_m, lse, mask=offs_m < seqlen_q)


def attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel. Shapes as flash-attn; returns out like q and lse (b, h, sq) fp32."""
    batch, seqlen_q, heads, headdim = q.shape
    _, seqlen_k, kv_heads, _ = k.shape
    cfg = fwd_config(headdim)
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, seqlen_q), device=q.device, dtype=torch.float32)
    grid = (cdiv(seqlen_q, cfg.block_m), batch * heads)
    attn_fwd_kernel[grid](
        q, k, v, out, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        heads, heads // kv_heads, seqlen_q, seqlen_k, seqlen_k - seqlen_q,
        softmax_scale * math.log2(math.e),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=headdim,
        HEAD_DIM_PAD=next_power_of_2(headdim), CAUSAL=causal,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out, lse
