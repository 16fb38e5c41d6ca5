"""Small CuTe-DSL helpers for the Hopper kernels (layout views, a WGMMA issue loop, a pair cvt).

Everything here runs at trace time inside ``cute.jit`` code; nothing touches a GPU at import.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warpgroup
from cutlass.cutlass_dsl import T, dsl_user_op

# Shared memory a CTA may have on sm_90 (227 KiB).
SMEM_LIMIT = 232_448


def transpose_view(t: cute.Tensor) -> cute.Tensor:
    """The same shared-memory tensor with its first two modes swapped (no data movement)."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


def select_modes(t: cute.Tensor, modes: list[int]) -> cute.Tensor:
    """A view of ``t`` with its modes reordered (e.g. (b, s, h, d) -> (s, d, h, b))."""
    return cute.make_tensor(t.iterator, cute.select(t.layout, modes))


def gmem_tensor(
    dtype: type[cutlass.Numeric], addr, shape: tuple, outer_strides: tuple, align: int
) -> cute.Tensor:
    """A global tensor from an address, a shape and the strides (elements) of all modes but
    the last, which is unit-stride.

    Promises the compiler ``align``-byte alignment of the base and of every outer stride (the
    launcher checks both: TMA descriptors need 16 bytes), so that vector accesses stay legal.
    """
    ptr = cute.make_ptr(dtype, addr, cute.AddressSpace.gmem, assumed_align=align)
    divby = align * 8 // dtype.width
    aligned = tuple(cute.assume(s, divby=divby) for s in outer_strides)
    return cute.make_tensor(ptr, cute.make_layout(shape, stride=(*aligned, 1)))


def acc_to_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """View a WGMMA accumulator fragment (fp32 or already converted to 16 bits) as the register
    A operand of the next WGMMA whose K mode is the accumulator's N mode.

    A Hopper accumulator fragment is ((2, 2, N/8), MMA_M, MMA_N); a 16-bit register A fragment
    wants ((2, 2, 2), MMA_M, K/16) per k-block, so every pair of 8-column groups becomes one
    k-block of 16. The element order in registers is unchanged: only the view differs.
    """
    layout = acc.layout
    split = cute.logical_divide(layout, ((None, None, 2), None, None))
    view = cute.make_layout(
        (
            (split.shape[0][0], split.shape[0][1], split.shape[0][2][0]),
            split.shape[1],
            (split.shape[0][2][1], split.shape[2]),
        ),
        stride=(
            (split.stride[0][0], split.stride[0][1], split.stride[0][2][0]),
            split.stride[1],
            (split.stride[0][2][1], split.stride[2]),
        ),
    )
    return cute.make_tensor(acc.iterator, view)


@cute.jit
def wgmma(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    frag_a: cute.Tensor,
    frag_b: cute.Tensor,
    zero_init: cutlass.Constexpr[bool],
    accumulate: Any = None,
) -> None:
    """Issue one warpgroup MMA (all k-blocks) as one commit group; the caller waits for it.

    A fresh MMA atom carries the ACCUMULATE flag so that the tiled MMA shared by several GEMMs
    is never mutated. ``accumulate`` (a runtime Boolean), where given, sets that flag for the
    first k-block instead of ``zero_init``.
    """
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init if accumulate is None else accumulate)
    for k in cutlass.range_constexpr(cute.size(frag_a.shape[2])):
        cute.gemm(atom, acc, frag_a[None, None, k], frag_b[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()


def inline_ptx(
    result: Any,
    operands: list,
    body: str,
    constraints: str,
    *,
    side_effects: bool = False,
    loc: Any = None,
    ip: Any = None,
) -> Any:
    """``body`` (PTX, AT&T operand syntax) on ``operands`` (DSL values) as one inline-asm op of
    the ``result`` type (None: no result); from within a ``dsl_user_op``, whose ``loc``/``ip``
    it passes on."""
    return llvm.inline_asm(
        result,
        [x.ir_value(loc=loc, ip=ip) for x in operands],
        body,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def pack_16bit_pair(
    lo: Float32, hi: Float32, bf16: bool, *, loc: Any = None, ip: Any = None
) -> Int32:
    """Two fp32 -> one register of two 16-bit values (``lo`` in the low half), one ``cvt``."""
    kind = "bf16x2" if bf16 else "f16x2"
    body = f"cvt.rn.{kind}.f32 $0, $1, $2;"
    return Int32(inline_ptx(T.i32(), [Float32(hi), Float32(lo)], body, "=r,f,f", loc=loc, ip=ip))


@cute.jit
def convert_16bit(src: cute.Tensor, dst: cute.Tensor) -> None:
    """fp32 fragment -> 16-bit fragment of the same shape, packed pairwise.

    `TensorSSA.to()` does not always pair the conversions (seen for 96-wide P tiles): the
    16-bit halves are then re-packed with movs between WGMMAs and ptxas serialises them (C7519).
    """
    bf16 = const_expr(dst.element_type == cutlass.BFloat16)
    dst32 = cute.recast_tensor(dst, Int32)
    for i in cutlass.range(cute.size(dst32), unroll_full=True):
        dst32[i] = pack_16bit_pair(src[2 * i], src[2 * i + 1], bf16)
