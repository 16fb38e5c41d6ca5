"""Torch tensors as the Hopper kernels take them: outer strides that TMA accepts, and the
symbolic stand-ins a TVM-FFI kernel is compiled from. Shared by the forward and backward
launchers."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

# The 16-bit dtypes the kernels take, torch's and cutlass's.
TORCH_TO_CUTLASS = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}


def outer_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """The (b, s, h) strides of ``t`` in elements; a size-1 dim gets a 16-byte stride instead
    of whatever torch reports (never used for addressing, but TMA and the compiler's alignment
    assumption need 16-byte multiples)."""
    aligned = 16 // t.element_size()
    dims = zip(t.shape[:3], t.stride()[:3], strict=True)
    b, s, h = (stride if n != 1 else aligned for n, stride in dims)
    return b, s, h


def tma_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a TVM-FFI launch hands it to a kernel: a size-1 (b, s, h) dim whose stride is
    not a positive 16-byte multiple (an expanded, zero-stride dim, or an odd one) gets the
    stride ``outer_strides`` gives it (a view, no copy), as the plain-number launch does: the
    compiled signature promises 16-byte multiples (TVM-FFI checks) and TMA needs them. Other
    tensors pass unchanged (the usual case; the test costs well under a microsecond)."""
    shape = t.shape
    if shape[0] != 1 and shape[1] != 1 and shape[2] != 1:  # the usual case, checked first
        return t
    size = t.element_size()
    dims = zip(shape[:3], t.stride()[:3], strict=True)
    if any(n == 1 and (stride <= 0 or stride * size % 16) for n, stride in dims):
        return t.as_strided(shape, (*outer_strides(t), 1))
    return t


def fake_tensor(dtype: type[cutlass.Numeric], rank: int, last: Any, align: int) -> Any:
    """A compile-time stand-in for a torch tensor of ``rank`` dims: every size but the last and
    every stride but the unit last one symbolic, so one kernel takes any shape and layout.

    The strides promise ``align``-byte multiples, as the base does (what the launchers check
    and TMA needs); TVM-FFI checks both on every call. Each dim gets its own symbol (equal
    sizes across tensors are checked by the launchers, not assumed by the code)."""
    divisibility = max(align * 8 // dtype.width, 1)
    shape = (*(cute.sym_int() for _ in range(rank - 1)), last)
    stride = (*(cute.sym_int64(divisibility=divisibility) for _ in range(rank - 1)), 1)
    return make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)
