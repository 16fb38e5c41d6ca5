"""The MMA warpgroups' step loop of the backward (``bwd.HopperAttnBwd`` at head dims 64-128):
S^T and dP^T, the exponentials and masks, dS^T, the dV/dK/dQ GEMMs and the dQ partial's hand-off
to the dQ warp, then the chain epilogue at a chain's last step."""

from __future__ import annotations

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from . import dq_fragment
from ._cute_utils import (
    acc_to_operand_a,
    convert_16bit,
    transpose_view,
    unpack_16bit_half,
    wgmma,
)
from .bwd_epilogue import DkvSums
from .bwd_sync import (
    BAR_DQ_EMPTY,
    BAR_DQ_FULL,
    BAR_DQ_READ,
    BAR_DS,
    BAR_STAGGER,
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

# Where a step issues its dK GEMM (``_ds_barrier_gemms``): after the dQ GEMM (FA4's order),
# before the dS barrier (dk_early), or at the next step, between its S^T and dP^T (dk_defer).
DK_AFTER_DQ, DK_BEFORE_DS, DK_NEXT_STEP = 0, 1, 2


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
        s_halves = self._s_halves_fragments(sK, sQ, wg, tidx, mma_sdp, shape_st)
        acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, hd)), Float32)
        acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, hd)), Float32)
        if const_expr(self.kv_on_full):
            # Zeroed here and after each chain's epilogue, not at a chain's first step: a
            # branch holding only the zeroing is if-converted, 128 selects in every step.
            acc_dK.fill(0.0)
            acc_dV.fill(0.0)
        # Coordinates of every accumulator element: (kv row, q row) of S^T, (kv row, d) of dK.
        tScS = thr_sdp.partition_C(cute.make_identity_tensor(shape_st))
        # lse_early: the elements whose LSE2 rows are read right after the GEMMs are issued
        # (one per row), and each element's register among them (trace time).
        lse_reps = self._plan_lse_early(mma_sdp, shape_st)
        rLSE = cute.make_rmem_tensor(cute.make_layout(max(len(lse_reps), 1)), Float32)
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
        kept_stage = Int32(0)  # dk_defer: the stage of the previous step's deferred dK
        kept_slot = Int32(0)  # dk_defer: 1 while a deferred dK is due (its slot held for it)
        dk_smem = None
        if const_expr(self.dk_defer or self.rotate):
            # The deferred dK (and the rotated loop's) reads this warpgroup's rows of dS^T
            # from shared memory (where the dQ GEMM reads them too): held in registers across
            # the step, they made ptxas serialise every WGMMA for want of registers.
            mma_dk_smem = self._dk_smem_tiled_mma()
            wg_dk = mma_dk_smem.get_slice(wg * 128)
            tKsdS = wg_dk.make_fragment_A(wg_dk.partition_A(sdS))
            tKsQ = wg_dk.make_fragment_B(wg_dk.partition_B(transpose_view(sQ)))
            dk_smem = (mma_dk_smem, tKsdS, tKsQ)
        if const_expr(self.ds_guard):
            # As if a step -1's dQ GEMM were done: the other warpgroup's first dS store passes.
            cute.arch.barrier_arrive(
                barrier_id=BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
            )
        if const_expr(self.rotate):
            # The step loop rotated (bwd_step_rotated.py): each iteration from a step's dS^T
            # store through the next step's dS^T arithmetic.
            self._rotated_loop(
                SimpleNamespace(
                    mdK=mdK, mdV=mdV, scale_log2=scale_log2, softmax_scale=softmax_scale,
                    seqlen_q=seqlen_q, seqlen_k=seqlen_k, sdQ=sdQ, sLSE=sLSE, sDelta=sDelta,
                    sInfo=sInfo, storage=storage, mma_sdp=mma_sdp, mma_dkv=mma_dkv,
                    mma_dq=mma_dq, tidx=tidx, dkv_sums=dkv_sums, sK_out=sK_out, sV_out=sV_out,
                    wg=wg, thr_sdp=thr_sdp, thr_dq=thr_dq, tSrK=tSrK, tSrQ=tSrQ, tPrV=tPrV,
                    tPrdO=tPrdO, tVrdO=tVrdO, tKrQ=tKrQ, tQrK=tQrK, tQrdS=tQrdS,
                    shape_st=shape_st, acc_dK=acc_dK, acc_dV=acc_dV, tScS=tScS, rLSE=rLSE,
                    tKcK=tKcK, ds_copy=ds_copy, thr_ds=thr_ds, tDsdS=tDsdS, dk_smem=dk_smem,
                )
            )  # fmt: skip
        else:
            while done == 0:
                cute.arch.mbarrier_wait(storage.full_bar.data_ptr() + stage, phase)
                if const_expr(self.top_sync):
                    # Both warpgroups issue their S^T together (the dS barrier's id: all 256 MMA
                    # threads meet on it in the same order).
                    cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=self.num_mma_threads)
                self._trace(dkv_sums, wg, traced, point_index("top"))
                if const_expr(self.wg_stagger):  # noqa: SIM102 (compile-time, then runtime)
                    # Warpgroup 0's S^T and dP^T of this step are issued (or it saw the
                    # terminator).
                    if wg == 1:
                        cute.arch.barrier(
                            barrier_id=BAR_STAGGER, number_of_threads=self.num_mma_threads
                        )
                acc_S = cute.make_rmem_tensor(thr_sdp.partition_shape_C(shape_st), Float32)
                if const_expr(self.gemm_before_flags):
                    # S^T = K Q^T before the flags are read: K is in (it arrives with the chain's
                    # first step's barrier); at the terminator the result is dropped.
                    self._issue_s(mma_sdp, acc_S, tSrK, tSrQ, stage, s_halves)
                flags = sInfo[I_FLAGS, stage]
                done = flags & F_DONE
                # dS has one buffer with dq_double (its comment in HopperAttnBwd.__init__), one per
                # stage else.
                ds_stage = Int32(0) if const_expr(self.dq_double) else stage
                # dO's buffer: its one buffer with do_single, the step's ring stage else.
                do_stage = Int32(0) if const_expr(self.do_single) else stage
                if done != 0:
                    self._stagger_arrive(wg)
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
                        self._issue_s(mma_sdp, acc_S, tSrK, tSrQ, stage, s_halves)
                    if const_expr(self.dk_defer):
                        # The previous step's dK between S^T and dP^T (its Q and dS^T still in
                        # their buffers): the tensor pipe has it while the exponentials start. At a
                        # chain's first step none is due (the last step issued its own): an empty
                        # commit group keeps the waits' counts.
                        if kept_slot != 0:
                            kept_ds = Int32(0) if const_expr(self.dq_double) else kept_stage
                            wgmma(
                                mma_dk_smem, acc_dK, tKsdS[None, None, None, kept_ds],
                                tKsQ[None, None, None, kept_stage], zero_init=False,
                            )  # fmt: skip
                        else:
                            warpgroup.commit_group()
                    if const_expr(not self.dp_late):
                        self._issue_dp(acc_dP, tPrV, tPrdO, do_stage, storage, do_phase, mma_sdp)
                    self._stagger_arrive(wg)
                    for r in cutlass.range_constexpr(len(lse_reps)):
                        rLSE[r] = sLSE[tScS[lse_reps[r]][1], stage]
                    # S^T done (dP^T, and dk_defer's dK, may still run); with s_halves its first
                    # half (the second and dP^T may still run).
                    warpgroup.wait_group(
                        int(not self.dp_late) + int(self.dk_defer) + int(self.s_halves)
                    )
                    self._trace(dkv_sums, wg, traced, point_index("s_done"))
                    if const_expr(self.dp_late):
                        self._issue_dp(acc_dP, tPrV, tPrdO, do_stage, storage, do_phase, mma_sdp)

                    # P^T = exp2(S^T * scale_log2 - lse2), masked (_probs), the LSE2 rows read from
                    # shared memory here.
                    if const_expr(not self.early_meta):
                        n0, m0, shift, edge = self._step_tiles(sInfo, stage, seqlen_q, seqlen_k)
                    probs_args = (
                        acc_S, tScS, sLSE, rLSE, stage, scale_log2, n0, m0, shift, seqlen_k,
                    )  # fmt: skip
                    if const_expr(self.exp_tail > 0 or self.s_halves):
                        # The last exp_tail exponentials after the dP^T wait, in one block with
                        # dS^T; with s_halves the first half's before the wait for the second.
                        # Each wait sits in a block between two branches: ptxas hoists a
                        # wgmma wait above every exponential of its own block.
                        split = max(cute.size(acc_S) - self.exp_tail, 0)
                        first = 0
                        if const_expr(self.s_halves):
                            first = cute.size(acc_S) // 2
                            if edge != 0:
                                self._probs(*probs_args, True, 0, first)
                            else:
                                self._probs(*probs_args, False, 0, first)
                            warpgroup.wait_group(1)
                        if const_expr(split > first):
                            if edge != 0:
                                self._probs(*probs_args, True, first, split)
                            else:
                                self._probs(*probs_args, False, first, split)
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
                        if const_expr(self.dv_early):
                            # dV now, in the tensor pipe while dS^T is computed (younger than
                            # dP^T: the wait leaves it running).
                            rP = cute.make_fragment_like(acc_S, self.dtype)
                            convert_16bit(acc_S, rP)
                            self._dv_gemm(acc_dV, rP, tVrdO, do_stage, mma_dkv)
                            warpgroup.wait_group(1)
                            self._trace(dkv_sums, wg, traced, point_index("dp_done"))
                            self._grad_scores(rP, acc_dP, tScS, sDelta, stage)
                        else:
                            warpgroup.wait_group(0)
                            self._trace(dkv_sums, wg, traced, point_index("dp_done"))
                            self._grad_scores(acc_S, acc_dP, tScS, sDelta, stage)

                    if const_expr(not self.dv_early):
                        rP = cute.make_fragment_like(acc_S, self.dtype)
                        if const_expr(self.pack_truncated == 2):
                            convert_16bit(acc_S, rP, truncated=True)
                        else:
                            rP.store(acc_S.load().to(self.dtype))
                    if const_expr(self.dk_defer):  # noqa: SIM102 (compile-time, then runtime)
                        # The dP^T wait took the deferred dK too: its slot is free.
                        if kept_slot != 0:
                            cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + kept_stage)
                    rdS = cute.make_fragment_like(acc_dP, self.dtype)
                    if const_expr(self.pack_truncated > 0):
                        convert_16bit(acc_dP, rdS, truncated=True)
                    else:
                        rdS.store(acc_dP.load().to(self.dtype))

                    acc_dQ = cute.make_rmem_tensor(
                        thr_dq.partition_shape_C(self.dq_mma_shape), Float32
                    )
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
                    if const_expr(not self.dv_early):
                        self._dv_gemm(acc_dV, rP, tVrdO, do_stage, mma_dkv)
                    self._ds_barrier_gemms(
                        self._dk_at(), acc_dQ, acc_dK, rdS, tQrK, tQrdS, tKrQ, mma_dq, mma_dkv,
                        ds_stage, stage, storage, dkv_sums, wg, traced,
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
                            if const_expr(self.dk_defer):
                                kept_stage, kept_slot = stage, Int32(1)
                            else:
                                cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                        else:
                            if const_expr(self.dk_defer):
                                self._chain_last_dk(acc_dK, rdS, tKrQ, stage, mma_dkv)
                                kept_slot = Int32(0)
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
        dk_at: cutlass.Constexpr[int],
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
        (``dk_at`` DK_AFTER_DQ, FA4's order: the tensor pipe runs dV, dQ, dK back to back),
        dK before the barrier and dQ after it (DK_BEFORE_DS), or dQ alone (DK_NEXT_STEP: the
        next step issues this dK). Returns with dQ done (dK may still run) and, with
        do_single, dO's buffer released (dV was its last reader)."""
        if const_expr(dk_at == DK_BEFORE_DS):
            self._dk_gemm(acc_dK, rdS, tKrQ, stage, mma_dkv)
        cute.arch.fence_view_async_shared()
        self._trace(dkv_sums, wg, traced, point_index("ds_arrive"))
        cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=self.num_mma_threads)
        self._trace(dkv_sums, wg, traced, point_index("ds_pass"))
        if const_expr(self.dq_swap):
            wgmma(mma_dq, acc_dQ, tQrK, tQrdS[None, None, None, ds_stage], zero_init=True)
        else:
            wgmma(mma_dq, acc_dQ, tQrdS[None, None, None, ds_stage], tQrK, zero_init=True)
        # dV done (P's registers are free): with dK first two groups are younger, else one.
        warpgroup.wait_group(2 if const_expr(dk_at == DK_BEFORE_DS) else 1)
        if const_expr(self.do_single):
            cute.arch.mbarrier_arrive(storage.do_empty.data_ptr())
        if const_expr(dk_at != DK_AFTER_DQ):
            warpgroup.wait_group(0)  # dQ done (and dK before it, DK_BEFORE_DS)
        else:
            self._dk_gemm(acc_dK, rdS, tKrQ, stage, mma_dkv)
            warpgroup.wait_group(1)  # dQ done, dK may still run
        if const_expr(self.ds_guard):
            cute.arch.barrier_arrive(
                barrier_id=BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
            )

    def _s_halves_fragments(
        self,
        sK: cute.Tensor,
        sQ: cute.Tensor,
        wg: Int32,
        tidx: Int32,
        mma_sdp: cute.TiledMma,
        shape_st: tuple[int, int],
    ) -> SimpleNamespace | None:
        """s_halves (trace time): the half-width S^T MMA, its K and Q fragments (Q's with an N
        mode per half) and the layout under which a thread's S^T registers are its two
        halves' accumulators, checked to hold the same (kv row, q row) coordinates in the same
        registers as the whole MMA's fragment. None without s_halves."""
        if not self.s_halves:
            return None
        mma_half = self._s_half_tiled_mma()
        wg_half = mma_half.get_slice(wg * 128)
        ident = cute.make_identity_tensor(shape_st)
        for t in (0, 31, 32, 127, 128, 255):
            whole = mma_sdp.get_slice(t).partition_C(ident)
            halves = mma_half.get_slice(t).partition_C(ident)
            if cute.size(whole) != cute.size(halves):
                raise AssertionError("s_halves: the halves' fragments differ in size")
            for i in range(cute.size(whole)):
                if tuple(whole[i]) != tuple(halves[i]):
                    raise AssertionError(
                        f"s_halves: thread {t}, register {i}: {tuple(halves[i])} in the halves, "
                        f"{tuple(whole[i])} in the whole S^T"
                    )
        return SimpleNamespace(
            mma=mma_half,
            tSrK=wg_half.make_fragment_A(wg_half.partition_A(sK)),
            tSrQ=wg_half.make_fragment_B(wg_half.partition_B(sQ)),
            layout=cute.make_layout(mma_half.get_slice(tidx).partition_shape_C(shape_st)),
        )

    @cute.jit
    def _issue_s(
        self,
        mma_sdp: cute.TiledMma,
        acc_S: cute.Tensor,
        tSrK: cute.Tensor,
        tSrQ: cute.Tensor,
        stage: Int32,
        halves: SimpleNamespace | None,
    ):
        """S^T = K Q^T from ring stage ``stage``: one commit group, or with s_halves
        (``halves``, ``_s_halves_fragments``) one per half of the Q tile, the first half
        first."""
        if const_expr(halves is None):
            wgmma(mma_sdp, acc_S, tSrK, tSrQ[None, None, None, stage], zero_init=True)
        else:
            # The N mode as (1, 2), so that a half keeps the (value, M, N) modes cute.gemm
            # takes.
            acc = cute.logical_divide(
                cute.make_tensor(acc_S.iterator, halves.layout), (None, None, 1)
            )
            frag_q = cute.logical_divide(halves.tSrQ, (None, 1, None, None))
            for n in cutlass.range_constexpr(2):
                wgmma(
                    halves.mma, acc[None, None, (None, n)], halves.tSrK,
                    frag_q[None, (None, n), None, stage], zero_init=True,
                )  # fmt: skip

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

    def _dk_at(self) -> int:
        """Where a step issues its dK GEMM (trace time): DK_NEXT_STEP with dk_defer,
        DK_BEFORE_DS with dk_early, else DK_AFTER_DQ."""
        if self.dk_defer:
            return DK_NEXT_STEP
        return DK_BEFORE_DS if self.dk_early else DK_AFTER_DQ

    @cute.jit
    def _chain_last_dk(
        self,
        acc_dK: cute.Tensor,
        rdS: cute.Tensor,
        tKrQ: cute.Tensor,
        stage: Int32,
        mma_dkv: cute.TiledMma,
    ):
        """dk_defer, at a chain's last step: its own dK GEMM (dS^T still in registers),
        awaited: the chain epilogue reads acc_dK."""
        self._dk_gemm(acc_dK, rdS, tKrQ, stage, mma_dkv)
        warpgroup.wait_group(0)

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
    def _stagger_arrive(self, wg: Int32) -> None:
        """wg_stagger: warpgroup 0 lets warpgroup 1 issue this step's GEMMs (no wait)."""
        if const_expr(self.wg_stagger):  # noqa: SIM102 (compile-time, then runtime)
            if wg == 0:
                cute.arch.barrier_arrive(
                    barrier_id=BAR_STAGGER, number_of_threads=self.num_mma_threads
                )

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
        rLSE: cute.Tensor,
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
        ``sLSE`` rows, or from ``rLSE`` for the elements lse_early read before the S^T wait."""
        if const_expr(self.skip_elementwise):
            return
        end = cute.size(acc_S) if const_expr(end is None) else end
        poly_count, poly_period = self.exp_poly
        for i in cutlass.range_constexpr(first, end):
            n, m = tScS[i]
            if const_expr(i in self._lse_slot):
                x = acc_S[i] * scale_log2 - rLSE[self._lse_slot[i]]
            else:
                x = acc_S[i] * scale_log2 - sLSE[m, stage]
            if const_expr(i % poly_period >= poly_period - poly_count):
                p = exp2_poly(x, self.exp_poly_degree)
            else:
                p = cute.math.exp2(x, fastmath=True)
            if const_expr(masked):
                p = self._mask_prob(p, n, m, n0, m0, shift, seqlen_k)
            acc_S[i] = p

    def _plan_lse_early(self, mma_sdp: cute.TiledMma, shape_st: tuple[int, int]) -> list[int]:
        """Trace time (plain Python): for lse_early, one fragment element per LSE2 row read
        early (the first lse_early distinct query columns in fragment order), and
        ``self._lse_slot``, each element's register among them. The columns are read off the
        MMA's thread-0 partition and checked to be the same pattern (shifted) for one thread
        of each warp, as the kernel indexes them with its own thread's coordinates."""
        self._lse_slot = {}
        if self.lse_early == 0:
            return []
        ident = cute.make_identity_tensor(shape_st)

        def columns(t: int) -> list[int]:
            coords = mma_sdp.get_slice(t).partition_C(ident)
            return [int(tuple(coords[i])[1]) for i in range(cute.size(coords))]

        base = columns(0)
        for t in range(0, self.num_mma_threads, 32):
            shifted = columns(t)
            if [c - shifted[0] for c in shifted] != [c - base[0] for c in base]:
                raise AssertionError(f"S^T fragment columns of thread {t} are not thread 0's")
        reps: list[int] = []
        slot_of_column: dict[int, int] = {}
        for i, column in enumerate(base):
            if column not in slot_of_column and len(reps) < self.lse_early:
                slot_of_column[column] = len(reps)
                reps.append(i)
            if column in slot_of_column:
                self._lse_slot[i] = slot_of_column[column]
        return reps

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
        """dS^T = P^T (dP^T - delta) in place of dP^T (acc_S holds P^T: fp32, or with dv_early
        the 16-bit copy dV reads)."""
        if const_expr(self.skip_elementwise):
            return
        packed = const_expr(acc_S.element_type is not Float32)
        if const_expr(packed):
            # Each value from its 32-bit pair (the packed conversion's registers). Read as
            # 16-bit values, ptxas converted each on its own (one F2F per value, beside the
            # exponentials, and both copies live: spills); that build was 0.95x (session 62).
            words = cute.recast_tensor(acc_S, Int32)
            bf16 = const_expr(acc_S.element_type == cutlass.BFloat16)
        for i in cutlass.range_constexpr(cute.size(acc_dP)):
            _, m = tScS[i]
            if const_expr(packed):
                p = unpack_16bit_half(words[i // 2], i % 2 == 1, bf16)
            else:
                p = acc_S[i]
            acc_dP[i] = p * (acc_dP[i] - sDelta[m, stage])

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
