"""The MMA warpgroups' step loop rotated (``HopperAttnBwd(rotate=True)``, a probe on the hd-128
full 4k kernel): each iteration runs one step from its dS^T store through dV, the dS barrier,
dQ, the dQ hand-off and the issue of its dK GEMM, then the next step's slot wait, S^T and dP^T,
the exponentials, the dP^T wait and the dS^T arithmetic. The step's dK GEMM is then still
running when the next step's S^T and dP^T are issued; the next S^T wait takes it too, and the
step's ring slot (dK reads its Q) is released there. In the plain loop
(``bwd_step.StepMixin.mma``) each step waits for its dK before the next one starts, and ptxas
waits for every WGMMA in flight at a loop's back-edge, so this overlap needs the back-edge
where none is: after a step's dS^T arithmetic, before its dS^T store (NOTES item 348)."""

from __future__ import annotations

from types import SimpleNamespace

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from ._cute_utils import convert_16bit, wgmma
from .bwd_step import DK_NEXT_STEP, point_index
from .bwd_sync import BAR_DQ_EMPTY, BAR_DQ_FULL, F_DONE, F_FIRST, F_LAST, I_FLAGS


class RotatedStepMixin:
    """``HopperAttnBwd``'s rotated step loop (``rotate``); its helpers are ``StepMixin``'s."""

    @cute.jit
    def _rotated_loop(self, v: SimpleNamespace):
        """The step loop of ``StepMixin.mma`` rotated; ``v`` holds ``mma``'s arguments and the
        fragments it made. Differences from that loop: a chain's first dK GEMM starts from
        zero by its ACCUMULATE flag (acc_dK is not zeroed after a chain's epilogue: zeros
        written on one path while the dK GEMM is in flight on the other made ptxas wait for
        it where the paths join), and the "end" trace point comes before the step's dK is
        done."""
        # (rotate refuses do_single, dq_double and ds_guard: dO and dS^T are in the step's
        # ring stage, and the dQ staging buffer is buffer 0.)
        stage = Int32(0)
        phase = Int32(0)
        buf = Int32(0)
        traced = Int32(0)  # steps this warpgroup has run (step_trace)
        kept_stage = Int32(0)  # the stage of the previous step, held until its dK is done
        kept_slot = Int32(0)  # 1 while that slot is held
        # P^T and dS^T of the step in flight, carried from one iteration to the next as packed
        # 16-bit pairs (its fp32 accumulators carried across the back-edge made ptxas
        # serialise every WGMMA for want of registers; 16-bit fragments were carried as one
        # register per value, and spilled).
        pairs = cute.size(v.thr_sdp.partition_shape_C(v.shape_st)) // 2
        pP = cute.make_rmem_tensor(cute.make_layout(pairs), Int32)
        pdS = cute.make_rmem_tensor(cute.make_layout(pairs), Int32)
        flags, done = self._rotated_front(v, pP, pdS, stage, phase, traced, kept_slot, kept_stage)
        while done == 0:
            rP = self._unpacked(pP, v)
            rdS = self._unpacked(pdS, v)
            acc_dQ = cute.make_rmem_tensor(v.thr_dq.partition_shape_C(self.dq_mma_shape), Float32)
            cute.copy(v.ds_copy, v.thr_ds.retile(rdS), v.tDsdS[None, None, None, stage])
            self._trace(v.dkv_sums, v.wg, traced, point_index("ds_stored"))
            self._dv_gemm(v.acc_dV, rP, v.tVrdO, stage, v.mma_dkv)
            # dQ alone after the dS barrier, awaited (DK_NEXT_STEP: this loop issues the dK).
            self._ds_barrier_gemms(
                DK_NEXT_STEP, acc_dQ, v.acc_dK, rdS, v.tQrK, v.tQrdS, v.tKrQ, v.mma_dq,
                v.mma_dkv, stage, stage, v.storage, v.dkv_sums, v.wg, traced,
            )  # fmt: skip

            # Hand the dQ partial to the dQ writer once its buffer is free, before the dK GEMM
            # is issued: the proxy fence of the hand-off waited for the dK GEMM in flight (its
            # shared-memory operand reads are async-proxy accesses).
            self._trace(v.dkv_sums, v.wg, traced, point_index("dq_wait"))
            self._dq_barrier(BAR_DQ_EMPTY, buf, v.wg, wait=True)
            self._trace(v.dkv_sums, v.wg, traced, point_index("dq_pass"))
            self._store_dq_fragment(acc_dQ, v.sdQ, buf, v.tidx, v.mma_dq)
            cute.arch.fence_view_async_shared()
            self._trace(v.dkv_sums, v.wg, traced, point_index("dq_stored"))
            self._dq_barrier(BAR_DQ_FULL, buf, v.wg, wait=False)
            # dK += dS^T Q, dS^T from shared memory (its registers are free while this GEMM
            # runs into the next step); a chain's first dK starts from zero by its ACCUMULATE
            # flag (zeroing acc_dK after the chain's epilogue, on one path while the GEMM is in
            # flight on the other, made ptxas wait for it where the paths join).
            mma_dk_smem, tKsdS, tKsQ = v.dk_smem
            wgmma(
                mma_dk_smem, v.acc_dK, tKsdS[None, None, None, stage],
                tKsQ[None, None, None, stage], zero_init=False,
                accumulate=(flags & F_FIRST) == 0,
            )  # fmt: skip

            if flags & F_LAST == 0:
                # dK still runs: the slot is released after the next step's S^T wait.
                kept_stage, kept_slot = stage, Int32(1)
            else:
                warpgroup.wait_group(0)
                kept_slot = Int32(0)
                self._rotated_chain_end(v, stage)
            self._trace(v.dkv_sums, v.wg, traced, point_index("end"))
            if const_expr(self.step_trace > 0):
                traced = traced + 1
            stage, phase = self._next_stage(stage, phase)
            flags, done = self._rotated_front(
                v, pP, pdS, stage, phase, traced, kept_slot, kept_stage
            )

    @cute.jit
    def _rotated_front(
        self,
        v: SimpleNamespace,
        pP: cute.Tensor,
        pdS: cute.Tensor,
        stage: Int32,
        phase: Int32,
        traced: Int32,
        kept_slot: Int32,
        kept_stage: Int32,
    ):
        """The first half of the step in ring stage ``stage``: its slot, S^T and dP^T, the S^T
        wait (which also takes the previous step's dK, older: its held slot is released), P^T
        and dS^T (packed 16-bit pairs into ``pP`` and ``pdS``); or, at the terminator, every
        GEMM awaited and the dQ writer stopped. Returns the step's flags and whether it is the
        terminator."""
        cute.arch.mbarrier_wait(v.storage.full_bar.data_ptr() + stage, phase)
        self._trace(v.dkv_sums, v.wg, traced, point_index("top"))
        # (The shape from self: Python ints carried into the loop in ``v`` become dynamic.)
        shape_st = (self.block_n, self.block_m)
        acc_S = cute.make_rmem_tensor(v.thr_sdp.partition_shape_C(shape_st), Float32)
        acc_dP = cute.make_rmem_tensor(v.thr_sdp.partition_shape_C(shape_st), Float32)
        if const_expr(self.gemm_before_flags):
            wgmma(v.mma_sdp, acc_S, v.tSrK, v.tSrQ[None, None, None, stage], zero_init=True)
        flags = v.sInfo[I_FLAGS, stage]
        done = flags & F_DONE
        if done != 0:
            warpgroup.wait_group(0)
            self._stop_dq_writer(Int32(0), v.wg, False)
        else:
            if const_expr(not self.gemm_before_flags):
                wgmma(v.mma_sdp, acc_S, v.tSrK, v.tSrQ[None, None, None, stage], zero_init=True)
            self._issue_dp(acc_dP, v.tPrV, v.tPrdO, stage, v.storage, Int32(0), v.mma_sdp)
            warpgroup.wait_group(1)
            self._trace(v.dkv_sums, v.wg, traced, point_index("s_done"))
            if kept_slot != 0:
                cute.arch.mbarrier_arrive(v.storage.empty_bar.data_ptr() + kept_stage)
            n0, m0, shift, edge = self._step_tiles(v.sInfo, stage, v.seqlen_q, v.seqlen_k)
            probs_args = (
                acc_S, v.tScS, v.sLSE, v.rLSE, stage, v.scale_log2, n0, m0, shift, v.seqlen_k,
            )  # fmt: skip
            if edge != 0:
                self._probs(*probs_args, True)
            else:
                self._probs(*probs_args, False)
            warpgroup.wait_group(0)
            self._trace(v.dkv_sums, v.wg, traced, point_index("dp_done"))
            self._grad_scores(acc_S, acc_dP, v.tScS, v.sDelta, stage)
            convert_16bit(acc_S, cute.recast_tensor(pP, self.dtype))
            convert_16bit(acc_dP, cute.recast_tensor(pdS, self.dtype))
        return flags, done

    @cute.jit
    def _unpacked(self, packed: cute.Tensor, v: SimpleNamespace) -> cute.Tensor:
        """A 16-bit accumulator-layout fragment (P^T's, dS^T's) holding ``packed``'s pairs."""
        frag = cute.make_rmem_tensor(
            v.thr_sdp.partition_shape_C((self.block_n, self.block_m)), self.dtype
        )
        words = cute.recast_tensor(frag, Int32)
        for j in cutlass.range_constexpr(cute.size(words)):
            words[j] = packed[j]
        return frag

    @cute.jit
    def _rotated_chain_end(self, v: SimpleNamespace, stage: Int32):
        """A chain's last step, its dK done: the chain epilogue (which releases the slot), and
        acc_dV zeroed for the next chain (acc_dK is zeroed by that chain's first dK GEMM)."""
        self._end_chain(
            v.storage, v.sInfo, stage, v.acc_dK, v.acc_dV, v.mdK, v.mdV, v.tKcK, v.mma_dkv,
            v.softmax_scale, v.seqlen_k, v.sK_out, v.sV_out, v.dkv_sums, v.tidx, v.wg,
        )  # fmt: skip
        v.acc_dV.fill(0.0)
