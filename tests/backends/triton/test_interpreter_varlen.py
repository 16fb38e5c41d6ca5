"""Packed sequences (varlen) and sliding windows on the Triton kernels, in Triton's interpreter:
numerics against the fp32 reference, bitwise repeats, order invariance (a sequence alone, packed
among others at any position, or in a padded batch gives the same bits), zero-step chains and
rows that see no key.

The backward runs tables built from the row rule alone, independently of the schedule engine
(``dash_attn.testing.band_plan``): which (Q tile, KV tile) pairs meet, and ranks counted over the KV
tiles that actually contribute. So these tests pin the kernel to the contract (section 3 of the
varlen/window contract) rather than to one generator's output.

Run with ``TRITON_INTERPRET=1 python -m pytest -m interpreter`` (fp16 only: the interpreter's
bf16 matmuls are wrong; tiny shapes, lengths deliberately not tile multiples).
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "interpreter tests need TRITON_INTERPRET=1 set before dash_attn's kernels are imported "
        "(run: TRITON_INTERPRET=1 python -m pytest -m interpreter)",
        allow_module_level=True,
    )

import itertools
from typing import Any

import torch

import dash_attn
from dash_attn.backends.triton.launch import run_backward, run_forward
from dash_attn.backends.triton.tiles import backward_tiles
from dash_attn.plan import (
    INTERPRETER,
    BackwardPlan,
    Problem,
    first_blocked_program,
    make_backward_plan,
    resolve_gqa_split,
)
from dash_attn.reference.attention import attention_ref
from dash_attn.schedule import Dispatch, Mask, ScheduleSpec, applicable_schedules, make_schedule
from dash_attn.testing import BandMask, assert_close_to_ref, band_plan, bitwise_equal

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

DTYPE = torch.float16
ATOL = 1e-3
NAMES = ("out", "lse", "dq", "dk", "dv")


def _band_schedule(
    seqlens: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    headdim: int,
    mask: BandMask,
    **options: Any,
) -> Any:
    """The interpreter's plan for tables from the row rule (see ``band_plan``)."""
    return band_plan(seqlens, heads, kv_heads, headdim, mask, device=INTERPRETER, **options)


# --- inputs and runs ----------------------------------------------------------------------------


def _sequence(seqlen_q: int, seqlen_k: int, heads: int, kv_heads: int, headdim: int, seed: int):
    """q, k, v, dout of one sequence (seqlen, heads, headdim), the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)

    def draw(rows: int, h: int) -> torch.Tensor:
        return torch.randn(rows, h, headdim, generator=gen).to(DTYPE)

    return (
        draw(seqlen_q, heads),
        draw(seqlen_k, kv_heads),
        draw(seqlen_k, kv_heads),
        draw(seqlen_q, heads),
    )


def _pack(parts: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """Concatenate sequences into q, k, v, dout, cu_seqlens_q, cu_seqlens_k."""
    q, k, v, dout = (torch.cat(xs) for xs in zip(*parts, strict=True))
    cu_q = torch.tensor([0, *itertools.accumulate(p[0].shape[0] for p in parts)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(p[1].shape[0] for p in parts)], dtype=torch.int32)
    return q, k, v, dout, cu_q, cu_k


def _run_varlen(
    seqlens: list[tuple[int, int]],
    seeds: list[int],
    heads: int,
    kv_heads: int,
    headdim: int,
    mask: BandMask,
    **schedule: Any,
) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
    """Forward and backward of a pack on the kernels (tables from the row rule); also returns
    the packed inputs."""
    plan = _band_schedule(seqlens, heads, kv_heads, headdim, mask, **schedule)
    return _run_with_plan(plan, seqlens, seeds, heads, kv_heads, headdim, mask)


def _run_with_plan(
    plan: Any,
    seqlens: list[tuple[int, int]],
    seeds: list[int],
    heads: int,
    kv_heads: int,
    headdim: int,
    mask: BandMask,
) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
    """Forward and backward of a pack by ``plan``; also returns the packed inputs."""
    parts = [
        _sequence(sq, sk, heads, kv_heads, headdim, s)
        for (sq, sk), s in zip(seqlens, seeds, strict=True)
    ]
    q, k, v, dout, cu_q, cu_k = _pack(parts)
    scale = headdim**-0.5
    out, lse = run_forward(
        q, k, v, causal=mask.causal, softmax_scale=scale, window=mask.window,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=max(sq for sq, _ in seqlens), max_seqlen_k=max(sk for _, sk in seqlens),
    )  # fmt: skip
    dq, dk, dv = run_backward(
        plan, dout, q, k, v, out, lse, scale,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, sync_check=True,
    )  # fmt: skip
    got = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    return got, (q, k, v, dout, cu_q, cu_k)


def _reference(inputs: tuple[torch.Tensor, ...], mask: BandMask) -> tuple[dict, dict]:
    """(fp32, same-dtype) references of a pack, gradients by autograd."""
    q, k, v, dout, cu_q, cu_k = inputs
    refs = []
    for upcast in (True, False):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = attention_ref(
            *leaves, causal=mask.causal, window_size=mask.window, upcast=upcast,
            cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        )  # fmt: skip
        out.backward(dout)
        grads = [x.grad for x in leaves]
        refs.append(
            {
                "out": out.detach(),
                "lse": lse.detach(),
                **dict(zip(("dq", "dk", "dv"), grads, strict=True)),
            }
        )
    return refs[0], refs[1]


def _seq_slice(got: dict[str, torch.Tensor], cu_q, cu_k, b: int) -> dict[str, torch.Tensor]:
    """Sequence b's rows of every output of a pack."""
    q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
    return {
        "out": got["out"][q0:q1],
        "lse": got["lse"][:, q0:q1],
        "dq": got["dq"][q0:q1],
        "dk": got["dk"][k0:k1],
        "dv": got["dv"][k0:k1],
    }


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], label: str) -> None:
    for name in NAMES:
        assert bitwise_equal(a[name], b[name]), f"{name} [{label}]: bits differ"


MASKS = {
    "full": BandMask(False, (-1, -1)),
    "causal": BandMask(True, (-1, -1)),
    "local(40,0)": BandMask(False, (40, 0)),
    "causal+local(70,-1)": BandMask(True, (70, -1)),
    "local(20,9)": BandMask(False, (20, 9)),
    "local(-1,15)": BandMask(False, (-1, 15)),
}

# Odd lengths, an empty query sequence, an empty key sequence, sq > sk (rows that see no key
# under causal masks) and sk > sq.
PACK = [(37, 50), (0, 10), (150, 150), (5, 0), (70, 200), (200, 70)]


@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
def test_varlen_matches_reference(mask: str) -> None:
    got, inputs = _run_varlen(PACK, list(range(len(PACK))), 4, 2, 64, MASKS[mask])
    ref, same = _reference(inputs, MASKS[mask])
    for name in NAMES:
        assert got[name].shape == ref[name].shape, name
        assert_close_to_ref(f"{name} [{mask}]", got[name], ref[name], same[name], atol=ATOL)


def _run_dense(
    seqlen_q: int,
    seqlen_k: int,
    seeds: list[int],
    heads: int,
    kv_heads: int,
    headdim: int,
    mask: BandMask,
    **schedule: Any,
) -> dict[str, torch.Tensor]:
    """A padded batch (batch, seqlen, heads, headdim) of same-length sequences, one per seed."""
    parts = [_sequence(seqlen_q, seqlen_k, heads, kv_heads, headdim, s) for s in seeds]
    q, k, v, dout = (torch.stack(xs) for xs in zip(*parts, strict=True))
    scale = headdim**-0.5
    out, lse = run_forward(q, k, v, causal=mask.causal, softmax_scale=scale, window=mask.window)
    plan = _band_schedule(
        [(seqlen_q, seqlen_k)] * len(seeds), heads, kv_heads, headdim, mask, **schedule
    )
    dq, dk, dv = run_backward(plan, dout, q, k, v, out, lse, scale, sync_check=True)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


INVARIANCE_MASK = BandMask(True, (90, -1))


@pytest.mark.parametrize(
    "schedule",
    [{}, {"descending": True}, {"static_workers": 3}],
    ids=["ascending-dynamic", "descending-dynamic", "ascending-static3"],
)
def test_sequence_bits_do_not_depend_on_the_pack(schedule: dict) -> None:
    # Sequence X (seed 7) alone, packed at different positions among others (other lengths, other
    # orders), and in a padded batch: its out, lse and gradients are bitwise the same, because
    # every tile, every summation order and every rank depends on X's own lengths only.
    x = (150, 210)
    heads, kv_heads, headdim, mask = 4, 2, 64, INVARIANCE_MASK
    alone, _ = _run_varlen([x], [7], heads, kv_heads, headdim, mask, **schedule)
    for label, seqlens, seeds, at in (
        ("middle", [(37, 50), x, (200, 70)], [1, 7, 2], 1),
        ("last, reordered", [(200, 70), (0, 10), (64, 300), x], [2, 3, 4, 7], 3),
    ):
        got, inputs = _run_varlen(seqlens, seeds, heads, kv_heads, headdim, mask, **schedule)
        _assert_bitwise(
            _seq_slice(got, inputs[4], inputs[5], at), _seq_slice(alone, *_cu(x), 0), label
        )
    batch = _run_dense(*x, [8, 7], heads, kv_heads, headdim, mask, **schedule)
    padded = {name: batch[name][1] for name in NAMES}
    _assert_bitwise(padded, _seq_slice(alone, *_cu(x), 0), "padded batch")


def _cu(seqlens: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.tensor([0, seqlens[0]], dtype=torch.int32),
        torch.tensor([0, seqlens[1]], dtype=torch.int32),
    )


def test_repeats_are_bitwise_equal() -> None:
    mask = MASKS["local(20,9)"]
    first, _ = _run_varlen(PACK, [5, 4, 3, 2, 1, 0], 4, 1, 64, mask)
    again, _ = _run_varlen(PACK, [5, 4, 3, 2, 1, 0], 4, 1, 64, mask)
    _assert_bitwise(first, again, "repeat")


def test_dense_window_matches_reference() -> None:
    # The padded-batch layout with a window, head dim 128 (64 x 128 tiles: two Q tiles per chain).
    seqlen_q, seqlen_k, heads, kv_heads, headdim = 130, 190, 2, 1, 128
    mask = MASKS["local(20,9)"]
    got = _run_dense(seqlen_q, seqlen_k, [11, 12], heads, kv_heads, headdim, mask)
    parts = [_sequence(seqlen_q, seqlen_k, heads, kv_heads, headdim, s) for s in (11, 12)]
    q, k, v, dout = (torch.stack(xs) for xs in zip(*parts, strict=True))
    refs = []
    for upcast in (True, False):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse = attention_ref(*leaves, causal=False, window_size=mask.window, upcast=upcast)
        out.backward(dout)
        refs.append(
            {
                "out": out.detach(),
                "lse": lse.detach(),
                "dq": leaves[0].grad,
                "dk": leaves[1].grad,
                "dv": leaves[2].grad,
            }
        )
    for name in NAMES:
        assert_close_to_ref(name, got[name], refs[0][name], refs[1][name], atol=ATOL)


def test_zero_step_chains_and_keyless_rows_give_zeros() -> None:
    # (64, 300) with window (10, 0): row m sees keys m + 226 .. m + 236, so keys 0..225 are
    # seen by no row: KV tile 0 (keys 0..127) is a chain with no step and must still write
    # dK = dV = 0. (200, 70) causal-like: rows 0..129 see no key: out 0, lse -inf, dq 0.
    mask = BandMask(False, (10, 0))
    seqlens = [(64, 300), (200, 70)]
    plan = _band_schedule(seqlens, 2, 1, 64, mask)
    assert plan.schedule.chain_start[1] == plan.schedule.chain_start[0]  # chain (0, 0, 0): empty
    assert 0 in plan.schedule.order
    got, inputs = _run_varlen(seqlens, [3, 4], 2, 1, 64, mask)
    cu_q, cu_k = inputs[4], inputs[5]
    first = _seq_slice(got, cu_q, cu_k, 0)
    assert torch.count_nonzero(first["dk"][:226]) == 0
    assert torch.count_nonzero(first["dv"][:226]) == 0
    assert torch.count_nonzero(first["dk"][226:]) > 0
    second = _seq_slice(got, cu_q, cu_k, 1)
    assert torch.count_nonzero(second["out"][:130]) == 0
    assert torch.isneginf(second["lse"][:, :130]).all()
    assert torch.isfinite(second["lse"][:, 130:]).all()
    assert torch.count_nonzero(second["dq"][:130]) == 0
    assert torch.count_nonzero(second["dq"][130:]) > 0
    ref, same = _reference(inputs, mask)
    for name in NAMES:
        assert_close_to_ref(name, got[name], ref[name], same[name], atol=ATOL)


# --- the schedule engine's tables -----------------------------------------------------------------


def _engine_plan(
    seqlens: list[tuple[int, int]], heads: int, kv_heads: int, headdim: int, mask: BandMask,
    schedule: str,
) -> BackwardPlan | None:  # fmt: skip
    """A plan with the engine's tables for a pack (what ``make_backward_plan`` will build once
    problems carry seqlens), or None for a static schedule that would block in the interpreter's
    program order."""
    tiles = backward_tiles(headdim, "atomic")
    split = resolve_gqa_split(heads, kv_heads)  # the planner's rule: a chain per q head
    spec = ScheduleSpec.from_seqlens(
        seqlens=seqlens, q_heads=heads, kv_heads=heads if split else kv_heads,
        block_m=tiles.block_m,
        block_n=tiles.block_n, mask=_engine_mask(mask), workers=INTERPRETER.sm_count,
    )  # fmt: skip
    sched = make_schedule(schedule, spec)
    if first_blocked_program(sched) is not None:
        return None
    if sched.dispatch is Dispatch.DYNAMIC:
        grid = min(INTERPRETER.sm_count, len(sched.order))
    else:
        grid = int((sched.worker_start[1:] > sched.worker_start[:-1]).sum())
    problem = Problem(
        batch=len(seqlens), seqlen_q=max(sq for sq, _ in seqlens),
        seqlen_k=max(sk for _, sk in seqlens), heads=heads, kv_heads=kv_heads, headdim=headdim,
        mask=spec.mask, dtype="float16",
    )  # fmt: skip
    return BackwardPlan(
        problem=problem, device=INTERPRETER, schedule=sched, tiles=tiles, backend="triton",
        backend_reason="test", deterministic=True, dq_reduce="atomic", grid=max(grid, 1),
        timeout_s=10.0, gqa_split=split,
    )  # fmt: skip


def _engine_mask(mask: BandMask) -> Mask:
    return Mask(causal=mask.causal, window_left=mask.window[0], window_right=mask.window[1])


ENGINE_PACK = [(37, 50), (150, 150), (5, 0), (70, 200)]


@pytest.mark.parametrize("mask", ["causal", "local(40,0)", "local(20,9)"])
def test_engine_schedules_match_reference_and_keep_sequence_bits(mask: str) -> None:
    # Every schedule the engine offers for the mask (static ones where the interpreter's program
    # order can run them): right by the 2x rule, and sequence (150, 150) gives the same bits
    # alone as inside the pack.
    band = MASKS[mask]
    heads, kv_heads, headdim = 2, 1, 64
    names = applicable_schedules(_engine_mask(band))
    assert names, mask
    ran = 0
    for name in names:
        plan = _engine_plan(ENGINE_PACK, heads, kv_heads, headdim, band, name)
        alone_plan = _engine_plan([ENGINE_PACK[1]], heads, kv_heads, headdim, band, name)
        if plan is None or alone_plan is None:
            continue
        ran += 1
        got, inputs = _run_with_plan(
            plan, ENGINE_PACK, [0, 1, 2, 3], heads, kv_heads, headdim, band
        )
        ref, same = _reference(inputs, band)
        for key in NAMES:
            assert_close_to_ref(f"{key} [{mask}, {name}]", got[key], ref[key], same[key], atol=ATOL)
        alone, alone_in = _run_with_plan(
            alone_plan, [ENGINE_PACK[1]], [1], heads, kv_heads, headdim, band
        )
        _assert_bitwise(
            _seq_slice(got, inputs[4], inputs[5], 1),
            _seq_slice(alone, alone_in[4], alone_in[5], 0),
            name,
        )
    assert ran >= 2  # fa3 and descending at least


# Windows around the forward's block edges (BLOCK_M x BLOCK_N = 128 x 64 at head dim 64, 64 x 32
# at 256): where the masked, unmasked and masked again key ranges of a Q tile meet.
FORWARD_WINDOWS = [(0, 0), (1, 0), (63, 0), (64, 0), (65, 1), (127, 31), (-1, 63), (200, -1)]


@pytest.mark.parametrize("headdim", [64, 256])
@pytest.mark.parametrize("window", FORWARD_WINDOWS, ids=[f"{w[0]},{w[1]}" for w in FORWARD_WINDOWS])
def test_forward_band_edges_match_reference(window: tuple[int, int], headdim: int) -> None:
    seqlens = [(260, 260), (100, 300), (300, 97)]
    parts = [
        _sequence(sq, sk, 1, 1, headdim, s) for (sq, sk), s in zip(seqlens, [1, 2, 3], strict=True)
    ]
    q, k, v, _, cu_q, cu_k = _pack(parts)
    out, lse = run_forward(
        q, k, v, causal=False, softmax_scale=headdim**-0.5, window=window,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=300, max_seqlen_k=300,
    )  # fmt: skip
    kwargs = dict(window_size=window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    ref_out, ref_lse = attention_ref(q, k, v, **kwargs)
    same_out, same_lse = attention_ref(q, k, v, upcast=False, **kwargs)
    assert_close_to_ref(f"out {window}", out, ref_out, same_out, atol=ATOL)
    assert_close_to_ref(f"lse {window}", lse, ref_lse, same_lse, atol=ATOL)


@pytest.mark.parametrize("schedule", ["fa3", "descending"])
def test_planned_padded_batch_window_matches_reference_and_varlen_bits(schedule: str) -> None:
    # The padded-batch layout with a window through make_backward_plan (dense problems carry
    # their mask into the engine already), against the reference, and bitwise equal to the same
    # sequences packed (varlen) with the engine's tables.
    seqlen_q, seqlen_k, heads, kv_heads, headdim = 130, 190, 2, 1, 64
    band = MASKS["local(20,9)"]
    mask = _engine_mask(band)
    problem = Problem(2, seqlen_q, seqlen_k, heads, kv_heads, headdim, mask, "float16")
    plan = make_backward_plan(problem, device=INTERPRETER, schedule=schedule)
    assert plan.spec.mask.kind == "local" and plan.schedule_name == schedule
    parts = [_sequence(seqlen_q, seqlen_k, heads, kv_heads, headdim, s) for s in (11, 12)]
    q, k, v, dout = (torch.stack(xs) for xs in zip(*parts, strict=True))
    scale = headdim**-0.5
    out, lse = run_forward(q, k, v, causal=False, softmax_scale=scale, window=band.window)
    dq, dk, dv = run_backward(plan, dout, q, k, v, out, lse, scale, sync_check=True)
    got = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    refs = []
    for upcast in (True, False):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        ref_out, ref_lse = attention_ref(*leaves, window_size=band.window, upcast=upcast)
        ref_out.backward(dout)
        grads = dict(zip(("dq", "dk", "dv"), (x.grad for x in leaves), strict=True))
        refs.append({"out": ref_out.detach(), "lse": ref_lse.detach(), **grads})
    for name in NAMES:
        assert_close_to_ref(name, got[name], refs[0][name], refs[1][name], atol=ATOL)
    packed_plan = _engine_plan([(seqlen_q, seqlen_k)] * 2, heads, kv_heads, headdim, band, schedule)
    packed, inputs = _run_with_plan(
        packed_plan, [(seqlen_q, seqlen_k)] * 2, [11, 12], heads, kv_heads, headdim, band
    )
    for b in range(2):
        dense_b = {"out": out[b], "lse": lse[b], "dq": dq[b], "dk": dk[b], "dv": dv[b]}
        _assert_bitwise(dense_b, _seq_slice(packed, inputs[4], inputs[5], b), f"sequence {b}")


def _api_run(
    fn: Any, inputs: tuple[torch.Tensor, ...], *extra: Any, **kwargs: Any
) -> dict[str, torch.Tensor]:
    """out, lse, dq, dk, dv of ``fn(q, k, v, *extra, **kwargs)``, a public API call."""
    q, k, v, dout = inputs[:4]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = fn(*leaves, *extra, return_lse=True, **kwargs)
    out.backward(dout)
    grads = dict(zip(("dq", "dk", "dv"), (x.grad for x in leaves), strict=True))
    return {"out": out.detach(), "lse": lse.detach(), **grads}


@pytest.mark.parametrize("schedule", ["auto", "fa3", "descending"])
def test_api_sequence_bits_invariant(schedule: str) -> None:
    # Through dash_attn_varlen_func / dash_attn_func: sequence X alone, packed at two positions,
    # and in a padded batch, with 4, 3 or 2 workers (sm_margin 0, 1, 2): the same bits.
    x, heads, kv_heads, headdim, window = (150, 150), 2, 1, 64, (40, 0)
    expected = None
    for seqlens, seeds, at in (
        ([x], [7], 0),
        ([(37, 50), x, (70, 200)], [1, 7, 2], 1),
        ([(200, 70), (0, 10), x], [2, 3, 7], 2),
    ):
        parts = [
            _sequence(sq, sk, heads, kv_heads, headdim, s)
            for (sq, sk), s in zip(seqlens, seeds, strict=True)
        ]
        inputs = _pack(parts)
        cu_q, cu_k = inputs[4], inputs[5]
        max_q, max_k = max(sq for sq, _ in seqlens), max(sk for _, sk in seqlens)
        for margin in (0, 1, 2):
            got = _api_run(
                dash_attn.dash_attn_varlen_func, inputs, cu_q, cu_k, max_q, max_k,
                window_size=window, schedule=schedule, sm_margin=margin,
            )  # fmt: skip
            got = _seq_slice(got, cu_q, cu_k, at)
            expected = expected or got
            _assert_bitwise(got, expected, f"{schedule}: pack of {len(seqlens)}, margin {margin}")
    parts = [_sequence(*x, heads, kv_heads, headdim, s) for s in (8, 7)]
    batch = tuple(torch.stack(xs) for xs in zip(*parts, strict=True))
    padded = _api_run(dash_attn.dash_attn_func, batch, window_size=window, schedule=schedule)
    _assert_bitwise({name: t[1] for name, t in padded.items()}, expected, "padded batch")
