"""The preprocess beside the hopper backward's main kernel (``hopper/bwd_pre_beside.py``, the
main kernel's ``pre_beside``; session 52, not shipped: ``hopper.PRE_BESIDE_HEADDIMS`` is empty).

CPU (CI): the kernel compiles for sm_90a for every dtype and Q tile the backend ships, with one
release per tile and no wait for any grid; the main kernel with ``pre_beside`` compiles with one
more bounded acquire loop (the producer's) and its one wait for the preprocess's end; the
launch lays the ready flags after the polled cast's counter and zeroes the flags on the host;
the plan's launch takes it only where asked.
GPU: LSE2 and delta bitwise equal to the plain preprocess's, every ready flag set once, in any
order; whole backwards with it give the bits of those without, repeatably, with a busy stream
and from a CUDA graph; a tile never made ready raises instead of hanging.
"""

from __future__ import annotations

import pytest
import torch
from pre_post_helpers import (
    DTYPES,
    SHIPPED,
    assert_repeats_and_replays,
    cutlass_dtype,
    gpu,
    needs_cute_dsl,
    record_kernel_calls,
)

pytestmark = needs_cute_dsl


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim,block_m", SHIPPED)
def test_beside_preprocess_compiles_with_one_release_per_tile(
    dtype: torch.dtype, head_dim: int, block_m: int, tmp_path, monkeypatch
) -> None:
    """It lets its dependent (the main kernel) launch and waits for no grid; each warp's tile
    ends with a proxy fence and two release adds (its ready flag, then the count of distinct
    tiles done); the row loads are 16-byte vectors, no acquire anywhere."""
    from dash_attn.backends.hopper import bwd_pre_beside, kernel_cache

    monkeypatch.setattr(kernel_cache, "_memo", {})
    compiled = bwd_pre_beside.compile_preprocess_beside(
        cutlass_dtype(dtype), head_dim, block_m, extra_options=f"--keep-ptx --dump-dir {tmp_path}"
    )
    ptx = compiled.__ptx__
    assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert "griddepcontrol.wait" not in ptx
    # The tile's flag (its old value says whether the tile is new), then the count.
    assert ptx.count("atom.global.release.add") == 1
    assert ptx.count("red.release.gpu.global.add.s32") == 1
    assert ptx.count("fence.proxy.async.global") == 1
    assert "ld.global.v4" in ptx and "ld.acquire" not in ptx
    assert ".reqntid 512, 1, 1" in ptx


def test_beside_preprocess_refuses_odd_shapes() -> None:
    import cutlass

    from dash_attn.backends.hopper.bwd_pre_beside import BwdPreprocessBeside

    with pytest.raises(ValueError, match="head_dim"):
        BwdPreprocessBeside(cutlass.BFloat16, 72, 64)
    with pytest.raises(ValueError, match="block_m must be a multiple of 4"):
        BwdPreprocessBeside(cutlass.BFloat16, 64, 70)
    # Chunks are whole passes of the tile: 80 rows at hd 128 in 5 chunks of 16.
    tiled = BwdPreprocessBeside(cutlass.BFloat16, 128, 80)
    assert tiled.chunks * tiled.passes * tiled.rows_per_pass == 80


@pytest.mark.parametrize("head_dim,causal", [(64, False), (256, True)])
def test_main_kernel_waits_for_each_tile_and_then_the_preprocess(
    head_dim: int, causal: bool, tmp_path, monkeypatch
) -> None:
    """``pre_beside`` adds the producer's acquire loads of the count of tiles done and of the
    step's ready flag (one lane each, at once) and its bounded acquire loop on the flag (two
    acquire loads: before and in the loop) with its proxy fence, and one wait for the
    preprocess's end
    (the shipped kernels are no programmatic dependents and wait for none); the dQ warps'
    releases stay as they are. It needs ``cast_trigger``."""
    from dash_attn.backends.hopper import bwd_launch, bwd_variant, kernel_cache

    monkeypatch.setattr(kernel_cache, "_memo", {})
    variant = bwd_variant(head_dim, causal, 2048, deterministic=True)
    for beside in (False, True):
        (tmp_path / str(beside)).mkdir()
    ptx = {
        beside: bwd_launch.compile_bwd(
            torch.bfloat16, head_dim, causal=causal, deterministic=True, variant=variant,
            cast_trigger=True, pre_beside=beside,
            extra_options=f"--keep-ptx --dump-dir {tmp_path / str(beside)}",
        ).__ptx__
        for beside in (False, True)
    }  # fmt: skip
    assert "griddepcontrol.wait" not in ptx[False]
    assert ptx[True].count("griddepcontrol.wait") == 1
    assert ptx[True].count("ld.acquire.gpu") == ptx[False].count("ld.acquire.gpu") + 4
    fences = ptx[False].count("fence.proxy.async.global")
    assert ptx[True].count("fence.proxy.async.global") == fences + 1
    assert ptx[True].count("red.release.gpu") == ptx[False].count("red.release.gpu")
    with pytest.raises(ValueError, match="cast_trigger"):
        bwd_launch.HopperAttnBwd(
            cutlass_dtype(torch.bfloat16), head_dim, causal, True,
            *bwd_launch.variant_tiles(variant, head_dim), **bwd_launch._variant_options(variant),
            pre_beside=True,
        )  # fmt: skip


def _plan_and_inputs(head_dim: int = 128):
    from dash_attn.plan import FULL, H200, Problem, make_backward_plan

    batch, seqlen, heads = 2, 300, 4
    plan = make_backward_plan(
        Problem(batch, seqlen, seqlen, heads, heads, head_dim, FULL, "bfloat16"),
        device=H200,
        backend="hopper",
    )
    q = torch.zeros(batch, seqlen, heads, head_dim, dtype=torch.bfloat16)
    return plan, q, torch.zeros(batch, heads, seqlen)


def test_full_backward_runs_the_preprocess_beside(monkeypatch) -> None:
    """``prepare_full(pre_order=..., pre_ctas=...)``: the flags end with one ready flag per dQ
    tile after the polled cast's counter (where the main kernel reads them), the host zeroes
    the flags before the preprocess, which gets the ready flags, the order and its CTAs; the
    order must list every tile, and the main kernel must have ``pre_beside``."""
    import inspect

    from dash_attn.backends.hopper import bwd_launch, launch
    from dash_attn.backends.hopper.bwd_pre_beside import BwdPreprocessBeside
    from dash_attn.backends.tables import dq_counts, pre_order
    from dash_attn.schedule import TABLE_FIELDS

    calls = record_kernel_calls(monkeypatch)
    plan, q, lse = _plan_and_inputs()
    assert plan.cast_sms > 0
    full = launch._prepare(plan, q, pre_beside=True)
    tiles = 2 * 4 * plan.spec.q_tiles
    assert full.main.pre_beside and full.pre_ctas == plan.cast_sms
    assert full.pre_order.tolist() == plan.schedule.dq_tiles_by_first_step().tolist()
    assert sorted(full.pre_order.tolist()) == list(range(tiles))
    _, _, _, flags = full(q, q, q, q, q, lse, 0.125, 0, 0)
    assert [name for name, _ in calls] == ["beside", "main", "cast"]
    params = list(inspect.signature(BwdPreprocessBeside.__call__).parameters)[1:-1]
    pre = dict(zip(params, calls[0][1], strict=True))
    assert flags.numel() == full.main.flag_count + 1 + tiles + 1 == 2 + tiles + 1 + tiles + 1
    ready = pre["mReady"]  # the ready flags and the count of tiles done
    assert ready.numel() == tiles + 1 and ready.data_ptr() == flags.data_ptr() + 4 * (3 + tiles)
    assert pre["mOrder"] is full.pre_order and pre["ctas"] == plan.cast_sms
    # Zeroed by the host (the stand-ins write nothing): the flags, after lse2 and delta.
    assert torch.equal(flags, torch.zeros_like(flags))
    # The plain launch of the same plan: no ready flags, the preprocess zeroes.
    calls.clear()
    plain = launch._prepare(plan, q, pre_beside=False)
    assert plain.pre_order is None and not plain.main.pre_beside
    _, _, _, flags = plain(q, q, q, q, q, lse, 0.125, 0, 0)
    assert [name for name, _ in calls] == ["pre", "main", "cast"]
    assert flags.numel() == 2 + tiles + 1
    variant = launch._variant(plan)
    counts = dq_counts(plan.schedule, q.device)
    order = pre_order(plan.schedule, q.device)
    with pytest.raises(ValueError, match="pre_beside"):
        bwd_launch.prepare_full(plain.main, tuple(q.shape), q.dtype, variant, dq_counts=counts,
                                pre_order=order, pre_ctas=4)  # fmt: skip
    with pytest.raises(ValueError, match="list the"):
        bwd_launch.prepare_full(full.main, tuple(q.shape), q.dtype, variant, dq_counts=counts,
                                pre_order=order[1:], pre_ctas=4)  # fmt: skip
    with pytest.raises(ValueError, match="pre_ctas"):
        bwd_launch.prepare_full(full.main, tuple(q.shape), q.dtype, variant, dq_counts=counts,
                                pre_order=order, pre_ctas=0)  # fmt: skip
    with pytest.raises(ValueError, match="cast_trigger"):
        bwd_launch.prepare_bwd(
            tuple(q.shape), q.dtype, dict(zip(TABLE_FIELDS, full.main.tables, strict=True)),
            block_m=plan.tiles.block_m, block_n=plan.tiles.block_n, num_workers=plan.grid,
            q_tiles=plan.spec.q_tiles, kv_tiles=plan.spec.kv_tiles,
            num_chains=plan.spec.num_chains, causal=False, deterministic=True, dynamic=False,
            timeout_ns=10**9, variant=variant, dkv_heads=4, pre_beside=True,
        )  # fmt: skip


def test_plans_take_the_preprocess_beside_where_listed(monkeypatch) -> None:
    """``_prepare``'s default: beside where the head dim is in ``PRE_BESIDE_HEADDIMS`` and the
    plan leaves SMs to the polled cast; never for a plan on every SM."""
    import dataclasses

    from dash_attn.backends.hopper import launch

    record_kernel_calls(monkeypatch)
    plan, q, _ = _plan_and_inputs()
    assert launch._prepare(plan, q).pre_order is None  # none listed (not shipped yet)
    monkeypatch.setattr(launch, "PRE_BESIDE_HEADDIMS", (128,))
    assert launch._prepare(plan, q).pre_order is not None
    on_every_sm = dataclasses.replace(plan, cast_sms=0)
    assert launch._prepare(on_every_sm, q).pre_order is None
    assert launch._prepare(on_every_sm, q, pre_beside=True).pre_order is None


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim,block_m", SHIPPED)
def test_beside_preprocess_matches_the_preprocess(
    dtype: torch.dtype, head_dim: int, block_m: int
) -> None:
    """LSE2 and delta bitwise equal to ``BwdPreprocess``'s (the same lanes and order per row),
    rows past seqlen_q included, on a shuffled order of the tiles; every ready flag is 1 and
    the count is all the tiles."""
    from dash_attn.backends.hopper.bwd_pre_beside import compile_preprocess_beside
    from dash_attn.backends.hopper.bwd_pre_post import compile_preprocess

    torch.manual_seed(1)
    batch, seqlen, heads = 2, 333, 3
    shape = (batch, seqlen, heads, head_dim)
    out = torch.randn(shape, device="cuda", dtype=dtype)
    dout = torch.randn(shape, device="cuda", dtype=dtype)
    lse = torch.randn(batch, heads, seqlen, device="cuda") * 3
    lse[:, :, ::7] = float("-inf")  # rows that saw no key
    q_tiles = -(-seqlen // block_m)
    rows_pad = q_tiles * block_m
    want = [torch.full((batch * heads, rows_pad), float("nan"), device="cuda") for _ in "ld"]
    zeroed = torch.empty(64, 4, device="cuda")
    compile_preprocess(cutlass_dtype(dtype), head_dim)(out, dout, lse, *want, zeroed)
    got = [torch.full_like(want[0], float("nan")) for _ in "ld"]
    tiles = batch * heads * q_tiles
    ready = torch.zeros(tiles + 1, device="cuda", dtype=torch.int32)  # and the count
    order = torch.randperm(tiles, device="cuda").to(torch.int32)
    beside = compile_preprocess_beside(cutlass_dtype(dtype), head_dim, block_m)
    beside(out, dout, lse, *got, ready, order, 2)
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(ready[:tiles], torch.ones_like(ready[:tiles])) and ready[tiles] == tiles


def _grads(q, k, v, dout, causal):
    from dash_attn import dash_attn_func

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = dash_attn_func(*leaves, causal=causal, deterministic=True, backend="hopper")
    return list(torch.autograd.grad(out, leaves, dout))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    "head_dim,causal,seqlen_q,seqlen_k",
    [
        (64, False, 1024, 1024),
        (64, True, 777, 777),
        (64, True, 1000, 700),  # rows that see no key; the host zeroes the accumulator too
        (128, False, 1000, 1000),
        (96, True, 1000, 1000),
        (256, False, 2000, 2000),
    ],  # fmt: skip
)
def test_backward_with_the_preprocess_beside_keeps_the_bits(
    cute_pre_post, head_dim: int, causal: bool, seqlen_q: int, seqlen_k: int, monkeypatch
) -> None:
    """With the preprocess beside the main kernel (``PRE_BESIDE_HEADDIMS`` listing the head dim)
    a deterministic backward gives the bits of the shipped launch (the preprocess before it),
    repeatably, also while another stream runs matmuls, and replayed from a CUDA graph."""
    from dash_attn import dash_attn_func, last_launch_info
    from dash_attn.backends.hopper import launch

    torch.manual_seed(4)
    batch, heads = 3, 2048 // head_dim // 4
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
               for seqlen in (seqlen_q, seqlen_k, seqlen_k))  # fmt: skip
    dout = torch.randn_like(q)
    launch._launches.clear()
    before = _grads(q, k, v, dout, causal)
    plan = last_launch_info()
    assert plan.cast_sms > 0
    assert launch._launches[next(reversed(launch._launches))][1].pre_order is None
    launch._launches.clear()
    monkeypatch.setattr(launch, "PRE_BESIDE_HEADDIMS", (head_dim,))
    first = _grads(q, k, v, dout, causal)
    assert launch._launches[next(reversed(launch._launches))][1].pre_order is not None
    assert all(torch.equal(a, b) for a, b in zip(first, before, strict=True))

    def attention(*leaves: torch.Tensor) -> torch.Tensor:
        return dash_attn_func(*leaves, causal=causal, deterministic=True, backend="hopper")

    def grads() -> list[torch.Tensor]:
        return _grads(q, k, v, dout, causal)

    assert_repeats_and_replays(grads, first, attention, (q, k, v), dout)
    launch._launches.clear()


def _plan_launches(head_dim: int, causal: bool, seqlen: int, timeout_s: float = 10.0):
    """A deterministic hopper plan whose static tables leave SMs to the polled cast, its inputs
    (q, k, v, out, lse, dout) and its launches with the preprocess before and beside the main
    kernel."""
    from dash_attn import dash_attn_func
    from dash_attn.backends.hopper import launch
    from dash_attn.device import device_info
    from dash_attn.dispatch import problem_of
    from dash_attn.plan import make_backward_plan
    from dash_attn.schedule import CAUSAL, FULL
    from dash_attn.testing import make_qkv

    heads = 2048 // head_dim // 4
    q, k, v = make_qkv(2, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16, "cuda", 5, False)
    out, lse = dash_attn_func(q, k, v, causal=causal, return_lse=True, backend="hopper")
    plan = make_backward_plan(
        problem_of(q, k, CAUSAL if causal else FULL), device=device_info(q.device),
        schedule="symmetric_shift" if causal else "shift", backend="hopper",
        timeout_s=timeout_s,
    )  # fmt: skip
    assert plan.cast_sms > 0
    before = launch._prepare(plan, q, pre_beside=False)
    beside = launch._prepare(plan, q, pre_beside=True)
    assert before.pre_order is None and beside.pre_order is not None
    return plan, (q, k, v, out, lse, torch.randn_like(q)), before, beside


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,causal,seqlen", [(64, False, 2000), (128, True, 1500)])
def test_a_slow_preprocess_in_any_order_keeps_the_bits(
    cute_pre_post, head_dim: int, causal: bool, seqlen: int
) -> None:
    """The producers' waits at work: the preprocess on one CTA, its tiles in the schedule's
    order and then reversed (the ones the first steps need last), gives the bits of the
    preprocess before the main kernel, and leaves every ready flag at 1, the count at all the
    tiles and no error raised."""
    import dataclasses

    plan, (q, k, v, out, lse, dout), before, beside = _plan_launches(head_dim, causal, seqlen)
    scale = head_dim**-0.5
    want = before(dout, q, k, v, out, lse, scale, 0, 0)[:3]
    tiles = beside.pre_order.numel()
    start = beside.main.flag_count + 1  # the ready flags follow the polled cast's counter
    for ctas, order in (
        (beside.pre_ctas, beside.pre_order),
        (1, beside.pre_order),
        (1, beside.pre_order.flip(0).contiguous()),
    ):
        full = dataclasses.replace(beside, pre_ctas=ctas, pre_order=order)
        *got, flags = full(dout, q, k, v, out, lse, scale, 0, 0)
        torch.cuda.synchronize()
        assert int(flags[1]) == 0, f"a wait timed out (pre_ctas {ctas})"
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), ctas
        ready = flags[start : start + tiles + 1]
        assert torch.equal(ready[:tiles], torch.ones_like(ready[:tiles]))
        assert int(ready[tiles]) == tiles


@gpu
@pytest.mark.gpu
def test_a_tile_never_made_ready_raises_instead_of_hanging(cute_pre_post, monkeypatch) -> None:
    """An order with one entry out of range (the preprocess skips it, so that tile is never
    made ready and the count of tiles done stays short): the producer's wait for that tile's
    ready flag gives up after the plan's timeout and the backward raises. Then, with the
    schedule's order back, the same plan's backward gives the bits of the preprocess before
    the main kernel."""
    from dash_attn import check_errors
    from dash_attn.backends.hopper import launch

    plan, (q, k, v, out, lse, dout), before, beside = _plan_launches(64, False, 1024, 0.2)
    scale = 64**-0.5
    want = launch.run_backward(plan, dout, q, k, v, out, lse, scale, sync_check=True)
    schedule_order = launch.pre_order
    broken = beside.pre_order.clone()
    broken[0] = broken.numel()  # the first tile the schedule needs: never made ready
    monkeypatch.setattr(launch, "pre_order", lambda schedule, device: broken)
    monkeypatch.setattr(launch, "PRE_BESIDE_HEADDIMS", (64,))
    launch._launches.clear()
    with pytest.raises(RuntimeError, match="timed out"):
        launch.run_backward(plan, dout, q, k, v, out, lse, scale, sync_check=True)
    check_errors()  # reported once
    monkeypatch.setattr(launch, "pre_order", schedule_order)
    launch._launches.clear()
    got = launch.run_backward(plan, dout, q, k, v, out, lse, scale, sync_check=True)
    assert launch._launch(plan, q).pre_order is not None
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
