"""The MMA warpgroups' step loop of the backward (``bwd.HopperAttnBwd`` at head dims 64-128):
S^T and dP^T, the exponentials and masks, dS^T, the dV/dK/dQ GEMMs and the dQ partial's hand-off
to the dQ warp, then the chain epilogue at a chain's last step."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from . import dq_fragment
from ._cute_utils import acc_to_operand_a, transpose_view, wgmma
from .bwd_epilogue import DkvSums
from .bwd_sync import (
    BAR_DQ_EMPTY,
    BAR_DQ_FULL,
    BAR_DQ_READ,
    BAR_DS,
    F_DONE,
    F_FIRST,
    F_LAST,
    I_BATCH,
    I_FLAGS,
    I_KVH,
    I_KVT,
    I_QT,
)
from .exp2_poly import exp2_poly

# step_trace (a probe): the places of a step where each MMA warp writes its SM clock, in order.
# The two "past a barrier" stamps read the clock right after a BAR.SYNC.DEFER_BLOCKING, which
# does not hold the clock read back (session 61: 33-42 cycles after the arrival stamp in every
# step): a warp's wait at those barriers shows in the interval that follows them, "dq_pass ->
# dq_stored" holding the wait for the dQ warp to free the staging buffer (session 62).
TRACE_POINTS = (
    "top",  # the step's ring slot is full
    "s_done",  # S^T is done (the exponentials start)
    "dp_done",  # dP^T is done (past its wait; exp_tail's last exponentials follow)
    "ds_stored",  # dS^T (and P^T) computed and dS^T's shared stores issued, before dV
    "ds_arrive",  # dS^T is in shared memory: at the warpgroups' dS barrier
    "ds_pass",  # past it (the dQ GEMM is issued)
    "dq_wait",  # dQ is done: at the dQ staging buffer's "empty" barrier
    "dq_pass",  # past it
    "dq_stored",  # the partial is stored and fenced (the hand-off's arrival follows)
    "end",  # dK is done and the slot released
)


# A trace point's index (trace time): ``self._trace(..., point_index("s_done"))``.
point_index = TRACE_POINTS.index
# Points stamped at hd 64 only: at hd 128 their two clock reads made the kernel spill (six
# local-memory instructions, session 64), which would change the step they time.
FINE_POINTS = ("dp_done", "ds_stored")


class StepMixin:
    """``HopperAttnBwd``'s MMA warpgroups at head dims 64-128."""

    @cute.jit
    def mma(
        self,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        scale_log2: Float32,
        softmax_scale: Float32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        sdO: cute.Tensor,
        sdS: cute.Tensor,
        sdQ: cute.Tensor,
        sLSE: cute.Tensor,
        sDelta: cute.Tensor,
        sInfo: cute.Tensor,
        storage,
        mma_sdp: cute.TiledMma,
        mma_dkv: cute.TiledMma,
        mma_dq: cute.TiledMma,
        tidx: Int32,
        dkv_sums: DkvSums,
        sK_out: cute.Tensor,
        sV_out: cute.Tensor,
    ):
        bm, bn, hd = self.block_m, self.block_n, self.head_dim
        wg, thr_sdp, thr_dkv, thr_dq, wg_sdp, wg_dkv, wg_dq = self._mma_slices(
            mma_sdp, mma_dkv, mma_dq, tidx
        )

        # Operand fragments (descriptors into shared memory; the stage is the last mode).
        tSrK = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        tSrQ = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tPrV = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        tPrdO = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        tVrdO = wg_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(sdO)))
        tKrQ = wg_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(sQ)))
        if const_expr(self.dq_swap):
            # dQ^T = K^T dS^T: K^T is the A operand, dS^T (the stage's tile) the B operand.
            tQrK = wg_dq.make_fragment_A(wg_dq.partition_A(transpose_view(sK)))
            tQrdS = wg_dq.make_fragment_B(wg_dq.partition_B(transpose_view(sdS)))
        else:
            tQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(transpose_view(sdS)))
            tQrK = wg_dq.make_fragment_B(wg_dq.partition_B(transpose_view(sK)))

        shape_st = (bn, bm)
        acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, hd)), Float32)
        acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, hd)), Float32)
        if const_expr(self.kv_on_full):
            # Zeroed here and after each chain's epilogue, not at a chain's first step: a
            # branch holding only the zeroing is if-converted, 128 selects in every step.
            acc_dK.fill(0.0)
            acc_dV.fill(0.0)
        # Coordinates of every accumulator element: (kv row, q row) of S^T, (kv row, d) of dK.
        tScS = thr_sdp.partition_C(cute.make_identity_tensor(shape_st))
        tKcK = thr_dkv.partition_C(cute.make_identity_tensor((bn, hd)))
        # dS^T leaves by stmatrix (not transposed): it takes each thread's 16-bit pairs in
        # exactly the accumulator's layout and writes rows of sdS, whose Q rows are contiguous
        # (one 32-bit store and one address computation per register pair otherwise, queued
        # in the same MIO pipe as the exponentials).
        ds_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
        )
        ds_copy = cute.make_tiled_copy_C(ds_atom, mma_sdp)
        thr_ds = ds_copy.get_slice(tidx)
        tDsdS = thr_ds.partition_D(sdS)

        stage = Int32(0)
        phase = Int32(0)
        kv_phase = Int32(0)
        do_phase = Int32(0)  # of dO's own mbarriers (do_single)
        done = Int32(0)
        buf = Int32(0)  # the dQ staging buffer of this step (always 0 without dq_double)
        traced = Int32(0)  # steps this warpgroup has run (step_trace)
        if const_expr(self.ds_guard):
            # As if a step -1's dQ GEMM were done: the other warpgroup's first dS store passes.
            cute.arch.barrier_arrive(
                barrier_id=BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
            )
        while done == 0:
            cute.arch.mbarrier_wait(storage.full_bar.data_ptr() + stage, phase)
            self._trace(dkv_sums, wg, traced, point_index("top"))
            acc_S = cute.make_rmem_tensor(thr_sdp.partition_shape_C(shape_st), Float32)
            if const_expr(self.gemm_before_flags):
                # S^T = K Q^T before the flags are read: K is in (it arrives with the chain's
                # first step's barrier); at the terminator the result is dropped.
                self._issue_s(mma_sdp, acc_S, tSrK, tSrQ, stage)
            flags = sInfo[I_FLAGS, stage]
            done = flags & F_DONE
            # dS has one buffer with dq_double (its comment in HopperAttnBwd.__init__), one per
            # stage else.
            ds_stage = Int32(0) if const_expr(self.dq_double) else stage
            # dO's buffer: its one buffer with do_single, the step's ring stage else.
            do_stage = Int32(0) if const_expr(self.do_single) else stage
            if done != 0:
                if const_expr(self.gemm_before_flags):
                    warpgroup.wait_group(0)
                self._stop_dq_writer(buf, wg, self.ds_guard)
            else:
                # Step metadata is read from the stage's slot where it is used (it stays
                # valid until this stage is released), so it does not occupy registers
                # across the MMAs.
                if const_expr(not self.kv_on_full):  # noqa: SIM102 (compile-time, then runtime)
                    if flags & F_FIRST != 0:
                        cute.arch.mbarrier_wait(storage.kv_full.data_ptr(), kv_phase)
                        kv_phase = kv_phase ^ 1
                        acc_dK.fill(0.0)
                        acc_dV.fill(0.0)

                if const_expr(self.early_meta):
                    n0, m0, shift, edge = self._step_tiles(sInfo, stage, seqlen_q, seqlen_k)
                # S^T = K Q^T (issued above with gemm_before_flags), dP^T = V dO^T (two commit
                # groups).
                acc_dP = cute.make_rmem_tensor(thr_sdp.partition_shape_C(shape_st), Float32)
                if const_expr(not self.gemm_before_flags):
                    self._issue_s(mma_sdp, acc_S, tSrK, tSrQ, stage)
                self._issue_dp(acc_dP, tPrV, tPrdO, do_stage, storage, do_phase, mma_sdp)
                warpgroup.wait_group(1)  # S^T done (dP^T may still run)
                self._trace(dkv_sums, wg, traced, point_index("s_done"))

                # P^T = exp2(S^T * scale_log2 - lse2), masked (_probs), the LSE2 rows read from
                # shared memory here.
                if const_expr(not self.early_meta):
                    n0, m0, shift, edge = self._step_tiles(sInfo, stage, seqlen_q, seqlen_k)
                probs_args = (
                    acc_S, tScS, sLSE, stage, scale_log2, n0, m0, shift, seqlen_k,
                )  # fmt: skip
                if const_expr(self.exp_tail > 0):
                    # The last exp_tail exponentials after the dP^T wait, in one block with
                    # dS^T. The wait sits in a block between two branches: ptxas hoists a
                    # wgmma wait above every exponential of its own block.
                    split = max(cute.size(acc_S) - self.exp_tail, 0)
                    if const_expr(split > 0):
                        if edge != 0:
                            self._probs(*probs_args, True, 0, split)
                        else:
                            self._probs(*probs_args, False, 0, split)
                    warpgroup.wait_group(0)
                    self._trace(dkv_sums, wg, traced, point_index("dp_done"))
                    if edge != 0:
                        self._probs(*probs_args, True, split)
                        self._grad_scores(acc_S, acc_dP, tScS, sDelta, stage)
                    else:
                        self._probs(*probs_args, False, split)
                        self._grad_scores(acc_S, acc_dP, tScS, sDelta, stage)
                else:
                    if edge != 0:
                        self._probs(*probs_args, True)
                    else:
                        self._probs(*probs_args, False)
                    warpgroup.wait_group(0)
                    self._trace(dkv_sums, wg, traced, point_index("dp_done"))
                    self._grad_scores(acc_S, acc_dP, tScS, sDelta, stage)

                rP = cute.make_fragment_like(acc_S, self.dtype)
                rP.store(acc_S.load().to(self.dtype))
                rdS = cute.make_fragment_like(acc_dP, self.dtype)
                rdS.store(acc_dP.load().to(self.dtype))

                acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C(self.dq_mma_shape), Float32)
                # dS^T to shared memory first, then dV (FA4's order): dV runs through the dS
                # barrier and dQ queues behind it, so the tensor cores see dV, dQ, dK back to
                # back. P's registers stay live until dV is done.
                if const_expr(self.ds_guard):
                    # The other warpgroup's previous dQ GEMM has read the dS buffer.
                    cute.arch.barrier(
                        barrier_id=BAR_DQ_READ + 1 - wg, number_of_threads=self.num_mma_threads
                    )
                cute.copy(ds_copy, thr_ds.retile(rdS), tDsdS[None, None, None, ds_stage])
                self._trace(dkv_sums, wg, traced, point_index("ds_stored"))
                self._dv_gemm(acc_dV, rP, tVrdO, do_stage, mma_dkv)
                self._ds_barrier_gemms(
                    acc_dQ, acc_dK, rdS, tQrK, tQrdS, tKrQ, mma_dq, mma_dkv, ds_stage, stage,
                    storage, dkv_sums, wg, traced,
                )  # fmt: skip
                if const_expr(self.do_single):
                    do_phase = do_phase ^ 1

                # Hand the dQ partial to the dQ writer once its buffer is free.
                self._trace(dkv_sums, wg, traced, point_index("dq_wait"))
                self._dq_barrier(BAR_DQ_EMPTY, buf, wg, wait=True)
                self._trace(dkv_sums, wg, traced, point_index("dq_pass"))
                self._store_dq_fragment(acc_dQ, sdQ, buf, tidx, mma_dq)
                cute.arch.fence_view_async_shared()
                self._trace(dkv_sums, wg, traced, point_index("dq_stored"))
                self._dq_barrier(BAR_DQ_FULL, buf, wg, wait=False)
                if const_expr(self.dq_double):
                    buf = buf ^ 1

                warpgroup.wait_group(0)
                if const_expr(self.dkv_sum or self.dkv_row_ptr):
                    # The chain's (batch, kv head, kv tile) are read at its last step only:
                    # read at every step, ptxas moves them into uniform registers before the
                    # branch, and every step waits there for the shared load (queued behind
                    # the dQ partial's stores).
                    if flags & F_LAST == 0:
                        cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                    else:
                        self._end_chain(
                            storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv,
                            softmax_scale, seqlen_k, sK_out, sV_out, dkv_sums, tidx, wg,
                        )  # fmt: skip
                        self._zero_for_next_chain(acc_dK, acc_dV)
                else:
                    b = sInfo[I_BATCH, stage]
                    kvh = sInfo[I_KVH, stage]
                    kvt = sInfo[I_KVT, stage]
                    # Q, dO, LSE2, delta and the metadata of this stage are no longer read.
                    cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                    if flags & F_LAST != 0:
                        # K/V are free for the next chain; dK/dV leave from registers.
                        cute.arch.mbarrier_arrive(storage.kv_empty.data_ptr())
                        rdK = cute.make_fragment_like(acc_dK, self.dtype)
                        rdK.store((acc_dK.load() * softmax_scale).to(self.dtype))
                        rdV = cute.make_fragment_like(acc_dV, self.dtype)
                        rdV.store(acc_dV.load().to(self.dtype))
                        gdK = mdK[b, None, kvh, None]
                        gdV = mdV[b, None, kvh, None]
                        # 32-bit stores of two neighbouring 16-bit values (the accumulator
                        # holds column pairs), rows past seqlen_k dropped.
                        self._store_pairs(rdK, gdK, tKcK, mma_dkv, kvt * bn, seqlen_k)
                        self._store_pairs(rdV, gdV, tKcK, mma_dkv, kvt * bn, seqlen_k)
                        self._zero_for_next_chain(acc_dK, acc_dV)

                self._trace(dkv_sums, wg, traced, point_index("end"))
                if const_expr(self.step_trace > 0):
                    traced = traced + 1
                stage, phase = self._next_stage(stage, phase)

    @cute.jit
    def _ds_barrier_gemms(
        self,
        acc_dQ: cute.Tensor,
        acc_dK: cute.Tensor,
        rdS: cute.Tensor,
        tQrK: cute.Tensor,
        tQrdS: cute.Tensor,
        tKrQ: cute.Tensor,
        mma_dq: cute.TiledMma,
        mma_dkv: cute.TiledMma,
        ds_stage: Int32,
        stage: Int32,
        storage,
        dkv_sums: DkvSums,
        wg: Int32,
        traced: Int32,
    ):
        """After the dS^T store and the dV GEMM: the dS barrier, then the dQ and dK GEMMs
        (FA4's order: the tensor pipe runs dV, dQ, dK back to back). Returns with dQ done (dK
        may still run) and, with do_single, dO's buffer released (dV was its last reader)."""
        cute.arch.fence_view_async_shared()
        self._trace(dkv_sums, wg, traced, point_index("ds_arrive"))
        cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=self.num_mma_threads)
        self._trace(dkv_sums, wg, traced, point_index("ds_pass"))
        if const_expr(self.dq_swap):
            wgmma(mma_dq, acc_dQ, tQrK, tQrdS[None, None, None, ds_stage], zero_init=True)
        else:
            wgmma(mma_dq, acc_dQ, tQrdS[None, None, None, ds_stage], tQrK, zero_init=True)
        warpgroup.wait_group(1)  # dV done (P's registers are free)
        if const_expr(self.do_single):
            cute.arch.mbarrier_arrive(storage.do_empty.data_ptr())
        self._dk_gemm(acc_dK, rdS, tKrQ, stage, mma_dkv)
        warpgroup.wait_group(1)  # dQ done, dK may still run
        if const_expr(self.ds_guard):
            cute.arch.barrier_arrive(
                barrier_id=BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
            )

    @cute.jit
    def _issue_s(
        self,
        mma_sdp: cute.TiledMma,
        acc_S: cute.Tensor,
        tSrK: cute.Tensor,
        tSrQ: cute.Tensor,
        stage: Int32,
    ):
        """S^T = K Q^T from ring stage ``stage`` (one commit group)."""
        wgmma(mma_sdp, acc_S, tSrK, tSrQ[None, None, None, stage], zero_init=True)

    @cute.jit
    def _issue_dp(
        self,
        acc_dP: cute.Tensor,
        tPrV: cute.Tensor,
        tPrdO: cute.Tensor,
        do_stage: Int32,
        storage,
        do_phase: Int32,
        mma_sdp: cute.TiledMma,
    ):
        """dP^T = V dO^T (with do_single, once dO's one buffer holds this step's)."""
        if const_expr(self.do_single):
            cute.arch.mbarrier_wait(storage.do_full.data_ptr(), do_phase)
        wgmma(mma_sdp, acc_dP, tPrV, tPrdO[None, None, None, do_stage], zero_init=True)

    @cute.jit
    def _dv_gemm(
        self,
        acc_dV: cute.Tensor,
        rP: cute.Tensor,
        tVrdO: cute.Tensor,
        do_stage: Int32,
        mma_dkv: cute.TiledMma,
    ):
        """dV += P^T dO, P^T (16-bit) from this thread's registers, which stay untouched until
        the GEMM is done; dO from its buffer ``do_stage`` (one commit group)."""
        wgmma(
            mma_dkv, acc_dV, acc_to_operand_a(rP), tVrdO[None, None, None, do_stage],
            zero_init=False,
        )  # fmt: skip

    @cute.jit
    def _dk_gemm(
        self,
        acc_dK: cute.Tensor,
        rdS: cute.Tensor,
        tKrQ: cute.Tensor,
        stage: Int32,
        mma_dkv: cute.TiledMma,
    ):
        """dK += dS^T Q, dS^T from this thread's registers, Q from ring stage ``stage`` (one
        commit group; the caller waits for it)."""
        wgmma(
            mma_dkv, acc_dK, acc_to_operand_a(rdS), tKrQ[None, None, None, stage],
            zero_init=False,
        )  # fmt: skip

    @cute.jit
    def _trace(
        self, dkv_sums: DkvSums, wg: Int32, step: Int32, point: cutlass.Constexpr[int]
    ) -> None:
        """step_trace (a probe; nothing without it): this warp's SM clock at ``point`` of its
        warpgroup's step ``step`` (the last traced step takes every later one), as an int32
        word of the buffer the kernel takes for the dK/dV sums: word
        (((cta * 2 + wg) * step_trace + step) * len(TRACE_POINTS) + point) * 4 + warp. Every
        lane stores the same value to the same word (one transaction, no branch). The
        ``FINE_POINTS`` are stamped at hd 64 only; their words stay zero elsewhere."""
        if const_expr(
            self.step_trace > 0 and (TRACE_POINTS[point] not in FINE_POINTS or self.head_dim == 64)
        ):
            cta = cute.arch.block_idx()[0]
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx() % 4)
            row = cta * 2 + wg
            last = Int32(self.step_trace - 1)
            kept = step if step < last else last
            word = ((row * self.step_trace + kept) * len(TRACE_POINTS) + point) * 4 + warp
            words = cute.make_tensor(
                cute.recast_ptr(dkv_sums.acc.iterator, dtype=Int32), cute.make_layout(word + 1)
            )
            words[word] = cute.arch.clock()

    def _zero_for_next_chain(self, acc_dK: cute.Tensor, acc_dV: cute.Tensor) -> None:
        """With kv_on_full, the accumulators of the next chain, zeroed in the branch of the
        chain's last step (which stores them) instead of at its first step."""
        if const_expr(self.kv_on_full):
            acc_dK.fill(0.0)
            acc_dV.fill(0.0)

    def _mma_slices(
        self, mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq: cute.TiledMma, tidx: Int32
    ):
        """(warpgroup, this thread's slices of the three tiled MMAs, then its warpgroup's: the
        operand fragments are made from the warpgroup's first thread's)."""
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_base = wg * 128
        return (
            wg, mma_sdp.get_slice(tidx), mma_dkv.get_slice(tidx), mma_dq.get_slice(tidx),
            mma_sdp.get_slice(wg_base), mma_dkv.get_slice(wg_base), mma_dq.get_slice(wg_base),
        )  # fmt: skip

    @cute.jit
    def _step_tiles(self, sInfo: cute.Tensor, stage: Int32, seqlen_q: Int32, seqlen_k: Int32):
        """(n0, m0, shift, edge) of the step in ring slot ``stage``: its first key and query
        rows, the causal diagonal's offset and whether any (key, query) pair of the tile needs
        a mask. Warp-uniform: the largest key must be < seqlen_k and, causal, <= the smallest
        query's limit. Interior tiles (all but the diagonal and the last KV tile) then skip
        the per-element compares and selects, which otherwise outnumber the exponentials."""
        bm, bn = self.block_m, self.block_n
        n0 = sInfo[I_KVT, stage] * bn
        m0 = sInfo[I_QT, stage] * bm
        shift = seqlen_k - seqlen_q
        edge = Int32(0)
        if n0 + bn > seqlen_k:
            edge = Int32(1)
        if const_expr(self.causal):  # noqa: SIM102 (compile-time, then runtime test)
            if n0 + bn - 1 > m0 + shift:
                edge = Int32(1)
        return n0, m0, shift, edge

    @cute.jit
    def _probs(
        self,
        acc_S: cute.Tensor,
        tScS: cute.Tensor,
        sLSE: cute.Tensor,
        stage: Int32,
        scale_log2: Float32,
        n0: Int32,
        m0: Int32,
        shift: Int32,
        seqlen_k: Int32,
        masked: cutlass.Constexpr,
        first: cutlass.Constexpr[int] = 0,
        end: cutlass.Constexpr[int | None] = None,
    ):
        """P^T = exp2(S^T * scale_log2 - lse2) in place, for the fragment's elements
        first..end; with ``masked``, zero for keys past seqlen_k (TMA gave zeros there, not
        -inf) and, causal, keys after the bottom-right diagonal. Rows past seqlen_q have
        lse2 = +inf, so P = 0 there without a mask. The LSE2 values come from the stage's
        ``sLSE`` rows."""
        end = cute.size(acc_S) if const_expr(end is None) else end
        poly_count, poly_period = self.exp_poly
        for i in cutlass.range_constexpr(first, end):
            n, m = tScS[i]
            x = acc_S[i] * scale_log2 - sLSE[m, stage]
            if const_expr(i % poly_period >= poly_period - poly_count):
                p = exp2_poly(x, self.exp_poly_degree)
            else:
                p = cute.math.exp2(x, fastmath=True)
            if const_expr(masked):
                p = self._mask_prob(p, n, m, n0, m0, shift, seqlen_k)
            acc_S[i] = p

    @cute.jit
    def _mask_prob(
        self, p: Float32, n, m, n0: Int32, m0: Int32, shift: Int32, seqlen_k: Int32
    ) -> Float32:
        """``p`` of key row n0 + n and query row m0 + m, or zero for a key past seqlen_k (TMA
        gave zeros there, not -inf) and, causal, a key after the bottom-right diagonal."""
        if n0 + n >= seqlen_k:
            p = Float32(0.0)
        if const_expr(self.causal):  # noqa: SIM102 (compile-time, then runtime test)
            if n0 + n > m0 + m + shift:
                p = Float32(0.0)
        return p

    @cute.jit
    def _grad_scores(
        self,
        acc_S: cute.Tensor,
        acc_dP: cute.Tensor,
        tScS: cute.Tensor,
        sDelta: cute.Tensor,
        stage: Int32,
    ):
        """dS^T = P^T (dP^T - delta) in place of dP^T (acc_S holds P^T in fp32)."""
        for i in cutlass.range_constexpr(cute.size(acc_dP)):
            _, m = tScS[i]
            acc_dP[i] = acc_S[i] * (acc_dP[i] - sDelta[m, stage])

    @cute.jit
    def _store_dq_fragment(
        self, acc: cute.Tensor, flat: cute.Tensor, buf: Int32, tidx: Int32, mma_dq: cute.TiledMma
    ):
        """acc_dQ of MMA thread ``tidx`` into staging buffer ``buf`` in fragment order
        (dq_fragment.py): registers 4 j .. 4 j + 3 as one 16-byte store at 512 j + 4 (tidx %
        128) in its warpgroup's half."""
        bm, hd = self.block_m, self.head_dim
        self._check_dq_fragment(mma_dq, cute.size(acc))
        wg = cute.arch.make_warp_uniform(tidx // 128)
        base = buf * (bm * hd) + wg * dq_fragment.half_size(bm, hd) + (tidx % 128) * 4
        for j in cutlass.range_constexpr(cute.size(acc) // 4):
            off = cute.assume(base + dq_fragment.fragment_offset(bm, hd, 0, 4 * j), divby=4)
            dst = cute.make_tensor(flat.iterator + off, cute.make_layout(4))
            for e in cutlass.range_constexpr(4):
                dst[e] = acc[4 * j + e]

    def _check_dq_fragment(self, mma_dq: cute.TiledMma, registers: int) -> None:
        """Trace time (plain Python, not staged): the layout the cast kernel decodes must be
        this MMA's. Its fragment coordinates are compared with dq_fragment.fragment_coords for
        every register of every lane of warp 0 and of the first and last thread of the other
        seven warps (the map is affine per warp; all 256 threads cost seconds of compile)."""
        bm, hd = self.block_m, self.head_dim
        ident = cute.make_identity_tensor(self.dq_mma_shape)
        threads = [*range(32), *(t for w in range(1, 8) for t in (32 * w, 32 * w + 31))]
        for t in threads:
            coords = mma_dq.get_slice(t).partition_C(ident)
            for i in range(registers):
                expected = dq_fragment.fragment_coords(bm, hd, t, i)
                # (dq_swap: the MMA's coordinates are (head dim, Q row))
                got = tuple(coords[i])[:: -1 if self.dq_swap else 1]
                if got != expected:
                    raise AssertionError(
                        f"dQ fragment of thread {t}, register {i}: the MMA has {got}, "
                        f"dq_fragment says {expected}"
                    )

    @cute.jit
    def _stop_dq_writer(self, buf: Int32, wg: Int32, guarded: cutlass.Constexpr[bool]):
        """At the "done" slot: one more handshake on the dQ buffer tells the dQ writer to stop;
        with a guarded P/dS buffer (``guarded``) the other warpgroup's last arrival is taken
        (after its last GEMMs)."""
        self._dq_barrier(BAR_DQ_EMPTY, buf, wg, wait=True)
        self._dq_barrier(BAR_DQ_FULL, buf, wg, wait=False)
        if const_expr(guarded):
            cute.arch.barrier(
                barrier_id=BAR_DQ_READ + 1 - wg, number_of_threads=self.num_mma_threads
            )
