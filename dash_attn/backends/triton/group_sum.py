"""The dK/dV of a grouped-query backward that ran one chain per q head (``BackwardPlan.gqa_split``):
each kv head's ``group`` partials added in q-head order.

The partials are 16-bit (each rounded as the kernel stores a chain's dK/dV), summed in fp32 from
q head ``g = 0`` to ``group - 1`` and rounded once to the output dtype, the structure of a
same-dtype PyTorch GQA backward (per-head gradients, then the sum over the group). The order is
fixed by the loop, whatever the tensor sizes, so the result is bitwise repeatable and depends on
nothing but the partials (the order-invariance contract holds).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 2048


@triton.jit
def _sum_rows(SRC, DST, offs, in_range, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr):
    # Output element (row, d) adds SRC[row, g, d] for g = 0 .. GROUP - 1, in that order.
    row = offs // HEAD_DIM
    src = SRC + row * (GROUP * HEAD_DIM) + (offs - row * HEAD_DIM)
    acc = tl.load(src, mask=in_range).to(tl.float32)
    for g in tl.static_range(1, GROUP):
        acc += tl.load(src + g * HEAD_DIM, mask=in_range).to(tl.float32)
    tl.store(DST + offs, acc.to(DST.dtype.element_ty), mask=in_range)


@triton.jit
def _sum_groups_kernel(
    DK_PART, DV_PART, DK, DV, n, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < n
    # Axis 1 picks the tensor: dK and dV in one launch.
    if tl.program_id(1) == 0:
        _sum_rows(DK_PART, DK, offs, in_range, GROUP, HEAD_DIM)
    else:
        _sum_rows(DV_PART, DV, offs, in_range, GROUP, HEAD_DIM)


def sum_kv_groups(
    dk_part: torch.Tensor, dv_part: torch.Tensor, kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """dk, dv ``(..., kv_heads, head_dim)`` from contiguous per-q-head partials
    ``(..., heads, head_dim)``: q head ``h`` belongs to kv head ``h // (heads // kv_heads)``."""
    for name, t in (("dk_part", dk_part), ("dv_part", dv_part)):
        if not t.is_contiguous() or t.dim() < 2:
            raise ValueError(f"{name} must be contiguous (..., heads, head_dim)")
    if dv_part.shape != dk_part.shape or dv_part.dtype != dk_part.dtype:
        raise ValueError(
            f"dv_part {tuple(dv_part.shape)} {dv_part.dtype} must match dk_part "
            f"{tuple(dk_part.shape)} {dk_part.dtype}"
        )
    *lead, heads, head_dim = dk_part.shape
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"kv_heads ({kv_heads}) must divide the partials' heads ({heads})")
    shape = (*lead, kv_heads, head_dim)
    dk = torch.empty(shape, device=dk_part.device, dtype=dk_part.dtype)
    dv = torch.empty(shape, device=dk_part.device, dtype=dk_part.dtype)
    n = dk.numel()
    if n:
        grid = (triton.cdiv(n, _BLOCK), 2)
        _sum_groups_kernel[grid](
            dk_part, dv_part, dk, dv, n, GROUP=heads // kv_heads, HEAD_DIM=head_dim,
            BLOCK=_BLOCK,
        )  # fmt: skip
    return dk, dv
