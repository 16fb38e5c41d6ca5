"""Two neighbouring fp32 values to global memory in one instruction (inline PTX).

The chain epilogue of a grouped-query backward that adds dK/dV in the kernel
(``HopperAttnBwd(dkv_sum=True)``) stores, reduce-adds and re-packs the accumulator's column pairs:
an MMA accumulator holds two neighbouring columns per register pair, so one 8-byte access per pair
halves the instructions of element-wise ones. ``red.global.add.v2.f32`` (sm_90) adds both values
at L2, as every reduction does, so a later adder on another SM never reads a stale L1 line.
"""

from __future__ import annotations

from typing import Any

from cutlass import Float32, Int64
from cutlass.cutlass_dsl import T, dsl_user_op

from ._cute_utils import inline_ptx


@dsl_user_op
def store_f32x2(addr: Int64, lo: Float32, hi: Float32, *, loc: Any = None, ip: Any = None) -> None:
    """``addr[0], addr[1] = lo, hi`` (global, 8-byte aligned ``addr``)."""
    operands = [Int64(addr), Float32(lo), Float32(hi)]
    body = "st.global.v2.f32 [$0], {$1, $2};"
    inline_ptx(None, operands, body, "l,f,f", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def red_add_f32x2(
    addr: Int64, lo: Float32, hi: Float32, *, loc: Any = None, ip: Any = None
) -> None:
    """``addr[0] += lo; addr[1] += hi`` at L2, relaxed, GPU scope (8-byte aligned ``addr``)."""
    operands = [Int64(addr), Float32(lo), Float32(hi)]
    body = "red.relaxed.gpu.global.add.v2.f32 [$0], {$1, $2};"
    inline_ptx(None, operands, body, "l,f,f", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def load_f32_cg(addr: Int64, *, loc: Any = None, ip: Any = None) -> Float32:
    """``addr[0]`` read at L2 (``ld.global.cg``: never an L1 line)."""
    body = "ld.global.cg.f32 $0, [$1];"
    value = inline_ptx(T.f32(), [Int64(addr)], body, "=f,l", side_effects=True, loc=loc, ip=ip)
    return Float32(value)
