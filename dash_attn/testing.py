"""Helpers shared by the test suites (CPU, interpreter and GPU) and the benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = [
    "assert_close_to_ref",
    "bitwise_equal",
    "make_qkv",
    "max_abs_diff",
    "repeat_equal",
]


def make_qkv(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    heads: int,
    kv_heads: int,
    headdim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
    requires_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh standard-normal q, k, v in the flash-attn layout.

    Values are drawn on the CPU from a generator seeded with ``seed`` (in float64 for float64,
    else float32, then rounded to ``dtype``), so the same seed gives the same inputs on every
    device and no call disturbs the global RNG.

    Return:
        q: (batch, seqlen_q, heads, headdim); k, v: (batch, seqlen_k, kv_heads, headdim); leaf
        tensors on ``device`` with ``requires_grad`` as asked.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    draw_dtype = torch.float64 if dtype == torch.float64 else torch.float32

    def draw(*shape: int) -> torch.Tensor:
        x = torch.randn(shape, generator=gen, dtype=draw_dtype)
        return x.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    q = draw(batch, seqlen_q, heads, headdim)
    k = draw(batch, seqlen_k, kv_heads, headdim)
    v = draw(batch, seqlen_k, kv_heads, headdim)
    return q, k, v


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64; equal entries (infinities included) count as 0, NaN as inf."""
    a64, b64 = a.detach().double(), b.detach().double()
    diff = torch.where(a64 == b64, 0.0, (a64 - b64).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    return diff.max().item() if diff.numel() else 0.0


def assert_close_to_ref(
    name: str,
    got: torch.Tensor,
    ref_fp32: torch.Tensor,
    ref_same_dtype: torch.Tensor,
    *,
    factor: float = 2.0,
    atol: float,
) -> None:
    """The flash-attn error rule: a kernel may be off the fp32 reference by at most ``factor`` times
    what a PyTorch computation in the kernel's own dtype is off, plus ``atol``.

    ``max |got - ref_fp32| <= factor * max |ref_same_dtype - ref_fp32| + atol``

    Arguments:
        name: what is compared (``"dq"``, ``"lse"``, ...), for the message.
        got: the kernel's result.
        ref_fp32: the upcast reference (``attention_ref(..., upcast=True)``).
        ref_same_dtype: the reference computed in the input dtype (``upcast=False``).
    Raises:
        AssertionError: shapes differ or the rule fails; the message shows both errors.
    """
    if got.shape != ref_fp32.shape or ref_same_dtype.shape != ref_fp32.shape:
        raise AssertionError(
            f"{name}: shapes differ: got {tuple(got.shape)}, ref_fp32 {tuple(ref_fp32.shape)}, "
            f"ref_same_dtype {tuple(ref_same_dtype.shape)}"
        )
    err = max_abs_diff(got, ref_fp32)
    base = max_abs_diff(ref_same_dtype, ref_fp32)
    bound = factor * base + atol
    if not err <= bound:
        raise AssertionError(
            f"{name}: max |got - ref| = {err:.3e} exceeds {factor} * max |same_dtype - ref| "
            f"({base:.3e}) + atol ({atol:.1e}) = {bound:.3e}"
        )


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``torch.equal`` on the raw bits: NaN equals the same NaN, 0.0 differs from -0.0."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        bits = _SAME_SIZE_INT[a.element_size()]
        return torch.equal(a.view(bits), b.view(bits))
    return torch.equal(a, b)


def repeat_equal(
    fn: Callable[[], torch.Tensor | Sequence[torch.Tensor]], n: int
) -> tuple[bool, float]:
    """Run ``fn`` ``n`` times; report whether every run is bitwise equal to the first.

    Equality is ``torch.equal`` on the raw bits (``bitwise_equal``), so it is strict even where
    ``==`` is lenient (signed zeros) or useless (NaN).

    ``fn`` returns a tensor or a sequence of tensors (e.g. ``(dq, dk, dv)``).

    Return:
        (all_equal, max_diff): ``bitwise_equal`` held for every output of every run, and the
        largest |difference| seen against the first run (0.0 when all equal, inf when a shape
        changed).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")

    def as_tuple(result: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if isinstance(result, torch.Tensor):
            return (result.detach().clone(),)
        return tuple(t.detach().clone() for t in result)

    first = as_tuple(fn())
    all_equal, worst = True, 0.0
    for _ in range(n - 1):
        again = as_tuple(fn())
        if len(again) != len(first):
            raise ValueError(f"fn returned {len(again)} tensors, first run returned {len(first)}")
        for a, b in zip(first, again, strict=True):
            if not bitwise_equal(a, b):
                all_equal = False
                same_shape = a.shape == b.shape
                worst = max(worst, max_abs_diff(a, b) if same_shape else float("inf"))
    return all_equal, worst
