"""GPU tests of packed sequences (varlen) and sliding windows on the Triton backend: numerics by the
flash-attn 2x rule against the fp32 reference, bitwise repeats per schedule (also with another
stream busy), the TMA dQ reduction against atomics, and order invariance: one sequence alone,
packed among others at other positions and in other orders, and in a padded batch, with
sm_margin 0 / 8 / 20, all bitwise equal. Skipped without CUDA.

Two sources of backward tables:

* ``dash_attn.testing.band_plan``: tables built from the row rule alone (the contract's table
  format, independent of the schedule engine); these tests only need the kernels.
* the public API (``dash_attn_varlen_func``, ``dash_attn_func(window_size=...)``) with every
  schedule the engine offers for the mask; skipped until the API is wired.

Run on a CUDA machine: ``python -m pytest tests/backends/test_gpu_varlen.py``.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    import dash_attn
    from dash_attn.backends.triton.launch import run_backward, run_forward
    from dash_attn.device import device_info
    from dash_attn.reference.attention import attention_ref
    from dash_attn.testing import BandMask, assert_close_to_ref, band_plan, bitwise_equal

    HAS_API = hasattr(dash_attn, "dash_attn_varlen_func")
else:
    HAS_API = False

needs_api = pytest.mark.skipif(not HAS_API, reason="dash_attn_varlen_func is not wired yet")

NAMES = ("out", "lse", "dq", "dk", "dv")
ATOL = 1e-3
# (causal, (window_left, window_right)) in flash-attn's terms.
MASKS = {
    "full": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "causal-local(255,0)": (True, (255, -1)),
    "local(100,37)": (False, (100, 37)),
    "local(-1,64)": (False, (-1, 64)),
}
# Odd lengths: one token, an empty query side, an empty key side, sq > sk (rows that see no key
# under causal masks), sk > sq, and one long sequence.
PACK = [(333, 517), (1, 1), (0, 40), (700, 300), (1000, 1000), (5, 0), (129, 130)]


# --- inputs and runs ----------------------------------------------------------------------------


def _sequence(
    seqlen_q: int, seqlen_k: int, heads: int, kv_heads: int, headdim: int, dtype, seed: int
) -> tuple[torch.Tensor, ...]:
    """q, k, v, dout of one sequence on the GPU, drawn on the CPU: the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)

    def draw(rows: int, h: int) -> torch.Tensor:
        return torch.randn(rows, h, headdim, generator=gen).to(device="cuda", dtype=dtype)

    return (
        draw(seqlen_q, heads),
        draw(seqlen_k, kv_heads),
        draw(seqlen_k, kv_heads),
        draw(seqlen_q, heads),
    )


def _pack(
    seqlens: list[tuple[int, int]], seeds: list[int], heads: int, kv_heads: int, headdim: int,
    dtype,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """q, k, v, dout, cu_seqlens_q, cu_seqlens_k of a pack (sequence i drawn from seeds[i])."""
    parts = [
        _sequence(sq, sk, heads, kv_heads, headdim, dtype, seed)
        for (sq, sk), seed in zip(seqlens, seeds, strict=True)
    ]
    q, k, v, dout = (torch.cat(xs) for xs in zip(*parts, strict=True))

    def cu(lengths) -> torch.Tensor:
        return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")

    return q, k, v, dout, cu(sq for sq, _ in seqlens), cu(sk for _, sk in seqlens)


def _run_kernels(
    inputs: tuple[torch.Tensor, ...], seqlens: list[tuple[int, int]], mask: str, **plan: Any
) -> dict[str, torch.Tensor]:
    """Forward and backward of a pack on the Triton kernels with ``band_plan`` tables."""
    q, k, v, dout, cu_q, cu_k = inputs
    causal, window = MASKS[mask]
    heads, headdim = q.shape[1], q.shape[2]
    scale = headdim**-0.5
    out, lse = run_forward(
        q, k, v, causal=causal, softmax_scale=scale, window=window,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=max(sq for sq, _ in seqlens), max_seqlen_k=max(sk for _, sk in seqlens),
    )  # fmt: skip
    tables = band_plan(
        seqlens, heads, k.shape[1], headdim, BandMask(causal, window),
        device=device_info(q.device), **plan,
    )  # fmt: skip
    dq, dk, dv = run_backward(
        tables, dout, q, k, v, out, lse, scale,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, sync_check=True,
    )  # fmt: skip
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def _references(inputs: tuple[torch.Tensor, ...], mask: str) -> tuple[dict, dict]:
    """(fp32, same-dtype) references of a pack, gradients by autograd."""
    q, k, v, dout, cu_q, cu_k = inputs
    causal, window = MASKS[mask]
    refs = []
    for upcast in (True, False):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out, lse = attention_ref(
            *leaves, causal=causal, window_size=window, upcast=upcast,
            cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        )  # fmt: skip
        out.backward(dout)
        grads = dict(zip(("dq", "dk", "dv"), (x.grad for x in leaves), strict=True))
        refs.append({"out": out.detach(), "lse": lse.detach(), **grads})
    return refs[0], refs[1]


def _seq(got: dict[str, torch.Tensor], inputs: tuple[torch.Tensor, ...], b: int) -> dict:
    """Sequence b's rows of every output of a pack."""
    cu_q, cu_k = inputs[4].tolist(), inputs[5].tolist()
    q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
    return {
        "out": got["out"][q0:q1],
        "lse": got["lse"][:, q0:q1],
        "dq": got["dq"][q0:q1],
        "dk": got["dk"][k0:k1],
        "dv": got["dv"][k0:k1],
    }


def _assert_bitwise(a: dict, b: dict, label: str) -> None:
    for name in NAMES:
        assert bitwise_equal(a[name], b[name]), f"{name} [{label}]: bits differ"


def _band_variants() -> list[dict[str, Any]]:
    variants: list[dict[str, Any]] = [{}, {"descending": True}, {"static_workers": 16}]
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0):
        variants.append({"dq_reduce": "tma"})
    return variants


# --- kernels with tables from the row rule ------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("headdim", [64, 128])
def test_varlen_matches_fp32_reference(headdim: int, mask: str, dtype) -> None:
    inputs = _pack(PACK, list(range(len(PACK))), 6, 2, headdim, dtype)
    ref, same = _references(inputs, mask)
    for variant in _band_variants():
        got = _run_kernels(inputs, PACK, mask, **variant)
        for name in NAMES:
            label = f"{name} [{mask}, d{headdim}, {variant}]"
            assert_close_to_ref(label, got[name], ref[name], same[name], atol=ATOL)


@pytest.mark.parametrize("headdim", [96, 192, 256])
def test_other_head_dims_match_fp32_reference(headdim: int) -> None:
    seqlens = [(257, 300), (3, 90), (190, 64)]
    for mask in ("causal", "local(100,37)"):
        inputs = _pack(seqlens, [1, 2, 3], 4, 1, headdim, torch.bfloat16)
        ref, same = _references(inputs, mask)
        got = _run_kernels(inputs, seqlens, mask)
        for name in NAMES:
            label = f"{name} [{mask}, d{headdim}]"
            assert_close_to_ref(label, got[name], ref[name], same[name], atol=ATOL)


def test_tma_dq_reduction_matches_atomics_bit_for_bit() -> None:
    """Varlen keeps the TMA dQ reduction: the accumulator pads each sequence to whole Q tiles, so
    a tile's rows never reach the next sequence (lengths here are not tile multiples, and a
    one-token sequence sits between long ones). Same adds in the same order as the atomics."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs Hopper")
    for headdim, mask in itertools.product((64, 128), ("causal", "local(100,37)")):
        inputs = _pack(PACK, [9] * len(PACK), 4, 2, headdim, torch.bfloat16)
        atomic = _run_kernels(inputs, PACK, mask, dq_reduce="atomic")
        tma = _run_kernels(inputs, PACK, mask, dq_reduce="tma")
        _assert_bitwise(atomic, tma, f"tma vs atomic, d{headdim}, {mask}")


def _busy_stream_matmuls(stream: torch.cuda.Stream, count: int = 20) -> None:
    """Queue big matmuls on ``stream``: they compete for SMs with the backward."""
    with torch.cuda.stream(stream):
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(count):
            a = (a @ a).clamp_(-1, 1)


@pytest.mark.parametrize("busy", [False, True], ids=["alone", "busy-stream"])
@pytest.mark.parametrize("mask", ["causal", "causal-local(255,0)", "local(100,37)"])
def test_band_tables_repeat_bitwise(mask: str, busy: bool) -> None:
    seqlens = [(1500, 1500), (17, 900), (2100, 2000), (640, 641)]
    inputs = _pack(seqlens, [1, 2, 3, 4], 8, 2, 128, torch.bfloat16)
    other = torch.cuda.Stream()
    for variant in _band_variants():
        first = _run_kernels(inputs, seqlens, mask, **variant)
        for _ in range(5):
            if busy:
                _busy_stream_matmuls(other)
            _assert_bitwise(first, _run_kernels(inputs, seqlens, mask, **variant), str(variant))
    torch.cuda.synchronize()


@pytest.mark.parametrize("mask", list(MASKS))
def test_band_tables_sequence_alone_packed_and_padded_bitwise(mask: str) -> None:
    x, heads, kv_heads, headdim = (777, 901), 4, 2, 128
    causal, window = MASKS[mask]
    for variant in _band_variants():
        alone_in = _pack([x], [5], heads, kv_heads, headdim, torch.bfloat16)
        alone = _run_kernels(alone_in, [x], mask, **variant)
        for label, seqlens, seeds, at in (
            ("first", [x, (300, 20), (1, 1)], [5, 1, 2], 0),
            ("middle", [(1, 1), (64, 300), x, (1000, 900)], [2, 3, 5, 4], 2),
        ):
            inputs = _pack(seqlens, seeds, heads, kv_heads, headdim, torch.bfloat16)
            got = _run_kernels(inputs, seqlens, mask, **variant)
            _assert_bitwise(_seq(got, inputs, at), _seq(alone, alone_in, 0), f"{label} {variant}")
        # A padded batch of two sequences of X's lengths, X second.
        parts = [_sequence(*x, heads, kv_heads, headdim, torch.bfloat16, s) for s in (6, 5)]
        q, k, v, dout = (torch.stack(xs) for xs in zip(*parts, strict=True))
        scale = headdim**-0.5
        out, lse = run_forward(q, k, v, causal=causal, softmax_scale=scale, window=window)
        tables = band_plan(
            [x, x], heads, kv_heads, headdim, BandMask(causal, window),
            device=device_info(q.device), **variant,
        )  # fmt: skip
        dq, dk, dv = run_backward(tables, dout, q, k, v, out, lse, scale, sync_check=True)
        padded = {"out": out[1], "lse": lse[1], "dq": dq[1], "dk": dk[1], "dv": dv[1]}
        _assert_bitwise(padded, _seq(alone, alone_in, 0), f"padded batch {variant}")


# --- the public API (every schedule of the engine) ----------------------------------------------


def _schedules(mask: str) -> list[str]:
    from dash_attn.schedule import Mask, applicable_schedules

    causal, (left, right) = MASKS[mask]
    return [*applicable_schedules(Mask(causal, left, right)), "auto"]


def _api_varlen(
    inputs: tuple[torch.Tensor, ...], seqlens: list[tuple[int, int]], mask: str, **options: Any
) -> dict[str, torch.Tensor]:
    q, k, v, dout, cu_q, cu_k = inputs
    causal, window = MASKS[mask]
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, lse = dash_attn.dash_attn_varlen_func(
        *leaves, cu_q, cu_k, max(sq for sq, _ in seqlens), max(sk for _, sk in seqlens),
        causal=causal, window_size=window, return_lse=True, backend="triton", **options,
    )  # fmt: skip
    out.backward(dout)
    grads = dict(zip(("dq", "dk", "dv"), (x.grad for x in leaves), strict=True))
    return {"out": out.detach(), "lse": lse.detach(), **grads}


def _api_padded(
    parts: list[tuple[torch.Tensor, ...]], mask: str, **options: Any
) -> dict[str, torch.Tensor]:
    q, k, v, dout = (torch.stack(xs) for xs in zip(*parts, strict=True))
    causal, window = MASKS[mask]
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, lse = dash_attn.dash_attn_func(
        *leaves, causal=causal, window_size=window, return_lse=True, backend="triton", **options
    )
    out.backward(dout)
    return {"out": out.detach(), "lse": lse.detach(), "dq": leaves[0].grad,
            "dk": leaves[1].grad, "dv": leaves[2].grad}  # fmt: skip


@needs_api
@pytest.mark.parametrize("mask", list(MASKS))
def test_api_matches_fp32_reference_every_schedule(mask: str) -> None:
    inputs = _pack(PACK, list(range(len(PACK))), 6, 2, 128, torch.bfloat16)
    ref, same = _references(inputs, mask)
    for schedule in _schedules(mask):
        for deterministic in (True, False):
            got = _api_varlen(inputs, PACK, mask, schedule=schedule, deterministic=deterministic)
            for name in NAMES:
                label = f"{name} [{mask}, {schedule}, det={deterministic}]"
                assert_close_to_ref(label, got[name], ref[name], same[name], atol=ATOL)


@needs_api
@pytest.mark.parametrize("busy", [False, True], ids=["alone", "busy-stream"])
@pytest.mark.parametrize("mask", ["causal", "causal-local(255,0)", "local(100,37)"])
def test_api_repeats_bitwise_every_schedule(mask: str, busy: bool) -> None:
    seqlens = [(1500, 1500), (17, 900), (2100, 2000), (640, 641)]
    inputs = _pack(seqlens, [1, 2, 3, 4], 8, 2, 128, torch.bfloat16)
    other = torch.cuda.Stream()
    for schedule in _schedules(mask):
        first = _api_varlen(inputs, seqlens, mask, schedule=schedule)
        for _ in range(9):
            if busy:
                _busy_stream_matmuls(other)
            _assert_bitwise(first, _api_varlen(inputs, seqlens, mask, schedule=schedule), schedule)
    torch.cuda.synchronize()


@needs_api
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
def test_api_sequence_bits_invariant(mask: str, headdim: int) -> None:
    """The contract: a sequence's out, lse and gradients do not depend on the pack around it,
    its position, a padded batch, or the SMs given to the backward (sm_margin)."""
    x, heads, kv_heads = (1111, 1300), 4, 2
    packs = [
        ("alone", [x], [5], 0),
        ("first", [x, (300, 20), (1, 1)], [5, 1, 2], 0),
        ("middle", [(1, 1), (64, 300), x, (1000, 900)], [2, 3, 5, 4], 2),
        ("last, 2000 tokens before", [(1000, 900), (1000, 1000), x], [4, 3, 5], 2),
    ]
    parts = [_sequence(*x, heads, kv_heads, headdim, torch.bfloat16, s) for s in (6, 5)]
    for schedule in _schedules(mask):
        expected = None
        for (label, seqlens, seeds, at), margin in itertools.product(packs, (0, 8, 20)):
            inputs = _pack(seqlens, seeds, heads, kv_heads, headdim, torch.bfloat16)
            got = _api_varlen(inputs, seqlens, mask, schedule=schedule, sm_margin=margin)
            got = _seq(got, inputs, at)
            if expected is None:
                expected = got
            _assert_bitwise(got, expected, f"{schedule}: {label}, sm_margin {margin}")
        padded = _api_padded(parts, mask, schedule=schedule)
        _assert_bitwise({name: t[1] for name, t in padded.items()}, expected, "padded batch")
