"""How a chain's dK/dV leave the backward's MMA warpgroups (``bwd.HopperAttnBwd``): from
registers as 32-bit pairs, through shared memory as 16-byte chunks of whole rows (``dkv_smem``,
``dkv_stage``), or added in q-head order into the kv heads' fp32 sums of a GQA split
(``dkv_sum``; the module docstring of ``bwd``, "Chain epilogue"); for both step layouts."""

from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from ._cute_utils import pack_16bit_pair, transpose_view
from .bwd_sync import (
    BAR_DKV,
    BAR_KV_FREE,
    I_BATCH,
    I_KVH,
    I_KVT,
)
from .gmem_pairs import load_f32_cg, red_add_f32x2, store_f32x2


class DkvSums(NamedTuple):
    """What the chain epilogue of ``dkv_sum`` needs beyond the chain (runtime values)."""

    acc: cute.Tensor  # fp32 [2 * b * seqlen_k * kv_heads * hd]: dK's accumulator, then dV's
    flags: cute.Tensor  # int32: [1] the error flag, from [sem_base] the dK/dV semaphores
    fail: cute.Tensor  # shared int32 [4]: [2 + w] warpgroup w's wait gave up
    kv_group: Int32  # q heads per kv head
    kv_tiles: Int32
    sem_base: Int32
    timeout_ns: Int64


def pair_rows(coords0, pairs: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """Thread 0's accumulator pairs by row: [(row, [(pair index, first column), ...]), ...]
    in order of first appearance. Pair j is elements 2j and 2j + 1, which must be neighbours
    in one row starting at an even column (one 32-bit store)."""
    by_row: dict[int, list[tuple[int, int]]] = {}
    for j in range(pairs):
        n0, d0 = coords0[2 * j]
        if d0 % 2 or coords0[2 * j + 1] != (n0, d0 + 1):
            raise ValueError(f"accumulator pair {j} is not two neighbouring columns")
        by_row.setdefault(n0, []).append((j, d0))
    return list(by_row.items())


class EpilogueMixin:
    """``HopperAttnBwd``'s chain epilogues (the MMA warpgroups at a chain's last step)."""

    @cute.jit
    def _end_chain(
        self, storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv, softmax_scale,
        seqlen_k, sK, sV, sums: DkvSums, tidx, wg,
    ):  # fmt: skip
        """A chain's last step, its dK done: the GQA split's dK/dV sums (``dkv_sum``) or the
        plain epilogue, each releasing the stage and K/V."""
        args = (
            storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv, softmax_scale,
            seqlen_k,
        )  # fmt: skip
        if const_expr(self.dkv_sum):
            self._sum_chain_epilogue(*args, sums, tidx, wg)
        else:
            self._chain_epilogue(*args, sK, sV, tidx, wg)

    @cute.jit
    def _chain_epilogue(
        self, storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv, softmax_scale,
        seqlen_k, sK, sV, tidx, wg,
    ):  # fmt: skip
        """The last step of a chain: release its ring stage and K/V (after reading the chain's
        batch, kv head and kv tile from the stage's slot), then dK/dV from registers to
        global memory (with dkv_smem through sK/sV: the K/V tiles, which are released after,
        or with dkv_stage a buffer of their own)."""
        b = sInfo[I_BATCH, stage]
        kvh = sInfo[I_KVH, stage]
        kvt = sInfo[I_KVT, stage]
        # Q, dO, LSE2, delta and the metadata of this stage are no longer read; K/V are free
        # for the next chain.
        cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
        if const_expr(not self.dkv_smem or self.dkv_stage):
            cute.arch.mbarrier_arrive(storage.kv_empty.data_ptr())
        rdK = cute.make_fragment_like(acc_dK, self.dtype)
        rdK.store((acc_dK.load() * softmax_scale).to(self.dtype))
        bn = self.block_n
        if const_expr(self.dkv_smem):
            rdV = cute.make_fragment_like(acc_dV, self.dtype)
            rdV.store(acc_dV.load().to(self.dtype))
            self._store_dkv_staged(
                rdK, rdV, sK, sV, mdK[b, None, kvh, None], mdV[b, None, kvh, None], kvt,
                seqlen_k, mma_dkv, tidx, wg,
            )  # fmt: skip
            if const_expr(not self.dkv_stage):
                cute.arch.mbarrier_arrive(storage.kv_empty.data_ptr())
            return
        rdV = cute.make_fragment_like(acc_dV, self.dtype)
        rdV.store(acc_dV.load().to(self.dtype))
        self._store_pairs(rdK, mdK[b, None, kvh, None], tKcK, mma_dkv, kvt * bn, seqlen_k)
        self._store_pairs(rdV, mdV[b, None, kvh, None], tKcK, mma_dkv, kvt * bn, seqlen_k)

    @cute.jit
    def _store_dkv_staged(self, rdK, rdV, sK, sV, gK, gV, kvt, seqlen_k, mma_dkv, tidx, wg):
        """dkv_smem: a chain's dK/dV (16-bit fragments) to global rows ``kvt * block_n + n``
        through the K/V tiles in shared memory, written by stmatrix and read back as 16-byte
        chunks of whole rows (full L2 sectors)."""
        if const_expr(not self.dkv_stage):
            # Both warpgroups' GEMMs of the last step are done (the dQ GEMM reads every row of
            # K). (dkv_stage's own buffer: each warpgroup writes and reads its own rows only.)
            cute.arch.barrier(barrier_id=BAR_KV_FREE, number_of_threads=self.num_mma_threads)
        self._stmatrix_dkv(rdK, rdV, sK, sV, mma_dkv, tidx)
        # Each warpgroup reads back only its own 64 rows.
        cute.arch.barrier(barrier_id=BAR_DKV + wg, number_of_threads=128)
        self._copy_rows_out(sK, sV, gK, gV, kvt, seqlen_k, tidx, wg)

    @cute.jit
    def _stmatrix_dkv(self, rdK, rdV, sK, sV, mma_dkv, tidx):
        """A chain's dK/dV (16-bit fragments in the accumulators' layout) into the (bn, hd)
        tiles sK/sV by stmatrix, each thread its own elements."""
        st_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
        )
        st_copy = cute.make_tiled_copy_C(st_atom, mma_dkv)
        thr_st = st_copy.get_slice(tidx)
        cute.copy(st_copy, thr_st.retile(rdK), thr_st.partition_D(sK))
        cute.copy(st_copy, thr_st.retile(rdV), thr_st.partition_D(sV))

    @cute.jit
    def _copy_rows_out(self, sK, sV, gK, gV, kvt, seqlen_k, tidx, wg):
        """Warpgroup ``wg``'s half of the rows of the dK/dV tiles staged in sK/sV to global rows
        ``kvt * block_n + n`` below seqlen_k, as 16-byte chunks of whole rows."""
        hd = self.head_dim
        rows = self.block_n // 2
        # 16-byte chunks per row and thread pass: all of a row's (8 at hd 64, 16 at hd 128),
        # or at hd 96 4 of its 12 (128 threads cover whole rows only in powers of two; each
        # thread then takes 3 chunks of its row, 64 bytes apart).
        chunks = hd // 8
        chunks_per_pass = chunks & -chunks
        ld_atom = cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128
        )
        ld_copy = cute.make_tiled_copy_tv(
            ld_atom,
            cute.make_layout(
                (128 // chunks_per_pass, chunks_per_pass), stride=(chunks_per_pass, 1)
            ),
            cute.make_layout((1, 8)),
        )
        thr_ld = ld_copy.get_slice(tidx % 128)
        block = kvt * 2 + wg
        coords = cute.local_tile(cute.make_identity_tensor(gK.shape), (rows, hd), (block, 0))
        tC = thr_ld.partition_D(coords)
        for s, g in ((sK, gK), (sV, gV)):
            tS = thr_ld.partition_S(cute.local_tile(s, (rows, hd), (wg, 0)))
            tD = thr_ld.partition_D(cute.local_tile(g, (rows, hd), (block, 0)))
            # A loop, unrolled by dkv_smem_unroll only: its addresses are computed per pass
            # (fully unrolled, ptxas hoists all of them out of the step loop and the step's
            # registers spill).
            for i in cutlass.range(cute.size(tS, mode=[1]), unroll=self.dkv_smem_unroll):
                frag = cute.make_fragment_like(tS[None, i, None])
                cute.autovec_copy(tS[None, i, None], frag)
                if tC[0, i, 0][0] < seqlen_k:
                    cute.copy(ld_atom, frag, tD[None, i, None])

    @cute.jit
    def _store_pairs(
        self,
        frag: cute.Tensor,
        g: cute.Tensor,
        coords: cute.Tensor,
        mma: cute.TiledMma,
        row0: Int32,
        rows: Int32,
    ):
        """A 16-bit accumulator-layout fragment to global rows row0 + n < rows, two
        neighbouring columns per 32-bit store. Legal: the pair's column is even (checked on
        thread 0's trace-time coordinates; every thread's first column is even too) and the
        base and row strides are 16-byte aligned (the launcher checks both)."""
        coords0 = mma.get_slice(0).partition_C(cute.make_identity_tensor(g.shape))
        words = cute.recast_tensor(frag, Int32)
        if const_expr(not self.dkv_row_ptr):
            for j in cutlass.range_constexpr(cute.size(words)):
                n0, d0 = coords0[2 * j]
                assert d0 % 2 == 0 and coords0[2 * j + 1] == (n0, d0 + 1)
                n, d = coords[2 * j]
                if row0 + n < rows:
                    elem = g.iterator + cute.crd2idx((row0 + n, d), g.layout)
                    ptr = cute.make_ptr(
                        Int32, elem.toint(), cute.AddressSpace.gmem, assumed_align=4
                    )
                    cute.make_tensor(ptr, cute.make_layout(1))[0] = words[j]
        else:
            # A thread's pairs lie in a few rows (two per 64-row warpgroup slab): every
            # thread's coordinates are its first one plus thread 0's (the accumulator's
            # thread-value layout), so each row gets one bounds test and one 64-bit address,
            # and its stores take constant column offsets from it.
            assert coords0[0] == (0, 0)
            rows0 = pair_rows(coords0, cute.size(words))
            n_t, d_t = coords[0]
            for i in cutlass.range_constexpr(len(rows0)):
                row = row0 + n_t + rows0[i][0]
                if row < rows:
                    row_start = g.iterator + cute.crd2idx((row, d_t), g.layout)
                    for k in cutlass.range_constexpr(len(rows0[i][1])):
                        j, d0 = rows0[i][1][k]
                        ptr = cute.make_ptr(
                            Int32, (row_start + d0).toint(), cute.AddressSpace.gmem,
                            assumed_align=4,
                        )  # fmt: skip
                        cute.make_tensor(ptr, cute.make_layout(1))[0] = words[j]

    @cute.jit
    def _sum_chain_epilogue(
        self, storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv, softmax_scale,
        seqlen_k, sums: DkvSums, tidx, wg,
    ):  # fmt: skip
        """The last step of a chain of a GQA split with ``dkv_sum``: release the stage and K/V,
        then add this warpgroup's rows of dK/dV into the kv head's sum at this q head's turn
        (``bwd``'s module docstring, "Chain epilogue")."""
        b, kvh, kvt, kv_heads, rank, last, sem_ptr, bar = self._dkv_sum_turn(
            storage, sInfo, stage, acc_dK, acc_dV, mdK, sums, tidx, wg
        )
        # Accumulator element (b, row, kvh, d) of dK at (((b s_k + row) kv_heads + kvh) hd + d),
        # dV's a whole dK later; 64-bit byte addresses.
        hd = self.head_dim
        acc_addr = sums.acc.iterator.toint()
        dv_offset = Int64(cute.size(mdK)) * 4
        coords0 = mma_dkv.get_slice(0).partition_C(cute.make_identity_tensor((self.block_n, hd)))
        pairs = cute.size(acc_dK) // 2
        rows0 = pair_rows(coords0, pairs)
        assert coords0[0] == (0, 0)
        n_t, d_t = tKcK[0]
        gdK = mdK[b, None, kvh, None]
        gdV = mdV[b, None, kvh, None]
        bf16 = const_expr(self.dtype == cutlass.BFloat16)
        for i in cutlass.range_constexpr(len(rows0)):
            row = kvt * self.block_n + n_t + rows0[i][0]
            if row < seqlen_k:
                row_addr = acc_addr + (Int64((b * seqlen_k + row) * kv_heads + kvh) * hd + d_t) * 4
                dk_row = gdK.iterator + cute.crd2idx((row, d_t), gdK.layout)
                dv_row = gdV.iterator + cute.crd2idx((row, d_t), gdV.layout)
                for k in cutlass.range_constexpr(len(rows0[i][1])):
                    j, d0 = rows0[i][1][k]
                    k0 = acc_dK[2 * j] * softmax_scale
                    k1 = acc_dK[2 * j + 1] * softmax_scale
                    v0, v1 = acc_dV[2 * j], acc_dV[2 * j + 1]
                    addr_k = row_addr + d0 * 4
                    addr_v = addr_k + dv_offset
                    if rank == last:
                        # The sum so far plus this chain's, rounded once (rank 0 only when
                        # the group has one head, which a split never has). dK's add is an
                        # explicit FMA: left to the compiler, the scale's product fused into it
                        # in some kernel variants and not in others, and a few dK elements
                        # differed between variants that must give the same bits (the "_kf"
                        # kernels; benchmarks/NOTES.md item 314).
                        if rank > 0:
                            k0 = cute.math.fma(softmax_scale, acc_dK[2 * j], load_f32_cg(addr_k))
                            k1 = cute.math.fma(
                                softmax_scale, acc_dK[2 * j + 1], load_f32_cg(addr_k + 4)
                            )
                            v0 = load_f32_cg(addr_v) + v0
                            v1 = load_f32_cg(addr_v + 4) + v1
                        for out, lo, hi in ((dk_row, k0, k1), (dv_row, v0, v1)):
                            ptr = cute.make_ptr(
                                Int32, (out + d0).toint(), cute.AddressSpace.gmem,
                                assumed_align=4,
                            )  # fmt: skip
                            cute.make_tensor(ptr, cute.make_layout(1))[0] = pack_16bit_pair(
                                lo, hi, bf16
                            )
                    elif rank == 0:
                        store_f32x2(addr_k, k0, k1)
                        store_f32x2(addr_v, v0, v1)
                    else:
                        red_add_f32x2(addr_k, k0, k1)
                        red_add_f32x2(addr_v, v0, v1)
        self._dkv_sum_release(sem_ptr, bar, rank, last, tidx)

    @cute.jit
    def _dkv_sum_turn(self, storage, sInfo, stage, acc_dK, acc_dV, mdK, sums: DkvSums, tidx, wg):
        """The start of a ``dkv_sum`` chain epilogue: release the ring stage and K/V, then wait
        (one thread per warpgroup, bounded) until the (batch, kv head, KV tile, warpgroup)
        semaphore equals this q head's rank in its group; a timed-out wait raises the error flag
        and turns the warpgroup's dK/dV into NaN. Returns (batch, kv head, KV tile, kv heads,
        rank, last rank, semaphore pointer, warpgroup barrier id)."""
        b = sInfo[I_BATCH, stage]
        q_head = sInfo[I_KVH, stage]  # the chain's head: a q head (GQA split)
        kvt = sInfo[I_KVT, stage]
        cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
        cute.arch.mbarrier_arrive(storage.kv_empty.data_ptr())
        kv_heads = cute.size(mdK.shape[2])
        kvh = q_head // sums.kv_group
        rank = q_head - kvh * sums.kv_group
        last = sums.kv_group - 1
        sem = sums.sem_base + ((b * kv_heads + kvh) * sums.kv_tiles + kvt) * 2 + wg
        sem_ptr = sums.flags.iterator + sem
        bar = BAR_DKV + wg
        if tidx % 128 == 0:
            failed = Int32(0)
            if rank > 0:
                failed = self._wait_turn(sem_ptr, rank, sums.timeout_ns)
            if failed != 0:
                # Never a silent wrong result: the error flag, and NaN into the sum below.
                sums.flags[1] = Int32(1)
            sums.fail[2 + wg] = failed
        cute.arch.barrier(barrier_id=bar, number_of_threads=128)
        if sums.fail[2 + wg] != 0:
            acc_dK.fill(Float32(float("nan")))
            acc_dV.fill(Float32(float("nan")))
        return b, kvh, kvt, kv_heads, rank, last, sem_ptr, bar

    @cute.jit
    def _dkv_sum_release(self, sem_ptr, bar: int | Int32, rank: Int32, last: Int32, tidx: Int32):
        """The end of a ``dkv_sum`` chain epilogue: unless this is the group's last q head, the
        warpgroup's adds are performed (every thread's fence) before its turn passes on."""
        if rank != last:
            cute.arch.fence_acq_rel_gpu()
            cute.arch.barrier(barrier_id=bar, number_of_threads=128)
            if tidx % 128 == 0:
                cute.arch.red(sem_ptr, Int32(1), op="add", dtype="s32", sem="release", scope="gpu")

    @cute.jit
    def _chain_epilogue_swapped(
        self, storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, mma_dkv, softmax_scale, seqlen_k,
        sK, sV, tidx, wg,
    ):  # fmt: skip
        """The last step of a chain (dkv_swap): release its ring stage, write dK/dV into the
        K/V tiles once both warpgroups' last GEMMs are done (stmatrix with transpose: the
        accumulators hold dK^T and dV^T; element by element, ptxas hoisted the 288 addresses
        out of the step loop and spilled), copy them out as 16-byte chunks of whole rows, then
        release K/V."""
        b = sInfo[I_BATCH, stage]
        kvh = sInfo[I_KVH, stage]
        kvt = sInfo[I_KVT, stage]
        cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
        rdK = cute.make_fragment_like(acc_dK, self.dtype)
        rdK.store((acc_dK.load() * softmax_scale).to(self.dtype))
        rdV = cute.make_fragment_like(acc_dV, self.dtype)
        rdV.store(acc_dV.load().to(self.dtype))
        # Both warpgroups' GEMMs of the last step are done (S, dP and dQ read all of K and V).
        cute.arch.barrier(barrier_id=BAR_KV_FREE, number_of_threads=self.num_mma_threads)
        st_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype
        )
        st_copy = cute.make_tiled_copy_C(st_atom, mma_dkv)
        thr_st = st_copy.get_slice(tidx)
        cute.copy(st_copy, thr_st.retile(rdK), thr_st.partition_D(transpose_view(sK)))
        cute.copy(st_copy, thr_st.retile(rdV), thr_st.partition_D(transpose_view(sV)))
        # Every element is in place (each warpgroup's rows hold the other's columns at hd 256).
        cute.arch.barrier(barrier_id=BAR_KV_FREE, number_of_threads=self.num_mma_threads)
        self._copy_rows_out(
            sK, sV, mdK[b, None, kvh, None], mdV[b, None, kvh, None], kvt, seqlen_k, tidx, wg
        )
        cute.arch.mbarrier_arrive(storage.kv_empty.data_ptr())

    @cute.jit
    def _sum_chain_epilogue_swapped(
        self, storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, softmax_scale, seqlen_k,
        sums: DkvSums, tidx, wg,
    ):  # fmt: skip
        """``_sum_chain_epilogue`` for the transposed accumulators of dkv_swap: the same turns
        (a semaphore per warpgroup: its elements are its own KV rows at hd 192, its own
        head-dim rows at hd 256), element by element (neighbouring registers are neighbouring
        KV rows, not neighbouring addresses)."""
        b, kvh, kvt, kv_heads, rank, last, sem_ptr, bar = self._dkv_sum_turn(
            storage, sInfo, stage, acc_dK, acc_dV, mdK, sums, tidx, wg
        )
        hd = self.head_dim
        dv_offset = Int64(cute.size(mdK))
        gdK = mdK[b, None, kvh, None]
        gdV = mdV[b, None, kvh, None]
        for i in cutlass.range_constexpr(cute.size(acc_dK)):
            d, n = tKcK[i]
            row = kvt * self.block_n + n
            if row < seqlen_k:
                # Element (b, row, kvh, d) of dK's fp32 sum; dV's a whole dK later.
                ptr_k = sums.acc.iterator + (Int64((b * seqlen_k + row) * kv_heads + kvh) * hd + d)
                ptr_v = ptr_k + dv_offset
                k0 = acc_dK[i] * softmax_scale
                v0 = acc_dV[i]
                if rank == last:
                    if rank > 0:
                        # An explicit FMA, as in _sum_chain_epilogue.
                        k0 = cute.math.fma(softmax_scale, acc_dK[i], load_f32_cg(ptr_k.toint()))
                        v0 = load_f32_cg(ptr_v.toint()) + v0
                    gdK[row, d] = k0.to(self.dtype)
                    gdV[row, d] = v0.to(self.dtype)
                elif rank == 0:
                    cute.make_tensor(ptr_k, cute.make_layout(1))[0] = k0
                    cute.make_tensor(ptr_v, cute.make_layout(1))[0] = v0
                else:
                    for ptr, value in ((ptr_k, k0), (ptr_v, v0)):
                        cute.arch.red(ptr, value, op="add", dtype="f32", sem="relaxed", scope="gpu")
        self._dkv_sum_release(sem_ptr, bar, rank, last, tidx)
