"""The backward's producer warp (warp 0 of ``bwd.HopperAttnBwd``): the only reader of the
schedule tables and the ticket counter; it fills the load ring step by step (metadata, TMA loads
of Q, dO, LSE2 and delta, K/V at a chain's first step) and ends with the terminator slot."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import cpasync

from .bwd_sync import (
    F_DONE,
    F_FIRST,
    F_LAST,
    F_QUIET,
    I_BATCH,
    I_FLAGS,
    I_KVH,
    I_KVT,
    I_QH,
    I_QT,
    I_RANK,
)


class ProducerMixin:
    """``HopperAttnBwd``'s warp 0."""

    @cute.jit
    def producer(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mDelta: cute.Tensor,
        tma_q: cute.CopyAtom,
        tma_k: cute.CopyAtom,
        tma_v: cute.CopyAtom,
        tma_do: cute.CopyAtom,
        tma_lse: cute.CopyAtom,
        tma_delta: cute.CopyAtom,
        mFlags: cute.Tensor,
        mChainStart: cute.Tensor,
        mStepHead: cute.Tensor,
        mStepTile: cute.Tensor,
        mStepRank: cute.Tensor,
        mOrder: cute.Tensor,
        mWorkerStart: cute.Tensor,
        kv_tiles: Int32,
        num_chains: Int32,
        dynamic: Int32,
        heads: Int32,
        kv_heads: Int32,
        kv_group: Int32,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        sdO: cute.Tensor,
        sLSE: cute.Tensor,
        sDelta: cute.Tensor,
        sInfo: cute.Tensor,
        storage,
    ):
        bm, bn, hd = self.block_m, self.block_n, self.head_dim
        lane = cute.arch.lane_idx()
        # The whole warp runs the loop (cute.copy of a TMA atom elects one lane with
        # elect.sync over the full warp, so every lane must reach it); lane 0 alone takes
        # tickets, writes the metadata and arrives on the mbarriers.
        worker, _, _ = cute.arch.block_idx()
        ticket = Int32(0)
        end = Int32(0)
        if dynamic != 0:
            ticket = self._take_ticket(mFlags, lane)
            end = num_chains
        else:
            ticket = mWorkerStart[worker]
            end = mWorkerStart[worker + 1]
        stage = Int32(0)
        phase = Int32(0)
        kv_phase = Int32(0)
        do_phase = Int32(0)  # of dO's own mbarriers (do_single)
        drain_phase = Int32(0)  # of the chains' "drained" mbarrier (drain_ticket)
        while ticket < end:
            chain = mOrder[ticket]
            b, kvh, kvt = self._chain_coords(chain, kv_tiles, kv_heads)
            lo = mChainStart[chain]
            hi = mChainStart[chain + 1]
            prefetch_step = hi - 1 - self.kv_prefetch_ahead
            if prefetch_step < lo:
                prefetch_step = lo
            for step in cutlass.range(lo, hi, unroll=1):
                full = storage.full_bar.data_ptr() + stage
                # The table reads (L2 latency) overlap the wait for the free stage instead of
                # delaying the loads after it.
                qh = mStepHead[step]
                qt = mStepTile[step]
                rank = mStepRank[step]
                cute.arch.mbarrier_wait(storage.empty_bar.data_ptr() + stage, phase ^ 1)
                if lane == 0:
                    flags = Int32(0)
                    if step == lo:
                        flags = flags | F_FIRST
                    if step == hi - 1:
                        flags = flags | F_LAST
                    sInfo[I_BATCH, stage] = b
                    sInfo[I_KVH, stage] = kvh
                    sInfo[I_KVT, stage] = kvt
                    sInfo[I_QH, stage] = qh
                    sInfo[I_QT, stage] = qt
                    sInfo[I_RANK, stage] = rank
                    sInfo[I_FLAGS, stage] = flags
                    # The arrive releases the metadata stores above to the consumers.
                    tx_bytes = Int32(self.bytes_step)
                    if const_expr(self.kv_on_full):  # noqa: SIM102 (compile-time, then runtime)
                        if step == lo:
                            tx_bytes = tx_bytes + self.bytes_kv
                    cute.arch.mbarrier_arrive_and_expect_tx(full, tx_bytes)
                cute.arch.sync_warp()
                gQ = cute.local_tile(mQ[None, None, qh, b], (bm, hd), (qt, 0))
                gdO = cute.local_tile(mdO[None, None, qh, b], (bm, hd), (qt, 0))
                gL = cute.local_tile(mLSE[None, b * heads + qh], (bm,), (qt,))
                gD = cute.local_tile(mDelta[None, b * heads + qh], (bm,), (qt,))
                self._tma_load(tma_q, gQ, sQ, stage, full, 2)
                if const_expr(not self.do_single):
                    self._tma_load(tma_do, gdO, sdO, stage, full, 2)
                self._tma_load(tma_lse, gL, sLSE, stage, full, 1)
                self._tma_load(tma_delta, gD, sDelta, stage, full, 1)
                if const_expr(self.do_single):
                    # dO's one buffer, once the previous step's dV GEMM has read it.
                    cute.arch.mbarrier_wait(storage.do_empty.data_ptr(), do_phase ^ 1)
                    do_full = storage.do_full.data_ptr()
                    if lane == 0:
                        cute.arch.mbarrier_arrive_and_expect_tx(do_full, self.bytes_do)
                    cute.arch.sync_warp()
                    self._tma_load(tma_do, gdO, sdO, Int32(0), do_full, 2)
                    do_phase = do_phase ^ 1
                if step == lo:
                    # K/V after the first Q/dO of the chain, so that those are not queued
                    # behind the wait for the previous chain to end.
                    cute.arch.mbarrier_wait(storage.kv_empty.data_ptr(), kv_phase ^ 1)
                    if const_expr(self.kv_on_full):
                        # Their bytes were counted into this step's barrier above.
                        kv_full = full
                    else:
                        kv_full = storage.kv_full.data_ptr()
                        if lane == 0:
                            cute.arch.mbarrier_arrive_and_expect_tx(kv_full, self.bytes_kv)
                        cute.arch.sync_warp()
                    kv_in = kvh // kv_group
                    gK = cute.local_tile(mK[None, None, kv_in, b], (bn, hd), (kvt, 0))
                    gV = cute.local_tile(mV[None, None, kv_in, b], (bn, hd), (kvt, 0))
                    self._tma_load_single(tma_k, gK, sK, kv_full)
                    self._tma_load_single(tma_v, gV, sV, kv_full)
                    kv_phase = kv_phase ^ 1
                if const_expr(self.kv_prefetch is not None):  # noqa: SIM102 (compile-time)
                    if step == prefetch_step and ticket + 1 < end and dynamic == 0 and lane == 0:
                        self._prefetch_kv(
                            mK, mV, tma_k, tma_v, sK, sV, mOrder[ticket + 1], kv_tiles,
                            kv_heads, kv_group,
                        )  # fmt: skip
                stage, phase = self._next_stage(stage, phase)
            if dynamic != 0:
                # The next ticket only once the MMA warpgroups have finished this chain (they
                # release K/V after its last step: the phase the next chain's K/V load waits
                # for, so that wait passes). A ticket taken as soon as the chain's last loads
                # are issued is held by a CTA whose last steps may still wait for their dQ
                # turns: the chain it names (often one that later chains of its group wait
                # for) could not start meanwhile.
                cute.arch.mbarrier_wait(storage.kv_empty.data_ptr(), kv_phase ^ 1)
                if const_expr(self.drain_ticket):  # noqa: SIM102 (compile-time, then runtime)
                    # (A chain of no step has no last turn: nothing arrives for it.)
                    if hi > lo:
                        cute.arch.mbarrier_wait(storage.do_empty.data_ptr(), drain_phase)
                        drain_phase = drain_phase ^ 1
                ticket = self._take_ticket(mFlags, lane)
            else:
                ticket = ticket + 1
        # Terminator slot: consumers leave their loop when they read it.
        cute.arch.mbarrier_wait(storage.empty_bar.data_ptr() + stage, phase ^ 1)
        if lane == 0:
            sInfo[I_FLAGS, stage] = Int32(F_DONE)
            cute.arch.mbarrier_arrive(storage.full_bar.data_ptr() + stage)
        if const_expr(self.dq_writers == 2):
            # The other dQ warp waits on the other stage: a terminator there too, without the
            # MMA warpgroups' stop handshake (they left at the first one).
            stage, phase = self._next_stage(stage, phase)
            cute.arch.mbarrier_wait(storage.empty_bar.data_ptr() + stage, phase ^ 1)
            if lane == 0:
                sInfo[I_FLAGS, stage] = Int32(F_DONE | F_QUIET)
                cute.arch.mbarrier_arrive(storage.full_bar.data_ptr() + stage)
        if const_expr(self.pdl):
            # The dQ cast may launch (it waits for this grid's end before reading anything).
            cute.arch.griddepcontrol_launch_dependents()

    @cute.jit
    def _chain_coords(self, chain: Int32, kv_tiles: Int32, kv_heads: Int32):
        """(batch, head, KV tile) of ``chain``: chains are numbered KV tile fastest, then the
        chain's head (k's, or q's in a GQA split), then the batch."""
        kvt = chain % kv_tiles
        rest = chain // kv_tiles
        kvh = rest % kv_heads
        return rest // kv_heads, kvh, kvt

    @cute.jit
    def _prefetch_kv(
        self, mK, mV, tma_k, tma_v, sK, sV, chain: Int32, kv_tiles: Int32, kv_heads: Int32,
        kv_group: Int32,
    ):  # fmt: skip
        """kv_prefetch: TMA prefetches of ``chain``'s K and V tiles into L2."""
        b, kvh, kvt = self._chain_coords(chain, kv_tiles, kv_heads)
        kv_in = kvh // kv_group
        shape = (self.block_n, self.head_dim)
        for atom, m, s in ((tma_k, mK, sK), (tma_v, mV, sV)):
            g = cute.local_tile(m[None, None, kv_in, b], shape, (kvt, 0))
            _, tg = cpasync.tma_partition(
                atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2), cute.group_modes(g, 0, 2)
            )
            cute.prefetch(atom, tg)

    @cute.jit
    def _take_ticket(self, mFlags: cute.Tensor, lane: Int32) -> Int32:
        """Next dynamic ticket: one atomic by lane 0, broadcast to the warp."""
        ticket = Int32(0)
        if lane == 0:
            ticket = cute.arch.atomic_add(mFlags.iterator, Int32(1), sem="relaxed", scope="gpu")
        return cute.arch.shuffle_sync(ticket, 0)

    @cute.jit
    def _tma_load(
        self,
        atom: cute.CopyAtom,
        g: cute.Tensor,
        s: cute.Tensor,
        stage: Int32,
        bar,
        rank: cutlass.Constexpr[int],
    ):
        ts, tg = cpasync.tma_partition(
            atom, 0, cute.make_layout(1), cute.group_modes(s, 0, rank), cute.group_modes(g, 0, rank)
        )
        cute.copy(atom, tg, ts[None, stage], tma_bar_ptr=bar)

    @cute.jit
    def _tma_load_single(self, atom: cute.CopyAtom, g: cute.Tensor, s: cute.Tensor, bar):
        ts, tg = cpasync.tma_partition(
            atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2), cute.group_modes(g, 0, 2)
        )
        cute.copy(atom, tg, ts, tma_bar_ptr=bar)
