"""Attention forward: O and the log-sum-exp, one program per (Q tile, batch x head).

Glossary
--------
BLOCK_M      query rows per program (one Q tile)
BLOCK_N      key rows per inner-loop step
HEAD_DIM     the real head dimension; HEAD_DIM_PAD is the next power of two (tl.arange needs it)
causal_shift seqlen_k - seqlen_q of the sequence: the diagonal of query row r is key
             r + causal_shift (bottom-right alignment)
qk_scale     softmax_scale * log2(e): the softmax runs in base 2 (exp2 is one instruction)
IS_VARLEN    packed sequences: q is (total_q, H, D), k/v (total_k, Hkv, D) and sequence b owns
             rows cu_seqlens[b] .. cu_seqlens[b + 1]; lse is (H, total_q). Otherwise a padded
             batch (b, s, H, D) with lse (b, H, s). A constexpr: the dense path loads nothing more.
WINDOW       a sliding window: query row r sees key c iff
             r + causal_shift - window_left <= c <= r + causal_shift + window_right
             (an unbounded side is passed as utils.UNBOUNDED: the same two compares serve every
             window). A constexpr: the causal/full paths compile as without it. CAUSAL is the window
             (unbounded, 0) without the runtime window.
Grid         (cdiv(max seqlen_q, BLOCK_M), batch * heads); a varlen program whose tile starts past
             its sequence's end exits at once

The forward is deterministic by construction (no cross-program reduction); only the backward needs
schedules. Rows that see no key (causal with seqlen_q > seqlen_k, windows, empty sequences) get
O = 0 and LSE = -inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import _versions  # noqa: F401  (an unsupported Triton fails here, clearly)
from .utils import cdiv, kernel_window, next_power_of_2


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
    window_left,
    window_right,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
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
            if WINDOW:
                diag = offs_m[:, None] + causal_shift
                keep = keep & (cols[None, :] <= diag + window_right)
                keep = keep & (cols[None, :] >= diag - window_left)
            elif CAUSAL:
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
def cdiv_mul(x, BLOCK: tl.constexpr):
    """x rounded up to a multiple of BLOCK (x >= 0)."""
    return (x + BLOCK - 1) // BLOCK * BLOCK


@triton.jit
def attn_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    CU_SEQLENS_Q,
    CU_SEQLENS_K,
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
    stride_lb,
    stride_lh,
    heads,
    group_size,
    seqlen_q,
    seqlen_k,
    window_left,
    window_right,
    qk_scale,
    num_m_blocks,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    # One axis for (row block, batch x head), row blocks fastest (the order a 2-D grid of
    # (row blocks, batch x head) runs in): a grid's second axis stops at 65535, which batch x
    # heads passes with a few thousand packed sequences.
    pid = tl.program_id(0)
    start_m = pid % num_m_blocks
    bh = pid // num_m_blocks
    b = bh // heads
    h = bh % heads
    kvh = h // group_size
    if IS_VARLEN:
        # Row offsets in int64: total tokens x heads x head dim may exceed 2**31 elements.
        q_start = tl.load(CU_SEQLENS_Q + b).to(tl.int64)
        k_start = tl.load(CU_SEQLENS_K + b).to(tl.int64)
        seqlen_q = (tl.load(CU_SEQLENS_Q + b + 1) - q_start).to(tl.int32)
        seqlen_k = (tl.load(CU_SEQLENS_K + b + 1) - k_start).to(tl.int32)
        if start_m * BLOCK_M >= seqlen_q:
            return
        q_base = q_start * stride_qm
        k_base = k_start * stride_kn
        v_base = k_start * stride_vn
        o_base = q_start * stride_om
        lse_base = q_start
    else:
        # In int64: a batch's offset passes 2**31 elements from 2**31-element tensors.
        q_base = b.to(tl.int64) * stride_qb
        k_base = b.to(tl.int64) * stride_kb
        v_base = b.to(tl.int64) * stride_vb
        o_base = b.to(tl.int64) * stride_ob
        lse_base = b.to(tl.int64) * stride_lb
    causal_shift = seqlen_k - seqlen_q
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d[None, :] < HEAD_DIM
    row_mask = offs_m[:, None] < seqlen_q

    q_ptrs = Q + q_base + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_mask & d_mask, other=0.0)
    k_ptrs = K + k_base + kvh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + v_base + kvh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    first_diag = start_m * BLOCK_M + causal_shift  # the first row's diagonal key
    last_diag = first_diag + BLOCK_M - 1  # the last row's
    if WINDOW:
        # The band of the tile's rows: keys [first_diag - left, last_diag + right]. Three loops:
        # masked blocks up to where every row sees the whole block, unmasked ones, masked ones.
        lo = tl.maximum(first_diag - window_left, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum(seqlen_k, last_diag + window_right + 1)
        hi = tl.maximum(hi, lo)
        # Every row sees key c iff last_diag - left <= c <= first_diag + right (and c < seqlen_k).
        full_lo = tl.maximum(last_diag - window_left, lo)
        full_lo = tl.minimum(cdiv_mul(full_lo - lo, BLOCK_N) + lo, hi)
        # (Differences are kept >= 0 before dividing: compiled and interpreted integer division
        # round negative numbers differently.)
        full_hi = tl.maximum(tl.minimum(first_diag + window_right + 1, hi), full_lo)
        full_hi = tl.maximum((full_hi - lo) // BLOCK_N * BLOCK_N + lo, full_lo)
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_d,
            lo, full_lo, seqlen_k, causal_shift, window_left, window_right, qk_scale,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, CAUSAL, WINDOW,
        )  # fmt: skip
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_d,
            full_lo, full_hi, seqlen_k, causal_shift, window_left, window_right, qk_scale,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, CAUSAL, WINDOW,
        )  # fmt: skip
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_d,
            full_hi, hi, seqlen_k, causal_shift, window_left, window_right, qk_scale,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, CAUSAL, WINDOW,
        )  # fmt: skip
    else:
        # Keys this tile can see: all of them (full) or up to the last row's diagonal (causal).
        hi = seqlen_k
        if CAUSAL:
            hi = tl.minimum(seqlen_k, last_diag + 1)
            hi = tl.maximum(hi, 0)
        # Blocks before mask_lo need no mask: inside seqlen_k and left of every row's diagonal.
        mask_lo = (seqlen_k // BLOCK_N) * BLOCK_N
        if CAUSAL:
            mask_lo = tl.minimum(mask_lo, tl.maximum(first_diag, 0) // BLOCK_N * BLOCK_N)
        mask_lo = tl.minimum(mask_lo, hi)
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_d,
            0, mask_lo, seqlen_k, causal_shift, window_left, window_right, qk_scale,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, False, CAUSAL, WINDOW,
        )  # fmt: skip
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, offs_m, offs_d,
            mask_lo, hi, seqlen_k, causal_shift, window_left, window_right, qk_scale,
            BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, True, CAUSAL, WINDOW,
        )  # fmt: skip

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    # Natural-log LSE for the API; -inf marks rows that saw no key.
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    o_ptrs = O + o_base + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_mask & d_mask)
    tl.store(LSE + lse_base + h * stride_lh + offs_m, lse, mask=offs_m < seqlen_q)


def attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    window: tuple[int, int] = (-1, -1),
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel; returns out like q and the natural-log lse in fp32.

    Dense (``cu_seqlens_q is None``): q (b, sq, h, d), k/v (b, sk, hkv, d), lse (b, h, sq).
    Varlen: q (total_q, h, d), k/v (total_k, hkv, d), cu_seqlens_q/k int32 [b + 1] on q's device,
    ``max_seqlen_q`` at least the longest query sequence (it sizes the grid), lse (h, total_q).
    ``window`` is (left, right) in tokens, -1 unbounded; ``causal`` bounds the right side at 0.
    """
    varlen = cu_seqlens_q is not None
    if varlen:
        if cu_seqlens_k is None or max_seqlen_q is None:
            raise ValueError("cu_seqlens_k and max_seqlen_q are required with cu_seqlens_q")
        total_q, heads, headdim = q.shape
        kv_heads = k.shape[1]
        batch = cu_seqlens_q.shape[0] - 1
        seqlen_q = seqlen_k = 0  # read per sequence from cu_seqlens in the kernel
        q_rows = max_seqlen_q
        lse = torch.empty((heads, total_q), device=q.device, dtype=torch.float32)
        # (b, row, head) strides of the dense layout; the batch ones are unused.
        q_strides = (0, q.stride(0), q.stride(1))
        k_strides = (0, k.stride(0), k.stride(1))
        v_strides = (0, v.stride(0), v.stride(1))
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, heads, headdim = q.shape
        _, seqlen_k, kv_heads, _ = k.shape
        q_rows = seqlen_q
        lse = torch.empty((batch, heads, seqlen_q), device=q.device, dtype=torch.float32)
        q_strides = (q.stride(0), q.stride(1), q.stride(2))
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        v_strides = (v.stride(0), v.stride(1), v.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
    # Contiguous whatever q's strides (as every backend's outputs: the ops' fake shapes say so).
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    o_strides = (0, out.stride(0), out.stride(1)) if varlen else tuple(out.stride()[:3])
    kind, window_left, window_right = kernel_window(causal, window)
    cfg = fwd_config(headdim)
    num_m_blocks = cdiv(max(q_rows, 1), cfg.block_m)
    grid = (num_m_blocks * batch * heads,)
    # Dense calls pass q itself for the unused cu_seqlens pointers (never read: IS_VARLEN False).
    attn_fwd_kernel[grid](
        q, k, v, out, lse,
        cu_seqlens_q if varlen else q, cu_seqlens_k if varlen else q,
        *q_strides, *k_strides, *v_strides, *o_strides, *lse_strides,
        heads, heads // kv_heads, seqlen_q, seqlen_k, window_left, window_right,
        softmax_scale * math.log2(math.e), num_m_blocks,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=headdim,
        HEAD_DIM_PAD=next_power_of_2(headdim), CAUSAL=kind == "causal", WINDOW=kind == "local",
        IS_VARLEN=varlen,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out, lse
