"""The last pass of every backward: the fp32 dQ accumulator times the softmax scale, cast to
q's dtype, in one read and one write (``(acc * scale).to(dtype)`` in torch is two passes over
the accumulator, ~2x the time of this kernel at training shapes).

The result is bit-identical to torch's: an fp32 product, then round-to-nearest-even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 4096


@triton.jit
def _scale_cast_kernel(ACC, OUT, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < n
    acc = tl.load(ACC + offs, mask=in_range)
    tl.store(OUT + offs, (acc * scale).to(OUT.dtype.element_ty), mask=in_range)


def scale_cast(acc: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``(acc * scale).to(dtype)`` for an fp32 ``acc``, fused when ``acc`` is contiguous."""
    if acc.dtype != torch.float32:
        raise ValueError(f"acc must be float32, got {acc.dtype}")
    if not acc.is_contiguous() or acc.numel() == 0:
        return (acc * scale).to(dtype)
    out = torch.empty(acc.shape, device=acc.device, dtype=dtype)
    n = acc.numel()
    _scale_cast_kernel[(triton.cdiv(n, _BLOCK),)](acc, out, n, scale, BLOCK=_BLOCK)
    return out
