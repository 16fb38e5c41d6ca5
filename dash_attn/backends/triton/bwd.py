"""Attention backward: one persistent kernel that executes any schedule's tables.

Glossary
--------
worker        one program of the persistent grid (grid = number of workers P)
chain         one KV tile (batch b, kv head, KV tile j): K_j, V_j are loaded once and dK_j, dV_j
              stay in registers while the chain walks its steps (all q heads of its GQA group)
step          (q head h, Q tile i, rank): recompute P for (i, j), add to dK_j / dV_j, and add the
              dQ partial dS_ij K_j into the fp32 accumulator of dQ tile (b, h, i)
rank          position of this contribution in the fixed summation order of that dQ tile
SEM           one int32 semaphore per dQ tile: the number of contributions already added
STATUS        int32 [2]: STATUS[0] = next dynamic ticket, STATUS[1] = error flag (1 = a wait
              timed out); zeroed before every launch together with SEM. A timed-out step goes on
              (adding NaN and releasing), so its successors are never stuck behind it.
DYNAMIC       chains are pulled as tickets from STATUS[0] (order[t] for ticket t, t < num_chains =
              the chains listed in order, fewer than the padded grid's for varlen); otherwise
              worker w runs order[worker_start[w]:worker_start[w + 1]]
DETERMINISTIC wait for SEM == rank, add; release SEM + 1 (after a barrier) in the next step
              (at its start, or with RELEASE_AFTER_QK after its first matmul), or at the end of
              the chain; a step never waits while it still holds an unreleased turn, so deferring
              adds no cycle. Otherwise add in arrival order (non-deterministic, same tables and
              work)
TIMED_WAIT    bound waits with %globaltimer (ns); the interpreter has no inline asm, so it
              bounds the number of polls instead
TABLES_AHEAD  the step tables are read one step ahead, so the next step's loads need not wait
              for a table load
LSE2, DELTA   per (batch x head, row) fp32, rows padded to q_tiles * BLOCK_M (no masks needed):
              LSE in log2 units with +inf for rows that saw no key or are padding (so that
              P = exp2(. - inf) = 0), and delta = rowsum(dO * O), 0 on padding rows. Varlen:
              per head, every sequence padded to a multiple of BLOCK_M rows, sequence b from
              row CU_ROWS_PAD[b] (index h * rows_pad_total + CU_ROWS_PAD[b] + row)
IS_VARLEN     packed sequences (constexpr): q/dO (total_q, H, D), k/v (total_k, Hkv, D), sequence
              b owns rows CU_SEQLENS[b] .. CU_SEQLENS[b + 1]; chain ids stay on the padded tile
              grid (b, kv head, j) and the row offsets and lengths are read per chain. The fp32
              dQ accumulator is padded like LSE2 (rows_pad_total, H, D), so a Q tile's rows never
              reach into the next sequence: its padding rows get exact zeros (P = 0 there), and
              a TMA tile ends where its sequence's padding does
WINDOW        a sliding window (constexpr): key n of row m is kept iff
              m + shift - window_left <= n <= m + shift + window_right (shift = seqlen_k -
              seqlen_q of the sequence; an unbounded side comes as utils.UNBOUNDED). The tables
              only list the (Q tile, KV tile) pairs the band meets; a chain with no step writes
              dK = dV = 0

The dQ partial is added with fp32 reductions performed at L2 in both modes (DQ_TMA: one TMA bulk
tensor reduction per step, the default on Hopper; otherwise vector atomics from every thread), so
a later contributor on another SM never reads a stale L1 line; inside the semaphore's critical
section the order of the additions is fixed, so the result is bitwise reproducible. Both forms add
the same fp32 values in the same order per element and give the same bits.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ...plan import BackwardPlan
from ...schedule import Dispatch, Mask
from . import _versions  # noqa: F401  (an unsupported Triton fails here, clearly)
from .utils import kernel_window, next_power_of_2
from .varlen import VarlenRows

# The interpreter has no clock: it bounds the number of polls instead (checked every 256 polls).
INTERPRETER_MAX_POLLS = 512

# Spin in PTX until *sem == rank or the deadline passes; $0 = 1 if it gave up. $4 is a value read
# earlier with acquire semantics: if it already is the turn, there is no poll at all. Every poll is
# an acquire load, which orders this thread's dQ adds after the predecessor's release without a
# fence (fence.acq_rel cost ~10% at hd128: benchmarks/NOTES.md). A loop written in Triton would be
# an scf.while inside the step loop, and Triton's software pipeliner leaves loops with nested
# loops alone. Labels inside { } are local to the block, so the asm may be inlined twice.
_SPIN_PTX = tl.constexpr("""
{
.reg .pred %p_done, %p_wait;
.reg .b32 %seen;
.reg .u64 %t_start, %t_now;
mov.u32 $0, 0;
mov.b32 %seen, $4;
setp.eq.s32 %p_done, %seen, $2;
@%p_done bra DONE;
mov.u64 %t_start, %globaltimer;
SPIN:
ld.acquire.gpu.global.b32 %seen, [$1];
setp.eq.s32 %p_done, %seen, $2;
@%p_done bra DONE;
mov.u64 %t_now, %globaltimer;
sub.u64 %t_now, %t_now, %t_start;
setp.le.u64 %p_wait, %t_now, $3;
@%p_wait bra SPIN;
mov.u32 $0, 1;
DONE:
}
""")


@triton.jit
def _load_acquire(ptr, TIMED_WAIT: tl.constexpr):
    """An acquire load of one int32 (GPU scope); a volatile load in the interpreter."""
    if TIMED_WAIT:
        return tl.inline_asm_elementwise(
            "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32, is_pure=False,
            pack=1,
        )  # fmt: skip
    else:
        return tl.load(ptr, volatile=True)


@triton.jit
def _cta_barrier(TIMED_WAIT: tl.constexpr, BULK_WAIT: tl.constexpr = False):
    """A CTA-wide barrier that Triton's software pipeliner does not see.

    ``tl.debug_barrier()`` inside the step loop makes the pipeliner skip the loop (no cp.async
    prefetch of Q and dO: -1 stage), so on the GPU the barrier is a bar.sync in inline asm. It is
    reached by every thread (no divergent control flow around it). ``BULK_WAIT`` first waits until
    this thread's TMA reductions have been performed (and orders them, issued by the async proxy,
    before the release that follows the barrier).
    """
    if TIMED_WAIT:
        if BULK_WAIT:
            tl.inline_asm_elementwise(
                "cp.async.bulk.wait_group 0; fence.proxy.async.global; bar.sync 0; mov.u32 $0, 0;",
                "=r", [], dtype=tl.int32, is_pure=False, pack=1,
            )  # fmt: skip
        else:
            tl.inline_asm_elementwise(
                "bar.sync 0; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
            )
    else:
        tl.debug_barrier()


@triton.jit
def _release_turn(pending_sem, has_pending, TIMED_WAIT: tl.constexpr, DQ_TMA: tl.constexpr):
    """Hand the previous step's dQ tile to its successor (if this chain has one pending). The
    barrier makes every thread's adds precede the release (a Triton 3.6 release atomic does not
    order the other threads' memory operations by itself). A mask, not an ``if``, keeps the step
    loop free of regions the pipeliner gives up on."""
    _cta_barrier(TIMED_WAIT, DQ_TMA)
    tl.atomic_add(pending_sem, 1, sem="release", mask=has_pending != 0)


@triton.jit
def _add_dq(
    DQ_DESC, dq_ptrs, dq_part, mask, desc_b, desc_row, h,
    BLOCK_M: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, DQ_TMA: tl.constexpr,
):  # fmt: skip
    """Add a dQ partial into the fp32 accumulator, at L2 either way.

    ``DQ_TMA``: one bulk tensor reduction (cp.reduce.async.bulk) from shared memory, issued by one
    thread, rows and columns past the tensor's end clipped by the TMA unit. Otherwise vector fp32
    reductions from every thread (red.global.add.v4.f32), masked.
    """
    if DQ_TMA:
        DQ_DESC.atomic_add([desc_b, desc_row, h, 0], dq_part.reshape([1, BLOCK_M, 1, HEAD_DIM_PAD]))
    else:
        tl.atomic_add(dq_ptrs, dq_part, mask=mask, sem="relaxed")


@triton.jit
def _wait_for_turn(sem_ptr, seen, rank, timeout, TIMED_WAIT: tl.constexpr):
    """Wait until the semaphore equals ``rank``; returns True if the wait gave up.

    ``seen`` is the semaphore as read (acquire) before the step's last matmuls, so an
    uncontended turn costs no round trip here. Every thread polls on its own (no barrier in the
    loop). On the GPU the loop is one inline-asm block (see _SPIN_PTX); the interpreter has no
    inline asm and runs programs one after another, so it polls in Python and bounds the number
    of polls instead.
    """
    if TIMED_WAIT:
        failed = tl.inline_asm_elementwise(
            _SPIN_PTX, "=r,l,r,l,r", [sem_ptr, rank, timeout, seen], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip
        return failed != 0
    else:
        polls = 0
        while (seen != rank) & (polls >= 0):
            seen = tl.load(sem_ptr, volatile=True)
            polls += 1
            if polls > timeout:
                polls = -1
        return polls < 0


@triton.jit
def attn_bwd_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ_ACC, DQ_DESC, DK, DV,
    SEM, STATUS,
    CHAIN_START, STEP_HEAD, STEP_TILE, STEP_RANK, ORDER, WORKER_START,
    CU_SEQLENS_Q, CU_SEQLENS_K, CU_ROWS_PAD,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    q_heads, kv_heads, kv_group, kv_tiles, q_tiles, num_chains,
    seqlen_q, seqlen_k, causal_shift, window_left, window_right, rows_pad_total,
    qk_scale, softmax_scale, timeout,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DETERMINISTIC: tl.constexpr,
    DYNAMIC: tl.constexpr,
    TIMED_WAIT: tl.constexpr,
    DQ_TMA: tl.constexpr,
    TABLES_AHEAD: tl.constexpr,
    RELEASE_AFTER_QK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_mask = offs_d[None, :] < HEAD_DIM

    if DYNAMIC:
        ticket = tl.atomic_add(STATUS, 1, sem="relaxed")
        end = num_chains
    else:
        ticket = tl.load(WORKER_START + pid)
        end = tl.load(WORKER_START + pid + 1)

    while ticket < end:
        chain = tl.load(ORDER + ticket)
        kv_tile = chain % kv_tiles
        rest = chain // kv_tiles
        kvh = rest % kv_heads
        b = rest // kv_heads
        if IS_VARLEN:
            # This chain's sequence: row offsets (int64: total tokens x heads x head dim may
            # pass 2**31 elements), lengths, and where its LSE2/delta/dQ rows start.
            q_start = tl.load(CU_SEQLENS_Q + b).to(tl.int64)
            k_start = tl.load(CU_SEQLENS_K + b).to(tl.int64)
            seq_q = (tl.load(CU_SEQLENS_Q + b + 1) - q_start).to(tl.int32)
            seq_k = (tl.load(CU_SEQLENS_K + b + 1) - k_start).to(tl.int32)
            shift = seq_k - seq_q
            # A multiple of BLOCK_M by construction: saying so keeps the LSE2/delta loads
            # vectorised as in the dense kernel (and with them, fewer registers and spills).
            pad_start = tl.multiple_of(tl.load(CU_ROWS_PAD + b), BLOCK_M)
            q_base = q_start * stride_qm
            do_base = q_start * stride_dom
            k_base = k_start * stride_kn
            v_base = k_start * stride_vn
            dk_base = k_start * stride_dkn
            dv_base = k_start * stride_dvn
            dq_base = pad_start.to(tl.int64) * stride_dqm
        else:
            seq_q = seqlen_q
            seq_k = seqlen_k
            shift = causal_shift
            # In int64: a batch's offset passes 2**31 elements from 2**31-element tensors.
            b64 = b.to(tl.int64)
            q_base = b64 * stride_qb
            do_base = b64 * stride_dob
            k_base = b64 * stride_kb
            v_base = b64 * stride_vb
            dk_base = b64 * stride_dkb
            dv_base = b64 * stride_dvb
            dq_base = b64 * stride_dqb

        offs_n = kv_tile * BLOCK_N + offs_n0
        n_valid = offs_n < seq_k
        kv_mask = n_valid[:, None] & d_mask
        # The chain's head indexes dK/dV; K/V are its group's (kv_group > 1: one chain per q
        # head of a GQA group, BackwardPlan.gqa_split).
        kv_in = kvh // kv_group
        k = tl.load(
            K + k_base + kv_in * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            V + v_base + kv_in * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        dk = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM_PAD], dtype=tl.float32)

        step_lo = tl.load(CHAIN_START + chain)
        step_hi = tl.load(CHAIN_START + chain + 1)
        # The release of a step's semaphore is deferred into the next step (see below); this
        # remembers which semaphore is still to be released.
        pending_sem = SEM
        has_pending = 0
        rows_pad = q_tiles * BLOCK_M
        if TABLES_AHEAD:
            # The next step's loads are issued at the end of this one (Triton's pipeliner);
            # reading their table entries a step earlier keeps that issue from waiting on a
            # table load's round trip (and lets the pipeliner keep a third buffer).
            h_next = tl.load(STEP_HEAD + step_lo, mask=step_lo < step_hi, other=0)
            q_tile_next = tl.load(STEP_TILE + step_lo, mask=step_lo < step_hi, other=0)
        # One step, and where the deterministic protocol sits in it (fragments marked [D1]..[D5]):
        #   table entries (head, Q tile) -> loads of Q, dO, LSE2, delta
        #   [D1] release the previous step's dQ tile (barrier, then +1 with release semantics)
        #        here, or with RELEASE_AFTER_QK after the first matmul
        #   S^T = K Q^T, P^T = exp2(S^T * scale - LSE2), masks; dV += P^T dO; dP^T = V dO^T
        #   dS^T = P^T (dP^T - delta)
        #   [D2] read this step's semaphore (acquire), two matmuls before it is needed
        #   dK += dS^T Q; dQ partial = dS K
        #   [D3] wait until the semaphore equals this step's rank (bounded; on timeout the
        #        partial becomes NaN and the error flag is raised)
        #   [D4] add the partial into the fp32 dQ accumulator (TMA bulk reduction or atomics)
        #   [D5] remember the semaphore: its release is [D1] of the next step or the chain's end
        # Non-deterministic mode skips [D1]-[D3] and [D5]: the same adds in arrival order.
        for step in range(step_lo, step_hi):
            if TABLES_AHEAD:
                h = h_next
                q_tile = q_tile_next
                ahead = tl.minimum(step + 1, step_hi - 1)
                h_next = tl.load(STEP_HEAD + ahead)
                q_tile_next = tl.load(STEP_TILE + ahead)
            else:
                h = tl.load(STEP_HEAD + step)
                q_tile = tl.load(STEP_TILE + step)
            offs_m = q_tile * BLOCK_M + offs_m0
            m_valid = offs_m < seq_q
            qo_mask = m_valid[:, None] & d_mask
            q = tl.load(
                Q + q_base + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=qo_mask,
                other=0.0,
            )
            do = tl.load(
                DO + do_base + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
                mask=qo_mask,
                other=0.0,
            )
            if IS_VARLEN:
                row_base = h * rows_pad_total + pad_start
            else:
                row_base = (b * q_heads + h) * rows_pad
            lse = tl.load(LSE2 + row_base + offs_m)
            delta = tl.load(DELTA + row_base + offs_m)
            if DETERMINISTIC:
                # Release the previous step's dQ tile at the start of this step, once this
                # step's loads have been issued: its adds have had the loop's tail to complete,
                # and the successor gets its turn as early as that allows. At head dims 64-128
                # this measured fastest (after the first matmul 1-9% slower, after later ones
                # 5-10% slower); at 192/256 the early release costs spills and after the first
                # matmul is faster (benchmarks/NOTES.md, attempts 11 and 14).
                if not RELEASE_AFTER_QK:  # [D1]
                    _release_turn(pending_sem, has_pending, TIMED_WAIT, DQ_TMA)
                rank = tl.load(STEP_RANK + step)
                sem_ptr = SEM + (b * q_heads + h) * q_tiles + q_tile

            # Transposed formulation: rows are keys, columns are queries.
            qk_t = tl.dot(k, tl.trans(q))
            p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :])
            keep = n_valid[:, None]
            if WINDOW:
                diag = offs_m[None, :] + shift
                keep = keep & (offs_n[:, None] <= diag + window_right)
                keep = keep & (offs_n[:, None] >= diag - window_left)
            elif CAUSAL:
                keep = keep & (offs_n[:, None] <= offs_m[None, :] + shift)
            p_t = tl.where(keep, p_t, 0.0)
            if DETERMINISTIC:
                if RELEASE_AFTER_QK:  # [D1], late
                    _release_turn(pending_sem, has_pending, TIMED_WAIT, DQ_TMA)
            dv += tl.dot(p_t.to(do.dtype), do)
            dp_t = tl.dot(v, tl.trans(do))
            ds_t = p_t * (dp_t - delta[None, :])
            ds_t = ds_t.to(q.dtype)
            if DETERMINISTIC:
                # Read the semaphore two matmuls before it is needed: the predecessor is
                # usually done by then, and the read's L2 round trip hides behind the matmuls.
                seen = _load_acquire(sem_ptr, TIMED_WAIT)  # [D2]
            dk += tl.dot(ds_t, q)
            dq_part = tl.dot(tl.trans(ds_t), k)

            dq_ptrs = (
                DQ_ACC + dq_base + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :]
            )
            # The TMA tile's (batch, row) coordinates: varlen's accumulator is one batch of
            # padded sequences (see IS_VARLEN above).
            if IS_VARLEN:
                desc_b = 0
                desc_row = pad_start + q_tile * BLOCK_M
            else:
                desc_b = b
                desc_row = q_tile * BLOCK_M
            if DETERMINISTIC:
                failed = _wait_for_turn(sem_ptr, seen, rank, timeout, TIMED_WAIT)  # [D3]
                # Never a silent wrong result: a step that gave up poisons what it adds and
                # raises the error flag (a plain store: every writer writes 1).
                dq_part = tl.where(failed, float("nan"), dq_part)
                tl.store(STATUS + 1, 1, mask=failed)
                _add_dq(  # [D4]
                    DQ_DESC, dq_ptrs, dq_part, qo_mask, desc_b, desc_row, h,
                    BLOCK_M, HEAD_DIM_PAD, DQ_TMA,
                )  # fmt: skip
                pending_sem = sem_ptr  # [D5]
                has_pending = 1
            else:
                _add_dq(
                    DQ_DESC, dq_ptrs, dq_part, qo_mask, desc_b, desc_row, h,
                    BLOCK_M, HEAD_DIM_PAD, DQ_TMA,
                )  # fmt: skip

        if DETERMINISTIC:
            if has_pending != 0:
                _release_turn(pending_sem, has_pending, TIMED_WAIT, DQ_TMA)
        dk = dk * softmax_scale
        # A chain with no step (a KV tile no query row's window reaches) stores zeros here.
        tl.store(
            DK + dk_base + kvh * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
            dk.to(DK.dtype.element_ty),
            mask=kv_mask,
        )
        tl.store(
            DV + dv_base + kvh * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
            dv.to(DV.dtype.element_ty),
            mask=kv_mask,
        )
        if DYNAMIC:
            ticket = tl.atomic_add(STATUS, 1, sem="relaxed")
        else:
            ticket += 1
    if DQ_TMA:
        # Bulk reductions still in flight are waited for before the program ends (the
        # non-deterministic mode has no release that would wait for them).
        _cta_barrier(TIMED_WAIT, True)


@triton.jit
def attn_bwd_preprocess_kernel(
    O, DO, LSE, LSE2, DELTA, CU_SEQLENS_Q, CU_ROWS_PAD,
    stride_ob, stride_om, stride_oh,
    stride_dob, stride_dom, stride_doh,
    stride_lb, stride_lh,
    heads, seqlen_q, rows_pad, num_m_blocks,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    """delta = rowsum(dO * O) and the LSE in log2 units, both fp32 with ``rows_pad`` rows per
    (batch x head): padding rows (and rows that saw no key) get LSE +inf and delta 0, so the
    backward reads them without masks. One program per (row block, batch x head).

    Varlen: ``rows_pad`` is the padded rows per head (all sequences), sequence b's rows start
    at CU_ROWS_PAD[b]; LSE is (H, total_q) with row stride ``stride_lh``."""
    # (Row block, batch x head) on one grid axis, as the forward's.
    pid = tl.program_id(0)
    start_m = pid % num_m_blocks
    bh = pid // num_m_blocks
    b = bh // heads
    h = bh % heads
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if IS_VARLEN:
        q_start = tl.load(CU_SEQLENS_Q + b).to(tl.int64)
        seq_q = (tl.load(CU_SEQLENS_Q + b + 1) - q_start).to(tl.int32)
        pad_start = tl.load(CU_ROWS_PAD + b)
        seq_rows = tl.load(CU_ROWS_PAD + b + 1) - pad_start
        if start_m * BLOCK_M >= seq_rows:
            return
        o_base = q_start * stride_om
        do_base = q_start * stride_dom
        lse_base = h * stride_lh + q_start
        out_base = h * rows_pad + pad_start
    else:
        seq_q = seqlen_q
        seq_rows = rows_pad
        o_base = b.to(tl.int64) * stride_ob
        do_base = b.to(tl.int64) * stride_dob
        lse_base = b.to(tl.int64) * stride_lb + h * stride_lh
        out_base = bh.to(tl.int64) * rows_pad
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    in_rows = offs_m < seq_q
    mask = in_rows[:, None] & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(
        O + o_base + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
        mask=mask,
        other=0.0,
    ).to(tl.float32)
    do = tl.load(
        DO + do_base + h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :],
        mask=mask,
        other=0.0,
    ).to(tl.float32)
    lse = tl.load(LSE + lse_base + offs_m, mask=in_rows, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    stored = offs_m < seq_rows
    tl.store(LSE2 + out_base + offs_m, lse2, mask=stored)
    tl.store(DELTA + out_base + offs_m, tl.sum(o * do, axis=1), mask=stored)


def attn_bwd_preprocess(
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    rows_pad: int,
    *,
    varlen: VarlenRows | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward's per-row inputs: (LSE in log2 units, delta), fp32.

    Dense: each ``(batch * heads, rows_pad)``, where ``rows_pad`` (a multiple of the backward's
    BLOCK_M and of 4, as TMA row strides need 16 bytes) is at least seqlen_q. Varlen (out and
    dout ``(total_q, heads, headdim)``, lse ``(heads, total_q)``): each ``(heads,
    varlen.rows_pad_total)``, sequence b from row ``varlen.cu_rows_pad[b]``; ``rows_pad`` is
    then the longest sequence's padded rows (it sizes the grid).
    """
    block_m = 64
    if varlen is None:
        batch, seqlen_q, heads, headdim = out.shape
        rows, cu_q, cu_pad = rows_pad, out, out  # the pointers are unused when dense
        o_strides = (out.stride(0), out.stride(1), out.stride(2))
        do_strides = (dout.stride(0), dout.stride(1), dout.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
        shape = (batch * heads, rows_pad)
    else:
        _, heads, headdim = out.shape
        batch, seqlen_q = varlen.batch, 0
        rows, cu_q, cu_pad = varlen.rows_pad_total, varlen.cu_seqlens_q, varlen.cu_rows_pad
        o_strides = (0, out.stride(0), out.stride(1))
        do_strides = (0, dout.stride(0), dout.stride(1))
        lse_strides = (0, lse.stride(0))
        shape = (heads, rows)
    lse2 = torch.empty(shape, device=out.device, dtype=torch.float32)
    delta = torch.empty_like(lse2)
    num_m_blocks = triton.cdiv(max(rows_pad, 1), block_m)
    grid = (num_m_blocks * batch * heads,)
    attn_bwd_preprocess_kernel[grid](
        out, dout, lse, lse2, delta, cu_q, cu_pad,
        *o_strides, *do_strides, *lse_strides,
        heads, seqlen_q, rows, num_m_blocks,
        BLOCK_M=block_m, HEAD_DIM=headdim, HEAD_DIM_PAD=next_power_of_2(headdim),
        IS_VARLEN=varlen is not None,
    )  # fmt: skip
    return lse2, delta


def mask_window(mask: Mask) -> tuple[str, int, int]:
    """The plan's mask as the kernels take it: (kind, window_left, window_right), see
    :func:`utils.kernel_window`."""
    return kernel_window(mask.causal, mask.window)


def attn_bwd_main(
    plan: BackwardPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse2: torch.Tensor,
    delta: torch.Tensor,
    tables: dict[str, torch.Tensor],
    softmax_scale: float,
    *,
    varlen: VarlenRows | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the persistent backward of ``plan``. Returns (dq_accum fp32 unscaled, dk, dv,
    status); with ``plan.gqa_split`` dk and dv have q's heads (per-q-head partials that
    ``group_sum.sum_kv_groups`` adds).

    ``lse2`` and ``delta`` come from :func:`attn_bwd_preprocess` with ``q_tiles * block_m`` rows
    (varlen: with the same ``varlen``); ``tables`` are the plan's schedule tables on q's device.
    With ``plan.dq_reduce == "tma"`` the dQ partials are added by TMA bulk reductions through a
    tensor descriptor of the accumulator (Hopper), else by per-thread vector atomics. Static
    schedules launch as a cooperative grid (all workers co-resident, or the launch fails); the
    interpreter bounds waits by polls.

    Varlen (``varlen`` given; q/dout ``(total_q, H, D)``, k/v ``(total_k, Hkv, D)``): the
    accumulator is ``(varlen.rows_pad_total, H, D)``, every sequence padded to whole Q tiles
    (gather the real rows with ``varlen.row_index``); a TMA tile then never crosses into the
    next sequence, so both dQ reductions stay correct. The window comes from
    ``plan.spec.mask``.
    """
    spec, tiles = plan.spec, plan.tiles
    interpret = plan.device.is_interpreter
    q_tiles, kv_tiles = spec.q_tiles, spec.kv_tiles
    # Tickets run over the chains listed in ``order``: with packed sequences or windows the
    # padded grid has chains that are not listed (KV tiles past a sequence's end).
    num_chains = tables["order"].numel()
    dq_tma = plan.dq_reduce == "tma"
    timeout = INTERPRETER_MAX_POLLS if interpret else int(plan.timeout_s * 1e9)
    cooperative = plan.dispatch is Dispatch.STATIC and not interpret
    kind, window_left, window_right = mask_window(spec.mask)
    headdim = q.shape[-1]
    heads, kv_heads = q.shape[-2], k.shape[-2]
    if varlen is None:
        batch, seqlen_q, _, _ = q.shape
        seqlen_k = k.shape[1]
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        # The (batch, row, head) strides of the dense layout.
        strides = [t.stride()[:3] for t in (q, k, v, dout, dq_acc)]
        cu_q = cu_k = cu_pad = q  # unused pointers (IS_VARLEN is off)
        desc_view = dq_acc
    else:
        batch, seqlen_q, seqlen_k = varlen.batch, 0, 0  # lengths are read per chain
        # At least one row: a TMA descriptor needs a non-empty tensor (a pack of empty query
        # sequences has no step, so the row is never touched).
        rows = max(varlen.rows_pad_total, 1)
        dq_acc = torch.zeros((rows, heads, headdim), device=q.device, dtype=torch.float32)
        strides = [(0, *t.stride()[:2]) for t in (q, k, v, dout, dq_acc)]
        cu_q, cu_k, cu_pad = varlen.cu_seqlens_q, varlen.cu_seqlens_k, varlen.cu_rows_pad
        desc_view = dq_acc.unsqueeze(0)  # one "batch" of padded sequences
    # dK/dV per chain head: the spec's kv heads (q's with gqa_split: per-q-head partials).
    dkv_heads = spec.kv_heads
    dk = torch.empty((*k.shape[:-2], dkv_heads, headdim), device=k.device, dtype=k.dtype)
    dv = torch.empty_like(dk)
    strides += [(0, *t.stride()[:2]) if varlen else t.stride()[:3] for t in (dk, dv)]
    # One zeroed buffer for the ticket, the error flag and every semaphore: a single memset.
    flags = torch.zeros(2 + batch * heads * q_tiles, device=q.device, dtype=torch.int32)
    status, sem = flags[:2], flags[2:]
    launch_options = {"launch_cooperative_grid": True} if cooperative else {}
    if dq_tma:
        # (batch, rows, heads, headdim) with one (BLOCK_M x headdim) block per dQ tile; rows
        # past the accumulator's end and padded columns are clipped by the TMA unit.
        dq_desc = TensorDescriptor(
            desc_view, list(desc_view.shape), list(desc_view.stride()),
            [1, tiles.block_m, 1, next_power_of_2(headdim)],
        )  # fmt: skip
    else:
        dq_desc = dq_acc  # unused by the kernel
    attn_bwd_kernel[(plan.grid,)](
        q, k, v, dout, lse2, delta, dq_acc, dq_desc, dk, dv,
        sem, status,
        tables["chain_start"], tables["step_q_head"], tables["step_q_tile"], tables["step_rank"],
        tables["order"], tables["worker_start"],
        cu_q, cu_k, cu_pad,
        *(stride for triple in strides for stride in triple),
        heads, dkv_heads, dkv_heads // kv_heads, kv_tiles, q_tiles, num_chains,
        seqlen_q, seqlen_k, seqlen_k - seqlen_q, window_left, window_right,
        varlen.rows_pad_total if varlen else 0,
        softmax_scale * math.log2(math.e), softmax_scale, timeout,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, HEAD_DIM=headdim,
        HEAD_DIM_PAD=next_power_of_2(headdim), CAUSAL=kind == "causal", WINDOW=kind == "local",
        IS_VARLEN=varlen is not None,
        DETERMINISTIC=plan.deterministic, DYNAMIC=plan.dispatch is Dispatch.DYNAMIC,
        TIMED_WAIT=not interpret, DQ_TMA=dq_tma,
        TABLES_AHEAD=tiles.tables_ahead, RELEASE_AFTER_QK=tiles.release_after_qk,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        **launch_options,
    )  # fmt: skip
    return dq_acc, dk, dv, status
