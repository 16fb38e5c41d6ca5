"""exp2 on the FMA pipe: a polynomial for some of the backward's exponentials.

The backward computes one exponential per (key, query) pair of every step, 16384 per CTA and
step at head dim 64 (128 x 128 tiles). The MUFU unit that runs ``ex2.approx`` takes 16 per SM
and clock, so they need ~1024 clocks a step, against ~512 for the dP^T GEMM that they overlap
with; computing a share of them with FMAs instead (FA4 does so in its Blackwell forward) frees
that unit at the price of ~10 more instructions per exponential. Measured (benchmarks/NOTES.md
item 99): slower at head dim 64, where the MUFU throughput turned out not to be the limit,
neutral at head dim 128 causal, 2% faster at 128 full from 8k keys, where it ships.

2^x = 2^floor(x) * 2^f with f = x - floor(x) in [0, 1): floor(x) comes from one addition of
1.5 * 2^23 rounded toward minus infinity (the integer lands in the low mantissa bits), 2^f
from a polynomial in Horner form, and 2^floor(x) is added into the exponent field with one
shift-add. x is first clamped to -127 (P = 0 there in practice; -inf, for rows past seqlen_q
whose lse2 is +inf, would otherwise give NaN). The clamp also turns a NaN x into a result of at
most 2^-126 where ex2.approx gives NaN; the row's other exponentials, on the MUFU unit, still
carry the NaN into dS. One inline-PTX block per element so that nothing reassociates the
rounding trick.

Coefficients: p(f) = 1 + c1 f + ... + cd f^d, minimax relative error on [0, 1) with p(0) = 1
exact (continuous across integers), fitted with Lawson's iteratively reweighted least squares
and rounded to fp32. Maximum relative error in fp32 arithmetic (``tests/backends/hopper/
test_exp2_poly.py`` recomputes it): degree 3 8.6e-5, degree 4 3.0e-6, degree 5 1.7e-7 (about
``ex2.approx.ftz.f32``'s own).
"""

from __future__ import annotations

import struct
from typing import Any

from cutlass import Float32
from cutlass.cutlass_dsl import T, dsl_user_op

from ._cute_utils import inline_ptx

# c1..cd for each degree d.
EXP2_POLY_COEFFS: dict[int, tuple[float, ...]] = {
    3: (0.6951168179512024, 0.22764484584331512, 0.07706718146800995),
    4: (0.6930448412895203, 0.2412802278995514, 0.05224243924021721, 0.013426707126200199),
    5: (
        0.6931512951850891,
        0.24016444385051727,
        0.05579991638660431,
        0.009017025120556355,
        0.0018671323778107762,
    ),
}
# Largest relative error of each degree in fp32 arithmetic over [0, 1) (rounded up).
EXP2_POLY_MAX_REL_ERROR = {3: 8.6e-5, 4: 3.0e-6, 5: 1.7e-7}

_CLAMP = -127.0
_ROUND_INT = 1.5 * 2.0**23  # x + this, rounded down, holds floor(x) in its low mantissa bits


def _ptx_f32(value: float) -> str:
    """A PTX fp32 immediate (0fXXXXXXXX) of ``value`` rounded to fp32."""
    return "0f" + struct.pack(">f", value).hex().upper()


def exp2_poly_ptx(degree: int) -> str:
    """The PTX block: $0 = 2^$1."""
    if degree not in EXP2_POLY_COEFFS:
        raise ValueError(f"degree must be one of {sorted(EXP2_POLY_COEFFS)}, got {degree}")
    coeffs = (1.0, *EXP2_POLY_COEFFS[degree])
    horner = [f"mov.f32 p, {_ptx_f32(coeffs[-1])};"]
    horner += [f"fma.rn.ftz.f32 p, p, f, {_ptx_f32(c)};" for c in reversed(coeffs[:-1])]
    lines = [
        "{",
        ".reg .f32 c, t, r, f, p;",
        ".reg .b32 ti, pi;",
        f"max.ftz.f32 c, $1, {_ptx_f32(_CLAMP)};",
        f"add.rm.ftz.f32 t, c, {_ptx_f32(_ROUND_INT)};",
        f"sub.rn.ftz.f32 r, t, {_ptx_f32(_ROUND_INT)};",
        "sub.rn.ftz.f32 f, c, r;",
        *horner,
        "mov.b32 ti, t;",
        "mov.b32 pi, p;",
        # floor(x) << 23 into the exponent field (the low 9 bits of 1.5 * 2^23's pattern are 0,
        # so the shift leaves only floor(x)); shl + add.s32 is one LEA on the ALU pipe.
        "shl.b32 ti, ti, 23;",
        "add.s32 ti, ti, pi;",
        "mov.b32 $0, ti;",
        "}",
    ]
    return "\n".join(lines)


@dsl_user_op
def exp2_poly(x: Float32, degree: int, *, loc: Any = None, ip: Any = None) -> Float32:
    """2^x on the FMA and ALU pipes (no MUFU), relative error EXP2_POLY_MAX_REL_ERROR[degree]
    for x >= -126; at most 2^-126 below, and for x = -inf or NaN."""
    body = exp2_poly_ptx(degree)
    return Float32(inline_ptx(T.f32(), [Float32(x)], body, "=f,f", loc=loc, ip=ip))
