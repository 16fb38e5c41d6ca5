"""The backward plan: one frozen decision per (problem, options, device), made without torch."""

from __future__ import annotations

import dataclasses
import doctest
import subprocess
import sys

import pytest

import dash_attn.plan
from dash_attn.backends.triton.tiles import backward_tiles, parse_tiles
from dash_attn.plan import (
    CAUSAL,
    FULL,
    H200,
    INTERPRETER,
    BackwardPlan,
    DeviceInfo,
    Mask,
    Problem,
    analysis_device,
    make_backward_plan,
)
from dash_attn.schedule import TABLE_FIELDS, Dispatch, make_schedule
from dash_attn.schedule.generators import auto_schedule_name

PROBLEM = Problem(batch=2, seqlen_q=1000, seqlen_k=700, heads=8, kv_heads=2, headdim=128)


def test_docstring_example() -> None:
    assert doctest.testmod(dash_attn.plan).failed == 0


def test_plan_holds_what_the_kernel_runs() -> None:
    plan = make_backward_plan(PROBLEM, device=H200, backend="triton")
    assert plan.backend == "triton" and plan.backend_reason == "asked for by name"
    assert plan.tiles == backward_tiles(128, "tma")
    assert plan.dq_reduce == "tma" and plan.deterministic
    assert plan.schedule_name == "shift" and plan.dispatch is Dispatch.STATIC
    spec = plan.spec
    assert (spec.q_tiles, spec.kv_tiles, spec.workers) == (16, 6, 132)
    expected = make_schedule("shift", spec)
    assert all(
        (getattr(plan.schedule, name) == getattr(expected, name)).all() for name in TABLE_FIELDS
    )
    # GQA 8/2 runs one chain per q head (gqa_split): 2 batches x 8 heads x 6 KV tiles.
    assert plan.gqa_split and (spec.q_heads, spec.kv_heads) == (8, 8)
    assert plan.grid == spec.num_chains == 2 * 8 * 6
    assert "shift" in plan.describe() and "b2 sq1000 sk700" in plan.describe()
    assert "dk/dv per q head" in plan.describe() and "h8/2" in plan.describe()


def test_gqa_split_is_a_rule_of_the_head_counts() -> None:
    """Split by default whenever heads > kv_heads (batch, lengths and workers play no part, so
    the order-invariance contract holds); False keeps one chain per kv head; MHA has nothing
    to split; anything but a bool or None is refused."""
    whole = make_backward_plan(PROBLEM, device=H200, backend="triton", gqa_split=False)
    assert not whole.gqa_split and whole.spec.kv_heads == 2 and whole.grid == 2 * 2 * 6
    assert "per q head" not in whole.describe()
    for batch, workers in ((1, 132), (7, 132), (1, 40)):
        problem = Problem(batch, 3000, 3000, heads=28, kv_heads=4, headdim=128, mask=CAUSAL)
        plan = make_backward_plan(problem, device=analysis_device(workers), backend="triton")
        assert plan.gqa_split and plan.spec.kv_heads == 28
    mha = Problem(2, 1000, 700, heads=8, kv_heads=8, headdim=128)
    for option in (None, True, False):
        assert not make_backward_plan(mha, device=H200, gqa_split=option).gqa_split
    with pytest.raises(TypeError, match="gqa_split"):
        make_backward_plan(PROBLEM, device=H200, gqa_split=1)  # type: ignore[arg-type]


def test_deterministic_hopper_plan_sums_dkv_in_the_kernel() -> None:
    """The deterministic hopper kernel adds a split group's dK/dV itself, in q-head order
    (``spec.dkv_sum_group``); its non-deterministic kernel and the Triton one write per-q-head
    partials. The tables' steps are the same either way (only the placement moves)."""
    summed = make_backward_plan(PROBLEM, device=H200, backend="hopper")
    assert summed.dkv_sum and summed.spec.dkv_sum_group == 4
    assert "dk/dv summed in the kernel" in summed.describe()
    for options in (
        dict(backend="hopper", deterministic=False),
        dict(backend="triton"),
        dict(backend="hopper", gqa_split=False),
    ):
        plan = make_backward_plan(PROBLEM, device=H200, **options)
        assert not plan.dkv_sum and plan.spec.dkv_sum_group == 1, options
    partials = make_backward_plan(PROBLEM, device=H200, backend="hopper", deterministic=False)
    assert (summed.schedule.step_rank == partials.schedule.step_rank).all()
    mha = Problem(2, 1000, 700, heads=8, kv_heads=8, headdim=128)
    assert not make_backward_plan(mha, device=H200, backend="hopper").dkv_sum
    with pytest.raises(ValueError, match="dkv_sum adds the dK/dV of a GQA split"):
        dash_attn.plan.backward_spec(mha, summed.tiles, 132, gqa_split=True, dkv_sum=True)


def test_plans_are_cached_per_arguments() -> None:
    assert make_backward_plan(PROBLEM, device=H200) is make_backward_plan(PROBLEM, device=H200)
    other = make_backward_plan(PROBLEM, device=H200, sm_margin=8, backend="triton")
    assert other.workers == 124 and other.schedule.spec.workers == 124


def test_dynamic_schedules_launch_at_most_one_program_per_sm() -> None:
    causal = Problem(4, 4096, 4096, 16, 16, 64, mask=CAUSAL)
    plan = make_backward_plan(causal, device=H200, schedule="descending", backend="triton")
    assert plan.dispatch is Dispatch.DYNAMIC and plan.grid == 132


def test_dq_reduce_follows_the_device() -> None:
    assert make_backward_plan(PROBLEM, device=INTERPRETER).dq_reduce == "atomic"
    ampere = DeviceInfo(sm_count=108, capability=(8, 0), name="A100")
    assert make_backward_plan(PROBLEM, device=ampere).dq_reduce == "atomic"
    with pytest.raises(ValueError, match="dq_reduce='tma' needs a Hopper"):
        make_backward_plan(PROBLEM, device=ampere, dq_reduce="tma")
    with pytest.raises(ValueError, match="dq_reduce must be one of"):
        make_backward_plan(PROBLEM, device=H200, dq_reduce="bulk")
    # The atomics path keeps two stages at head dim 128 (the block sizes are the same).
    atomic = make_backward_plan(PROBLEM, device=H200, dq_reduce="atomic", backend="triton")
    assert atomic.tiles.num_stages == 2
    assert atomic.spec == make_backward_plan(PROBLEM, device=H200, backend="triton").spec


def test_explicit_tiles_are_recorded_and_set_the_schedule() -> None:
    tiles = parse_tiles("64x64w8s2")
    plan = make_backward_plan(PROBLEM, device=H200, tiles=tiles, backend="triton")
    assert plan.tiles == tiles and plan.spec.kv_tiles == 11 and plan.spec.tile_ratio == 1


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(sm_margin=132), ValueError, "leaves no multiprocessor"),
        (dict(sm_margin=-1), ValueError, "sm_margin must be an int >= 0"),
        (dict(backend="cuda"), ValueError, "backend must be one of"),
        (dict(schedule="symmetric_shift"), ValueError, "for the causal mask"),
        (dict(timeout_s=0.0), ValueError, "timeout_s must be a positive"),
    ],
)
def test_bad_options_raise_naming_the_option(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        make_backward_plan(PROBLEM, device=H200, **kwargs)


def test_hopper_backend_by_name_or_a_clear_error() -> None:
    pytest.importorskip("cutlass")
    plan = make_backward_plan(PROBLEM, device=H200, backend="hopper")
    assert plan.backend == "hopper" and plan.tiles.block_n == 128 and plan.tiles.num_warps == 12
    # auto takes it at the head dims and lengths where it was measured faster, with the reason.
    long = Problem(2, 4096, 2048, 8, 2, 128)
    auto = make_backward_plan(long, device=H200)
    assert auto.backend == "hopper" and auto.backend_reason.startswith("auto: covered")
    with pytest.raises(ValueError, match="dq_reduce='atomic' is an option of the Triton"):
        make_backward_plan(long, device=H200, dq_reduce="atomic")
    assert make_backward_plan(PROBLEM, device=H200).backend == "hopper"  # seqlen_k 700
    short = make_backward_plan(Problem(2, 300, 4096, 8, 2, 128), device=H200)
    assert short.backend == "triton" and "below 512 tokens" in short.backend_reason
    with pytest.raises(NotImplementedError, match="backend='hopper' cannot run this bwd: needs"):
        make_backward_plan(PROBLEM, device=INTERPRETER, backend="hopper")
    odd = Problem(1, 100, 100, 2, 2, 80)
    with pytest.raises(NotImplementedError, match=r"bwd head dims \[64, 96, 128, 192, 256\], not"):
        make_backward_plan(odd, device=H200, backend="hopper")
    # Head dims 192 and 256: FA4's tiles there (session 40), auto from 512 tokens.
    for headdim, block_n in ((192, 96), (256, 48)):
        wide = make_backward_plan(Problem(2, 1024, 1024, 8, 2, headdim), device=H200)
        assert wide.backend == "hopper"
        assert (wide.tiles.block_m, wide.tiles.block_n) == (64, block_n)
        short = make_backward_plan(Problem(2, 300, 300, 8, 2, headdim), device=H200)
        assert short.backend == "triton" and "below 512 tokens" in short.backend_reason
    # Head dim 96: covered, and auto takes it from 512 tokens (session 37's sweep).
    d96 = Problem(2, 4096, 4096, 8, 2, 96)
    assert make_backward_plan(d96, device=H200).backend == "hopper"
    assert make_backward_plan(Problem(2, 300, 300, 8, 2, 96), device=H200).backend == "triton"
    unaligned = Problem(1, 100, 100, 2, 2, 128, tma_aligned=False)
    with pytest.raises(NotImplementedError, match="16-byte aligned"):
        make_backward_plan(unaligned, device=H200, backend="hopper")
    reason = make_backward_plan(unaligned, device=H200).backend_reason
    assert reason.startswith("auto: hopper needs 16-byte aligned")


def test_forward_backend_by_the_same_rules() -> None:
    """``auto`` runs the hopper forward at head dims 64, 96, 128, 192 and 256 from 512 tokens
    (where the forward sweeps measured it faster than Triton's), Triton below and at head dims
    it does not cover; the backward as well since session 40."""
    pytest.importorskip("cutlass")
    from dash_attn.backends import choose_forward_backend

    for headdim in (64, 96, 128, 192, 256):
        at = Problem(2, 512, 512, 8, 8, headdim)
        assert choose_forward_backend(at, H200, "auto")[0] == "hopper"
        below = Problem(2, 511, 4096, 8, 8, headdim)
        name, why = choose_forward_backend(below, H200, "auto")
        assert name == "triton" and "below 512 tokens" in why
    plan = make_backward_plan(Problem(2, 4096, 4096, 8, 8, 192), device=H200)
    assert plan.backend == "hopper" and plan.backend_reason.startswith("auto: covered")
    assert choose_forward_backend(Problem(2, 300, 300, 8, 8, 192), H200, "hopper")[0] == "hopper"
    name, why = choose_forward_backend(Problem(2, 4096, 4096, 8, 8, 80), H200, "auto")
    assert name == "triton" and "fwd head dims" in why


def test_auto_without_cutlass_runs_triton_and_says_why(monkeypatch) -> None:
    from dash_attn.backends import hopper

    monkeypatch.setattr(hopper, "cutlass_available", lambda: False)
    other = Problem(3, 2048, 2048, 2, 2, 64)  # not cached by the tests above
    plan = make_backward_plan(other, device=H200)
    assert plan.backend == "triton" and "nvidia-cutlass-dsl is not installed" in plan.backend_reason
    with pytest.raises(NotImplementedError, match="nvidia-cutlass-dsl is not installed"):
        make_backward_plan(other, device=H200, backend="hopper")


def test_bad_problems_raise() -> None:
    with pytest.raises(ValueError, match="Problem.heads"):
        Problem(1, 10, 10, heads=6, kv_heads=4, headdim=64)
    with pytest.raises(ValueError, match="Problem.dtype"):
        Problem(1, 10, 10, 1, 1, 64, dtype="float32")
    with pytest.raises(TypeError, match="Problem.mask must be a Mask"):
        Problem(1, 10, 10, 1, 1, 64, mask="causal")  # type: ignore[arg-type]


def test_flops_count_as_flash_attn() -> None:
    full = Problem(1, 1024, 1024, 16, 16, 128, mask=FULL)
    assert full.flops("fwd") == 4 * 16 * 1024 * 1024 * 128
    assert full.flops("bwd") == 2.5 * full.flops("fwd")
    causal = Problem(1, 1024, 1024, 16, 16, 128, mask=CAUSAL)
    assert causal.flops("bwd") == full.flops("bwd") / 2


def test_analysis_device_is_hopper_with_the_given_workers() -> None:
    device = analysis_device(32)
    assert device.sm_count == 32 and device.has_tma and not device.is_interpreter


def test_making_a_plan_imports_neither_torch_nor_triton() -> None:
    code = (
        "import sys; from dash_attn.plan import Problem, H200, make_backward_plan; "
        "make_backward_plan(Problem(1, 100, 100, 2, 2, 64), device=H200); "
        "print(sorted(m for m in ('torch', 'triton', 'cutlass') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_nondet_hopper_auto_takes_descending_where_listed() -> None:
    """A non-det hopper plan with schedule="auto" runs ``descending`` from the key lengths of
    ``hopper.NONDET_DESCENDING_MIN_SEQLEN_K`` on; below them, on the Triton backend, and in
    deterministic mode auto is the documented rule; a named schedule is kept."""
    from dash_attn.backends.hopper import NONDET_DESCENDING_MIN_SEQLEN_K

    def plan(headdim: int, mask: Mask, seqlen: int, **options) -> BackwardPlan:
        problem = Problem(2, seqlen, seqlen, 4, 2, headdim, mask)
        return make_backward_plan(problem, device=H200, **options)

    assert NONDET_DESCENDING_MIN_SEQLEN_K == {
        "full": {256: 1024}, "causal": {192: 8192, 256: 2048}
    }  # fmt: skip
    for headdim, mask, start in ((256, FULL, 1024), (256, CAUSAL, 2048), (192, CAUSAL, 8192)):
        fast = plan(headdim, mask, start, backend="hopper", deterministic=False)
        assert fast.schedule.name == "descending" and fast.dispatch is Dispatch.DYNAMIC
        below = plan(headdim, mask, start - 16, backend="hopper", deterministic=False)
        det = plan(headdim, mask, start, backend="hopper")
        assert below.schedule.name == det.schedule.name == auto_schedule_name(det.spec)
        assert det.schedule.name in ("shift", "symmetric_shift")
        named = plan(headdim, mask, start, backend="hopper", deterministic=False, schedule="fa3")
        assert named.schedule.name == "fa3"
        triton = plan(headdim, mask, start, backend="triton", deterministic=False)
        assert triton.schedule.name == auto_schedule_name(triton.spec)
    # Head dims 64-128 keep the rule (0.96-1.05x either way).
    assert plan(128, CAUSAL, 16384, backend="hopper", deterministic=False).schedule.name == (
        "symmetric_shift"
    )


def test_full_mask_auto_walks_down_from_tasks_and_an_area() -> None:
    """The full mask's deterministic ``auto`` per sequence: ``descending`` from
    ``DESCENDING_MIN_TASKS`` tile tasks and ``DESCENDING_MIN_AREA`` padded tokens squared,
    ``shift`` below. The area floor (session 45) keeps hd 256's small tiles (64 x 48: 21888
    tasks at 8k) on ``shift`` up to 10k tokens, where it measured 1.06x faster; d64 and d128
    keep the tasks rule."""
    from dash_attn.schedule.generators import DESCENDING_MIN_AREA, DESCENDING_MIN_TASKS

    def name(headdim: int, seqlen: int, backend: str = "hopper") -> str:
        problem = Problem(1, seqlen, seqlen, 4, 4, headdim, FULL)
        return make_backward_plan(problem, device=H200, backend=backend).schedule.name

    assert (DESCENDING_MIN_TASKS, DESCENDING_MIN_AREA) == (12288, 10240**2)
    for headdim in (64, 128, 192, 256):
        assert name(headdim, 8192) == "shift", headdim
        assert name(headdim, 16384) == "descending", headdim
    assert name(256, 10176) == "shift" and name(256, 10304) == "descending"
    assert name(192, 10176) == "shift" and name(192, 10304) == "descending"
    # The tasks rule binds first at d64 (128 x 128 tiles) and d128 (80 x 128).
    assert name(64, 12288) == "shift" and name(64, 14208) == "descending"
    assert name(128, 11040) == "shift" and name(128, 11200) == "descending"
    assert name(128, 12288, backend="triton") == "descending"


def _sweep_problem(headdim: int, causal: bool, seqlen: int) -> Problem:
    heads = 2048 // headdim
    return Problem(
        16384 // seqlen, seqlen, seqlen, heads, heads, headdim, CAUSAL if causal else FULL
    )


@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen", [1024, 8192])
def test_deterministic_hopper_plans_leave_sms_to_the_dq_cast(
    headdim: int, causal: bool, seqlen: int
) -> None:
    """At the sweep's shapes the static order-invariant tables have the same busiest worker on
    4 workers fewer, so deterministic hopper plans take them and leave those SMs to the dQ cast
    (``cast_sms``); the tables are the schedule's on 128 workers, and no worker has more steps
    than on 132."""
    problem = _sweep_problem(headdim, causal, seqlen)
    plan = make_backward_plan(problem, device=H200, backend="hopper")
    assert plan.dispatch is Dispatch.STATIC
    assert (plan.cast_sms, plan.workers, plan.grid) == (4, 128, 128)
    assert "dq cast beside it on 4 SMs" in plan.describe()
    full = make_schedule(plan.schedule_name, dataclasses.replace(plan.spec, workers=132))
    assert plan.schedule.busiest_worker_steps() == full.busiest_worker_steps()


def test_the_dq_cast_keeps_its_place_elsewhere() -> None:
    """No SMs are left to the cast where that would change bits or cost time, where the
    caller keeps SMs for other kernels, where the cast has nothing to wait for, or where it
    was not measured: worker-dependent tables, dynamic dispatch (d64 full 16k: descending),
    ``sm_margin``, in-kernel dK/dV sums (GQA), the Triton backend, a non-det kernel without
    turns (hd 256 from the non-det auto's descending length on), and where 4 workers fewer
    would give the busiest worker more steps (hd 256 full 1k). A small shape whose grid leaves
    SMs idle anyway keeps its tables."""
    short = _sweep_problem(64, False, 1024)

    def cast_sms(problem: Problem, **options) -> int:
        return make_backward_plan(problem, device=H200, **{"backend": "hopper", **options}).cast_sms

    assert cast_sms(short) == 4
    # (Non-det plans count their adds since session 59: test_counted_nondet_hopper_plans_...)
    assert cast_sms(short, deterministic=False) == 4
    long_256 = _sweep_problem(256, False, 4096)
    assert cast_sms(long_256) == 4
    assert cast_sms(long_256, deterministic=False, schedule="shift") == 0
    assert cast_sms(short, invariant=False) == 0
    assert cast_sms(short, sm_margin=4) == 0
    assert cast_sms(short, backend="triton") == 0
    long_full = make_backward_plan(_sweep_problem(64, False, 16384), device=H200, backend="hopper")
    assert long_full.dispatch is Dispatch.DYNAMIC and long_full.cast_sms == 0
    gqa = make_backward_plan(Problem(4, 1024, 1024, 32, 8, 64, FULL), device=H200, backend="hopper")
    assert gqa.dkv_sum and gqa.cast_sms == 0
    assert cast_sms(Problem(16, 1024, 1024, 32, 32, 96, FULL)) == 4
    assert cast_sms(_sweep_problem(256, False, 1024)) == 0
    # Here the tables on 4 workers fewer would give the busiest worker 2 more steps: the plan
    # keeps every worker and the cast after the kernel.
    plan = make_backward_plan(_sweep_problem(256, True, 2048), device=H200, backend="hopper")
    fewer = dataclasses.replace(plan.spec, workers=plan.spec.workers - 4)
    lean = make_schedule(plan.schedule.name, fewer)
    assert plan.cast_sms == 0 and plan.grid == plan.spec.workers == 132
    assert lean.busiest_worker_steps() == plan.schedule.busiest_worker_steps() + 2
    small = make_backward_plan(
        Problem(3, 777, 777, 8, 8, 64, CAUSAL), device=H200, backend="hopper"
    )
    assert small.workers == 132 and small.cast_sms == 132 - small.grid > 4


def test_a_hand_built_plan_with_cast_sms_it_cannot_poll_is_refused() -> None:
    """``cast_sms`` on a plan whose dQ cast cannot run beside the kernel (dynamic tickets,
    non-det, the Triton backend, in-kernel dK/dV sums, more SMs than the GPU has) raises
    ValueError naming the field when the plan is made, not deep in the launch (before session
    56 a dynamic plan failed in ``busiest_worker_steps`` at its first call)."""
    long_full = make_backward_plan(_sweep_problem(128, False, 16384), device=H200, backend="hopper")
    short = make_backward_plan(_sweep_problem(64, False, 1024), device=H200, backend="hopper")
    gqa = make_backward_plan(Problem(4, 1024, 1024, 32, 8, 64, FULL), device=H200, backend="hopper")
    # hd 256 full 4k: the non-det backward runs the kernel without turns there.
    det_256 = make_backward_plan(_sweep_problem(256, False, 4096), device=H200, backend="hopper")
    assert short.cast_sms == 4 and dataclasses.replace(short, cast_sms=4) == short
    assert det_256.cast_sms == 4
    bad = {
        "dispatches dynamically": lambda: dataclasses.replace(long_full, cast_sms=4),
        "non-deterministic": lambda: dataclasses.replace(det_256, deterministic=False),
        "runs its cast after": lambda: dataclasses.replace(short, backend="triton"),
        "sums dk/dv": lambda: dataclasses.replace(gqa, cast_sms=4),
        "exceed the device's 132 SMs": lambda: dataclasses.replace(short, cast_sms=5),
        ">= 0": lambda: dataclasses.replace(long_full, cast_sms=-1),
    }
    for reason, make in bad.items():
        with pytest.raises(ValueError, match=f"cast_sms.*{reason}"):
            make()


def test_counted_nondet_hopper_plans_leave_sms_to_the_dq_cast(monkeypatch) -> None:
    """Non-deterministic hopper backwards run counted kernels (``hopper.BWD_NONDET_TWIN``, since
    session 59) but at hd 256 from the non-det auto's descending length on: their plans leave
    SMs to the dQ cast as det plans do, on the same tables, and a hand-built non-det plan may
    carry ``cast_sms``. With the kernels without turns (``BWD_NONDET_UNCOUNTED``) neither."""
    from dash_attn.backends import hopper

    short = _sweep_problem(64, False, 1024)
    for headdim, causal, seqlen in ((64, False, 1024), (128, False, 4096), (128, True, 8192)):
        problem = _sweep_problem(headdim, causal, seqlen)
        assert hopper.nondet_counts_adds(headdim, causal, seqlen)
        nondet = make_backward_plan(problem, device=H200, backend="hopper", deterministic=False)
        det = make_backward_plan(problem, device=H200, backend="hopper")
        assert (nondet.cast_sms, nondet.grid) == (det.cast_sms, det.grid) == (4, 128)
        assert nondet.schedule.order.tolist() == det.schedule.order.tolist()
        assert nondet.schedule.worker_start.tolist() == det.schedule.worker_start.tolist()
    det = make_backward_plan(short, device=H200, backend="hopper")
    assert dataclasses.replace(det, deterministic=False).cast_sms == 4
    assert hopper.nondet_counts_adds(256, False, 512)
    assert not hopper.nondet_counts_adds(256, False, 1024)
    assert hopper.nondet_counts_adds(256, True, 1024)
    assert not hopper.nondet_counts_adds(256, True, 2048)
    # Still not beside a dynamic schedule, nor with sm_margin.
    long_full = _sweep_problem(64, False, 16384)
    plan = make_backward_plan(long_full, device=H200, backend="hopper", deterministic=False)
    assert plan.dispatch is Dispatch.DYNAMIC and plan.cast_sms == 0
    margin = make_backward_plan(
        short, device=H200, backend="hopper", deterministic=False, sm_margin=4
    )  # fmt: skip
    assert margin.cast_sms == 0
    monkeypatch.setattr(hopper, "BWD_NONDET_TWIN", dict(hopper.BWD_NONDET_UNCOUNTED))
    make_backward_plan.cache_clear()
    try:
        assert not hopper.nondet_counts_adds(64, False, 1024)
        plan = make_backward_plan(short, device=H200, backend="hopper", deterministic=False)
        assert plan.cast_sms == 0
        with pytest.raises(ValueError, match="cast_sms.*non-deterministic and its kernel does not"):
            dataclasses.replace(det, deterministic=False)
    finally:
        monkeypatch.undo()
        make_backward_plan.cache_clear()


@pytest.mark.parametrize("sm_count", [16, 17])
@pytest.mark.parametrize("seqlen,causal", [(2048, False), (4096, False), (4096, True)])
def test_a_gpu_of_few_sms_keeps_the_dq_cast_after(sm_count: int, seqlen: int, causal: bool) -> None:
    """On a GPU of 16 or 17 SMs (a MIG slice), 4 workers fewer cannot hold a group's 16
    lanes: the deterministic hopper plan keeps the tables on every SM and the cast after them,
    instead of refusing the call (it raised ValueError, "lower sm_margin", before session 53)."""
    problem = Problem(1, seqlen, seqlen, 16, 16, 128, CAUSAL if causal else FULL, "bfloat16")
    device = analysis_device(sm_count)
    plan = make_backward_plan(problem, device=device, backend="hopper")
    assert plan.cast_sms == 0 and plan.workers == sm_count
    on_every_sm = make_schedule(plan.schedule.name, plan.schedule.spec)
    for field in TABLE_FIELDS:
        assert (getattr(plan.schedule, field) == getattr(on_every_sm, field)).all()


def test_batch_times_heads_over_the_grid_axis_runs_on_triton() -> None:
    """The hopper backward's preprocess and dQ cast launch batch x heads on a grid's second
    axis (at most 65535): beyond it ``auto`` takes triton and says why, and asking for hopper
    is a clear error."""
    problem = Problem(2048, 512, 512, 32, 32, 64, CAUSAL, "bfloat16")
    plan = make_backward_plan(problem, device=H200)
    assert plan.backend == "triton" and "batch x heads (2048 x 32)" in plan.backend_reason
    with pytest.raises(NotImplementedError, match="batch x heads"):
        make_backward_plan(problem, device=H200, backend="hopper")
    within = dataclasses.replace(problem, batch=2047)
    assert make_backward_plan(within, device=H200).backend == "hopper"
