"""GPU tests of every backend: numerics against an fp32 reference, bitwise repeats (also with
another stream busy), the bounded wait, torch.compile. Skipped without CUDA.

Run on a CUDA machine: ``python -m pytest tests/backends/test_gpu.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    import dash_attn
    from dash_attn import dash_attn_func, last_launch_info
    from dash_attn.backends import hopper_unsupported
    from dash_attn.device import device_info
    from dash_attn.dispatch import backend_module, problem_of
    from dash_attn.plan import make_backward_plan
    from dash_attn.reference.attention import attention_ref
    from dash_attn.schedule import CAUSAL, FULL, Mask, applicable_schedules
    from dash_attn.testing import assert_close_to_ref, broken_ranks, hopper_gap, make_qkv

# (batch, seqlen_q, seqlen_k, heads, kv_heads, headdim): seqlens deliberately not tile multiples.
SHAPES = [
    pytest.param((2, 333, 333, 4, 4, 64), id="b2-s333-h4-d64"),
    pytest.param((1, 1000, 1000, 4, 2, 128), id="b1-s1000-gqa4:2-d128"),
    pytest.param((2, 257, 513, 6, 2, 128), id="b2-sq257-sk513-gqa6:2-d128"),
    pytest.param((1, 700, 300, 4, 1, 64), id="b1-sq700-sk300-mqa-d64"),
    pytest.param((1, 300, 300, 2, 2, 96), id="b1-s300-d96"),
    pytest.param((1, 300, 300, 2, 1, 192), id="b1-s300-mqa-d192"),
    pytest.param((1, 200, 260, 2, 2, 256), id="b1-sq200-sk260-d256"),
    pytest.param((2, 257, 513, 6, 2, 96), id="b2-sq257-sk513-gqa6:2-d96"),
]
BACKENDS = ["triton", "hopper"]
GRADS = ("out", "dq", "dk", "dv")


@pytest.fixture(autouse=True)
def _hopper_tests_need_cutlass(request: pytest.FixtureRequest) -> None:
    """The hopper-only tests import the CuTe-DSL kernels before their shape checks: on a GPU
    machine without ``nvidia-cutlass-dsl`` they skip (as the backend-parametrised ones do through
    ``hopper_gap``) instead of failing on the import."""
    from dash_attn.backends.hopper import cutlass_available

    if request.node.name.startswith("test_hopper_") and not cutlass_available():
        pytest.skip("hopper backend: nvidia-cutlass-dsl is not installed")


def _grads(fn, q, k, v, dout):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def _skip_if_uncovered(backend: str, q: torch.Tensor, k: torch.Tensor, causal: bool) -> None:
    if backend == "hopper" and (gap := hopper_gap(q, k, causal)) is not None:
        pytest.skip(f"hopper backend: {gap}")


def _dash(causal: bool, backend: str, schedule: str = "auto", deterministic: bool = True):
    def run(q, k, v):
        return dash_attn_func(
            q, k, v, causal=causal, schedule=schedule, deterministic=deterministic, backend=backend
        )

    return run


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_fp32_reference_every_schedule(backend, shape, causal, dtype):
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim = shape
    q, k, v = make_qkv(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, dtype, "cuda", seed=seqlen_q + headdim
    )
    _skip_if_uncovered(backend, q, k, causal)
    dout = torch.randn_like(q)
    ref = _grads(lambda a, b, c: attention_ref(a, b, c, causal=causal)[0], q, k, v, dout)
    same = _grads(
        lambda a, b, c: attention_ref(a, b, c, causal=causal, upcast=False)[0], q, k, v, dout
    )
    for schedule in [*applicable_schedules(CAUSAL if causal else FULL), "auto"]:
        for deterministic in (True, False):
            got = _grads(_dash(causal, backend, schedule, deterministic), q, k, v, dout)
            assert last_launch_info().backend == backend
            for name, g, r, s in zip(GRADS, got, ref, same, strict=True):
                label = f"{name} [{backend}, {schedule}, det={deterministic}]"
                assert_close_to_ref(label, g, r, s, atol=1e-3)


def _busy_stream_matmuls(stream: torch.cuda.Stream, count: int = 20) -> None:
    """Queue big matmuls on ``stream``: they compete for SMs with the backward."""
    with torch.cuda.stream(stream):
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(count):
            a = (a @ a).clamp_(-1, 1)


@pytest.mark.parametrize("busy", [False, True], ids=["alone", "busy-stream"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bitwise_repeatable_every_schedule(backend, headdim, causal, busy):
    """10 runs per schedule give the same bits, also while another stream runs matmuls (the
    persistent kernel then shares SMs; static schedules must still finish and agree)."""
    batch, seqlen, heads, kv_heads = 2, 2000, 8, 4
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, kv_heads, headdim, torch.bfloat16, "cuda", 7)
    _skip_if_uncovered(backend, q, k, causal)
    dout = torch.randn_like(q)
    other = torch.cuda.Stream()
    for schedule in applicable_schedules(CAUSAL if causal else FULL):
        run = _dash(causal, backend, schedule)
        first = _grads(run, q, k, v, dout)
        for _ in range(9):
            if busy:
                _busy_stream_matmuls(other)
            again = _grads(run, q, k, v, dout)
            for name, x, y in zip(GRADS, first, again, strict=True):
                assert torch.equal(x, y), f"{name} differs between runs [{backend}, {schedule}]"
        torch.cuda.synchronize()


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_full_sequence_walks_down_static_or_dynamic(backend):
    """A full-mask sequence past DESCENDING_MIN_TASKS tile tasks (15625 with 128 x 128 tiles):
    ``auto`` runs ``descending`` (dynamic tickets); ``shift_descending`` runs the same tables
    from static worker lists. Same bits both ways, repeatable with another stream busy, and
    within the flash-attn rule of the fp32 reference."""
    q, k, v = make_qkv(1, 16000, 16000, 2, 1, 64, torch.bfloat16, "cuda", 5)
    _skip_if_uncovered(backend, q, k, False)
    dout = torch.randn_like(q)
    dynamic = _grads(_dash(False, backend), q, k, v, dout)
    assert last_launch_info().schedule.name == "descending"
    other = torch.cuda.Stream()
    for busy in (False, True):
        if busy:
            _busy_stream_matmuls(other)
        static = _grads(_dash(False, backend, "shift_descending"), q, k, v, dout)
        plan = last_launch_info()
        assert plan.schedule.name == "shift_descending" and plan.schedule.dispatch.value == "static"
        for name, x, y in zip(GRADS, dynamic, static, strict=True):
            assert torch.equal(x, y), f"{name}: static and dynamic walks differ [{backend}]"
    torch.cuda.synchronize()
    ref = _grads(lambda a, b, c: attention_ref(a, b, c)[0], q, k, v, dout)
    same = _grads(lambda a, b, c: attention_ref(a, b, c, upcast=False)[0], q, k, v, dout)
    for name, g, r, s in zip(GRADS, dynamic, ref, same, strict=True):
        assert_close_to_ref(f"{name} [{backend}, long full]", g, r, s, atol=1e-3)


def _ref_out(q, k, v, *, causal: bool, upcast: bool = True):
    return attention_ref(q, k, v, causal=causal, upcast=upcast)[0]


def test_hopper_long_key_variant_gives_the_same_bits(monkeypatch):
    """From ``BWD_VARIANT_LONG``'s key length on, the hopper backward runs another kernel variant
    with the same tiles (hd 128 full: two dQ staging buffers). Only where a dQ partial waits for
    its turn may differ: its gradients equal the other variant's bit for bit for every schedule,
    repeat with another stream busy, and are within the flash-attn rule of the fp32 reference."""
    from dash_attn.backends import hopper
    from dash_attn.backends.hopper import launch as hopper_launch

    for (headdim, kind), (min_seqlen_k, variant) in hopper.BWD_VARIANT_LONG.items():
        causal = kind == "causal"
        seqlen = min_seqlen_k + 8  # not a tile multiple
        q, k, v = make_qkv(1, seqlen, seqlen, 2, 1, headdim, torch.bfloat16, "cuda", 9)
        _skip_if_uncovered("hopper", q, k, causal)
        twin = hopper.BWD_DET_TWIN.get(variant, variant)  # the tests' backwards are det
        assert hopper.bwd_variant(headdim, causal, seqlen, deterministic=True) == twin
        dout = torch.randn_like(q)
        for schedule in [*applicable_schedules(Mask(causal=causal)), "auto"]:
            long = _grads(_dash(causal, "hopper", schedule), q, k, v, dout)
            with monkeypatch.context() as m:
                # The other variant: the threshold out of reach, the prepared launches dropped.
                m.setitem(hopper.BWD_VARIANT_LONG, (headdim, kind), (1 << 30, variant))
                m.setattr(hopper_launch, "_launches", {})
                short = _grads(_dash(causal, "hopper", schedule), q, k, v, dout)
            for name, x, y in zip(GRADS, long, short, strict=True):
                assert torch.equal(x, y), f"{name}: {variant} differs [{schedule}, {kind}]"
        _busy_stream_matmuls(torch.cuda.Stream())
        again = _grads(_dash(causal, "hopper"), q, k, v, dout)
        for name, x, y in zip(GRADS, long, again, strict=True):
            assert torch.equal(x, y), f"{name}: {variant} not repeatable with a busy stream"
        torch.cuda.synchronize()
        ref = _grads(functools.partial(_ref_out, causal=causal), q, k, v, dout)
        same = _grads(functools.partial(_ref_out, causal=causal, upcast=False), q, k, v, dout)
        for name, g, r, s in zip(GRADS, long, ref, same, strict=True):
            assert_close_to_ref(f"{name} [hopper, {variant}]", g, r, s, atol=1e-3)


def test_hopper_det_twin_gives_the_same_bits(monkeypatch):
    """Deterministic hopper backwards run the ``BWD_DET_TWIN`` of the variant (two dQ warps,
    at head dims 192/256 sharing the one staging buffer): for every schedule, with GQA (the
    kernel's dK/dV group sums) and lengths that are not tile multiples, seqlen_q != seqlen_k,
    its gradients equal the one-writer variant's bit for bit, and repeat with another stream
    busy."""
    from dash_attn.backends import hopper
    from dash_attn.backends.hopper import launch as hopper_launch

    cases = [(key, 1000) for key in hopper.BWD_VARIANT]
    cases += [(key, start + 8) for key, (start, _) in hopper.BWD_VARIANT_LONG.items()]
    for (headdim, kind), seqlen in cases:
        causal = kind == "causal"
        seqlen_k = seqlen + 100
        twin = hopper.bwd_variant(headdim, causal, seqlen_k, deterministic=True)
        with monkeypatch.context() as m:
            m.setattr(hopper, "BWD_DET_TWIN", {})
            name = hopper.bwd_variant(headdim, causal, seqlen_k, deterministic=True)
        if twin == name:
            continue
        q, k, v = make_qkv(1, seqlen, seqlen_k, 4, 2, headdim, torch.bfloat16, "cuda", 11)
        _skip_if_uncovered("hopper", q, k, causal)
        dout = torch.randn_like(q)
        for schedule in [*applicable_schedules(Mask(causal=causal)), "auto"]:
            two = _grads(_dash(causal, "hopper", schedule), q, k, v, dout)
            with monkeypatch.context() as m:
                m.setattr(hopper, "BWD_DET_TWIN", {})
                m.setattr(hopper_launch, "_launches", {})
                one = _grads(_dash(causal, "hopper", schedule), q, k, v, dout)
            for grad, x, y in zip(GRADS, two, one, strict=True):
                assert torch.equal(x, y), f"{grad}: {twin} differs from {name} [{schedule}]"
        _busy_stream_matmuls(torch.cuda.Stream())
        again = _grads(_dash(causal, "hopper", schedule), q, k, v, dout)
        for grad, x, y in zip(GRADS, two, again, strict=True):
            assert torch.equal(x, y), f"{grad}: {twin} not repeatable with a busy stream"
        torch.cuda.synchronize()


def test_hopper_counted_nondet_kernels_are_correct() -> None:
    """The counted non-deterministic kernels (``hopper.counted_nondet_twin``, what non-det
    backwards run since session 59: the first dQ store, the others added in arrival order once
    it has landed, every add counted for the dQ cast beside the kernel): for every head dim,
    mask and schedule, with GQA, tails and seqlen_q != seqlen_k, dq, dk and dv are within the
    flash-attn rule of the fp32 reference, dk and dv (each chain's own order) equal the kernel
    without turns' (``BWD_NONDET_UNCOUNTED``) bit for bit, also with another stream busy, and
    static plans leave SMs to the polled cast."""
    from dash_attn.backends import hopper
    from tools.hopper.bwd_probe import nondet_kernels

    for headdim, kind in hopper.BWD_VARIANT:
        causal = kind == "causal"
        q, k, v = make_qkv(1, 1000, 1100, 4, 2, headdim, torch.bfloat16, "cuda", 12)
        _skip_if_uncovered("hopper", q, k, causal)
        dout = torch.randn_like(q)
        ref = _grads(functools.partial(_ref_out, causal=causal), q, k, v, dout)
        same = _grads(functools.partial(_ref_out, causal=causal, upcast=False), q, k, v, dout)
        for schedule in [*applicable_schedules(Mask(causal=causal)), "auto"]:
            run = _dash(causal, "hopper", schedule, deterministic=False)
            with nondet_kernels(counted=False):
                uncounted = _grads(run, q, k, v, dout)
                assert not last_launch_info().cast_sms
            with nondet_kernels(counted=True):
                counted = _grads(run, q, k, v, dout)
                plan = last_launch_info()
                assert hopper.nondet_counts_adds(headdim, causal, 1100)
                static = plan.dispatch.name == "STATIC"
                assert (plan.cast_sms > 0) == static, (headdim, kind, schedule)
                if schedule == "auto":
                    _busy_stream_matmuls(torch.cuda.Stream())
                    busy = _grads(run, q, k, v, dout)
                    torch.cuda.synchronize()
                    for name in ("dk", "dv"):
                        i = GRADS.index(name)
                        assert torch.equal(busy[i], counted[i]), f"{name} busy [{headdim}]"
            tag = f"hopper counted non-det, d{headdim} {kind} {schedule}"
            for name, g, r, s in zip(GRADS, counted, ref, same, strict=True):
                assert_close_to_ref(f"{name} [{tag}]", g, r, s, atol=1e-3)
            for name in ("out", "dk", "dv"):
                i = GRADS.index(name)
                assert torch.equal(counted[i], uncounted[i]), f"{name} differs [{tag}]"


@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_hopper_counted_nondet_broken_table_raises_instead_of_hanging(headdim: int) -> None:
    """A counted non-det kernel waits for each dQ tile's first store: with every rank + 1 no
    tile gets one, so its waits give up after the plan's bound and the backward raises, and
    the GPU is still usable afterwards."""
    from tools.hopper.bwd_probe import nondet_kernels

    q, k, v = make_qkv(1, 1024, 1024, 2, 2, headdim, torch.bfloat16, "cuda", 1)
    _skip_if_uncovered("hopper", q, k, False)
    with nondet_kernels(counted=True):
        out, lse = dash_attn_func(q, k, v, return_lse=True, backend="hopper")
        good = make_backward_plan(
            problem_of(q, k, FULL), device=device_info(q.device), schedule="shift",
            backend="hopper", timeout_s=0.2, deterministic=False,
        )  # fmt: skip
        assert good.cast_sms > 0
        run_backward = backend_module("hopper").run_backward
        with pytest.raises(RuntimeError, match="timed out.*'broken'"):
            run_backward(
                broken_ranks(good), torch.randn_like(q), q, k, v, out, lse, headdim**-0.5,
                sync_check=True,
            )  # fmt: skip
        got = _grads(_dash(False, "hopper", deterministic=False), q, k, v, torch.randn_like(q))
        assert all(torch.isfinite(g.float()).all() for g in got)


@pytest.mark.parametrize("headdim", [96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gqa_split_is_the_mha_backward_of_repeated_kv(backend, causal, headdim):
    """GQA runs one chain per q head (the plan's ``gqa_split``, the default): for every
    schedule the gradients equal, bit for bit, the MHA backward of K/V repeated per q head
    followed by the fixed-order group sum (the same tables). Where the kernel adds the group's
    dK/dV itself (``plan.dkv_sum``: the deterministic hopper kernel, fp32 partials summed in
    q-head order and rounded once) dq is still that one bit for bit and dk/dv are at least as
    close to the fp32 reference as the sum of the 16-bit partials on average (their mean
    absolute error: the largest error of either can land one rounding step apart on a given
    dout, as it did in session 64 on an unseeded one), and within the flash-attn rule. With
    ``gqa_split=False`` (one chain per kv head) the backward still meets the rule."""
    from dash_attn.backends.triton.group_sum import sum_kv_groups

    batch, seqlen_q, seqlen_k, heads, kv_heads = 2, 700, 1100, 6, 2
    q, k, v = make_qkv(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.bfloat16, "cuda", 21
    )
    _skip_if_uncovered(backend, q, k, causal)
    # Seeded: the same dout whichever tests ran before in the process.
    dout = make_qkv(
        batch, seqlen_q, 1, heads, 1, headdim, torch.bfloat16, "cuda", 22, requires_grad=False
    )[0]
    scale = headdim**-0.5
    out, lse = dash_attn_func(q, k, v, causal=causal, return_lse=True, backend=backend)
    k_rep, v_rep = (x.repeat_interleave(heads // kv_heads, dim=2) for x in (k, v))
    run_backward = backend_module(backend).run_backward
    device = device_info(q.device)
    ref = _grads(functools.partial(_ref_out, causal=causal), q, k, v, dout)
    same = _grads(functools.partial(_ref_out, causal=causal, upcast=False), q, k, v, dout)
    for schedule in [*applicable_schedules(Mask(causal=causal)), "auto"]:
        options = dict(device=device, schedule=schedule, backend=backend)
        split = make_backward_plan(problem_of(q, k, Mask(causal=causal)), **options)
        mha = make_backward_plan(problem_of(q, k_rep, Mask(causal=causal)), **options)
        # The same tables up to the dK/dV sums' placement, which changes no bit of dq. The MHA
        # plan may leave SMs to the polled dQ cast where the split one (its in-kernel dK/dV
        # sums) does not: only with order-invariant tables, whose bits do not depend on the
        # worker count, so dq must still be equal bit for bit.
        workers = mha.spec.workers if mha.cast_sms and mha.spec.invariant else split.spec.workers
        assert split.gqa_split and mha.spec == dataclasses.replace(
            split.spec, dkv_sum_group=1, workers=workers
        )
        got = run_backward(split, dout, q, k, v, out, lse, scale, sync_check=True)
        dq, dk_heads, dv_heads = run_backward(
            mha, dout, q, k_rep, v_rep, out, lse, scale, sync_check=True
        )
        want = (dq, *sum_kv_groups(dk_heads, dv_heads, kv_heads))
        assert split.dkv_sum == (backend == "hopper")
        for name, x, y, r, s in zip(("dq", "dk", "dv"), got, want, ref[1:], same[1:], strict=True):
            if name == "dq" or not split.dkv_sum:
                assert torch.equal(x, y), f"{name}: split differs from repeated K/V [{schedule}]"
                continue
            label = f"{name} [{backend}, {schedule}, dK/dV summed in the kernel]"
            assert_close_to_ref(label, x, r, s, atol=1e-3)
            err, err_partials = ((t.float() - r.float()).abs().mean().item() for t in (x, y))
            assert err <= err_partials, f"{label}: mean error {err} > partials' {err_partials}"
        whole = make_backward_plan(
            problem_of(q, k, Mask(causal=causal)), gqa_split=False, **options
        )
        assert not whole.gqa_split and whole.spec.kv_heads == kv_heads
        grads = run_backward(whole, dout, q, k, v, out, lse, scale, sync_check=True)
        for name, g, r, s in zip(("dq", "dk", "dv"), grads, ref[1:], same[1:], strict=True):
            assert_close_to_ref(f"{name} [{backend}, {schedule}, no split]", g, r, s, atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nondeterministic_mode_is_correct_and_reported(backend):
    # Arrival order: usually differs in the low bits of dq. What must hold is that it is still
    # correct (above) and that det mode is the one that repeats; report whether it repeated.
    q, k, v = make_qkv(1, 4096, 4096, 16, 16, 128, torch.bfloat16, "cuda", 3)
    _skip_if_uncovered(backend, q, k, False)
    dout = torch.randn_like(q)
    runs = [_grads(_dash(False, backend, deterministic=False), q, k, v, dout)[1] for _ in range(5)]
    assert not last_launch_info().deterministic
    differs = any(not torch.equal(runs[0], r) for r in runs[1:])
    print(f"{backend}: non-deterministic dq differs across 5 runs: {differs}")


# Causal shapes whose order-invariant static tables deadlocked before session 44 merged the
# rounds that wait on each other (tests/schedule/test_invariance.py, DEADLOCKED_BEFORE): a
# deterministic backward there timed out instead of finishing.
DRIFTING_LANE_SHAPES = [
    pytest.param((3, 207, 14868, 2, 1, 64), id="b3-sq207-sk14868-mqa-d64"),
    pytest.param((2, 281, 6165, 4, 2, 256), id="b2-sq281-sk6165-gqa4:2-d256"),
]


@pytest.mark.parametrize("shape", DRIFTING_LANE_SHAPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_backward_where_lanes_drift(backend, shape):
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.bfloat16,
                       "cuda", seed=6)  # fmt: skip
    _skip_if_uncovered(backend, q, k, True)
    dout = torch.randn_like(q)
    ref = _grads(lambda a, b, c: attention_ref(a, b, c, causal=True)[0], q, k, v, dout)
    same = _grads(
        lambda a, b, c: attention_ref(a, b, c, causal=True, upcast=False)[0], q, k, v, dout
    )
    runs = [_grads(_dash(True, backend), q, k, v, dout) for _ in range(3)]
    assert last_launch_info().schedule.name == "symmetric_shift"
    for name, g, r, s in zip(GRADS, runs[0], ref, same, strict=True):
        assert_close_to_ref(f"{name} [{backend}, drifting lanes]", g, r, s, atol=1e-3)
    for again in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], again, strict=True))


@pytest.mark.parametrize(
    ("shape", "causal"),
    [((1, 2100, 2300, 4, 2, 256), True), ((2, 1100, 1030, 2, 1, 256), False),
     ((1, 8200, 8300, 2, 2, 192), True)],
    ids=["b1-sq2100-sk2300-gqa4:2-d256-causal", "b2-sq1100-sk1030-mqa-d256-full",
         "b1-sq8200-sk8300-d192-causal"],
)  # fmt: skip
def test_hopper_nondet_auto_takes_descending_where_listed(shape, causal):
    """A non-det hopper backward with schedule="auto" runs descending where it was measured
    faster (``hopper.NONDET_DESCENDING_MIN_SEQLEN_K``): still right by the rule, and the plan
    says so; the deterministic auto keeps its static shift tables."""
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim = shape
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.bfloat16,
                       "cuda", seed=4)  # fmt: skip
    _skip_if_uncovered("hopper", q, k, causal)
    dout = torch.randn_like(q)
    ref = _grads(lambda a, b, c: attention_ref(a, b, c, causal=causal)[0], q, k, v, dout)
    same = _grads(
        lambda a, b, c: attention_ref(a, b, c, causal=causal, upcast=False)[0], q, k, v, dout
    )
    got = _grads(_dash(causal, "hopper", deterministic=False), q, k, v, dout)
    plan = last_launch_info()
    assert (plan.deterministic, plan.schedule.name) == (False, "descending")
    for name, g, r, s in zip(GRADS, got, ref, same, strict=True):
        assert_close_to_ref(f"{name} [hopper non-det auto, d{headdim}]", g, r, s, atol=1e-3)
    det = make_backward_plan(
        problem_of(q, k, CAUSAL if causal else FULL), device=device_info(q.device),
        backend="hopper",
    )  # fmt: skip
    assert det.schedule.name in ("shift", "symmetric_shift")


@pytest.mark.parametrize("headdim", [64, 128, 192, 256])
@pytest.mark.parametrize("backend", BACKENDS)
def test_broken_table_raises_instead_of_hanging(backend, headdim):
    batch, seqlen, heads = 1, 1024, 2
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, heads, headdim, torch.bfloat16, "cuda", 1)
    _skip_if_uncovered(backend, q, k, False)
    out, lse = dash_attn_func(q, k, v, return_lse=True, backend=backend)
    good = make_backward_plan(
        problem_of(q, k, FULL), device=device_info(q.device), schedule="shift",
        backend=backend, timeout_s=0.2,
    )  # fmt: skip
    # Every rank + 1: the first contributor of each dQ tile waits for a turn that never comes.
    broken = broken_ranks(good)
    run_backward = backend_module(backend).run_backward
    with pytest.raises(RuntimeError, match="timed out.*'broken'"):
        run_backward(broken, torch.randn_like(q), q, k, v, out, lse, headdim**-0.5, sync_check=True)
    # The GPU is still usable afterwards.
    again = dash_attn_func(q, k, v, backend=backend)
    assert torch.isfinite(again.float()).all()


@pytest.mark.parametrize("headdim", [128, 256])
def test_hopper_dkv_sum_wait_times_out_with_nan_and_flag(headdim):
    """The GQA split's in-kernel dK/dV sums wait for their turn like the dQ adds: a turn that
    never comes (the dK/dV semaphores set past every rank before the launch) gives up after the
    plan's bound, raises the error flag and stores NaN, and the GPU stays usable (at head dim
    256 through the transposed accumulators' epilogue).

    ``fa3``'s tickets give each worker one chain here (fewer chains than workers), so dQ must
    stay finite: no chain runs after a timed-out epilogue. With two chains per worker (``auto``'s
    symmetric pairs) the first chain's 0.2 s timeout delays the second's dQ turns, and a dQ
    warp that starts its bounded wait at its ring slot (``early_turn``, the two-warp kernels at
    192/256) can time out on them too: NaN in dQ as well, the same error (session 42, call 2's
    probe)."""
    from dash_attn.backends.hopper.launch import _prepare
    from dash_attn.backends.triton.bwd import attn_bwd_preprocess

    batch, seqlen, heads, kv_heads = 1, 512, 4, 2
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, kv_heads, headdim, torch.bfloat16, "cuda", 5)
    _skip_if_uncovered("hopper", q, k, True)
    out, lse = dash_attn_func(q, k, v, causal=True, return_lse=True, backend="hopper")
    plan = make_backward_plan(
        problem_of(q, k, CAUSAL), device=device_info(q.device), schedule="fa3",
        backend="hopper", timeout_s=0.2,
    )  # fmt: skip
    assert plan.dkv_sum and plan.spec.num_chains <= plan.workers
    launch = _prepare(plan, q)
    main = getattr(launch, "main", launch)
    dout = torch.randn_like(q)
    lse2, delta = attn_bwd_preprocess(out, dout, lse, plan.spec.q_tiles * plan.tiles.block_m)
    zeroed = torch.zeros(main.dq_size + main.flag_count, device="cuda", dtype=torch.float32)
    dq_acc, flags = main.split_zeroed(zeroed)
    dq_sems = 2 + batch * heads * plan.spec.q_tiles
    flags[dq_sems:] = 1 << 20  # no dK/dV turn ever comes
    dk, dv = main.launch(q, k, v, dout, lse2, delta, dq_acc, flags, headdim**-0.5)
    torch.cuda.synchronize()
    assert int(flags[1]) == 1
    assert torch.isnan(dk.float()).all() and torch.isnan(dv.float()).all()
    assert torch.isfinite(dq_acc).all()
    again = dash_attn_func(q, k, v, causal=True, backend="hopper")
    assert torch.isfinite(again.float()).all()


@pytest.mark.parametrize("headdim", [128, 192])
def test_hopper_dkv_sum_out_of_order_raises_instead_of_hanging(headdim):
    """A static table whose worker runs q head 1's chain of a KV tile before q head 0's (whose
    dK/dV it must add after) on the same worker: the dK/dV wait gives up after the plan's bound,
    and the backward raises a RuntimeError naming the schedule, as a broken dQ order does."""
    batch, seqlen, heads, kv_heads = 1, 1024, 4, 2
    q, k, v = make_qkv(batch, seqlen, seqlen, heads, kv_heads, headdim, torch.bfloat16, "cuda", 9)
    _skip_if_uncovered("hopper", q, k, False)
    out, lse = dash_attn_func(q, k, v, return_lse=True, backend="hopper")
    good = make_backward_plan(
        problem_of(q, k, FULL), device=device_info(q.device), schedule="shift",
        backend="hopper", timeout_s=0.2,
    )  # fmt: skip
    assert good.dkv_sum
    sched = good.schedule
    lists = [sched.worker_chains(w) for w in range(sched.spec.workers)]
    first, second = sched.spec.chain_id(0, 0, 0), sched.spec.chain_id(0, 1, 0)
    lists = [[c for c in chains if c != first] for chains in lists]
    host = next(w for w, chains in enumerate(lists) if second in chains)
    lists[host].insert(lists[host].index(second) + 1, first)
    order = [c for chains in lists for c in chains]
    starts = np.cumsum([0] + [len(chains) for chains in lists])
    broken = dataclasses.replace(
        good,
        schedule=dataclasses.replace(sched, name="broken", order=order, worker_start=starts),
    )
    run_backward = backend_module("hopper").run_backward
    with pytest.raises(RuntimeError, match="dQ or dK/dV wait timed out.*'broken'"):
        run_backward(broken, torch.randn_like(q), q, k, v, out, lse, headdim**-0.5, sync_check=True)
    again = dash_attn_func(q, k, v, backend="hopper")
    assert torch.isfinite(again.float()).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph_matches_eager(backend):
    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            # Scaling by 2 is exact in bf16, so compiled and eager must agree bit for bit.
            return 2 * dash_attn_func(q, k, v, causal=True, backend=backend)

    block = Block()
    compiled = torch.compile(block, fullgraph=True)
    q, k, v = make_qkv(2, 300, 300, 4, 2, 128, torch.bfloat16, "cuda", 11)
    _skip_if_uncovered(backend, q, k, True)
    dout = torch.randn(2, 300, 4, 128, device="cuda", dtype=torch.bfloat16)
    eager = _grads(block, q, k, v, dout)
    comp = _grads(compiled, q, k, v, dout)
    for name, x, y in zip(GRADS, eager, comp, strict=True):
        assert torch.equal(x, y), f"compiled {name} differs from eager [{backend}]"


# From 512 tokens at head dims 192 and 256 auto runs both directions on hopper (until session 40
# the backward there was Triton's, reading the hopper forward's out and lse).
MIXED_SHAPES = [
    pytest.param((1, 520, 600, 4, 2, 192), id="b1-sq520-sk600-gqa4:2-d192"),
    pytest.param((1, 600, 530, 2, 1, 256), id="b1-sq600-sk530-mqa-d256"),
]


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[4], SHAPES[5], SHAPES[6], *MIXED_SHAPES])
def test_auto_backends_per_direction_match_reference(shape):
    """backend="auto" may run the forward on one backend and the backward on the other (their
    coverage differs by head dim): still right, and the plan says which backward ran and why."""
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim = shape
    q, k, v = make_qkv(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.bfloat16, "cuda", seed=9
    )
    dout = torch.randn_like(q)
    ref = _grads(lambda a, b, c: attention_ref(a, b, c, causal=True)[0], q, k, v, dout)
    same = _grads(
        lambda a, b, c: attention_ref(a, b, c, causal=True, upcast=False)[0], q, k, v, dout
    )
    got = _grads(_dash(True, "auto"), q, k, v, dout)
    plan = last_launch_info()
    assert plan.backend in ("triton", "hopper") and plan.backend_reason.startswith("auto")
    forward_backend, why = dash_attn.last_forward_backend()
    assert forward_backend in ("triton", "hopper") and why.startswith("auto")
    if headdim in (192, 256) and min(seqlen_q, seqlen_k) >= 512 and _fwd_gap(q, k) is None:
        assert (forward_backend, plan.backend) == ("hopper", "hopper"), (why, plan.backend_reason)
    for name, g, r, s in zip(GRADS, got, ref, same, strict=True):
        assert_close_to_ref(f"{name} [auto, d{headdim}, {plan.backend} bwd]", g, r, s, atol=1e-3)


@pytest.mark.parametrize("headdim", [96, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_forward_other_head_dims_match_reference(causal, headdim):
    """The hopper forward covers head dims its backward does not yet; by name it must be right
    (out and lse) on non-tile-multiple shapes, GQA, both masks, and repeat bitwise."""
    q, k, v = make_qkv(2, 333, 517, 4, 2, headdim, torch.bfloat16, "cuda", seed=headdim)
    _skip_if_uncovered_fwd(q, k)
    out, lse = torch.ops.dash_attn.fwd(q, k, v, causal, headdim**-0.5, "hopper")
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal)
    same_out, same_lse = attention_ref(q, k, v, causal=causal, upcast=False)
    tag = f"hopper fwd d{headdim} {'causal' if causal else 'full'}"
    assert_close_to_ref(f"out [{tag}]", out, ref_out, same_out, atol=1e-3)
    assert_close_to_ref(f"lse [{tag}]", lse, ref_lse, same_lse, atol=1e-3)
    again = torch.ops.dash_attn.fwd(q, k, v, causal, headdim**-0.5, "hopper")
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1]), f"{tag}: repeat differs"


@pytest.mark.parametrize("headdim", [64, 96])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_forward_192_row_tiles_match_reference(causal, headdim):
    """From FWD_3WG_MIN_SEQLEN query tokens (per mask and head dim) the hopper forward runs
    192-row tiles (three consumer warpgroups; at hd 96 with P through shared memory): right
    (out, lse) on a length that is no tile multiple, GQA, bitwise repeatable, and bitwise the
    128-row kernel's outputs (the same per-row arithmetic), so the length that picks the tile
    does not change the bits."""
    from dash_attn.backends.hopper import FWD_3WG_MIN_SEQLEN
    from dash_attn.backends.hopper.fwd_launch import hopper_fwd
    from dash_attn.backends.hopper.launch import forward_consumer_wgs, forward_persistent

    seqlen = max(FWD_3WG_MIN_SEQLEN["causal" if causal else "full"][headdim], 1000) + 1
    q, k, v = make_qkv(1, seqlen, seqlen, 2, 1, headdim, torch.bfloat16, "cuda", seed=3)
    _skip_if_uncovered_fwd(q, k)
    scale = headdim**-0.5
    assert forward_consumer_wgs(headdim, seqlen, causal) == 3
    out, lse = torch.ops.dash_attn.fwd(q, k, v, causal, scale, "hopper")
    again = torch.ops.dash_attn.fwd(q, k, v, causal, scale, "hopper")
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])
    persistent = forward_persistent(headdim, seqlen, causal)
    rows128 = hopper_fwd(q, k, v, causal=causal, softmax_scale=scale, persistent=persistent)
    assert torch.equal(out, rows128[0]) and torch.equal(lse, rows128[1])
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal)
    same_out, same_lse = attention_ref(q, k, v, causal=causal, upcast=False)
    tag = f"hopper fwd d{headdim}, 192 rows"
    assert_close_to_ref(f"out [{tag}]", out, ref_out, same_out, atol=1e-3)
    assert_close_to_ref(f"lse [{tag}]", lse, ref_lse, same_lse, atol=1e-3)


@pytest.mark.parametrize(
    "shape",
    [(2, 1000, 1000, 4, 4, 64), (1, 777, 1500, 6, 2, 128), (3, 1500, 700, 8, 1, 64),
     (4, 200, 333, 2, 2, 128), (1, 64, 64, 1, 1, 64), (2, 1000, 1500, 6, 2, 96)],
    ids=lambda s: "x".join(map(str, s)),
)  # fmt: skip
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_persistent_forward_matches_per_tile_kernel(shape, causal):
    """The persistent forward (one CTA per SM walking the tiles; causal: the host's tile lists)
    computes each tile as the per-tile kernel does: bitwise equal out and lse on tails, GQA,
    Sq != Sk (causal: rows that see no key) and fewer tiles than SMs, at both warpgroup counts
    at hd 64, the same bits again on a second call; and within the flash-attn rule."""
    from dash_attn.backends.hopper.fwd_launch import hopper_fwd

    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim = shape
    q, k, v = make_qkv(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.bfloat16, "cuda", seed=11
    )
    _skip_if_uncovered_fwd(q, k)
    scale = headdim**-0.5
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal)
    same_out, same_lse = attention_ref(q, k, v, causal=causal, upcast=False)
    for wgs in (2, 3) if headdim == 64 else (2,):
        per_tile = hopper_fwd(q, k, v, causal=causal, softmax_scale=scale, consumer_wgs=wgs)
        out, lse = hopper_fwd(
            q, k, v, causal=causal, softmax_scale=scale, consumer_wgs=wgs, persistent=True
        )
        assert torch.equal(out, per_tile[0]) and torch.equal(lse, per_tile[1]), wgs
        again = hopper_fwd(
            q, k, v, causal=causal, softmax_scale=scale, consumer_wgs=wgs, persistent=True
        )
        assert torch.equal(out, again[0]) and torch.equal(lse, again[1]), wgs
        name = f"[persistent fwd d{headdim}, {'causal' if causal else 'full'}, {wgs} warpgroups]"
        assert_close_to_ref(f"out {name}", out, ref_out, same_out, atol=1e-3)
        assert_close_to_ref(f"lse {name}", lse, ref_lse, same_lse, atol=1e-3)


@pytest.mark.parametrize(
    "shape",
    [(3, 1100, 1300, 6, 2, 256), (3, 1300, 1100, 6, 2, 192), (2, 700, 700, 5, 5, 256),
     (1, 5000, 4000, 4, 1, 192)],
    ids=lambda s: "x".join(map(str, s)),
)  # fmt: skip
def test_hopper_forward_lpt_order_keeps_the_bits(shape):
    """The causal forward at hd 192/256 launches its tiles in L2 groups, longest first
    (``lpt_order``, on up to ``FWD_LPT_ORDER_MAX_SEQLEN_K``): out and lse bitwise those of each
    head's tiles in turn (only which CTA runs a tile changes) on tails, GQA, MHA and
    Sq != Sk, repeatable, and within the flash-attn rule."""
    from dash_attn.backends.hopper.fwd_launch import hopper_fwd
    from dash_attn.backends.hopper.launch import forward_lpt_order

    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim = shape
    q, k, v = make_qkv(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.bfloat16, "cuda", seed=5
    )
    _skip_if_uncovered_fwd(q, k)
    assert forward_lpt_order(headdim, seqlen_k, True)
    scale = headdim**-0.5
    out, lse = torch.ops.dash_attn.fwd(q, k, v, True, scale, "hopper")
    head_order = hopper_fwd(q, k, v, causal=True, softmax_scale=scale, lpt_order=False)
    assert torch.equal(out, head_order[0]) and torch.equal(lse, head_order[1])
    again = torch.ops.dash_attn.fwd(q, k, v, True, scale, "hopper")
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])
    ref_out, ref_lse = attention_ref(q, k, v, causal=True)
    same_out, same_lse = attention_ref(q, k, v, causal=True, upcast=False)
    name = f"[lpt_order fwd d{headdim}]"
    assert_close_to_ref(f"out {name}", out, ref_out, same_out, atol=1e-3)
    assert_close_to_ref(f"lse {name}", lse, ref_lse, same_lse, atol=1e-3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_forward_p_smem_matches_reference(causal):
    """``p_smem`` (P through shared memory; the backend's choice at hd 96 with three consumer
    warpgroups, also run here with two): persistent and per tile, out and lse within the
    flash-attn rule on GQA with Sq != Sk, and bitwise repeatable."""
    from dash_attn.backends.hopper.fwd_launch import hopper_fwd

    q, k, v = make_qkv(2, 1000, 1500, 6, 2, 96, torch.bfloat16, "cuda", seed=13)
    _skip_if_uncovered_fwd(q, k)
    scale = 96**-0.5
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal)
    same_out, same_lse = attention_ref(q, k, v, causal=causal, upcast=False)
    for wgs in (2, 3):
        for persistent in (False, True):
            kwargs = dict(causal=causal, softmax_scale=scale, consumer_wgs=wgs, p_smem=True)
            out, lse = hopper_fwd(q, k, v, persistent=persistent, **kwargs)
            again = hopper_fwd(q, k, v, persistent=persistent, **kwargs)
            assert torch.equal(out, again[0]) and torch.equal(lse, again[1]), (wgs, persistent)
            name = f"[p_smem fwd d96, {wgs} warpgroups, persistent={persistent}]"
            assert_close_to_ref(f"out {name}", out, ref_out, same_out, atol=1e-3)
            assert_close_to_ref(f"lse {name}", lse, ref_lse, same_lse, atol=1e-3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_forward_tile_n_matches_reference(causal):
    """``tile_n`` (keys per block; the backend keeps ``TILE_N``): at hd 96 144- and 160-key
    blocks with 192-row tiles and P through shared memory (per tile) and 144 with 128-row
    tiles (persistent), out and lse within the flash-attn rule on GQA with Sq != Sk, and
    bitwise repeatable."""
    from dash_attn.backends.hopper.fwd_launch import hopper_fwd

    q, k, v = make_qkv(2, 1000, 1500, 6, 2, 96, torch.bfloat16, "cuda", seed=17)
    _skip_if_uncovered_fwd(q, k)
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal)
    same_out, same_lse = attention_ref(q, k, v, causal=causal, upcast=False)
    configs = [
        dict(tile_n=144, consumer_wgs=3, p_smem=True, persistent=False),
        dict(tile_n=160, consumer_wgs=3, p_smem=True, persistent=False),
        dict(tile_n=144, consumer_wgs=2, persistent=True),
    ]
    for kwargs in configs:
        out, lse = hopper_fwd(q, k, v, causal=causal, softmax_scale=96**-0.5, **kwargs)
        again = hopper_fwd(q, k, v, causal=causal, softmax_scale=96**-0.5, **kwargs)
        assert torch.equal(out, again[0]) and torch.equal(lse, again[1]), kwargs
        assert_close_to_ref(f"out [fwd d96 {kwargs}]", out, ref_out, same_out, atol=1e-3)
        assert_close_to_ref(f"lse [fwd d96 {kwargs}]", lse, ref_lse, same_lse, atol=1e-3)


def _fwd_gap(q: torch.Tensor, k: torch.Tensor) -> str | None:
    """Why the hopper forward cannot run q and k here (the mask does not change it), or None."""
    return hopper_unsupported(problem_of(q, k, CAUSAL), device_info(q.device), "fwd")


def _skip_if_uncovered_fwd(q: torch.Tensor, k: torch.Tensor) -> None:
    gap = _fwd_gap(q, k)
    if gap is not None:
        pytest.skip(f"hopper forward: {gap}")


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[4]])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_tma_dq_reduce_matches_atomics_bit_for_bit(shape, causal):
    """dq_reduce='tma' (bulk reductions) adds the same partials in the same order as 'atomic'."""
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim = shape
    q, k, v = make_qkv(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.bfloat16, "cuda", seed=5
    )
    dout = torch.randn_like(q)
    scale = headdim**-0.5
    out, lse = torch.ops.dash_attn.fwd(q, k, v, causal, scale)
    run_backward = backend_module("triton").run_backward
    for schedule in applicable_schedules(CAUSAL if causal else FULL):
        grads = {}
        for mode in ("atomic", "tma"):
            plan = make_backward_plan(
                problem_of(q, k, Mask(causal=causal)), device=device_info(q.device),
                schedule=schedule, backend="triton", dq_reduce=mode,
            )  # fmt: skip
            grads[mode] = run_backward(plan, dout, q, k, v, out, lse, scale, sync_check=True)
        for name, x, y in zip(("dq", "dk", "dv"), grads["tma"], grads["atomic"], strict=True):
            assert torch.equal(x, y), f"{name} [{schedule}]: tma reduction differs from atomics"
