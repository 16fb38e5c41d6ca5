"""The Triton kernels on the CPU, in Triton's interpreter: numerics, determinism, the bounded wait,
the custom ops and the launch report.

Run with ``TRITON_INTERPRET=1 python -m pytest -m interpreter`` (CI's second session). The variable
is read when the kernels are decorated, i.e. when dash_attn's kernel modules are imported, so this
module skips as a whole in a session that runs without it.

Interpreter limits these tests are shaped around:

* bf16 matmuls are wrong in the Triton 3.6 interpreter: float16 only.
* Programs run one after another, in program-id order. A ``dynamic`` schedule (``fa3``,
  ``descending``) always completes: a chain only waits on chains with a smaller ticket, which ran
  earlier. A ``static`` schedule (``shift``, ``symmetric_shift``) completes only if its worker
  lists, run back to back, meet every dQ rank in order; otherwise the plan refuses it in
  deterministic mode (``auto`` takes ``descending``). Which case a shape is in follows from the
  tables alone (``_static_completes_in_program_order``); the static tests assert it first. A wait
  that can never be met (a broken table) gives up after ``INTERPRETER_MAX_POLLS`` polls and
  raises RuntimeError.
* Tiles are 64/128 rows, so shapes stay small (seqlens 1..300) and deliberately not tile multiples.
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

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import dash_attn
from dash_attn import dash_attn_func
from dash_attn.backends.triton.launch import run_backward
from dash_attn.backends.triton.tiles import parse_tiles
from dash_attn.plan import CAUSAL, FULL, INTERPRETER, BackwardPlan, Problem, make_backward_plan
from dash_attn.reference.attention import attention_ref, causal_mask
from dash_attn.schedule import Dispatch
from dash_attn.testing import assert_close_to_ref, bitwise_equal, broken_ranks, make_qkv

pytestmark = [
    pytest.mark.interpreter,
    # Triton 3.6's interpreter turns 1-element arrays into scalars (NumPy < 2.4 only warns).
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

DTYPE = torch.float16  # bf16 matmuls are wrong in the Triton 3.6 interpreter
ATOL = 1e-3  # as the GPU tests
DYNAMIC_SCHEDULES = ["fa3", "descending"]
# Far above what a timed-out static backward takes here (about a second); only a hang reaches it.
DEADLINE_S = 120.0

# (batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal)
CASES = [
    pytest.param((2, 100, 100, 2, 2, 64, False), id="b2-s100-h2-d64-full"),
    pytest.param((2, 150, 150, 4, 2, 64, True), id="b2-s150-gqa4:2-d64-causal"),
    pytest.param((2, 150, 70, 4, 1, 64, True), id="b2-sq150-sk70-mqa4:1-d64-causal"),
    pytest.param((2, 70, 150, 4, 2, 128, True), id="b2-sq70-sk150-gqa4:2-d128-causal"),
    pytest.param((2, 33, 1, 4, 2, 64, True), id="b2-sq33-sk1-gqa4:2-d64-causal"),
    pytest.param((2, 1, 150, 4, 1, 128, False), id="b2-sq1-sk150-mqa4:1-d128-full"),
]
DETERMINISTIC = [
    pytest.param(True, id="det"),
    pytest.param(False, id="nondet"),
]


def _seed(shape: tuple) -> int:
    return sum(int(x) * 31**i for i, x in enumerate(shape)) % 10_000


def _inputs(shape: tuple) -> tuple[torch.Tensor, ...]:
    """q, k, v (leaves, no grad) and dout for ``shape``, the same on every call."""
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, _ = shape
    seed = _seed(shape)
    q, k, v = make_qkv(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, DTYPE, "cpu", seed, requires_grad=False
    )
    gen = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(q.shape, generator=gen).to(DTYPE)
    return q, k, v, dout


def _run(fn: Callable, q, k, v, dout) -> dict[str, torch.Tensor]:
    """out, lse, dq, dk, dv of ``fn(q, k, v) -> (out, lse)`` through autograd."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out, lse = fn(q, k, v)
    out.backward(dout)
    return {
        "out": out.detach(),
        "lse": lse.detach(),
        "dq": q.grad,
        "dk": k.grad,
        "dv": v.grad,
    }


def _plan(shape: tuple, schedule: str = "auto", **options: Any) -> BackwardPlan:
    """The plan the interpreter runs for ``shape`` (fp16, the interpreter's 4 workers)."""
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal = shape
    problem = Problem(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, CAUSAL if causal else FULL, "float16"
    )
    return make_backward_plan(problem, device=INTERPRETER, schedule=schedule, **options)


def _run_plan(shape: tuple, plan: BackwardPlan) -> dict[str, torch.Tensor]:
    """Gradients of ``shape``'s inputs by ``run_backward(plan)``, the forward by the op."""
    q, k, v, dout = _inputs(shape)
    headdim, causal = shape[5], shape[6]
    out, lse = torch.ops.dash_attn.fwd(q, k, v, causal, headdim**-0.5)
    dq, dk, dv = run_backward(plan, dout, q, k, v, out, lse, headdim**-0.5, sync_check=True)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def _run_dash(shape: tuple, **kwargs: Any) -> dict[str, torch.Tensor]:
    causal = shape[-1]
    return _run(
        lambda q, k, v: dash_attn_func(q, k, v, causal=causal, return_lse=True, **kwargs),
        *_inputs(shape),
    )


_REFS: dict[tuple, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}


def _references(shape: tuple) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(fp32 reference, same-dtype reference) for ``shape``, computed once."""
    if shape not in _REFS:
        causal = shape[-1]
        _REFS[shape] = tuple(
            _run(
                lambda q, k, v, up=upcast: attention_ref(q, k, v, causal=causal, upcast=up),
                *_inputs(shape),
            )
            for upcast in (True, False)
        )
    return _REFS[shape]


def _assert_matches_reference(got: dict[str, torch.Tensor], shape: tuple, label: str) -> None:
    ref, same = _references(shape)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert got[name].dtype == ref[name].dtype, f"{name} [{label}]: dtype"
        assert_close_to_ref(f"{name} [{label}]", got[name], ref[name], same[name], atol=ATOL)


def _static_completes_in_program_order(name: str, shape: tuple) -> bool:
    """Whether static schedule ``name`` finishes when its workers run one after another.

    Replays what the interpreter does: worker 0 runs all its chains, then worker 1, ...; a step
    whose dQ tile has not yet received ``rank`` contributions waits for one that never comes.
    """
    sched = _plan(shape, name, deterministic=False).schedule  # the plan refuses det ones that block
    assert sched.dispatch is Dispatch.STATIC
    added: dict[tuple[int, int, int], int] = defaultdict(int)
    completes = True
    for worker in range(len(sched.worker_start) - 1):
        for chain in sched.worker_chains(worker):
            b = sched.chain_coords(chain)[0]
            for q_head, q_tile, rank in sched.chain_steps(chain):
                completes &= added[b, q_head, q_tile] == rank
                added[b, q_head, q_tile] += 1
    return completes


def _within_deadline(fn: Callable[[], Any], seconds: float = DEADLINE_S) -> Any:
    """``fn()``, failing (instead of hanging the session) if it runs longer than ``seconds``.

    A hung call is left behind in a daemon thread; the test fails either way.
    """
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds:.0f} s: the bounded wait hangs"
    if "error" in result:
        raise result["error"]
    return result.get("value")


# ---------------------------------------------------------------------------------------------
# 1. numerics against the fp32 reference


@pytest.mark.parametrize("deterministic", DETERMINISTIC)
@pytest.mark.parametrize("schedule", DYNAMIC_SCHEDULES)
@pytest.mark.parametrize("shape", CASES)
def test_matches_fp32_reference(shape, schedule, deterministic):
    got = _run_dash(shape, schedule=schedule, deterministic=deterministic)
    _assert_matches_reference(got, shape, f"{schedule}, deterministic={deterministic}")

    info = dash_attn.last_launch_info()
    assert (info.schedule_name, info.dispatch) == (schedule, "dynamic")

    _, seqlen_q, seqlen_k, _, _, _, causal = shape
    for name, x in got.items():
        if name != "lse":
            assert torch.isfinite(x).all(), f"{name} has non-finite values"
    if causal and seqlen_q > seqlen_k:
        # Rows that see no key: output 0, LSE -inf, no gradient.
        empty = ~causal_mask(seqlen_q, seqlen_k).any(dim=1)
        assert empty.any()
        assert (got["out"][:, empty] == 0).all()
        assert torch.isneginf(got["lse"][:, :, empty]).all()
        assert (got["dq"][:, empty] == 0).all()
        assert torch.isfinite(got["lse"][:, :, ~empty]).all()
    else:
        assert torch.isfinite(got["lse"]).all()


# ---------------------------------------------------------------------------------------------
# 2. determinism


@pytest.mark.parametrize("schedule", DYNAMIC_SCHEDULES)
@pytest.mark.parametrize(
    "shape",
    [
        pytest.param((2, 150, 150, 4, 2, 64, True), id="b2-s150-gqa4:2-d64-causal"),
        pytest.param((2, 70, 150, 4, 1, 128, False), id="b2-sq70-sk150-mqa4:1-d128-full"),
    ],
)
def test_two_runs_bitwise_equal(shape, schedule):
    first = _run_dash(shape, schedule=schedule, deterministic=True)
    again = _run_dash(shape, schedule=schedule, deterministic=True)
    for name in first:
        assert torch.equal(first[name], again[name]), f"{name} differs between two runs"
        assert bitwise_equal(first[name], again[name]), f"{name}: bits differ (signed zero?)"


@pytest.mark.parametrize(
    "shape, flags",
    [
        pytest.param((1, 70, 150, 4, 2, 96, True), "a", id="d96-causal-tables-ahead"),
        pytest.param((1, 70, 150, 4, 2, 96, True), "r", id="d96-causal-release-after-qk"),
        pytest.param((1, 130, 90, 2, 1, 96, False), "ar", id="d96-full-both"),
    ],
)
def test_tile_options_give_the_same_bits(shape, flags):
    """The tile options of BackwardTiles (step tables read ahead, release after the first matmul)
    move loads and the hand-off, never the summation order: the same bits as without them."""
    plain = _run_plan(shape, _plan(shape, "fa3", tiles=parse_tiles("64x128w8s2")))
    plan = _plan(shape, "fa3", tiles=parse_tiles(f"64x128w8s2{flags}"))
    assert (plan.tiles.tables_ahead, plan.tiles.release_after_qk) == ("a" in flags, "r" in flags)
    optioned = _run_plan(shape, plan)
    for name in plain:
        assert bitwise_equal(optioned[name], plain[name]), f"{name}: tiles option {flags} differs"


@pytest.mark.parametrize(
    "shape, schedule",
    [
        pytest.param((2, 150, 150, 4, 2, 64, True), "descending", id="gqa4:2-d64-causal"),
        pytest.param((1, 70, 150, 6, 2, 96, False), "fa3", id="gqa6:2-sq70-sk150-d96-full"),
        pytest.param((2, 150, 70, 4, 1, 64, True), "descending", id="mqa4:1-sq150-sk70-causal"),
    ],
)
def test_gqa_split_is_the_mha_backward_of_repeated_kv_summed_in_head_order(shape, schedule):
    """A GQA backward split by q head (the default) is, bit for bit, the MHA backward of K/V
    repeated per q head (the same tables: one chain per q head) followed by the fixed-order
    group sum; and with the split off it still meets the rule (one chain per kv head)."""
    from dash_attn.backends.triton.group_sum import sum_kv_groups

    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal = shape
    split = _plan(shape, schedule)
    assert split.gqa_split and split.spec.kv_heads == heads
    got = _run_plan(shape, split)

    group = heads // kv_heads
    q, k, v, dout = _inputs(shape)
    mha_shape = (batch, seqlen_q, seqlen_k, heads, heads, headdim, causal)
    mha = _plan(mha_shape, schedule)
    assert not mha.gqa_split and mha.schedule.spec == split.schedule.spec
    k_rep, v_rep = (x.repeat_interleave(group, dim=2) for x in (k, v))
    out, lse = torch.ops.dash_attn.fwd(q, k_rep, v_rep, causal, headdim**-0.5)
    dq, dk_heads, dv_heads = run_backward(
        mha, dout, q, k_rep, v_rep, out, lse, headdim**-0.5, sync_check=True
    )
    dk, dv = sum_kv_groups(dk_heads, dv_heads, kv_heads)
    for name, want in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert bitwise_equal(got[name], want), f"{name}: split differs from repeated K/V"

    whole = _run_plan(shape, _plan(shape, schedule, gqa_split=False))
    _assert_matches_reference(whole, shape, f"{schedule}, gqa_split=False")
    assert not torch.equal(whole["dk"], got["dk"])  # another summation order, other bits


@pytest.mark.parametrize("gqa_split", [None, True, False])
def test_gqa_split_option_of_the_api(gqa_split):
    """``dash_attn_func(gqa_split=...)`` reaches the plan (None and True split, False keeps one
    chain per kv head), each meets the rule, and the split's bits are the plan-level run's."""
    shape = (2, 150, 150, 4, 2, 64, True)
    got = _run_dash(shape, schedule="descending", gqa_split=gqa_split)
    plan = dash_attn.last_launch_info()
    assert plan.gqa_split is (gqa_split is not False)
    assert plan.spec.kv_heads == (4 if plan.gqa_split else 2)
    _assert_matches_reference(got, shape, f"gqa_split={gqa_split}")
    direct = _run_plan(shape, _plan(shape, "descending", gqa_split=gqa_split))
    for name in ("dq", "dk", "dv"):
        assert bitwise_equal(got[name], direct[name]), f"{name}: API and plan differ"


def test_group_sum_adds_in_q_head_order():
    """``sum_kv_groups``: fp32 sum of each group's 16-bit partials from q head 0 up, one
    rounding: equal to that loop in torch, and not to the reverse order (one group is made so
    that the orders differ: 2**-20 + 32768 - 32768 is 0 in fp32, -32768 + 32768 + 2**-20 is
    not)."""
    from dash_attn.backends.triton.group_sum import sum_kv_groups

    gen = torch.Generator().manual_seed(5)
    dk_part = torch.randn(2, 7, 6, 40, generator=gen).half()
    dv_part = torch.randn(2, 7, 6, 40, generator=gen).half()
    dk_part[1, 3, 3:6] = torch.tensor([2.0**-20, 32768.0, -32768.0]).half()[:, None]
    dk, dv = sum_kv_groups(dk_part, dv_part, 2)
    for part, got in ((dk_part, dk), (dv_part, dv)):
        grouped = part.view(2, 7, 2, 3, 40).float()
        want = grouped[:, :, :, 0] + grouped[:, :, :, 1] + grouped[:, :, :, 2]
        assert got.dtype == torch.float16 and got.shape == (2, 7, 2, 40)
        assert bitwise_equal(got, want.half())
    reverse = dk_part.view(2, 7, 2, 3, 40).float().flip(3)
    reverse = (reverse[:, :, :, 0] + reverse[:, :, :, 1] + reverse[:, :, :, 2]).half()
    assert (dk[1, 3, 1] == 0).all() and (reverse[1, 3, 1] == 2.0**-20).all()
    with pytest.raises(ValueError, match="kv_heads"):
        sum_kv_groups(dk_part, dv_part, 4)
    with pytest.raises(ValueError, match="dv_part"):
        sum_kv_groups(dk_part, dv_part[..., :20].contiguous(), 2)


def test_broadcast_dout_gives_the_bits_of_its_copy():
    """A gradient with zero strides (a headdim vector broadcast over batch, seqlen and heads, as
    the gradient of ``out.sum((0, 1, 2))``) is read through its strides: same bits as a copy."""
    shape = (1, 70, 90, 2, 1, 64, True)
    q, k, v, _ = _inputs(shape)
    dout = torch.linspace(-1, 1, 64, dtype=DTYPE).expand(q.shape)

    def run(grad: torch.Tensor) -> dict[str, torch.Tensor]:
        return _run(
            lambda a, b, c: dash_attn_func(a, b, c, causal=True, schedule="fa3", return_lse=True),
            q, k, v, grad,
        )  # fmt: skip

    broadcast, copied = run(dout), run(dout.contiguous())
    for name in copied:
        assert bitwise_equal(broadcast[name], copied[name]), name


@pytest.mark.parametrize("shape", [(1, 70, 90, 2, 1, 192, True), (1, 90, 70, 2, 2, 256, False)])
def test_backward_from_another_forwards_out_and_lse(shape):
    """The backward reads out and lse as the ops' contract gives them (out like q; lse a
    contiguous fp32 (batch, heads, seqlen_q) tensor, natural log), whichever forward made them
    (auto picks each direction's backend on its own; until session 40 it ran the hopper forward
    and this backward at head dims 192 and 256). Fed the fp32 reference's out and lse, it gives
    the reference gradients within the rule."""
    q, k, v, dout = _inputs(shape)
    batch, seqlen_q, _, heads, _, headdim, causal = shape
    ref, same = _references(shape)
    out, lse = ref["out"], ref["lse"].contiguous()
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert lse.shape == (batch, heads, seqlen_q)
    grads = torch.ops.dash_attn.bwd(
        dout, q, k, v, out, lse, causal, headdim**-0.5, True, "fa3", 0, "triton"
    )
    for name, got in zip(("dq", "dk", "dv"), grads, strict=True):
        label = f"{name} [another forward's out and lse, d{headdim}]"
        assert_close_to_ref(label, got, ref[name], same[name], atol=ATOL)


def test_bf16_is_refused_with_the_reason():
    # The interpreter's bf16 tl.dot is wrong (max error ~8e8 on this shape), with no warning.
    q, k, v = make_qkv(1, 70, 90, 2, 2, 64, torch.bfloat16, "cpu", 0, requires_grad=False)
    with pytest.raises(NotImplementedError, match=r"bfloat16 .*interpreter.*float16"):
        dash_attn_func(q, k, v, causal=True)
    # The custom ops refuse too (callers that skip dash_attn_func).
    with pytest.raises(NotImplementedError, match=r"bfloat16 .*interpreter"):
        torch.ops.dash_attn.fwd(q, k, v, True, 0.125)


# ---------------------------------------------------------------------------------------------
# 3. static schedules: one that would block in program order is refused, never timed out


@pytest.mark.parametrize(
    "schedule, shape",
    [
        pytest.param("shift", (1, 150, 150, 2, 2, 64, False), id="shift-b1-s150-h2-d64-full"),
        pytest.param(
            "symmetric_shift",
            (1, 100, 257, 2, 1, 64, True),
            id="symshift-b1-sq100-sk257-d64-causal",
        ),
    ],
)
def test_static_schedule_that_would_block_is_refused(schedule, shape):
    assert not _static_completes_in_program_order(schedule, shape), (
        "precondition: the schedule's worker lists, run one after another, must block"
    )
    # Refused by the plan, before any launch: no timed-out wait blaming a concurrent kernel.
    with pytest.raises(NotImplementedError, match="one after another"):
        _within_deadline(lambda: _run_dash(shape, schedule=schedule, deterministic=True))
    # auto runs a dynamic schedule for the same shape, and it is right.
    got = _run_dash(shape, schedule="auto", deterministic=True)
    assert (dash_attn.last_launch_info().schedule_name, dash_attn.last_launch_info().dispatch) == (
        "descending",
        "dynamic",
    )
    _assert_matches_reference(got, shape, "auto where the static schedule would block")


@pytest.mark.parametrize(
    "schedule, shape",
    [
        pytest.param("shift", (2, 40, 150, 4, 2, 64, False), id="shift-b2-sq40-sk150-d64-full"),
        pytest.param(
            "symmetric_shift", (2, 150, 150, 4, 2, 64, True), id="symshift-b2-s150-gqa4:2-causal"
        ),
    ],
)
def test_static_schedule_that_never_blocks_completes_correctly(schedule, shape):
    # Not every static schedule blocks here: when the worker lists, run back to back, already
    # meet every rank in order, the static path completes and must be right.
    assert _static_completes_in_program_order(schedule, shape), "precondition"
    got = _within_deadline(lambda: _run_dash(shape, schedule=schedule, deterministic=True))
    _assert_matches_reference(got, shape, schedule)
    info = dash_attn.last_launch_info()
    assert (info.schedule_name, info.dispatch) == (schedule, "static")


def test_non_deterministic_static_schedule_does_not_wait():
    # deterministic=False adds dQ with plain atomics: no semaphore, so no wait to time out.
    shape = (1, 150, 150, 2, 2, 64, False)
    assert not _static_completes_in_program_order("shift", shape)
    got = _within_deadline(lambda: _run_dash(shape, schedule="shift", deterministic=False))
    _assert_matches_reference(got, shape, "shift, deterministic=False")


def test_broken_dynamic_table_times_out_instead_of_hanging():
    # Every rank + 1: the first contributor of each dQ tile waits for a turn that never comes,
    # even with dynamic dispatch (as the GPU test of the same name).
    shape = (1, 150, 150, 2, 2, 64, False)
    good = _plan(shape, "fa3")
    broken = broken_ranks(good)
    with pytest.raises(RuntimeError, match="timed out.*'broken'"):
        _within_deadline(lambda: _run_plan(shape, broken))
    # The failure is reported once, not again, and the next backward works.
    dash_attn.check_errors()
    got = _run_dash(shape, schedule="fa3", deterministic=True)
    _assert_matches_reference(got, shape, "fa3 after a timed-out backward")


# ---------------------------------------------------------------------------------------------
# 4. the custom ops


def _op_inputs(causal: bool) -> tuple[torch.Tensor, ...]:
    return _inputs((2, 70, 100, 4, 2, 64, causal))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck_fwd(causal):
    # Every default test_util (schema, autograd registration, fake tensor, AOT dispatch with
    # dynamic shapes) runs here in a few seconds, so no subset is needed.
    q, k, v, _ = _op_inputs(causal)
    torch.library.opcheck(torch.ops.dash_attn.fwd.default, (q, k, v, causal, 0.125))


@pytest.mark.parametrize("deterministic", DETERMINISTIC)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck_bwd(causal, deterministic):
    # Dynamic schedule only: a static one may time out in the interpreter (see the module doc).
    q, k, v, dout = _op_inputs(causal)
    out, lse = torch.ops.dash_attn.fwd(q, k, v, causal, 0.125)
    torch.library.opcheck(
        torch.ops.dash_attn.bwd.default,
        (dout, q, k, v, out, lse, causal, 0.125, deterministic, "fa3", 0, "auto"),
    )


def _check_fake_shapes(q, k, v, dout, expect_type: type | None) -> None:
    batch, seqlen_q, heads, _ = q.shape
    out, lse = torch.ops.dash_attn.fwd(q, k, v, True, 0.125)
    assert (out.shape, out.dtype, out.device) == (q.shape, q.dtype, q.device)
    assert (lse.shape, lse.dtype, lse.device) == ((batch, heads, seqlen_q), torch.float32, q.device)
    grads = torch.ops.dash_attn.bwd(dout, q, k, v, out, lse, True, 0.125, True, "fa3", 0, "auto")
    for name, g, x in zip(("dq", "dk", "dv"), grads, (q, k, v), strict=True):
        assert (g.shape, g.dtype, g.device) == (x.shape, x.dtype, x.device), name
    if expect_type is not None:
        assert all(isinstance(t, expect_type) for t in (out, lse, *grads))


def test_fake_implementations_under_fake_tensor_mode():
    real = _inputs((2, 70, 150, 4, 2, 128, True))
    with FakeTensorMode() as mode:
        fake = tuple(mode.from_tensor(x) for x in real)
        _check_fake_shapes(*fake, expect_type=torch._subclasses.fake_tensor.FakeTensor)


def test_fake_implementations_on_meta_tensors():
    real = _inputs((2, 150, 70, 4, 1, 64, True))
    _check_fake_shapes(*(x.to("meta") for x in real), expect_type=None)


# ---------------------------------------------------------------------------------------------
# 5. the launch report


@pytest.mark.parametrize(
    "schedule, deterministic, causal, expected",
    [
        pytest.param("fa3", True, False, ("fa3", "dynamic"), id="fa3-det-full"),
        pytest.param("descending", False, True, ("descending", "dynamic"), id="desc-nondet-causal"),
        # One Q tile and one KV tile: a single chain per (batch, kv head), every rank 0, so even
        # a static schedule completes in the interpreter.
        pytest.param("auto", True, False, ("shift", "static"), id="auto-det-full"),
        pytest.param("auto", False, True, ("symmetric_shift", "static"), id="auto-nondet-causal"),
    ],
)
def test_last_launch_info(schedule, deterministic, causal, expected, monkeypatch):
    monkeypatch.setattr(dash_attn.dispatch, "_last_plan", None)  # nothing left from other tests
    shape = (2, 50, 60, 4, 2, 64, causal)
    _run_dash(shape, schedule=schedule, deterministic=deterministic)
    info = dash_attn.last_launch_info()
    assert info is not None
    assert (info.schedule_name, info.dispatch) == expected
    assert info.deterministic is deterministic
    assert info.spec.mask.causal is causal
    # GQA 4/2 split by q head (the default): the schedule of 4 chain heads.
    assert (info.spec.batch, info.spec.q_heads, info.spec.kv_heads) == (2, 4, 4)
    assert info.gqa_split and info.problem.kv_heads == 2
    assert info.backend == "triton" and info.device == INTERPRETER
    assert info.backend_reason.startswith("auto: hopper needs an sm_90 GPU")
    forward_backend, why = dash_attn.last_forward_backend()
    assert forward_backend == "triton" and why.startswith("auto: hopper needs an sm_90 GPU")
    assert 1 <= info.grid <= info.workers == INTERPRETER.sm_count
