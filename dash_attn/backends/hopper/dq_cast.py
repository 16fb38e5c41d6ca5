"""The last pass of a hopper backward whose dQ accumulator is in fragment order
(:mod:`.dq_fragment`): read each tile, scale, cast to q's dtype and write dq ``(b, s, h, d)``
row-major, dropping the padded rows of the last Q tile. One program per (Q tile, batch x head).

The arithmetic is the same as the row-major cast (``backends.triton.dq_cast``): an fp32
product, then round-to-nearest-even; only the addresses differ (``dq_fragment.tile_offset``,
evaluated element-wise here).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import BWD_HEADDIMS
from .dq_fragment import WG_THREADS, wg_split


@triton.jit
def _fragment_cast_kernel(
    ACC,
    OUT,
    seqlen_q,
    heads,
    q_tiles,
    stride_ob,
    stride_os,
    stride_oh,
    scale,
    BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    COLS: tl.constexpr,
    SPLIT: tl.constexpr,
    WG_THREADS: tl.constexpr,
):
    tile = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    # ROWS, COLS: BLOCK_M and HEAD_DIM rounded up to powers of two (Triton's ranges), the extra
    # rows and columns masked.
    row = tl.arange(0, ROWS)[:, None]
    col = tl.arange(0, COLS)[None, :]
    # dq_fragment.tile_offset, element-wise.
    if SPLIT == "cols":
        wg = col // (HEAD_DIM // 2)
        rr = row
        cc = col % (HEAD_DIM // 2)
    elif SPLIT == "swap":
        wg = col // 64
        rr = col % 64
        cc = row
    else:
        wg = row // 64
        rr = row % 64
        cc = col
    thread = 32 * (rr // 16) + 4 * (rr % 8) + (cc % 8) // 2  # within its warpgroup
    index = cc % 2 + 2 * ((rr % 16) // 8) + 4 * (cc // 8)
    half = BLOCK_M * HEAD_DIM // 2
    offset = wg * half + (index // 4) * (WG_THREADS * 4) + thread * 4 + index % 4
    base = (bh.to(tl.int64) * q_tiles + tile) * (BLOCK_M * HEAD_DIM)
    in_tile = (row < BLOCK_M) & (col < HEAD_DIM)
    acc = tl.load(ACC + base + offset, mask=in_tile)
    seq = tile * BLOCK_M + row
    dst = OUT + b.to(tl.int64) * stride_ob + seq.to(tl.int64) * stride_os + h * stride_oh + col
    tl.store(dst, (acc * scale).to(OUT.dtype.element_ty), mask=in_tile & (seq < seqlen_q))


def scale_cast_fragments(
    acc: torch.Tensor, scale: float, dtype: torch.dtype, seqlen_q: int, block_m: int
) -> torch.Tensor:
    """dq ``(batch, seqlen_q, heads, head_dim)`` in ``dtype`` = ``acc * scale`` decoded from the
    fragment-order accumulator ``acc`` fp32 ``(batch, heads, q_tiles, block_m * head_dim)``."""
    if acc.dtype != torch.float32 or acc.dim() != 4 or not acc.is_contiguous():
        raise ValueError(
            f"acc must be a contiguous fp32 (batch, heads, q_tiles, block_m * head_dim) tensor, "
            f"got {acc.dtype} {tuple(acc.shape)}"
        )
    batch, heads, q_tiles, tile = acc.shape
    split = wg_split(block_m)
    head_dim = tile // block_m
    if head_dim * block_m != tile or head_dim not in BWD_HEADDIMS:
        raise ValueError(
            f"acc's last dim {tile} is not block_m ({block_m}) x a head dim of {BWD_HEADDIMS}"
        )
    if q_tiles != -(-seqlen_q // block_m):
        raise ValueError(f"q_tiles={q_tiles} does not tile seqlen_q={seqlen_q} by {block_m}")
    out = torch.empty((batch, seqlen_q, heads, head_dim), device=acc.device, dtype=dtype)
    if out.numel() == 0:
        return out
    _fragment_cast_kernel[(q_tiles, batch * heads)](
        acc, out, seqlen_q, heads, q_tiles, out.stride(0), out.stride(1), out.stride(2), scale,
        BLOCK_M=block_m, ROWS=triton.next_power_of_2(block_m), HEAD_DIM=head_dim,
        COLS=triton.next_power_of_2(head_dim), SPLIT=split,
        WG_THREADS=WG_THREADS,
        num_warps=8,
    )  # fmt: skip
    return out
