"""The polynomial exp2 of the Hopper backward, checked by running its PTX text on the CPU.

A small interpreter executes the instructions ``exp2_poly_ptx`` emits (fp32 arithmetic with
their rounding modes, the integer shift-add) on NumPy arrays, so the test checks the code the
kernel inlines, not a second copy of the algorithm.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("cutlass")

from dash_attn.backends.hopper.exp2_poly import (  # noqa: E402
    EXP2_POLY_COEFFS,
    EXP2_POLY_MAX_REL_ERROR,
    exp2_poly_ptx,
)


def _imm(token: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(token[2:]), dtype=">f4").astype(np.float32)[0]


def _round_down_f32(exact: np.ndarray) -> np.ndarray:
    """float64 values -> the largest fp32 <= each (add.rm's rounding of an exact sum)."""
    nearest = exact.astype(np.float32)
    above = nearest.astype(np.float64) > exact
    return np.where(above, np.nextafter(nearest, np.float32(-np.inf)), nearest)


def run_ptx(ptx: str, x: np.ndarray) -> np.ndarray:
    """Execute the block on fp32 inputs ($1) and return $0 (fp32)."""
    regs: dict[str, np.ndarray] = {"$1": x.astype(np.float32)}

    def val(tok: str) -> np.ndarray:
        if tok.startswith("0f"):
            return _imm(tok)
        return np.uint32(int(tok)) if tok.isdigit() else regs[tok]

    def f32_bits(a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype=np.float32).view(np.uint32)

    for line in ptx.splitlines():
        line = line.strip()
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        m = re.fullmatch(r"([\w.]+) (.+);", line)
        assert m, line
        op, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        d, srcs = args[0], [val(a) for a in args[1:]]
        with np.errstate(invalid="ignore", over="ignore"):
            if op == "max.ftz.f32":
                out = np.fmax(srcs[0], srcs[1]).astype(np.float32)  # NaN-ignoring, as PTX
            elif op == "add.rm.ftz.f32":
                out = _round_down_f32(srcs[0].astype(np.float64) + np.float64(srcs[1]))
            elif op == "sub.rn.ftz.f32":
                out = (srcs[0].astype(np.float64) - np.float64(srcs[1])).astype(np.float32)
            elif op == "fma.rn.ftz.f32":
                a, b, c = (np.asarray(s, dtype=np.float64) for s in srcs)
                out = (a * b + c).astype(np.float32)  # the fp32 product is exact in fp64
            elif op in ("mov.f32", "mov.b32"):
                out = np.array(srcs[0], copy=True)
            elif op == "shl.b32":
                out = (f32_bits(srcs[0]) << srcs[1]).view(np.float32)
            elif op == "add.s32":
                out = (f32_bits(srcs[0]) + f32_bits(srcs[1])).view(np.float32)
            else:
                raise AssertionError(f"instruction not modelled: {op}")
        regs[d] = np.broadcast_to(out, regs["$1"].shape).astype(np.float32)
    return regs["$0"]


@pytest.mark.parametrize("degree", sorted(EXP2_POLY_COEFFS))
def test_relative_error_bound(degree: int) -> None:
    rng = np.random.default_rng(degree)
    x = np.concatenate([
        rng.uniform(-126.0, 0.0, 400_000),
        rng.uniform(-1.0, 1.0, 100_000),
        np.linspace(-20.0, 8.0, 100_001),
    ]).astype(np.float32)  # fmt: skip
    got = run_ptx(exp2_poly_ptx(degree), x).astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    rel = np.abs(got / want - 1.0)
    assert rel.max() <= EXP2_POLY_MAX_REL_ERROR[degree]
    # The bound is tight (a looser constant would hide a worse fit).
    assert rel.max() > EXP2_POLY_MAX_REL_ERROR[degree] / 3


@pytest.mark.parametrize("degree", sorted(EXP2_POLY_COEFFS))
def test_exact_points_and_underflow(degree: int) -> None:
    ptx = exp2_poly_ptx(degree)
    ints = np.arange(-126, 20, dtype=np.float32)
    np.testing.assert_array_equal(run_ptx(ptx, ints), np.exp2(ints))  # p(0) = 1 exactly
    low = np.array([-np.inf, -1e30, -200.0, -127.5, -127.0, np.nan], dtype=np.float32)
    out = run_ptx(ptx, low)
    assert np.all(np.isfinite(out)) and np.all(out >= 0) and np.all(out <= 2.0**-126)


def test_degree_is_checked() -> None:
    with pytest.raises(ValueError, match="degree"):
        exp2_poly_ptx(2)
