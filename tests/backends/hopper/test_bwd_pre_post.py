"""The CuTe-DSL preprocess and dQ cast around the hopper backward (``hopper/bwd_pre_post.py``).

CPU (CI): both compile for sm_90a for every dtype, head dim and Q tile the backend ships.
GPU: the preprocess against the Triton one (LSE2 bitwise, delta to fp32 rounding, the zeroed
buffer), the cast against the Triton fragment cast (bitwise) on lengths that are not tile
multiples, and a set error flag reaching ``check_errors`` through the host-mapped word.
"""

from __future__ import annotations

import dataclasses

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


def test_shipped_tiles_are_covered() -> None:
    from dash_attn.backends import hopper

    shipped = {(hd, hopper.bwd_tiles(hd, causal).block_m)
               for hd in hopper.BWD_HEADDIMS for causal in (False, True)}  # fmt: skip
    assert shipped == set(SHIPPED)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", sorted({hd for hd, _ in SHIPPED}))
def test_preprocess_compiles(dtype: torch.dtype, head_dim: int, monkeypatch) -> None:
    from dash_attn.backends.hopper import bwd_pre_post, kernel_cache

    monkeypatch.setenv("DASH_ATTN_KERNEL_CACHE", "0")
    monkeypatch.setattr(kernel_cache, "_memo", {})
    compiled = bwd_pre_post.compile_preprocess(cutlass_dtype(dtype), head_dim)
    assert callable(compiled)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim,block_m", SHIPPED)
def test_dq_cast_compiles(dtype: torch.dtype, head_dim: int, block_m: int, monkeypatch) -> None:
    from dash_attn.backends.hopper import bwd_pre_post, kernel_cache

    monkeypatch.setenv("DASH_ATTN_KERNEL_CACHE", "0")
    monkeypatch.setattr(kernel_cache, "_memo", {})
    compiled = bwd_pre_post.compile_dq_cast(cutlass_dtype(dtype), head_dim, block_m)
    assert callable(compiled)


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_pre_post_programmatic_launch_instructions(pdl: bool, tmp_path, monkeypatch) -> None:
    """With ``pdl`` the preprocess lets its dependent launch once its loads are issued and the
    cast waits for the main kernel's end before its first read; without, neither."""
    from dash_attn.backends.hopper import bwd_pre_post, kernel_cache

    monkeypatch.setattr(kernel_cache, "_memo", {})
    options = f"--keep-ptx --dump-dir {tmp_path}"
    dtype = cutlass_dtype(torch.bfloat16)
    pre = bwd_pre_post.compile_preprocess(dtype, 128, pdl=pdl, extra_options=options).__ptx__
    cast = bwd_pre_post.compile_dq_cast(dtype, 128, 64, pdl=pdl, extra_options=options).__ptx__
    assert ("griddepcontrol.launch_dependents" in pre) == pdl
    assert "griddepcontrol.wait" not in pre
    assert ("griddepcontrol.wait" in cast) == pdl
    assert "griddepcontrol.launch_dependents" not in cast


@pytest.mark.parametrize("head_dim,block_m", [(64, 128), (128, 80), (256, 64)])
def test_polled_cast_waits_for_each_tile_instead_of_the_main_kernel(
    head_dim: int, block_m: int, tmp_path, monkeypatch
) -> None:
    """The polled cast (session 50, beside the main kernel): one thread's bounded acquire loop
    on the tile's semaphore, the CTA's barrier before the loads, the tile's casts as the plain
    cast's (NaN-scaled if the flag is raised), the CTA counter after them (one atomic), and
    only behind it (the last CTA) the wait for the main kernel's end."""
    from dash_attn.backends.hopper import bwd_pre_post, kernel_cache

    monkeypatch.setattr(kernel_cache, "_memo", {})
    options = f"--keep-ptx --dump-dir {tmp_path}"
    dtype = cutlass_dtype(torch.bfloat16)
    polled = bwd_pre_post.compile_dq_cast(
        dtype, head_dim, block_m, poll=True, extra_options=options
    ).__ptx__
    plain = bwd_pre_post.compile_dq_cast(dtype, head_dim, block_m, extra_options=options).__ptx__
    # The last CTA alone waits for the main kernel's end; no CTA lets a dependent start.
    assert polled.count("griddepcontrol.wait") == 1 and "launch_dependents" not in polled
    assert "griddepcontrol" not in plain
    assert "ld.acquire.gpu.global.b32" in polled and "%globaltimer" in polled
    assert "ld.acquire" not in plain and "atom." not in plain
    assert polled.count("atom.global.acq_rel.add") == 1
    assert polled.count("bar.sync") == plain.count("bar.sync") + 1
    # The same loads and conversions of the tile, and its stores; one more store (the flag of
    # a timed-out wait).
    for op in ("cvt.rn", "ld.global.v4"):
        assert polled.count(op) == plain.count(op) > 0, op
    assert polled.count("st.global") == plain.count("st.global") + 1
    # A raised flag after the wait: the tile's scale becomes NaN (session 54).
    assert "0f7FC00000" in polled and "0f7FC00000" not in plain


def test_preprocess_refuses_odd_head_dim() -> None:
    import cutlass

    from dash_attn.backends.hopper.bwd_pre_post import BwdPreprocess

    with pytest.raises(ValueError, match="head_dim"):
        BwdPreprocess(cutlass.BFloat16, 72)


def test_preprocess_rows_per_cta() -> None:
    """The probe's knob (``tools/hopper/preprocess_rows_ab.py``): rows per CTA must fill whole
    passes of the CTA's threads (16 rows a pass at hd 64, 32 at hd 96), and the probe's
    variants compile."""
    import cutlass

    from dash_attn.backends.hopper.bwd_pre_post import BwdPreprocess
    from tools.hopper.preprocess_rows_ab import SIDES, compile_rows

    with pytest.raises(ValueError, match="rows must be a multiple of 16"):
        BwdPreprocess(cutlass.BFloat16, 64, rows=24)
    with pytest.raises(ValueError, match="rows must be a multiple of 32"):
        BwdPreprocess(cutlass.BFloat16, 96, rows=48)
    with pytest.raises(ValueError, match="rows must be a multiple of 32"):
        BwdPreprocess(cutlass.BFloat16, 64, rows=16, threads=256)
    shipped = BwdPreprocess(cutlass.BFloat16, 128)
    assert (shipped.rows, shipped.threads, shipped.heads_fastest) == SIDES[0] == (64, 128, False)
    assert callable(compile_rows(cutlass.BFloat16, 64, *SIDES[-1]))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(2, 333, 3, 64), (1, 200, 2, 128), (3, 64, 1, 128)])
def test_preprocess_matches_triton(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    from dash_attn.backends.hopper.bwd_pre_post import compile_preprocess
    from dash_attn.backends.triton.bwd import attn_bwd_preprocess

    torch.manual_seed(0)
    batch, seqlen, heads, head_dim = shape
    out = torch.randn(shape, device="cuda", dtype=dtype)
    dout = torch.randn(shape, device="cuda", dtype=dtype)
    lse = torch.randn(batch, heads, seqlen, device="cuda") * 3
    lse[:, :, ::7] = float("-inf")  # rows that saw no key
    rows_pad = -(-seqlen // 128) * 128
    ref_lse2, ref_delta = attn_bwd_preprocess(out, dout, lse, rows_pad)
    lse2 = torch.full((batch * heads, rows_pad), float("nan"), device="cuda")
    delta = torch.full_like(lse2, float("nan"))
    zeroed = torch.full((1234, 4), float("nan"), device="cuda")
    compile_preprocess(cutlass_dtype(dtype), head_dim)(out, dout, lse, lse2, delta, zeroed)
    torch.cuda.synchronize()
    assert torch.equal(lse2, ref_lse2)
    torch.testing.assert_close(delta, ref_delta, rtol=1e-5, atol=1e-5)
    assert torch.equal(delta[:, seqlen:], torch.zeros_like(delta[:, seqlen:]))
    assert torch.equal(zeroed, torch.zeros_like(zeroed))
    # A fixed summation order: the same bits again.
    again = torch.empty_like(delta)
    compile_preprocess(cutlass_dtype(dtype), head_dim)(out, dout, lse, lse2, again, zeroed)
    assert torch.equal(again, delta)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("head_dim,block_m", SHIPPED)
@pytest.mark.parametrize("seqlen", [100, 257])
def test_dq_cast_matches_triton(dtype: torch.dtype, head_dim: int, block_m: int, seqlen: int):
    from dash_attn.backends.hopper.bwd_pre_post import compile_dq_cast
    from dash_attn.backends.hopper.dq_cast import scale_cast_fragments

    torch.manual_seed(1)
    batch, heads = 2, 3
    q_tiles = -(-seqlen // block_m)
    acc = torch.randn(batch, heads, q_tiles, block_m * head_dim, device="cuda") * 10
    ref = scale_cast_fragments(acc, 0.125, dtype, seqlen, block_m)
    dq = torch.full((batch, seqlen, heads, head_dim), float("nan"), device="cuda", dtype=dtype)
    flags = torch.zeros(8, device="cuda", dtype=torch.int32)
    compile_dq_cast(cutlass_dtype(dtype), head_dim, block_m)(acc, dq, flags, 0.125, 0, 0)
    torch.cuda.synchronize()
    assert torch.equal(dq, ref)


@gpu
@pytest.mark.gpu
def test_dq_cast_reports_a_set_flag_through_the_mapped_word() -> None:
    from dash_attn import errors
    from dash_attn.backends.hopper.bwd_pre_post import compile_dq_cast

    errors.check_errors()
    cast = compile_dq_cast(cutlass_dtype(torch.bfloat16), 64, 128)
    acc = torch.zeros(1, 1, 1, 128 * 64, device="cuda")
    dq = torch.empty(1, 100, 1, 64, device="cuda", dtype=torch.bfloat16)
    flags = torch.zeros(3, device="cuda", dtype=torch.int32)
    address, launch = errors.mapped_launch("launch A timed out", torch.cuda.current_device())
    assert address != 0 and launch > 0
    cast(acc, dq, flags, 1.0, address, launch)  # flag clear: nothing reported
    errors.check_errors()
    flags[1] = 1
    address, launch = errors.mapped_launch(lambda: "launch B timed out", dq.device.index)
    cast(acc, dq, flags, 1.0, address, launch)
    with pytest.raises(RuntimeError, match="launch B timed out"):
        errors.check_errors()
    errors.check_errors()  # reported once


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,block_m", [(64, 128), (128, 80), (128, 64)])
def test_polled_cast_matches_the_plain_cast_and_times_out(head_dim: int, block_m: int) -> None:
    """The polled cast (session 50) on finished semaphores writes the plain cast's bits and
    counts its CTAs; on a semaphore that never reaches its count it waits out its bound, raises
    the flag and the host-mapped word, writes that tile as NaN, and does not hang."""
    from dash_attn import errors
    from dash_attn.backends.hopper.bwd_pre_post import compile_dq_cast

    torch.manual_seed(2)
    batch, heads, seqlen = 2, 3, 257
    q_tiles = -(-seqlen // block_m)
    tiles = batch * heads * q_tiles
    acc = torch.randn(batch, heads, q_tiles, block_m * head_dim, device="cuda") * 10
    dtype = cutlass_dtype(torch.bfloat16)
    plain_dq = torch.full((batch, seqlen, heads, head_dim), float("nan"), device="cuda",
                          dtype=torch.bfloat16)  # fmt: skip
    flags = torch.zeros(2 + tiles + 1, device="cuda", dtype=torch.int32)
    compile_dq_cast(dtype, head_dim, block_m)(acc, plain_dq, flags, 0.125, 0, 0)
    counts = torch.randint(1, 9, (tiles,), device="cuda", dtype=torch.int32)
    flags[2 : 2 + tiles] = counts
    polled_dq = torch.full_like(plain_dq, float("nan"))
    polled = compile_dq_cast(dtype, head_dim, block_m, poll=True)
    # A programmatic dependent may start before the kernel ahead of it has flushed its writes
    # (it waits for nothing here): the inputs are made visible first.
    torch.cuda.synchronize()
    polled(acc, polled_dq, flags, counts, 0.125, 10**9, 0, 0)
    torch.cuda.synchronize()
    assert torch.equal(polled_dq, plain_dq)
    assert flags[1].item() == 0 and flags[-1].item() == tiles
    # One tile short of its count: a bounded wait (1 ms), the flag and the mapped word.
    errors.check_errors()
    flags.zero_()
    flags[2 : 2 + tiles] = counts
    flags[2 + tiles // 2] -= 1
    address, launch = errors.mapped_launch("polled cast timed out", torch.cuda.current_device())
    torch.cuda.synchronize()
    polled_dq.zero_()
    polled(acc, polled_dq, flags, counts, 0.125, 10**6, address, launch)
    with pytest.raises(RuntimeError, match="polled cast timed out"):
        errors.check_errors()
    assert flags[1].item() == 1 and flags[-1].item() == tiles
    # The short tile's partial sum is never written as a finite result (session 54).
    bh, tile = divmod(tiles // 2, q_tiles)
    rows = polled_dq[bh // heads, tile * block_m : (tile + 1) * block_m, bh % heads]
    assert rows.numel() > 0 and torch.isnan(rows).all()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    "head_dim,causal,seqlen",
    [
        (64, False, 1024),
        (64, True, 777),
        (128, False, 1000),
        (96, True, 1000),
        (192, True, 1500),
        (256, False, 2000),
    ],
)
def test_backward_with_the_polled_cast_keeps_the_bits(
    head_dim: int, causal: bool, seqlen: int, monkeypatch
) -> None:
    """A deterministic backward whose plan leaves SMs to the dQ cast (``cast_sms``: kernels
    compiled with ``cast_trigger`` on 4 workers fewer, the cast beside them) gives the bits of
    the plan without
    (``POLLED_CAST_HEADDIMS`` emptied: all workers, the cast after the main kernel), because
    the order-invariant tables do not depend on the worker count; repeatably, also while
    another stream runs matmuls, and replayed from a CUDA graph (the programmatic launch
    captured)."""
    from dash_attn import dash_attn_func, last_launch_info
    from dash_attn import plan as plan_module
    from dash_attn.backends.hopper import launch

    torch.manual_seed(3)
    batch, heads = 3, 2048 // head_dim // 4
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))  # fmt: skip
    dout = torch.randn_like(q)

    def attention(*leaves: torch.Tensor) -> torch.Tensor:
        return dash_attn_func(*leaves, causal=causal, deterministic=True, backend="hopper")

    def grads() -> list[torch.Tensor]:
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        return list(torch.autograd.grad(attention(*leaves), leaves, dout))

    plan_module.make_backward_plan.cache_clear()
    with monkeypatch.context() as patch:
        patch.setattr(plan_module, "POLLED_CAST_HEADDIMS", ())
        after = grads()
        assert last_launch_info().cast_sms == 0
    plan_module.make_backward_plan.cache_clear()
    launch._launches.clear()
    first = grads()
    plan = last_launch_info()
    assert plan.cast_sms >= 4 and plan.grid <= plan.device.sm_count - plan.cast_sms
    assert all(torch.equal(a, b) for a, b in zip(first, after, strict=True))
    assert_repeats_and_replays(grads, first, attention, (q, k, v), dout)
    launch._launches.clear()


def _stubbed_full_backward(plan, q, variant: str, monkeypatch, cast_trigger=False, **options):
    """``prepare_full`` of ``plan``'s launch with the three kernels replaced by stand-ins that
    record their arguments: (the FullBackward, the list of (kernel, args) calls)."""
    from dash_attn.backends.hopper import bwd_launch
    from dash_attn.backends.tables import device_tables

    calls = record_kernel_calls(monkeypatch)
    spec, tiles = plan.spec, plan.tiles
    main = bwd_launch.prepare_bwd(
        tuple(q.shape), q.dtype, device_tables(plan.schedule, q.device),
        block_m=tiles.block_m, block_n=tiles.block_n, num_workers=plan.grid,
        q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains, causal=False,
        deterministic=True, dynamic=False, timeout_ns=10**9, variant=variant,
        dkv_heads=spec.kv_heads, cast_trigger=cast_trigger,
    )  # fmt: skip
    return bwd_launch.prepare_full(main, tuple(q.shape), q.dtype, variant, **options), calls


def test_full_backward_lays_out_one_buffer_and_passes_each_signature(monkeypatch) -> None:
    """``FullBackward`` (CPU, kernels replaced by stand-ins that record their arguments): LSE2,
    delta, the dQ accumulator and the flags are views of one allocation, in the order and the
    shapes each kernel's signature takes; the preprocess gets the zeroed region as 16-byte rows
    and runs first; the cast gets the scale, the error word and the launch number."""
    import inspect

    from dash_attn.backends.hopper.bwd import HopperAttnBwd
    from dash_attn.backends.hopper.bwd_pre_post import BwdPreprocess, DqFragmentCast
    from dash_attn.plan import FULL, H200, Problem, make_backward_plan
    from dash_attn.schedule import TABLE_FIELDS

    batch, seqlen, heads, kv_heads, head_dim = 2, 300, 4, 2, 128
    plan = make_backward_plan(
        Problem(batch, seqlen, seqlen, heads, kv_heads, head_dim, FULL, "bfloat16"), device=H200
    )
    q = torch.zeros(batch, seqlen, heads, head_dim, dtype=torch.bfloat16)
    k = torch.zeros(batch, seqlen, kv_heads, head_dim, dtype=torch.bfloat16)
    lse = torch.zeros(batch, heads, seqlen)
    spec, tiles = plan.spec, plan.tiles
    full, calls = _stubbed_full_backward(plan, q, "t80_wg", monkeypatch)
    main = full.main
    dq, dk, dv, status = full(q, q, k, k, q, lse, 0.125, 4096, 7)
    assert [name for name, _ in calls] == ["pre", "main", "cast"]

    def named(kernel_call, args):
        params = list(inspect.signature(kernel_call).parameters)[1:-1]  # no self, stream
        assert len(args) == len(params)
        return dict(zip(params, args, strict=True))

    pre = named(BwdPreprocess.__call__, calls[0][1])
    mainargs = named(HopperAttnBwd.__call__, calls[1][1])
    cast = named(DqFragmentCast.__call__, calls[2][1])
    rows_pad = spec.q_tiles * tiles.block_m
    assert pre["mLSE2"].shape == pre["mDelta"].shape == (batch * heads, rows_pad)
    assert mainargs["mLSE"] is pre["mLSE2"] and mainargs["mDelta"] is pre["mDelta"]
    zero = pre["mZero"]
    assert zero.shape[1] == 4 and zero.is_contiguous()
    acc, flags = mainargs["mdQacc"], mainargs["mFlags"]
    assert acc.shape == (batch, heads, spec.q_tiles, tiles.block_m * head_dim)
    assert flags.dtype == torch.int32 and flags.numel() == 2 + batch * heads * spec.q_tiles
    # The accumulator and the flags lie inside the zeroed rows; LSE2 and delta outside them.
    start, end = zero.data_ptr(), zero.data_ptr() + zero.numel() * 4
    assert start == acc.data_ptr() and flags.data_ptr() + flags.numel() * 4 <= end
    assert pre["mDelta"].data_ptr() + pre["mDelta"].numel() * 4 <= start
    assert all(t.data_ptr() % 16 == 0 for t in (pre["mLSE2"], pre["mDelta"], acc))
    assert mainargs["softmax_scale"] == 0.125
    assert tuple(mainargs[name] for name in ("mChainStart", "mStepHead")) == main.tables[:2]
    assert len(TABLE_FIELDS) == len(main.tables)
    assert cast["mAcc"] is acc and cast["mdQ"] is dq and cast["mFlags"] is flags
    assert (cast["softmax_scale"], cast["error_addr"], cast["launch_id"]) == (0.125, 4096, 7)
    assert dq.shape == q.shape and dq.dtype == q.dtype
    # GQA 4/2: split by q head, so the main kernel writes per-q-head partials (summed later).
    assert plan.gqa_split and dk.shape == dv.shape == (batch, seqlen, heads, head_dim)
    assert mainargs["mdK"] is dk and mainargs["mdV"] is dv and mainargs["mK"] is k
    assert status is flags  # status[1] is the launch's error flag


def test_full_backward_after_a_first_store_kernel_zeroes_only_the_flags(monkeypatch) -> None:
    """``prepare_full(zero_acc=False)``: the preprocess's zeroed rows start at the flags (the
    kernel writes every accumulator tile first) and cover all of them."""
    from dash_attn.plan import FULL, H200, Problem, make_backward_plan

    batch, seqlen, heads, head_dim = 2, 300, 4, 128
    plan = make_backward_plan(
        Problem(batch, seqlen, seqlen, heads, heads, head_dim, FULL, "bfloat16"), device=H200
    )
    q = torch.zeros(batch, seqlen, heads, head_dim, dtype=torch.bfloat16)
    lse = torch.zeros(batch, heads, seqlen)
    spec, tiles = plan.spec, plan.tiles
    full, calls = _stubbed_full_backward(plan, q, "t80_wgr_p14_sm2_fs", monkeypatch, zero_acc=False)
    full(q, q, q, q, q, lse, 0.125, 0, 0)
    args = dict(calls)
    zero = args["pre"][-1]
    acc, flags = args["main"][6], args["main"][10]
    assert acc.shape == (batch, heads, spec.q_tiles, tiles.block_m * head_dim)
    assert zero.data_ptr() == flags.data_ptr() == acc.data_ptr() + acc.numel() * 4
    assert zero.shape[1] == 4 and zero.numel() >= flags.numel() > zero.numel() - 4


def test_full_backward_with_the_polled_cast(monkeypatch) -> None:
    """``prepare_full(dq_counts=...)`` (a main kernel prepared with ``cast_trigger``): the cast
    gets the counts and the main kernel's timeout after the flags, and the flags one more zeroed
    word (the polled cast's CTA counter) after the dQ semaphores. A main kernel without
    ``cast_trigger`` and a ``dkv_sum`` kernel refuse the counts."""
    import inspect

    from dash_attn.backends.hopper import bwd_launch
    from dash_attn.backends.hopper.bwd_pre_post import DqFragmentCastPolled
    from dash_attn.plan import FULL, H200, Problem, make_backward_plan

    batch, seqlen, heads, head_dim = 2, 300, 4, 128
    plan = make_backward_plan(
        Problem(batch, seqlen, seqlen, heads, heads, head_dim, FULL, "bfloat16"), device=H200
    )
    q = torch.zeros(batch, seqlen, heads, head_dim, dtype=torch.bfloat16)
    lse = torch.zeros(batch, heads, seqlen)
    counts = torch.from_numpy(plan.schedule.dq_tile_counts())
    full, calls = _stubbed_full_backward(
        plan, q, "t80_wgr_p14_sm2_fs", monkeypatch, cast_trigger=True, zero_acc=False,
        dq_counts=counts,
    )  # fmt: skip
    dq, _, _, flags = full(q, q, q, q, q, lse, 0.125, 4096, 7)
    args = dict(calls)
    params = list(inspect.signature(DqFragmentCastPolled.__call__).parameters)[1:-1]
    cast = dict(zip(params, args["cast"], strict=True))
    tiles = batch * heads * plan.spec.q_tiles
    assert cast["mdQ"] is dq and cast["mFlags"] is flags and cast["mCounts"] is counts
    assert (cast["softmax_scale"], cast["timeout_ns"]) == (0.125, full.main.timeout_ns)
    assert (cast["error_addr"], cast["launch_id"]) == (4096, 7)
    assert flags.numel() == full.main.flag_count + 1 == 2 + tiles + 1
    zero = args["pre"][-1]
    assert zero.data_ptr() == flags.data_ptr() and zero.numel() >= flags.numel()
    # Every tile of a full mask is added to by every KV tile.
    assert counts.tolist() == [plan.spec.kv_tiles] * tiles
    plain = dataclasses.replace(full.main, cast_trigger=False)
    with pytest.raises(ValueError, match="does not let the polled cast start"):
        bwd_launch.prepare_full(plain, tuple(q.shape), q.dtype, "t80_wgr_p14_sm2_fs",
                                dq_counts=counts)  # fmt: skip
    summed = dataclasses.replace(full.main, dkv_sum=True)
    with pytest.raises(ValueError, match="dkv_sum"):
        bwd_launch.prepare_full(summed, tuple(q.shape), q.dtype, "t80_wgr_p14_sm2_fs",
                                dq_counts=counts)  # fmt: skip
    # A pdl variant lets its dependent start before the preprocess has zeroed the flags.
    with pytest.raises(ValueError, match="pdl variant"):
        bwd_launch.prepare_full(full.main, tuple(q.shape), q.dtype, "t80_wgr_p14_sm2_fs_pdl",
                                dq_counts=counts)  # fmt: skip


def test_polled_cast_waits_as_long_as_the_main_kernel_may_run(monkeypatch) -> None:
    """The plan's launch gives the polled cast's waits the plan's timeout plus the busiest
    worker's steps at ``CAST_WAIT_PER_STEP_NS`` each (its CTAs start with the main kernel, so a
    tile finished last is waited for about as long as the whole kernel), while the main
    kernel's own waits keep the plan's timeout; ``prepare_full`` alone passes the main kernel's."""
    from dash_attn.backends.hopper import launch
    from dash_attn.plan import FULL, H200, Problem, make_backward_plan

    calls = record_kernel_calls(monkeypatch)
    monkeypatch.setattr(launch, "_launches", {})
    problem = Problem(8, 2048, 2048, 32, 32, 64, FULL, "bfloat16")
    plan = make_backward_plan(problem, device=H200, backend="hopper", timeout_s=0.05)
    assert plan.cast_sms > 0
    q = torch.zeros(8, 2048, 32, 64, dtype=torch.bfloat16)
    full = launch._prepare(plan, q)
    steps = plan.schedule.busiest_worker_steps()
    assert steps == 512  # 4096 chains of 16 steps on 128 workers
    want = 50_000_000 + steps * launch.CAST_WAIT_PER_STEP_NS
    assert full.main.timeout_ns == 50_000_000 and full.cast_timeout_ns == want
    full(q, q, q, q, q, torch.zeros(8, 32, 2048), 0.125, 0, 0)
    (cast_args,) = [args for name, args in calls if name == "cast"]
    assert cast_args[5] == want  # (acc, dq, flags, counts, scale, timeout_ns, ...)


def test_mapped_error_words_raise_the_launchs_text_once(monkeypatch) -> None:
    """``errors.mapped_launch`` numbers launches and keeps their texts; a kernel writing the
    number into its device's word (simulated here on a host array) makes the next check raise
    that launch's text, once."""
    import numpy as np

    from dash_attn import errors

    words = np.zeros(errors._MAX_DEVICES, dtype=np.int32)
    monkeypatch.setattr(errors, "_mapped_words", words)
    monkeypatch.setattr(errors, "_mapped_base", 1 << 20)
    monkeypatch.setattr(errors, "_mapped_texts", {})
    monkeypatch.setattr(errors, "_mapped_devices", set())
    first = errors.mapped_launch("first launch failed", 0)
    second = errors.mapped_launch(lambda: "second launch failed", 1)
    assert first[0] == 1 << 20 and second[0] == (1 << 20) + 4
    assert second[1] == first[1] + 1 > 0
    errors.check_errors(synchronize=False)  # nothing set
    words[1] = second[1]
    with pytest.raises(RuntimeError, match="second launch failed"):
        errors.check_errors(synchronize=False)
    assert not words.any()
    errors.check_errors(synchronize=False)
    # A launch whose text was dropped (more than _MAPPED_KEEP since) still raises.
    words[0] = 123456
    with pytest.raises(RuntimeError, match="launch 123456 on cuda:0"):
        errors.check_errors(synchronize=False)
    assert errors.mapped_launch("x", errors._MAX_DEVICES) == (0, 0)


@pytest.mark.parametrize(
    ("value", "enabled"),
    [(None, True), ("", True), ("1", True), ("on", True), ("0", False), (" off ", False),
     ("False", False), ("NO", False)],
)  # fmt: skip
def test_switch_reads_the_environment(value: str | None, enabled: bool) -> None:
    from dash_attn.backends.hopper.launch import cute_pre_post_from_env

    assert cute_pre_post_from_env(value) is enabled


@pytest.mark.parametrize("enabled", [False, True], ids=["default", "cute-pre-post"])
def test_plan_launch_follows_the_switch(enabled: bool, monkeypatch) -> None:
    """``launch.CUTE_PRE_POST`` picks the host path per plan launch (kept per switch value):
    off, the main kernel alone (Triton preprocess and cast around it); on, ``FullBackward``
    with the CuTe kernels compiled for the plan's dtype, head dim and Q tile."""
    from dash_attn.backends.hopper import bwd_launch, launch
    from dash_attn.plan import CAUSAL, H200, Problem, make_backward_plan

    monkeypatch.setattr(launch, "CUTE_PRE_POST", enabled)
    monkeypatch.setattr(launch, "_launches", {})
    plan = make_backward_plan(Problem(2, 300, 300, 4, 2, 128, CAUSAL, "bfloat16"), device=H200)
    q = torch.zeros(2, 300, 4, 128, dtype=torch.bfloat16)
    prepared = launch._launch(plan, q)
    assert launch._launch(plan, q) is prepared
    if not enabled:
        assert isinstance(prepared, bwd_launch.BwdLaunch)
        return
    assert isinstance(prepared, bwd_launch.FullBackward)
    assert prepared.rows_pad == plan.spec.q_tiles * plan.tiles.block_m
    rows, _, acc, flags, padding = prepared.parts
    assert rows == 2 * 4 * plan.spec.q_tiles * plan.tiles.block_m
    assert (acc, flags) == (prepared.main.dq_size, prepared.main.flag_count)
    assert prepared.buf_size % 4 == 0 and prepared.zero_start % 4 == 0 and padding < 4


# ---- the whole backward on the CuTe host path (GPU): what the default path's tests check ----


def _grads(q, k, v, dout, **kwargs):
    from dash_attn import dash_attn_func

    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = dash_attn_func(q, k, v, backend="hopper", **kwargs)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shape", [(2, 333, 333, 4, 4, 64), (1, 1000, 1000, 4, 2, 128), (2, 257, 513, 6, 2, 128)]
)
def test_cute_pre_post_backward_matches_reference(cute_pre_post, shape, causal, dtype) -> None:
    from dash_attn import last_launch_info
    from dash_attn.backends.hopper import bwd_launch, launch
    from dash_attn.reference.attention import attention_ref
    from dash_attn.testing import assert_close_to_ref, make_qkv

    batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype, "cuda", 5)
    dout = torch.randn_like(q)

    def reference(upcast: bool):
        def run(a, b, c):
            return attention_ref(a, b, c, causal=causal, upcast=upcast)[0]

        q_, k_, v_ = (x.detach().clone().requires_grad_() for x in (q, k, v))
        out = run(q_, k_, v_)
        out.backward(dout)
        return out.detach(), q_.grad, k_.grad, v_.grad

    ref, same = reference(True), reference(False)
    for deterministic in (True, False):
        got = _grads(q, k, v, dout, causal=causal, deterministic=deterministic)
        plan = last_launch_info()
        assert plan.backend == "hopper"
        assert isinstance(launch._launch(plan, q), bwd_launch.FullBackward)
        for name, g, r, s in zip(("out", "dq", "dk", "dv"), got, ref, same, strict=True):
            assert_close_to_ref(f"{name} [det={deterministic}]", g, r, s, atol=1e-3)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_cute_pre_post_backward_is_bitwise_repeatable(cute_pre_post, head_dim, causal) -> None:
    """10 runs per schedule, the last five with matmuls queued on another stream."""
    from dash_attn.schedule import CAUSAL, FULL, applicable_schedules
    from dash_attn.testing import make_qkv

    q, k, v = make_qkv(2, 2000, 2000, 8, 4, head_dim, torch.bfloat16, "cuda", 7)
    dout = torch.randn_like(q)
    other = torch.cuda.Stream()
    for schedule in applicable_schedules(CAUSAL if causal else FULL):
        first = _grads(q, k, v, dout, causal=causal, schedule=schedule)
        for i in range(9):
            if i >= 4:
                with torch.cuda.stream(other):
                    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
                    for _ in range(10):
                        a = (a @ a).clamp_(-1, 1)
            again = _grads(q, k, v, dout, causal=causal, schedule=schedule)
            for name, x, y in zip(("out", "dq", "dk", "dv"), first, again, strict=True):
                assert torch.equal(x, y), f"{name} differs between runs [{schedule}]"
        torch.cuda.synchronize()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_det_backward_needs_no_zeroed_accumulator(cute_pre_post, head_dim, causal) -> None:
    """Deterministic kernels store each dQ tile's first partial instead of adding it to a
    zeroed accumulator (``dq_first_store``): with the allocator's free memory full of NaN
    first, then full of zeros, the gradients are finite and equal, also for queries that see
    no key (causal, more queries than keys: there the accumulator is zeroed)."""
    from dash_attn.testing import make_qkv

    for seqlen_q, seqlen_k in ((1000, 1000), (700, 300)):
        q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, torch.bfloat16, "cuda", 3)
        dout = torch.randn_like(q)
        runs = []
        for fill in (float("nan"), 0.0):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            # One cached block much larger than a backward's buffers, filled, then freed: the
            # backward's first allocation (LSE2, delta, accumulator, flags) is carved from it.
            junk = torch.full((64 << 20,), fill, device="cuda")
            del junk
            runs.append(_grads(q, k, v, dout, causal=causal, deterministic=True))
        for name, a, b in zip(("out", "dq", "dk", "dv"), *runs, strict=True):
            assert torch.isfinite(a.float()).all(), (name, seqlen_q, seqlen_k)
            assert torch.equal(a, b), (name, seqlen_q, seqlen_k)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("sync_check", [True, False], ids=["sync-check", "next-check"])
def test_cute_pre_post_broken_table_raises_instead_of_hanging(cute_pre_post, sync_check) -> None:
    """A table whose every rank is one too high: each first contributor waits for a turn that
    never comes; the launch gives up after the plan's timeout, poisons dQ with NaN, and the
    host-mapped word makes the check raise (at once, or at the next check)."""

    from dash_attn import check_errors, dash_attn_func
    from dash_attn.backends.hopper import launch
    from dash_attn.device import device_info
    from dash_attn.dispatch import problem_of
    from dash_attn.plan import make_backward_plan
    from dash_attn.schedule import FULL
    from dash_attn.testing import broken_ranks, make_qkv

    q, k, v = make_qkv(1, 1024, 1024, 2, 2, 64, torch.bfloat16, "cuda", 1)
    out, lse = dash_attn_func(q, k, v, return_lse=True, backend="hopper")
    good = make_backward_plan(
        problem_of(q, k, FULL), device=device_info(q.device), schedule="shift",
        backend="hopper", timeout_s=0.2,
    )  # fmt: skip
    broken = broken_ranks(good)
    dout = torch.randn_like(q)
    if sync_check:
        with pytest.raises(RuntimeError, match="timed out.*'broken'"):
            launch.run_backward(broken, dout, q, k, v, out, lse, 64**-0.5, sync_check=True)
    else:
        dq, _, _ = launch.run_backward(broken, dout, q, k, v, out, lse, 64**-0.5)
        with pytest.raises(RuntimeError, match="timed out.*'broken'"):
            check_errors()
        assert torch.isnan(dq.float()).any()
    check_errors()  # reported once
    again = dash_attn_func(q, k, v, backend="hopper")
    assert torch.isfinite(again.float()).all()


def test_launches_a_graph_was_captured_with_are_never_dropped(monkeypatch) -> None:
    """A replay reads a captured launch's tables and counts by address: a launch asked for
    during a capture stays however many plans come after, while the oldest others go."""
    from dash_attn.backends.hopper import launch
    from dash_attn.plan import FULL, H200, Problem, make_backward_plan

    record_kernel_calls(monkeypatch)
    monkeypatch.setattr(launch, "_launches", {})
    monkeypatch.setattr(launch, "_pinned_launches", set())
    monkeypatch.setattr(launch, "_MAX_LAUNCHES", 3)
    q = torch.zeros(2, 300, 4, 128, dtype=torch.bfloat16)

    def plan(seqlen_k: int):
        problem = Problem(2, 300, seqlen_k, 4, 4, 128, FULL, "bfloat16")
        return make_backward_plan(problem, device=H200, backend="hopper")

    first, captured = plan(300), plan(301)
    launch._launch(first, q)
    kept = launch._launch(captured, q, captured=True)
    for seqlen_k in range(302, 308):
        launch._launch(plan(seqlen_k), q)
    assert len(launch._launches) == 3
    assert launch._launch(captured, q) is kept
    assert (id(first), q.device.index, launch.CUTE_PRE_POST) not in launch._launches
