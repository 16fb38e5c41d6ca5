"""The Hopper forward's consumer warpgroups (``fwd.HopperFwd``): per key block S = Q K^T, the
mask, the online softmax in base 2, P to 16 bits and O += P V, the two warpgroups handing the
tensor cores to each other by named barriers; then the epilogue (O / rowsum and the LSE)."""

from __future__ import annotations

import math
import operator
from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as cpipe
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from ._cute_utils import acc_to_operand_a, convert_16bit, wgmma

LN_2 = math.log(2.0)

# Named barrier ids (0 is __syncthreads). Epilogue: the 256 consumer threads, before O
# overwrites sQ and again before the TMA store reads sO.
_BAR_EPILOGUE = 1
# Scheduler barriers: consumer warpgroup w (1 or 2) waits on id _BAR_SCHED_BASE + w - 1.
_BAR_SCHED_BASE = 2
# p_smem: consumer warpgroup w's P tile fully in shared memory (its 128 threads), id
# _BAR_P_BASE + w - 1 (after the scheduler barriers of up to three warpgroups).
_BAR_P_BASE = 5


def _mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View a WGMMA accumulator ((2, 2, N/8), MMA_M, MMA_N) as (rows, cols) of this thread.

    Element (2, 2, V) = (column pair, row half, column group of 8); rows are (row half, MMA_M),
    columns (pair, V, MMA_N). Same storage, re-indexed, so softmax can loop row by row.
    """
    lay = cute.make_layout(acc.layout.shape)  # column-major over the fragment's own modes
    shape = (
        (lay.shape[0][1], lay.shape[1]),
        (lay.shape[0][0], lay.shape[0][2], lay.shape[2]),
    )
    stride = (
        (lay.stride[0][1], lay.stride[1]),
        (lay.stride[0][0], lay.stride[0][2], lay.stride[2]),
    )
    return cute.make_tensor(
        acc.iterator, cute.composition(acc.layout, cute.make_layout(shape, stride=stride))
    )


def _row_reduce4(s_mn: cute.Tensor, r: int, op: Any) -> Any:
    """``op`` over row ``r`` of an (rows, cols) view as four independent chains, combined as
    (0 op 1) op (2 op 3): a single chain would be a cols-deep run of dependent instructions."""
    # A plain function, traced from the kernel: its Python loops unroll at trace time.
    part = [s_mn[r, j] for j in range(4)]
    for c in range(4, cute.size(s_mn, mode=[1]), 4):
        for j in range(4):
            part[j] = op(part[j], s_mn[r, c + j])
    return op(op(part[0], part[1]), op(part[2], part[3]))


class FwdConsumerMixin:
    """``HopperFwd``'s consumer warpgroups (its options are read from ``self``)."""

    @cute.jit
    def consume(
        self,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        sO: cute.Tensor,
        sP: cute.Tensor,
        tma_o: cute.CopyAtom,
        pipe_q: cpipe.PipelineTmaAsync,
        pipe_k: cpipe.PipelineTmaAsync,
        pipe_v: cpipe.PipelineTmaAsync,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        scale_log2: Float32,
        tidx: Int32,
        mTiles: cute.Tensor,
        first_tile: Int32,
        tile_step: Int32,
        tile_end: Int32,
        num_m_blocks: Int32,
        heads: Int32,
        seqlen_k: Int32,
    ) -> None:
        tm, tn, hd = self.tile_m, self.tile_n, self.head_dim
        wg = cute.arch.make_warp_uniform(tidx // 128) + 1  # 1 .. num_consumer_wg
        # Per-warpgroup slices issue the WGMMAs (descriptors over this WG's 64 rows of Q);
        # per-thread slices give coordinates for masking and the epilogue.
        wg_qk = tiled_mma_qk.get_slice((wg - 1) * 128)
        wg_pv = tiled_mma_pv.get_slice((wg - 1) * 128)
        thr_qk = tiled_mma_qk.get_slice(tidx)
        thr_pv = tiled_mma_pv.get_slice(tidx)

        tSrQ = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
        tSrK = wg_qk.make_fragment_B(wg_qk.partition_B(sK))
        sVt = cute.composition(
            sV, cute.make_ordered_layout((hd, tn, self.num_stages), order=(1, 0, 2))
        )
        tOrVt = wg_pv.make_fragment_B(wg_pv.partition_B(sVt))
        if const_expr(self.p_smem):
            # PV's A operand is this warpgroup's slab of sP, written by stmatrix in the layout
            # of the QK^T accumulator (_set_p).
            tOrP = wg_pv.make_fragment_A(wg_pv.partition_A(sP))
            p_atom = cute.make_copy_atom(
                cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
            )
            p_copy = cute.make_tiled_copy_C(p_atom, tiled_mma_qk).get_slice(tidx)
            p_stage = (p_atom, p_copy, p_copy.partition_D(sP))
        else:
            tOrP = wg_pv.make_fragment_A(wg_pv.partition_shape_A((tm, tn)))
            p_stage = None
        acc_o = cute.make_rmem_tensor(wg_pv.partition_shape_C((tm, hd)), Float32)
        acc_s_shape = wg_qk.partition_shape_C((tm, tn))

        c_s = cute.make_identity_tensor((tm, tn))
        t_coord = thr_qk.partition_C(c_s)
        t0_coord = tiled_mma_qk.get_slice(0).partition_C(c_s)

        n_rows = cute.size(_mn_view(acc_o), mode=[0])
        row_max = cute.make_rmem_tensor(n_rows, Float32)
        row_sum = cute.make_rmem_tensor(n_rows, Float32)
        row_scale = cute.make_rmem_tensor(n_rows, Float32)
        seqlen_q = mO.shape[0]
        # Bottom-right causal: key n is visible to row m iff n <= m + shift.
        shift = seqlen_k - seqlen_q
        q_state = cpipe.make_pipeline_state(cpipe.PipelineUserType.Consumer, 1)
        # On entry to a tile: the stage of its first K (the rings run on across tiles).
        kv_state = cpipe.make_pipeline_state(cpipe.PipelineUserType.Consumer, self.num_stages)

        for it in cutlass.range(first_tile, tile_end, tile_step, unroll=1):
            tile = mTiles[it] if const_expr(self.tile_list) else it
            m_block, head, batch, n_block_max = self._tile(
                tile, num_m_blocks, heads, seqlen_q, seqlen_k
            )
            acc_o.fill(0.0)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
            # Warpgroup 1 goes first: pre-arrive on its own scheduler barrier.
            if wg == 1:
                cute.arch.barrier_arrive(barrier_id=_BAR_SCHED_BASE, number_of_threads=256)

            pipe_q.consumer_wait(q_state)

            if n_block_max > 0:
                # First block (highest n): S only; always masked (it holds the seqlen_k edge and,
                # if causal, the diagonal).
                n_block = n_block_max - 1
                pipe_k.consumer_wait(kv_state)
                acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
                wgmma(tiled_mma_qk, acc_s, tSrQ, tSrK[None, None, None, kv_state.index], True)
                warpgroup.wait_group(0)
                pipe_k.consumer_release(kv_state)
                self._mask(acc_s, t_coord, t0_coord, m_block, n_block, seqlen_k, shift)
                self._online_softmax(acc_s, row_max, row_sum, row_scale, scale_log2)
                self._set_p(acc_s, tOrP, p_stage, wg)

                # Blocks left of n_unmasked need no mask: fully inside seqlen_k and left of every
                # row's diagonal.
                n_unmasked = seqlen_k // tn
                if const_expr(self.causal):
                    diag = cutlass.max(m_block * tm + shift + 1, 0)
                    n_unmasked = cutlass.min(n_unmasked, diag // tn)
                n_unmasked = cutlass.min(n_unmasked, n_block_max - 1)
                n_masked = n_block_max - 1 - n_unmasked
                for i in cutlass.range(n_masked, unroll=1):
                    kv_state = self._step(
                        n_block_max - 2 - i, True, kv_state, wg, acc_o, tOrP, tOrVt, tSrQ, tSrK,
                        acc_s_shape, pipe_k, pipe_v, tiled_mma_qk, tiled_mma_pv, t_coord, t0_coord,
                        row_max, row_sum, row_scale, scale_log2, m_block, seqlen_k, shift, p_stage,
                    )  # fmt: skip
                for i in cutlass.range(n_unmasked, unroll=1):
                    kv_state = self._step(
                        n_unmasked - 1 - i, False, kv_state, wg, acc_o, tOrP, tOrVt, tSrQ, tSrK,
                        acc_s_shape, pipe_k, pipe_v, tiled_mma_qk, tiled_mma_pv, t_coord, t0_coord,
                        row_max, row_sum, row_scale, scale_log2, m_block, seqlen_k, shift, p_stage,
                    )  # fmt: skip
                # Q is read by no later GEMM of this tile: release it, so that (persistent) the
                # next tile's Q loads during this tile's last PV and epilogue.
                pipe_q.consumer_release(q_state)
                # Last PV (block 0) on its own.
                pipe_v.consumer_wait(kv_state)
                v_stage = tOrVt[None, None, None, kv_state.index]
                wgmma(tiled_mma_pv, acc_o, tOrP, v_stage, False)
                warpgroup.wait_group(0)
                pipe_v.consumer_release(kv_state)
                kv_state.advance()
            else:
                pipe_q.consumer_release(q_state)
            q_state.advance()
            # Balance the scheduler barriers: WG1's pre-arrive pairs with this final sync (which
            # absorbs the last WG's last arrive); every other in-loop sync of a WG pairs with an
            # in-loop arrive of the WG before it in the cycle.
            if wg == 1:
                self._sched_sync(wg)

            # ---- finalize: quad-reduce the sums, LSE in natural log, O /= sum.
            lse = cute.make_rmem_tensor(n_rows, Float32)
            for r in cutlass.range_constexpr(n_rows):
                total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
                empty = total == 0.0
                row_scale[r] = cute.arch.rcp_approx(total if not empty else Float32(1.0))
                lse[r] = (row_max[r] * scale_log2 + cute.math.log2(total, fastmath=True)) * LN_2
                if empty:
                    lse[r] = -Float32.inf  # row saw no key: out = 0 (acc is 0), lse = -inf
            self._rescale(acc_o, row_scale)

            # ---- LSE: the quad leader of each row writes it, rows past seqlen_q skipped.
            c_o = cute.make_identity_tensor((tm, hd))
            tOcO = _mn_view(thr_pv.partition_C(c_o))
            if tOcO[0, 0][1] == 0:
                for r in cutlass.range_constexpr(n_rows):
                    row = m_block * tm + tOcO[r, 0][0]
                    if row < seqlen_q:
                        mLSE[batch, head, row] = lse[r]

            # ---- O: registers -> smem (sO) -> one TMA store of the whole tile_m-row tile.
            r_o = cute.make_rmem_tensor_like(acc_o, self.dtype)
            convert_16bit(acc_o, r_o)
            if const_expr(self.persistent):  # noqa: SIM102 (compile-time, then runtime test)
                # sO must have been read by the previous tile's store (issued by this thread).
                if tidx == 0:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
            # All consumer warpgroups must be done reading sQ (QK^T WGMMAs) before O overwrites it
            # (persistent: done with sO's previous contents).
            cute.arch.barrier(barrier_id=_BAR_EPILOGUE, number_of_threads=self.num_consumer_threads)
            st_atom = cute.make_copy_atom(
                cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
            )
            st_copy = cute.make_tiled_copy_C(st_atom, tiled_mma_pv).get_slice(tidx)
            cute.copy(st_atom, st_copy.retile(r_o), st_copy.partition_D(sO))
            cute.arch.fence_view_async_shared()  # make the generic-proxy smem writes visible to TMA
            cute.arch.barrier(barrier_id=_BAR_EPILOGUE, number_of_threads=self.num_consumer_threads)
            if tidx == 0:
                # One thread issues the store (a TMA S2G copy is not elected automatically) and
                # waits for its read: before the CTA exits, or persistent, before the next tile's
                # O is written to sO.
                gO = cute.local_tile(mO[None, None, head, batch], (tm, hd), (m_block, 0))
                tOs, tOg = cpasync.tma_partition(
                    tma_o,
                    0,
                    cute.make_layout(1),
                    cute.group_modes(sO, 0, 2),
                    cute.group_modes(gO, 0, 2),
                )
                cute.copy(tma_o, tOs, tOg)
                cute.arch.cp_async_bulk_commit_group()
                if const_expr(not self.persistent):
                    cute.arch.cp_async_bulk_wait_group(0, read=True)

        if const_expr(self.persistent):  # noqa: SIM102 (compile-time, then runtime test)
            # smem must stay valid until the last bulk store has read it.
            if tidx == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _step(
        self,
        n_block: Int32,
        masked: cutlass.Constexpr[bool],
        kv_state: Any,
        wg: Int32,
        acc_o: cute.Tensor,
        tOrP: cute.Tensor,
        tOrVt: cute.Tensor,
        tSrQ: cute.Tensor,
        tSrK: cute.Tensor,
        acc_s_shape: Any,
        pipe_k: cpipe.PipelineTmaAsync,
        pipe_v: cpipe.PipelineTmaAsync,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        t_coord: cute.Tensor,
        t0_coord: cute.Tensor,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        row_scale: cute.Tensor,
        scale_log2: Float32,
        m_block: Int32,
        seqlen_k: Int32,
        shift: Int32,
        p_stage: Any,
    ) -> Any:
        """One overlapped step: S_j = Q K_j^T and O += P_{j+1} V_{j+1} in flight, then the
        softmax of S_j.


        tOrP holds P of the previous (higher) block on entry and P of block j on exit.

        ptxas hoists the wait for PV to just before the first conversion of P (which writes
        PV's operand registers) and interleaves the conversions with the exponentials, so
        most of the softmax runs after PV is done. Keeping the wait behind all exponentials
        (a basic-block edge before it) measured slower, 0.92-0.98x at hd 64 and 128
        (benchmarks/NOTES.md, item 53), so the order is left to ptxas.
        """
        v_state = kv_state.clone()
        kv_state.advance()
        pipe_k.consumer_wait(kv_state)
        self._sched_sync(wg)
        acc_s = cute.make_rmem_tensor(acc_s_shape, Float32)
        wgmma(tiled_mma_qk, acc_s, tSrQ, tSrK[None, None, None, kv_state.index], True)
        pipe_v.consumer_wait(v_state)
        wgmma(tiled_mma_pv, acc_o, tOrP, tOrVt[None, None, None, v_state.index], False)
        self._sched_arrive(wg)
        warpgroup.wait_group(1)  # S_j is ready; PV may still run
        pipe_k.consumer_release(kv_state)
        if const_expr(masked):
            self._mask(acc_s, t_coord, t0_coord, m_block, n_block, seqlen_k, shift)
        self._online_softmax(acc_s, row_max, row_sum, row_scale, scale_log2)
        warpgroup.wait_group(0)  # PV done: tOrP and V stage are free, acc_o is settled
        pipe_v.consumer_release(v_state)
        self._set_p(acc_s, tOrP, p_stage, wg)
        if const_expr(self.skip_unit_rescale):
            changed = row_scale[0] != Float32(1.0)
            for r in cutlass.range_constexpr(1, cute.size(row_scale)):
                changed = changed | (row_scale[r] != Float32(1.0))
            if cute.arch.vote_any_sync(changed):
                self._rescale(acc_o, row_scale)
        else:
            self._rescale(acc_o, row_scale)
        return kv_state

    # --------------------------------------------------------------- consumer helpers

    @cute.jit
    def _mask(
        self,
        acc_s: cute.Tensor,
        t_coord: cute.Tensor,
        t0_coord: cute.Tensor,
        m_block: Int32,
        n_block: Int32,
        seqlen_k: Int32,
        shift: Int32,
    ) -> None:
        """-inf where key >= seqlen_k (TMA zero-fill would give score 0) or, if causal,
        key > row + shift.


        Compares the compile-time column of thread 0 against a per-row limit shifted by this
        thread's own column offset, so the inner test is one compare per element.
        """
        s_mn = _mn_view(acc_s)
        c_mn = _mn_view(t_coord)
        c0_mn = _mn_view(t0_coord)
        col_base = n_block * self.tile_n + c_mn[0, 0][1]
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            limit = seqlen_k - col_base
            if const_expr(self.causal):
                row = m_block * self.tile_m + c_mn[r, 0][0]
                limit = cutlass.min(limit, row + shift + 1 - col_base)
            for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1])):
                if c0_mn[0, c][1] >= limit:
                    s_mn[r, c] = -Float32.inf

    @cute.jit
    def _online_softmax(
        self,
        acc_s: cute.Tensor,
        row_max: cute.Tensor,
        row_sum: cute.Tensor,
        row_scale: cute.Tensor,
        scale_log2: Float32,
    ) -> None:
        """Base-2 online softmax on S in place (S -> P) and the factor to rescale O by.

        row_max is kept in raw score units (one FFMA per element: s * scale_log2 - max_scaled);
        row_sum stays a per-thread partial sum and is reduced over the quad only at the end.
        All rows' maxima are reduced (four independent FMNMX chains each, then the quad
        shuffles of every row together) before any exponential: `TensorSSA.reduce` gives one
        NaN-propagating chain per row and `warp_reduction_max` a compare-and-select after the
        first shuffle (same kernel time, fewer instructions, no spill in the 192-row kernel).
        """
        s_mn = _mn_view(acc_s)
        n_rows = cute.size(row_max)
        maxima = [
            cute.arch.fmax(_row_reduce4(s_mn, r, cute.arch.fmax), row_max[r]) for r in range(n_rows)
        ]
        for offset in (2, 1):  # a row's four threads are a quad of lanes
            for r in cutlass.range_constexpr(n_rows):
                other = cute.arch.shuffle_sync_bfly(
                    maxima[r], offset=offset, mask=-1, mask_and_clamp=31
                )
                maxima[r] = cute.arch.fmax(maxima[r], other)
        for r in cutlass.range_constexpr(n_rows):
            cur = maxima[r]
            prev = row_max[r]
            row_max[r] = cur
            # A row that has seen only masked keys keeps max = -inf; use 0 to avoid inf - inf.
            safe = cur if cur != -Float32.inf else Float32(0.0)
            scaled = safe * scale_log2
            row = s_mn[r, None].load()
            s_mn[r, None].store(cute.math.exp2(row * scale_log2 - scaled, fastmath=True))
            row_scale[r] = cute.math.exp2((prev - safe) * scale_log2, fastmath=True)
            row_sum[r] = row_sum[r] * row_scale[r] + _row_reduce4(s_mn, r, operator.add)

    @cute.jit
    def _rescale(self, acc_o: cute.Tensor, row_scale: cute.Tensor) -> None:
        o_mn = _mn_view(acc_o)
        for r in cutlass.range_constexpr(cute.size(row_scale)):
            o_mn[r, None].store(o_mn[r, None].load() * row_scale[r])

    @cute.jit
    def _set_p(self, acc_s: cute.Tensor, tOrP: cute.Tensor, p_stage: Any, wg: Int32) -> None:
        """P (the softmax'ed S block) in 16 bits as the next PV's A operand: into its registers,
        or (p_smem, ``p_stage`` = (stmatrix atom, thread copy, its sP partition)) into this
        warpgroup's slab of sP, made visible to the WGMMA (async proxy) and awaited by the
        warpgroup's four warps, each of which issues its part of the PV."""
        if const_expr(p_stage is None):
            convert_16bit(acc_to_operand_a(acc_s), tOrP)
        else:
            p_atom, p_copy, p_dst = p_stage
            r_p = cute.make_rmem_tensor_like(acc_s, self.dtype)
            convert_16bit(acc_s, r_p)
            cute.copy(p_atom, p_copy.retile(r_p), p_dst)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=_BAR_P_BASE - 1 + wg, number_of_threads=128)

    def _sched_sync(self, wg: Int32) -> None:
        """Wait for my turn on the tensor cores (the previous warpgroup arrived on my barrier).

        Each scheduler barrier pairs 128 waiting threads of its owner with 128 arriving
        threads of the warpgroup before it in the cycle 1 -> 2 (-> 3) -> 1.
        """
        cute.arch.barrier(barrier_id=_BAR_SCHED_BASE - 1 + wg, number_of_threads=256)

    def _sched_arrive(self, wg: Int32) -> None:
        """Hand the tensor cores to the next warpgroup in the cycle."""
        # Plain Python (trace-time) choice: num_consumer_wg is a compile-time int.
        nxt = 3 - wg if self.num_consumer_wg == 2 else wg % self.num_consumer_wg + 1
        cute.arch.barrier_arrive(barrier_id=_BAR_SCHED_BASE - 1 + nxt, number_of_threads=256)
