"""Every schedule, executed with semaphores in PyTorch, gives autograd's gradients in fp64.

The executor only lets a dQ partial in when its tile's semaphore equals the step's rank, so these
tests prove three things per schedule and shape: the tables cover exactly the tiles the mask needs
(gradients match), they run without deadlock under the worker model the kernel assumes, and every
dQ tile is summed in rank order whatever the timing.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import numpy as np
import pytest
import torch

from dash_attn.reference.attention import attention_ref
from dash_attn.reference.executor import execute_schedule_backward, run_schedule_backward
from dash_attn.schedule import Mask, ScheduleSpec, applicable_schedules, make_schedule
from dash_attn.testing import assert_close_to_ref, bitwise_equal, make_qkv

TOL = {"atol": 1e-10, "rtol": 0.0}


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    block_m: int
    block_n: int
    workers: int
    causal: bool
    headdim: int = 8

    @property
    def id(self) -> str:
        mask = "causal" if self.causal else "full"
        return (
            f"b{self.batch}-sq{self.seqlen_q}-sk{self.seqlen_k}-h{self.heads}-kv{self.kv_heads}"
            f"-bm{self.block_m}-bn{self.block_n}-w{self.workers}-{mask}"
        )

    def spec(self) -> ScheduleSpec:
        return ScheduleSpec.from_shape(
            batch=self.batch,
            seqlen_q=self.seqlen_q,
            seqlen_k=self.seqlen_k,
            q_heads=self.heads,
            kv_heads=self.kv_heads,
            block_m=self.block_m,
            block_n=self.block_n,
            mask=Mask(causal=self.causal),
            workers=self.workers,
            invariant=False,  # the worker-dependent tables these shapes were chosen for
        )


# (batch, seqlen_q, seqlen_k, heads, kv_heads, block_m, block_n, workers); each runs full and
# causal. Comments: what the shape is there for.
_SHAPES = [
    (1, 50, 50, 2, 2, 8, 8, 3),  # ragged square, fewer workers (3) than chains (14)
    (2, 37, 45, 4, 2, 8, 16, 64),  # GQA, tile ratio 2, sq < sk, more workers than chains
    (1, 45, 29, 3, 1, 8, 8, 5),  # MQA, sq > sk: causal rows with no key
    (2, 16, 40, 2, 1, 8, 16, 2),  # sq much shorter than sk, ratio 2
    (1, 33, 7, 2, 2, 4, 8, 4),  # sk < block_n: one ragged KV tile, most causal rows empty
    (1, 1, 19, 2, 1, 4, 4, 1),  # a single query row, a single worker
    (1, 21, 1, 1, 1, 4, 4, 2),  # a single key
    (2, 32, 32, 2, 2, 8, 16, 8),  # tile multiples, workers == chains
    (1, 24, 48, 2, 2, 8, 8, 12),  # more KV tiles than Q tiles (shift wraps onto busy tiles)
]
CASES = [Case(*shape, causal=causal) for shape in _SHAPES for causal in (False, True)]
CASE_SCHEDULES = [
    pytest.param(case, name, id=f"{case.id}-{name}")
    for case in CASES
    for name in applicable_schedules(case.spec())
]


@functools.cache
def _problem(case: Case) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """fp64 inputs (q, k, v, out, lse, dout) and autograd's (dq, dk, dv), computed once per case."""
    q, k, v = make_qkv(
        case.batch,
        case.seqlen_q,
        case.seqlen_k,
        case.heads,
        case.kv_heads,
        case.headdim,
        torch.float64,
        "cpu",
        seed=zlib.crc32(case.id.encode()),
    )
    out, lse = attention_ref(q, k, v, causal=case.causal)
    dout = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(7))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    inputs = tuple(t.detach() for t in (q, k, v, out, lse, dout))
    return inputs, grads


def _run(case: Case, name: str, timing_seed: int | None = None):
    inputs, _ = _problem(case)
    schedule = make_schedule(name, case.spec())
    return run_schedule_backward(
        schedule,
        *inputs,
        softmax_scale=None,
        block_m=case.block_m,
        block_n=case.block_n,
        timing_seed=timing_seed,
    )


def _check_rank_order(case: Case, run) -> None:
    spec = case.spec()
    schedule = make_schedule("fa3", spec)  # only for chain_coords, identical for every schedule
    for b in range(spec.batch):
        for h in range(spec.q_heads):
            for i in range(spec.q_tiles):
                added = run.dq_additions.get(spec.dq_tile_id(b, h, i), [])
                ranks = [rank for _, rank in added]
                assert ranks == list(range(len(ranks))), f"dQ tile (b={b}, h={h}, i={i}): {ranks}"
                kv_tiles = sorted(schedule.chain_coords(chain)[2] for chain, _ in added)
                assert kv_tiles == list(range(spec.kv_tiles_of(i))), (b, h, i, kv_tiles)
                kv_head = h // spec.group_size
                assert all(schedule.chain_coords(c)[:2] == (b, kv_head) for c, _ in added)
    assert run.steps == spec.num_tasks()


@pytest.mark.parametrize("case, name", CASE_SCHEDULES)
def test_matches_autograd_in_rank_order(case: Case, name: str):
    _, grads = _problem(case)
    run = _run(case, name)
    got_all = (run.dq, run.dk, run.dv)
    for label, got, expected in zip(("dq", "dk", "dv"), got_all, grads, strict=True):
        assert got.shape == expected.shape and got.dtype == torch.float64, label
        torch.testing.assert_close(got, expected, **TOL, msg=lambda m, label=label: f"{label}: {m}")
    _check_rank_order(case, run)


@pytest.mark.parametrize("case, name", CASE_SCHEDULES)
def test_uneven_timing_gives_identical_bits(case: Case, name: str):
    # Workers advance at random speeds; the semaphores must make the sums bit-for-bit the same.
    lockstep = _run(case, name)
    for seed in range(3):
        run = _run(case, name, timing_seed=seed)
        _check_rank_order(case, run)
        pairs = zip((run.dq, run.dk, run.dv), (lockstep.dq, lockstep.dk, lockstep.dv), strict=True)
        assert all(bitwise_equal(got, ref) for got, ref in pairs), f"timing seed {seed}"


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(case, id=case.id)
        for case in CASES
        if not case.causal
        and case.spec().kv_tiles <= case.spec().q_tiles
        and case.workers >= case.spec().num_chains
    ],
)
def test_shift_never_waits(case: Case):
    # The paper's Lemma 1: with one worker per chain and N <= M, the KV tiles of each step touch
    # distinct dQ tiles, so no semaphore ever blocks and the makespan is one chain's length.
    run = _run(case, "shift")
    spec = case.spec()
    assert run.stalls == 0
    assert run.rounds == spec.q_tiles * spec.group_size


def test_execute_returns_the_run_gradients():
    case = CASES[3]
    inputs, _ = _problem(case)
    got = execute_schedule_backward(
        make_schedule("fa3", case.spec()),
        *inputs,
        softmax_scale=None,
        block_m=case.block_m,
        block_n=case.block_n,
    )
    run = _run(case, "fa3")
    assert all(bitwise_equal(a, b) for a, b in zip(got, (run.dq, run.dk, run.dv), strict=True))


def _with_ranks(schedule, ranks: np.ndarray):
    return dataclasses.replace(schedule, step_rank=ranks)


def _reversed_ranks(schedule) -> np.ndarray:
    """Every dQ tile summed in the opposite order: rank r -> (count - 1 - r)."""
    dq = schedule.step_dq_tile()
    counts = np.bincount(dq)
    return counts[dq] - 1 - schedule.step_rank


def test_static_cycle_is_reported_as_deadlock():
    # shift, M = N = 2: chain 0 visits q0 then q1, chain 1 visits q1 then q0. Reversing the ranks
    # makes each chain's first step wait for the other chain's second step: a cycle.
    case = Case(1, 4, 4, 1, 1, 2, 2, 2, causal=False)
    inputs, _ = _problem(case)
    schedule = make_schedule("shift", case.spec())
    bad = _with_ranks(schedule, _reversed_ranks(schedule))
    with pytest.raises(RuntimeError, match=r"deadlock in schedule 'shift' after 0 of 4 steps"):
        execute_schedule_backward(bad, *inputs, softmax_scale=None, block_m=2, block_n=2)


def test_dynamic_wait_on_a_later_ticket_deadlocks_with_one_worker():
    # With reversed ranks chain 0 waits for chain 1, which is never dispatched while the only
    # worker holds chain 0. With two workers the same tables run.
    for workers, deadlocks in ((1, True), (2, False)):
        case = Case(1, 4, 4, 1, 1, 2, 2, workers, causal=False)
        inputs, grads = _problem(case)
        schedule = make_schedule("fa3", case.spec())
        bad = _with_ranks(schedule, _reversed_ranks(schedule))
        if deadlocks:
            with pytest.raises(RuntimeError, match="deadlock.*worker 0 chain 0 step 0"):
                execute_schedule_backward(bad, *inputs, softmax_scale=None, block_m=2, block_n=2)
        else:
            got = execute_schedule_backward(bad, *inputs, softmax_scale=None, block_m=2, block_n=2)
            for g, e in zip(got, grads, strict=True):
                torch.testing.assert_close(g, e, **TOL)


def test_schedule_for_another_shape_is_rejected():
    case = CASES[0]
    inputs, _ = _problem(case)
    other = dataclasses.replace(case, block_m=4, block_n=4)
    with pytest.raises(ValueError, match="schedule 'fa3' was built for"):
        execute_schedule_backward(
            make_schedule("fa3", other.spec()),
            *inputs,
            softmax_scale=None,
            block_m=case.block_m,
            block_n=case.block_n,
        )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_low_precision_meets_the_flash_attn_rule(dtype: torch.dtype, causal: bool):
    # 16-bit inputs as the kernel sees them: operands rounded to 16 bits, fp32 accumulation.
    case = Case(1, 40, 56, 4, 2, 8, 16, 6, causal=causal, headdim=16)
    q, k, v = make_qkv(1, 40, 56, 4, 2, 16, dtype, "cpu", seed=21)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out32, lse32 = attention_ref(q32, k32, v32, causal=causal)
    dout = torch.randn(out32.shape, generator=torch.Generator().manual_seed(22)).to(dtype)
    ref = torch.autograd.grad(out32, (q32, k32, v32), dout.float())
    out_same, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    same = torch.autograd.grad(out_same, (q, k, v), dout)

    schedule = make_schedule("auto", case.spec())
    got = execute_schedule_backward(
        schedule,
        q.detach(),
        k.detach(),
        v.detach(),
        out32.detach().to(dtype),
        lse32.detach(),
        dout,
        softmax_scale=None,
        block_m=case.block_m,
        block_n=case.block_n,
    )
    for label, g, r, s in zip(("dq", "dk", "dv"), got, ref, same, strict=True):
        assert g.dtype == dtype, label
        assert_close_to_ref(label, g, r, s, atol=1e-3)


# ------------------------------------------------------------------------------------------------
# Packed sequences (varlen) and sliding windows


def _window_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: list[tuple[int, int]],
    mask: Mask,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed fp64 attention, straight from ``Mask.keeps``: out (total_q, H, D), lse (H, total_q).
    Rows that see no key get out = 0 and lse = -inf, as flash-attn returns them."""
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    row_q = row_k = 0
    for seqlen_q, seqlen_k in lengths:
        qb = q[row_q : row_q + seqlen_q]
        kb = k[row_k : row_k + seqlen_k].repeat_interleave(group, dim=1)
        vb = v[row_k : row_k + seqlen_k].repeat_interleave(group, dim=1)
        scores = torch.einsum("mhd,nhd->hmn", qb, kb) * q.shape[-1] ** -0.5
        keep = mask.keeps(
            torch.arange(seqlen_q)[:, None], torch.arange(seqlen_k)[None, :], seqlen_q, seqlen_k
        )
        scores = scores.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # -inf for rows without a key
        finite = torch.where(torch.isneginf(lse), 0.0, lse)
        probs = torch.where(keep, torch.exp(scores - finite[..., None]), 0.0)
        outs.append(torch.einsum("hmn,nhd->mhd", probs, vb))
        lses.append(lse)
        row_q, row_k = row_q + seqlen_q, row_k + seqlen_k
    return torch.cat(outs), torch.cat(lses, dim=1)


PACK = [(13, 13), (0, 5), (30, 22), (7, 40), (9, 0), (17, 17)]
WINDOW_MASKS = [
    Mask(),
    Mask(causal=True),
    Mask(window_left=6, window_right=0),
    Mask(window_left=3, window_right=5),
    Mask(window_left=-1, window_right=2),
]


@pytest.mark.parametrize("mask", WINDOW_MASKS, ids=lambda m: m.name)
@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "worker-dependent"])
def test_varlen_and_windows_match_autograd(mask: Mask, invariant: bool):
    heads, kv_heads, headdim, block_m, block_n = 4, 2, 8, 4, 8
    generator = torch.Generator().manual_seed(5)
    total_q, total_k = sum(a for a, _ in PACK), sum(b for _, b in PACK)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(shape, dtype=torch.float64, generator=generator).requires_grad_()

    q, k, v = (
        draw(total_q, heads, headdim),
        draw(total_k, kv_heads, headdim),
        draw(total_k, kv_heads, headdim),
    )
    out, lse = _window_reference(q, k, v, PACK, mask)
    dout = torch.randn(out.shape, dtype=torch.float64, generator=generator)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    cu_q = torch.tensor([0, *np.cumsum([a for a, _ in PACK])], dtype=torch.int32)
    cu_k = torch.tensor([0, *np.cumsum([b for _, b in PACK])], dtype=torch.int32)
    spec = ScheduleSpec.from_seqlens(
        seqlens=PACK,
        q_heads=heads,
        kv_heads=kv_heads,
        block_m=block_m,
        block_n=block_n,
        mask=mask,
        workers=8,
        invariant=invariant,
    )
    inputs = (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), dout)
    for name in applicable_schedules(spec):
        schedule = make_schedule(name, spec)
        runs = [
            run_schedule_backward(
                schedule,
                *inputs,
                softmax_scale=None,
                block_m=block_m,
                block_n=block_n,
                timing_seed=seed,
                cu_seqlens_q=cu_q,
                cu_seqlens_k=cu_k,
            )
            for seed in (None, 1)
        ]
        got_all = (runs[0].dq, runs[0].dk, runs[0].dv)
        for label, got, expected in zip(("dq", "dk", "dv"), got_all, grads, strict=True):
            torch.testing.assert_close(
                got, expected, **TOL, msg=lambda m, x=f"{name} {label}": f"{x}: {m}"
            )
        assert runs[0].steps == spec.num_tasks()
        for a, b in ((runs[0].dq, runs[1].dq), (runs[0].dk, runs[1].dk)):
            assert bitwise_equal(a, b), name
        for tile, added in runs[0].dq_additions.items():
            assert [rank for _, rank in added] == list(range(len(added))), (name, tile)


def test_dense_window_matches_autograd():
    batch, seqlen_q, seqlen_k, heads = 2, 29, 35, 2
    mask = Mask(window_left=9, window_right=4)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads, 8, torch.float64, "cpu", seed=3)
    packed = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    out_p, lse_p = _window_reference(*packed, [(seqlen_q, seqlen_k)] * batch, mask)
    out = out_p.reshape(batch, seqlen_q, heads, -1)
    lse = torch.stack(lse_p.split(seqlen_q, dim=1))  # (b, h, sq)
    dout = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    spec = ScheduleSpec.from_shape(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        q_heads=heads,
        kv_heads=heads,
        block_m=8,
        block_n=8,
        mask=mask,
        workers=5,
    )
    for name in applicable_schedules(spec):
        got = execute_schedule_backward(
            make_schedule(name, spec),
            *(t.detach() for t in (q, k, v, out, lse)),
            dout,
            softmax_scale=None,
            block_m=8,
            block_n=8,
        )
        for g, e in zip(got, grads, strict=True):
            torch.testing.assert_close(g, e, **TOL)


def test_varlen_needs_both_offsets():
    case = CASES[0]
    inputs, _ = _problem(case)
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k go together"):
        execute_schedule_backward(
            make_schedule("fa3", case.spec()),
            *inputs,
            softmax_scale=None,
            block_m=case.block_m,
            block_n=case.block_n,
            cu_seqlens_q=torch.tensor([0, 50], dtype=torch.int32),
        )


# ------------------------------------------------------------------ GQA split by q head

_SPLIT_CASES = [case for case in CASES if case.heads > case.kv_heads]


def _split_spec(case: Case, sums: bool) -> ScheduleSpec:
    """The plan's GQA split: a chain per q head; with ``sums`` its dK/dV added in the kernel."""
    spec = dataclasses.replace(case.spec(), kv_heads=case.heads)
    return dataclasses.replace(spec, dkv_sum_group=case.heads // case.kv_heads) if sums else spec


@pytest.mark.parametrize("case", _SPLIT_CASES, ids=[c.id for c in _SPLIT_CASES])
def test_gqa_split_sums_and_partials_match_autograd_in_order(case: Case) -> None:
    """Both ways of adding a split group's dK/dV give autograd's gradients (fp64: the same bits
    either way, the partials' rounding being exact there); with the in-kernel sums every
    (batch, kv head, KV tile) receives its chains in q-head order under any timing, and the
    chain-end waits never deadlock, for every schedule."""
    inputs, grads = _problem(case)
    for name in applicable_schedules(case.spec()):
        partials = make_schedule(name, _split_spec(case, sums=False))
        summed = make_schedule(name, _split_spec(case, sums=True))
        kwargs = dict(softmax_scale=None, block_m=case.block_m, block_n=case.block_n)
        want = execute_schedule_backward(partials, *inputs, **kwargs)
        for got, expected in zip(want, grads, strict=True):
            torch.testing.assert_close(got, expected, **TOL)
        group = case.heads // case.kv_heads
        for seed in (None, 1, 2):
            run = run_schedule_backward(summed, *inputs, timing_seed=seed, **kwargs)
            got = (run.dq, run.dk, run.dv)
            assert all(bitwise_equal(x, y) for x, y in zip(got, want, strict=True)), (name, seed)
            assert run.dkv_additions and all(
                ranks == list(range(group)) for ranks in run.dkv_additions.values()
            ), (name, seed)


def test_gqa_split_in_16_bits_sums_match_the_repeated_kv_backward_in_dq() -> None:
    """bf16 inputs: dq of the split is the MHA backward's of K/V repeated per q head, bit for bit
    (the same tables), and dk/dv of both ways stay close to fp32's."""
    case = Case(2, 37, 45, 4, 2, 8, 16, 64, causal=True)
    q, k, v = make_qkv(2, 37, 45, 4, 2, 8, torch.bfloat16, "cpu", seed=3)
    out, lse = attention_ref(q, k, v, causal=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(q.dtype)
    inputs = (q, k, v, out.to(q.dtype), lse, dout)
    kwargs = dict(softmax_scale=None, block_m=8, block_n=16)
    k_rep, v_rep = (x.repeat_interleave(2, dim=2) for x in (k, v))
    mha = make_schedule("symmetric_shift", dataclasses.replace(case.spec(), kv_heads=4))
    dq_rep, _, _ = execute_schedule_backward(mha, q, k_rep, v_rep, *inputs[3:], **kwargs)
    ref = [g.to(torch.float32) for g in _fp32_grads(q, k, v, dout)]
    for sums in (False, True):
        split = make_schedule("symmetric_shift", _split_spec(case, sums))
        dq, dk, dv = execute_schedule_backward(split, *inputs, **kwargs)
        assert bitwise_equal(dq, dq_rep)
        assert all(torch.isfinite(g.float()).all() for g in (dk, dv))
        for got, r in zip((dk, dv), ref[1:], strict=True):
            torch.testing.assert_close(got.float(), r, atol=3e-2, rtol=3e-2)


def _fp32_grads(q, k, v, dout) -> tuple[torch.Tensor, ...]:
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    out, _ = attention_ref(qf, kf, vf, causal=True)
    return torch.autograd.grad(out, (qf, kf, vf), dout.float())


def test_gqa_split_sum_out_of_order_deadlocks() -> None:
    """One worker runs q head 1's chain of a KV tile before q head 0's: q head 1's dK/dV wait
    for q head 0's, which that worker never reaches."""
    case = Case(1, 8, 8, 2, 1, 8, 8, 1, causal=False)
    inputs, _ = _problem(case)
    schedule = make_schedule("shift", _split_spec(case, sums=True))
    broken = dataclasses.replace(schedule, order=schedule.order[::-1])
    with pytest.raises(RuntimeError, match="deadlock .* waits to add its dK/dV .* at rank 1"):
        run_schedule_backward(broken, *inputs, softmax_scale=None, block_m=8, block_n=8)
