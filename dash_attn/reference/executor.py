"""Run a ``Schedule`` tile by tile in PyTorch, with the semaphores the Triton kernel relies on.

This is an executable model of the deterministic backward kernel. It does not call the per-tile
math in bulk: it simulates ``spec.workers`` workers that each walk their chains step by step, and
every dQ partial is added into the fp32 (fp64 for fp64 inputs) dQ accumulator only when that dQ
tile's semaphore equals the step's rank, exactly as the kernel waits. A worker whose next step is
not yet allowed is blocked while the others advance; if every unfinished worker is blocked the
tables cannot run on the GPU either, and ``RuntimeError("deadlock ...")`` is raised.

Time is modelled in rounds: in each round every worker that holds a chain checks its semaphore
against the state left by the previous round (a step of one round cannot see another step of the
same round), and the ready ones execute one step. ``timing_seed`` lets a random subset of the ready
workers advance instead, to mimic uneven speeds: the result must not change, which is the point.

Glossary:
    chain c = (batch, kv_head, kv_tile): one KV tile's steps; dK/dV accumulate across them.
    step = (q_head, q_tile, rank): one tile task; its dQ partial is the ``rank``-th addition into
        dQ tile (batch, q_head, q_tile).
    static dispatch: worker w runs ``order[worker_start[w]:worker_start[w + 1]]`` in that order.
    dynamic dispatch: a free worker takes the next ticket t and runs chain ``order[t]``.

Per step (rows R of Q tile i, rows C of KV tile j, one query head; padded to full tiles, with the
mask ``spec.mask.keeps(r, c, seqlen_q, seqlen_k)``: flash-attn's row rule, windows included, with
each sequence's own lengths for packed (varlen) input)::

    P = exp(scale * Q_R K_C^T - lse_R)   (0 where masked)
    dV_C += P^T dO_R
    dS = P * (dO_R V_C^T - delta_R)
    dK_C += dS^T Q_R                     (times scale once, when the chain ends)
    dQ_R += dS K_C                       (ordered; times scale once, at the end)

Deferring ``scale`` to the end of an accumulation is what flash-attn does (it multiplies dQaccum in
its postprocess and dK at the epilogue). For 16-bit inputs the matmul operands are rounded to the
input dtype, as ``tl.dot`` consumes them, and accumulated in float32.

Grouped-query attention split by q head (a schedule whose spec has as many kv heads as q heads,
``plan.BackwardPlan.gqa_split``): chain head ``h`` reads K/V of kv head ``h // group``. Its dK/dV
are added per kv head in q-head order: with ``spec.dkv_sum_group > 1`` as the hopper kernel does
(a chain's end waits until the (batch, kv head, KV tile) semaphore equals its q head's rank in
the group, then adds its dK/dV into an accumulator in the compute dtype, rounded once at the
end; the wait blocks its worker like a step's), otherwise from partials rounded to the input
dtype, summed after the run in the compute dtype (``group_sum.sum_kv_groups``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from dataclasses import dataclass, field

import torch

from ..schedule.types import Dispatch, Schedule, ScheduleSpec
from .attention import compute_dtype

__all__ = ["ScheduleRun", "execute_schedule_backward", "run_schedule_backward"]


@dataclass
class ScheduleRun:
    """Result of ``run_schedule_backward``.

    Attributes:
        dq, dk, dv: gradients, in the dtype of q, k, v.
        dq_additions: dQ tile id (``spec.dq_tile_id``) -> ``(chain, rank)`` of each addition, in
            the order the additions actually happened. Tiles that no step touches are absent.
        dkv_additions: with dK/dV sums (``spec.dkv_sum_group > 1``), (batch, kv head, KV tile)
            -> the q-head ranks of its chains in the order their dK/dV were added.
        rounds: simulated time, in steps of one worker.
        stalls: worker-rounds spent holding a chain whose next step had to wait on a semaphore.
        steps: number of steps executed (equals ``spec.num_tasks()``).
    """

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dq_additions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    dkv_additions: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)
    rounds: int = 0
    stalls: int = 0
    steps: int = 0


@dataclass
class _Worker:
    chain: int = -1  # -1: idle
    step: int = 0  # index of the next step within the chain
    queue: list[int] = field(default_factory=list)  # static dispatch: chains still to run


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Zero-pad dim 1 (the sequence) to ``rows``: the kernel's masked loads return zeros there."""
    extra = rows - x.shape[1]
    if extra == 0:
        return x
    pad = x.new_zeros((x.shape[0], extra, *x.shape[2:]))
    return torch.cat([x, pad], dim=1)


def _check_matches(
    schedule: Schedule, q: torch.Tensor, k: torch.Tensor, spec: ScheduleSpec
) -> None:
    got = schedule.spec
    if got != spec:
        raise ValueError(
            f"schedule {schedule.name!r} was built for {got}, but q {tuple(q.shape)} and "
            f"k {tuple(k.shape)} with these block sizes need {spec}"
        )


def _lengths(cu_seqlens: torch.Tensor, name: str) -> list[int]:
    if cu_seqlens.ndim != 1 or len(cu_seqlens) < 2:
        raise ValueError(f"{name} must be a 1-d tensor of batch + 1 offsets")
    offsets = [int(x) for x in cu_seqlens.tolist()]
    lengths = [hi - lo for lo, hi in zip(offsets[:-1], offsets[1:], strict=True)]
    if offsets[0] != 0 or min(lengths) < 0:
        raise ValueError(f"{name} must start at 0 and be non-decreasing, got {offsets}")
    return lengths


def _unpack(x: torch.Tensor, cu: list[int], rows: int) -> torch.Tensor:
    """Packed ``(total, ...)`` rows -> a zero-padded ``(batch, rows, ...)`` batch."""
    out = x.new_zeros((len(cu) - 1, rows, *x.shape[1:]))
    for b in range(len(cu) - 1):
        out[b, : cu[b + 1] - cu[b]] = x[cu[b] : cu[b + 1]]
    return out


def _pack(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """A padded ``(batch, rows, ...)`` batch -> packed ``(sum(lengths), ...)`` rows."""
    return torch.cat([x[b, :n] for b, n in enumerate(lengths)], dim=0)


def run_schedule_backward(
    schedule: Schedule,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    *,
    softmax_scale: float | None,
    block_m: int,
    block_n: int,
    timing_seed: int | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
) -> ScheduleRun:
    """Execute ``schedule`` step by step and report gradients plus the observed dQ order.

    Arguments:
        schedule: tables for the tile-level shape of these tensors with these block sizes;
            the mask (``schedule.spec.mask``, windows included), the worker count and
            ``invariant`` are taken from it.
        q: (batch_size, seqlen_q, nheads, headdim), or (total_q, nheads, headdim) with
            ``cu_seqlens_q`` (varlen: sequence b is rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``).
        k, v: (batch_size, seqlen_k, nheads_k, headdim), or (total_k, nheads_k, headdim).
        out: like q, the forward output.
        lse: (batch_size, nheads, seqlen_q), or (nheads, total_q) for varlen: the forward
            logsumexp (``-inf`` for rows that see no key).
        dout: like q.
        softmax_scale: float or None (1 / sqrt(headdim)).
        block_m, block_n: rows per Q tile and per KV tile.
        timing_seed: None for lockstep rounds; an int lets a random non-empty subset of the ready
            workers advance in each round (uneven worker speeds).
        cu_seqlens_q, cu_seqlens_k: batch + 1 row offsets for packed sequences (both or none).
    Return:
        ScheduleRun with dq, dk, dv (shaped like q, k, v), the addition order per dQ tile and
        round/stall counts.
    Raises:
        ValueError: the schedule was built for another shape or block size, or bad cu_seqlens.
        RuntimeError: the tables deadlock (every unfinished worker waits on a semaphore).
    """
    spec_in = schedule.spec
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k go together (varlen), or neither")
    varlen = cu_seqlens_q is not None and cu_seqlens_k is not None
    heads, headdim = q.shape[-2], q.shape[-1]
    kv_heads = k.shape[-2]
    if varlen:
        lengths_q = _lengths(cu_seqlens_q, "cu_seqlens_q")  # type: ignore[arg-type]
        lengths_k = _lengths(cu_seqlens_k, "cu_seqlens_k")  # type: ignore[arg-type]
        if len(lengths_q) != len(lengths_k):
            raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length")
        seqlens = list(zip(lengths_q, lengths_k, strict=True))
        spec = ScheduleSpec.from_seqlens(
            seqlens=seqlens,
            q_heads=heads,
            kv_heads=kv_heads,
            block_m=block_m,
            block_n=block_n,
            mask=spec_in.mask,
            workers=spec_in.workers,
            invariant=spec_in.invariant,
        )
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
        seqlen_k = k.shape[1]
        seqlens = [(seqlen_q, seqlen_k)] * batch
        spec = ScheduleSpec.from_shape(
            batch=batch,
            seqlen_q=seqlen_q,
            seqlen_k=seqlen_k,
            q_heads=heads,
            kv_heads=kv_heads,
            block_m=block_m,
            block_n=block_n,
            mask=spec_in.mask,
            workers=spec_in.workers,
            invariant=spec_in.invariant,
        )
    # A GQA split's schedule has a chain per q head (as many "kv heads" as q heads).
    split = spec_in.kv_heads == heads and kv_heads < heads
    if split:
        spec = dataclasses.replace(
            spec, kv_heads=heads, dkv_sum_group=spec_in.dkv_sum_group
        )  # a spec of the same tiles and lengths, one chain head per q head
    _check_matches(schedule, q, k, spec)
    group = heads // kv_heads  # q heads per K/V head
    sums = spec.dkv_sum_group > 1
    batch = spec.batch
    scale = 1.0 / math.sqrt(headdim) if softmax_scale is None else float(softmax_scale)

    work = compute_dtype(q.dtype)
    low_precision = q.dtype in (torch.float16, torch.bfloat16)

    def operand(x: torch.Tensor) -> torch.Tensor:
        # tl.dot takes 16-bit operands and accumulates in fp32: round, then compute in fp32.
        return x.to(q.dtype).to(work) if low_precision else x

    rows_q = spec.q_tiles * block_m
    rows_k = spec.kv_tiles * block_n
    # The preprocess kernel: delta = rowsum(dO * O), padded with zeros.
    delta_rows = (dout.detach().to(work) * out.detach().to(work)).sum(-1)
    # Empty rows carry lse = -inf; every entry of such a row is masked, so a finite stand-in
    # keeps exp() from producing inf (and inf * 0 = NaN) before the mask zeroes it.
    lse_rows = lse.detach().to(work)
    lse_rows = torch.where(torch.isneginf(lse_rows), 0.0, lse_rows)
    if varlen:
        cu_q = [0, *itertools.accumulate(lengths_q)]
        cu_k = [0, *itertools.accumulate(lengths_k)]
        qp, dop = (_unpack(x.detach().to(work), cu_q, rows_q) for x in (q, dout))
        kp, vp = (_unpack(x.detach().to(work), cu_k, rows_k) for x in (k, v))
        delta = _unpack(delta_rows, cu_q, rows_q)
        lse_w = _unpack(lse_rows.transpose(0, 1), cu_q, rows_q)  # (b, rows, h)
    else:
        qp, dop = (_pad_rows(x.detach().to(work), rows_q) for x in (q, dout))
        kp, vp = (_pad_rows(x.detach().to(work), rows_k) for x in (k, v))
        delta = _pad_rows(delta_rows, rows_q)
        lse_w = _pad_rows(lse_rows.transpose(1, 2), rows_q)  # (b, sq, h)

    dq_accum = torch.zeros((batch, rows_q, heads, headdim), dtype=work, device=q.device)
    # Per chain head: the kv heads', or with a GQA split the q heads' (partials or, with sums,
    # unused: the sums go straight into dk_sum / dv_sum of the kv heads).
    dk_out = torch.zeros((batch, rows_k, spec.kv_heads, headdim), dtype=work, device=q.device)
    dv_out = torch.zeros_like(dk_out)
    dk_sum = torch.zeros((batch, rows_k, kv_heads, headdim), dtype=work, device=q.device)
    dv_sum = torch.zeros_like(dk_sum)
    dkv_semaphore: dict[tuple[int, int, int], int] = {}

    local_r = torch.arange(block_m, device=q.device).unsqueeze(1)
    local_c = torch.arange(block_n, device=q.device).unsqueeze(0)

    def tile_mask(b: int, q_tile: int, kv_tile: int) -> torch.Tensor:
        r = q_tile * block_m + local_r
        c = kv_tile * block_n + local_c
        return spec.mask.keeps(r, c, *seqlens[b])  # the one row rule, windows included

    # Per-chain dK/dV accumulators, alive while a worker holds the chain (the kernel's registers).
    acc_dk: dict[int, torch.Tensor] = {}
    acc_dv: dict[int, torch.Tensor] = {}
    semaphore = [0] * (spec.batch * spec.q_heads * spec.q_tiles)
    run = ScheduleRun(dq=dq_accum, dk=dk_out, dv=dv_out)
    chain_steps = [schedule.chain_steps(c) for c in range(schedule.num_chains)]

    def execute(chain: int, index: int) -> None:
        b, kv_head, kv_tile = schedule.chain_coords(chain)
        q_head, q_tile, rank = chain_steps[chain][index]
        rq = slice(q_tile * block_m, (q_tile + 1) * block_m)
        rk = slice(kv_tile * block_n, (kv_tile + 1) * block_n)
        q_t = operand(qp[b, rq, q_head])
        do_t = operand(dop[b, rq, q_head])
        kv_in = kv_head // group if split else kv_head
        k_t = operand(kp[b, rk, kv_in])
        v_t = operand(vp[b, rk, kv_in])
        s = (q_t @ k_t.T) * scale
        p = torch.exp(s - lse_w[b, rq, q_head].unsqueeze(1))
        p = torch.where(tile_mask(b, q_tile, kv_tile), p, 0.0)
        dp = do_t @ v_t.T
        ds = p * (dp - delta[b, rq, q_head].unsqueeze(1))
        acc_dv[chain] += operand(p).T @ do_t
        acc_dk[chain] += operand(ds).T @ q_t
        # The ordered part: only here does the semaphore matter.
        dq_id = spec.dq_tile_id(b, q_head, q_tile)
        if semaphore[dq_id] != rank:
            raise RuntimeError(f"executor bug: a step of dQ tile {dq_id} ran before its turn")
        dq_accum[b, rq, q_head] += operand(ds) @ k_t
        semaphore[dq_id] += 1
        run.dq_additions.setdefault(dq_id, []).append((chain, rank))
        run.steps += 1

    def sum_turn(chain: int) -> tuple[tuple[int, int, int], int]:
        """The (batch, kv head, KV tile) of a chain's dK/dV sum and its rank there."""
        b, head, kv_tile = schedule.chain_coords(chain)
        return (b, head // spec.dkv_sum_group, kv_tile), head % spec.dkv_sum_group

    def finish(chain: int) -> None:
        b, kv_head, kv_tile = schedule.chain_coords(chain)
        rk = slice(kv_tile * block_n, (kv_tile + 1) * block_n)
        if not sums:
            dk_out[b, rk, kv_head] = acc_dk.pop(chain) * scale
            dv_out[b, rk, kv_head] = acc_dv.pop(chain)
            return
        key, rank = sum_turn(chain)
        if dkv_semaphore.get(key, 0) != rank:
            raise RuntimeError(f"executor bug: the dK/dV of chain {chain} added before its turn")
        dk_sum[b, rk, key[1]] += acc_dk.pop(chain) * scale
        dv_sum[b, rk, key[1]] += acc_dv.pop(chain)
        dkv_semaphore[key] = rank + 1
        run.dkv_additions.setdefault(key, []).append(rank)

    def ready(chain: int, index: int) -> bool:
        if index == len(chain_steps[chain]):  # a sum's chain, waiting to add its dK/dV
            key, rank = sum_turn(chain)
            return dkv_semaphore.get(key, 0) == rank
        b, _, _ = schedule.chain_coords(chain)
        q_head, q_tile, rank = chain_steps[chain][index]
        return semaphore[spec.dq_tile_id(b, q_head, q_tile)] == rank

    def wait_text(w: int, chain: int, index: int) -> str:
        if index == len(chain_steps[chain]):
            key, rank = sum_turn(chain)
            return (
                f"worker {w} chain {chain} waits to add its dK/dV to (b, kv_head, kv_tile) = "
                f"{key} at rank {rank}, semaphore is {dkv_semaphore.get(key, 0)}"
            )
        b, _, _ = schedule.chain_coords(chain)
        q_head, q_tile, rank = chain_steps[chain][index]
        dq_id = spec.dq_tile_id(b, q_head, q_tile)
        return (
            f"worker {w} chain {chain} step {index} waits for dQ tile {dq_id} "
            f"(b={b}, q_head={q_head}, q_tile={q_tile}) at rank {rank}, "
            f"semaphore is {semaphore[dq_id]}"
        )

    workers = [_Worker() for _ in range(spec.workers)]
    if schedule.dispatch is Dispatch.STATIC:
        for w, worker in enumerate(workers):
            lo, hi = int(schedule.worker_start[w]), int(schedule.worker_start[w + 1])
            worker.queue = schedule.order[lo:hi].tolist()[::-1]  # reversed: pop() takes the next
    tickets = schedule.order.tolist()[::-1] if schedule.dispatch is Dispatch.DYNAMIC else []
    rng = random.Random(timing_seed) if timing_seed is not None else None

    def take_chain(worker: _Worker) -> None:
        # Skip empty chains at once: they hold no semaphore and add nothing.
        while worker.chain < 0:
            source = worker.queue if schedule.dispatch is Dispatch.STATIC else tickets
            if not source:
                return
            chain = source.pop()
            if chain_steps[chain]:
                worker.chain, worker.step = chain, 0
                acc_dk[chain] = torch.zeros((block_n, headdim), dtype=work, device=q.device)
                acc_dv[chain] = torch.zeros_like(acc_dk[chain])

    while True:
        for worker in workers:
            take_chain(worker)
        active = [w for w, worker in enumerate(workers) if worker.chain >= 0]
        if not active:
            break
        # Decide from the state at the start of the round, then apply: a step cannot see a
        # semaphore released in the same round (the model of equal-length steps).
        go = [w for w in active if ready(workers[w].chain, workers[w].step)]
        if not go:
            waits = [wait_text(w, workers[w].chain, workers[w].step) for w in active]
            raise RuntimeError(
                f"deadlock in schedule {schedule.name!r} after {run.steps} of "
                f"{sum(len(s) for s in chain_steps)} steps: " + "; ".join(waits)
            )
        run.rounds += 1
        run.stalls += len(active) - len(go)
        if rng is not None:
            chosen = [w for w in go if rng.random() < 0.5]
            go = chosen or [rng.choice(go)]
        for w in go:
            worker = workers[w]
            steps = len(chain_steps[worker.chain])
            if worker.step < steps:
                execute(worker.chain, worker.step)
                worker.step += 1
                if worker.step < steps or sums:
                    # A sum's chain keeps its worker after its last step: its dK/dV go in at
                    # its turn, a step of its own (index ``steps``, see ready()).
                    continue
            finish(worker.chain)
            worker.chain = -1

    if split and not sums:
        # The partials, rounded as the kernel stores them, added per kv head in q-head order.
        for out_, partials in ((dk_sum, dk_out), (dv_sum, dv_out)):
            rounded = partials.to(k.dtype).to(work)
            for h in range(heads):
                out_[:, :, h // group] += rounded[:, :, h]
    dk_all, dv_all = (dk_sum, dv_sum) if split else (dk_out, dv_out)
    if varlen:
        run.dq = (_pack(dq_accum, lengths_q) * scale).to(q.dtype)
        run.dk = _pack(dk_all, lengths_k).to(k.dtype)
        run.dv = _pack(dv_all, lengths_k).to(v.dtype)
    else:
        run.dq = (dq_accum[:, : seqlens[0][0]] * scale).to(q.dtype)
        run.dk = dk_all[:, : seqlens[0][1]].to(k.dtype)
        run.dv = dv_all[:, : seqlens[0][1]].to(v.dtype)
    return run


def execute_schedule_backward(
    schedule: Schedule,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    *,
    softmax_scale: float | None,
    block_m: int,
    block_n: int,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward computed by executing ``schedule`` (see ``run_schedule_backward``).

    Return:
        dq, dk, dv, each with the shape and dtype of q, k, v.
    """
    run = run_schedule_backward(
        schedule,
        q,
        k,
        v,
        out,
        lse,
        dout,
        softmax_scale=softmax_scale,
        block_m=block_m,
        block_n=block_n,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
    )
    return run.dq, run.dk, run.dv
