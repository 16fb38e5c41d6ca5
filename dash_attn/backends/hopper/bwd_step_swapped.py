"""The MMA warpgroups' step loop at head dims 192 and 256 (``dkv_swap``, FA4's layout there):
Q rows as the MMA rows, P and dS through shared memory, dK^T and dV^T accumulated with the head
dim as M (``bwd.HopperAttnBwd``'s constructor comment on ``dkv_swap``)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from ._cute_utils import transpose_view, wgmma
from .bwd_epilogue import DkvSums
from .bwd_sync import (
    BAR_DQ_EMPTY,
    BAR_DQ_FULL,
    BAR_DQ_READ,
    BAR_DS,
    F_DONE,
    F_FIRST,
    F_LAST,
    I_FLAGS,
)


def fragment_rows(coords0, size: int) -> tuple[list[int], list[int]]:
    """Thread 0's distinct accumulator rows in order of first appearance, and for each of the
    ``size`` registers the index of its row in that list. Every thread's rows are its first
    row plus thread 0's (the accumulator's thread-value layout), so per-row values are read
    once per distinct row."""
    rows: list[int] = []
    slot: list[int] = []
    for i in range(size):
        row = coords0[i][0]
        if row not in rows:
            rows.append(row)
        slot.append(rows.index(row))
    return rows, slot


class SwappedStepMixin:
    """``HopperAttnBwd``'s MMA warpgroups at head dims 192 and 256 (``dkv_swap``)."""

    def _swapped_tiled_mmas(self):
        """The tiled MMAs of the dkv_swap step (its comment in ``HopperAttnBwd.__init__``)."""
        bn, hd = self.block_n, self.head_dim
        K_major = cute.nvgpu.OperandMajorMode.K
        MN_major = cute.nvgpu.OperandMajorMode.MN
        # S = Q K^T and dP = dO V^T: M = the 64 Q rows, the WGs split the KV columns.
        mma_sdp = sm90_helpers.make_trivial_tiled_mma(
            self.dtype, self.dtype, K_major, K_major, Float32,
            atom_layout_mnk=(1, 2, 1), tiler_mn=(64, bn // 2),
        )  # fmt: skip
        # dV^T += dO^T P and dK^T += Q^T dS: M = the head dim, N = KV rows, K = Q rows; A (dO^T,
        # Q^T) and B (P^T, dS^T views of the (Q rows, KV rows) tiles) both read MN-major.
        if self.dkv_split == "n":
            atom_dkv, tiler_dkv = (1, 2, 1), (64, bn // 2)
        else:
            atom_dkv, tiler_dkv = (2, 1, 1), (64, bn)
        mma_dkv = sm90_helpers.make_trivial_tiled_mma(
            self.dtype, self.dtype, MN_major, MN_major, Float32,
            atom_layout_mnk=atom_dkv, tiler_mn=tiler_dkv,
        )  # fmt: skip
        # dQ = dS K: A = dS (K-major: KV rows contiguous), B = K read MN-major; the WGs split
        # the head dim (dq_fragment's "cols").
        mma_dq = sm90_helpers.make_trivial_tiled_mma(
            self.dtype, self.dtype, K_major, MN_major, Float32,
            atom_layout_mnk=(1, 2, 1), tiler_mn=(64, hd // 2),
        )  # fmt: skip
        return mma_sdp, mma_dkv, mma_dq

    @cute.jit
    def mma_swapped(
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
        sPdS: cute.Tensor,
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
    ):
        """The MMA warpgroups' step loop of ``dkv_swap`` (head dims 192 and 256; its comment in
        ``HopperAttnBwd.__init__``). Same ring, K/V, dQ hand-off and chain protocol as ``mma``; sPdS
        holds dS ([.., 0]) and P ([.., 1])."""
        bm, bn, hd = self.block_m, self.block_n, self.head_dim
        wg, thr_sdp, thr_dkv, thr_dq, wg_sdp, wg_dkv, wg_dq = self._mma_slices(
            mma_sdp, mma_dkv, mma_dq, tidx
        )

        # Operand fragments (descriptors into shared memory; the stage is the last mode).
        tSrQ = wg_sdp.make_fragment_A(wg_sdp.partition_A(sQ))
        tSrK = wg_sdp.make_fragment_B(wg_sdp.partition_B(sK))
        tPrdO = wg_sdp.make_fragment_A(wg_sdp.partition_A(sdO))
        tPrV = wg_sdp.make_fragment_B(wg_sdp.partition_B(sV))
        tVrdO = wg_dkv.make_fragment_A(wg_dkv.partition_A(transpose_view(sdO)))
        tVrP = wg_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(sPdS)))
        tKrQ = wg_dkv.make_fragment_A(wg_dkv.partition_A(transpose_view(sQ)))
        tKrdS = wg_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(sPdS)))
        tQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(sPdS))
        tQrK = wg_dq.make_fragment_B(wg_dq.partition_B(transpose_view(sK)))

        shape_s = (bm, bn)
        acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((hd, bn)), Float32)
        acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((hd, bn)), Float32)
        # Coordinates of every accumulator element: (q row, kv row) of S, (d, kv row) of dK^T.
        tScS = thr_sdp.partition_C(cute.make_identity_tensor(shape_s))
        tKcK = thr_dkv.partition_C(cute.make_identity_tensor((hd, bn)))
        coords0 = mma_sdp.get_slice(0).partition_C(cute.make_identity_tensor(shape_s))
        n_regs = cute.size(tScS)
        rows0, row_slot = fragment_rows(coords0, n_regs)
        assert coords0[0] == (0, 0)
        # P and dS leave by stmatrix in the accumulator's layout (KV rows contiguous in sPdS)
        # at hd 192. At hd 256 a warpgroup's 24 KV columns start inside a 16-column swizzle
        # atom, which a tiled copy cannot partition: element by element there (12 + 12 per
        # thread and step).
        ps_stmatrix = (bn // 2) % 16 == 0
        if const_expr(ps_stmatrix):
            ds_atom = cute.make_copy_atom(
                cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
            )
            ds_copy = cute.make_tiled_copy_C(ds_atom, mma_sdp)
            thr_ds = ds_copy.get_slice(tidx)
            tDsPdS = thr_ds.partition_D(sPdS)
        rLSE = cute.make_rmem_tensor(len(rows0), Float32)
        rDelta = cute.make_rmem_tensor(len(rows0), Float32)

        stage = Int32(0)
        phase = Int32(0)
        kv_phase = Int32(0)
        do_phase = Int32(0)
        done = Int32(0)
        buf = Int32(0)
        # As if a step -1's GEMMs were done: the other warpgroup's first P store passes.
        cute.arch.barrier_arrive(
            barrier_id=BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
        )
        while done == 0:
            cute.arch.mbarrier_wait(storage.full_bar.data_ptr() + stage, phase)
            flags = sInfo[I_FLAGS, stage]
            done = flags & F_DONE
            if done != 0:
                self._stop_dq_writer(buf, wg, True)
            else:
                if flags & F_FIRST != 0:
                    cute.arch.mbarrier_wait(storage.kv_full.data_ptr(), kv_phase)
                    kv_phase = kv_phase ^ 1
                    acc_dK.fill(0.0)
                    acc_dV.fill(0.0)
                n0, m0, shift, edge = self._step_tiles(sInfo, stage, seqlen_q, seqlen_k)
                acc_S = cute.make_rmem_tensor(thr_sdp.partition_shape_C(shape_s), Float32)
                acc_dP = cute.make_rmem_tensor(thr_sdp.partition_shape_C(shape_s), Float32)
                wgmma(mma_sdp, acc_S, tSrQ[None, None, None, stage], tSrK, zero_init=True)
                cute.arch.mbarrier_wait(storage.do_full.data_ptr(), do_phase)
                wgmma(mma_sdp, acc_dP, tPrdO[None, None, None, 0], tPrV, zero_init=True)
                # Two LSE2 and delta values per thread (its two Q rows), read while S runs.
                m_t = tScS[0][0]
                for r in cutlass.range_constexpr(len(rows0)):
                    rLSE[r] = sLSE[m_t + rows0[r], stage]
                    rDelta[r] = sDelta[m_t + rows0[r], stage]
                warpgroup.wait_group(1)
                if edge != 0:
                    self._probs_rows(
                        acc_S, tScS, rLSE, row_slot, scale_log2, n0, m0, shift, seqlen_k, True
                    )
                else:
                    self._probs_rows(
                        acc_S, tScS, rLSE, row_slot, scale_log2, n0, m0, shift, seqlen_k, False
                    )
                rP = cute.make_fragment_like(acc_S, self.dtype)
                rP.store(acc_S.load().to(self.dtype))
                # The other warpgroup's GEMMs of the previous step have read P and dS.
                cute.arch.barrier(
                    barrier_id=BAR_DQ_READ + 1 - wg, number_of_threads=self.num_mma_threads
                )
                if const_expr(ps_stmatrix):
                    cute.copy(ds_copy, thr_ds.retile(rP), tDsPdS[None, None, None, 1])
                else:
                    for i in cutlass.range_constexpr(n_regs):
                        sPdS[tScS[i][0], tScS[i][1], 1] = rP[i]
                warpgroup.wait_group(0)
                for i in cutlass.range_constexpr(n_regs):
                    acc_dP[i] = acc_S[i] * (acc_dP[i] - rDelta[row_slot[i]])
                rdS = cute.make_fragment_like(acc_dP, self.dtype)
                rdS.store(acc_dP.load().to(self.dtype))
                if const_expr(ps_stmatrix):
                    cute.copy(ds_copy, thr_ds.retile(rdS), tDsPdS[None, None, None, 0])
                else:
                    for i in cutlass.range_constexpr(n_regs):
                        sPdS[tScS[i][0], tScS[i][1], 0] = rdS[i]
                cute.arch.fence_view_async_shared()
                cute.arch.barrier(barrier_id=BAR_DS, number_of_threads=self.num_mma_threads)

                # dV^T, then dQ (its hand-off waits for it), then dK^T.
                acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C((bm, hd)), Float32)
                wgmma(
                    mma_dkv, acc_dV, tVrdO[None, None, None, 0], tVrP[None, None, None, 1],
                    zero_init=False,
                )  # fmt: skip
                wgmma(mma_dq, acc_dQ, tQrdS[None, None, None, 0], tQrK, zero_init=True)
                wgmma(
                    mma_dkv, acc_dK, tKrQ[None, None, None, stage], tKrdS[None, None, None, 0],
                    zero_init=False,
                )  # fmt: skip
                warpgroup.wait_group(1)  # dV^T and dQ done
                # dV^T was dO's last reader: the producer may load the next step's dO.
                cute.arch.mbarrier_arrive(storage.do_empty.data_ptr())
                do_phase = do_phase ^ 1
                self._dq_barrier(BAR_DQ_EMPTY, buf, wg, wait=True)
                self._store_dq_fragment(acc_dQ, sdQ, buf, tidx, mma_dq)
                cute.arch.fence_view_async_shared()
                self._dq_barrier(BAR_DQ_FULL, buf, wg, wait=False)
                warpgroup.wait_group(0)  # dK^T done: this warpgroup no longer reads P and dS
                cute.arch.barrier_arrive(
                    barrier_id=BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
                )
                if flags & F_LAST == 0:
                    cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                elif const_expr(self.dkv_sum):
                    self._sum_chain_epilogue_swapped(
                        storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, softmax_scale,
                        seqlen_k, dkv_sums, tidx, wg,
                    )  # fmt: skip
                else:
                    self._chain_epilogue_swapped(
                        storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, mma_dkv, softmax_scale,
                        seqlen_k, sK, sV, tidx, wg,
                    )  # fmt: skip

                stage, phase = self._next_stage(stage, phase)

    @cute.jit
    def _probs_rows(
        self,
        acc_S: cute.Tensor,
        tScS: cute.Tensor,
        rLSE: cute.Tensor,
        row_slot: cutlass.Constexpr,
        scale_log2: Float32,
        n0: Int32,
        m0: Int32,
        shift: Int32,
        seqlen_k: Int32,
        masked: cutlass.Constexpr,
    ):
        """P = exp2(S * scale_log2 - lse2) in place (dkv_swap: S's rows are Q rows, the LSE2 of
        register i is rLSE[row_slot[i]]); with ``masked`` ``_mask_prob``'s masks."""
        for i in cutlass.range_constexpr(cute.size(acc_S)):
            m, n = tScS[i]
            p = cute.math.exp2(acc_S[i] * scale_log2 - rLSE[row_slot[i]], fastmath=True)
            if const_expr(masked):
                p = self._mask_prob(p, n, m, n0, m0, shift, seqlen_k)
            acc_S[i] = p
