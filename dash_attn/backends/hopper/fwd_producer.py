"""The Hopper forward's producer (warpgroup 0 of ``fwd.HopperFwd``; its warp 0 issues the
loads): Q once per tile, K and V through their 2-stage mbarrier rings, K one block ahead of V."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as cpipe
from cutlass import Int32, const_expr
from cutlass.cute.nvgpu import cpasync


class FwdProducerMixin:
    """``HopperFwd``'s producer warpgroup (its options are read from ``self``)."""

    @cute.jit
    def load(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        sQ: cute.Tensor,
        sK: cute.Tensor,
        sV: cute.Tensor,
        tma_q: cute.CopyAtom,
        tma_k: cute.CopyAtom,
        tma_v: cute.CopyAtom,
        pipe_q: cpipe.PipelineTmaAsync,
        pipe_k: cpipe.PipelineTmaAsync,
        pipe_v: cpipe.PipelineTmaAsync,
        mTiles: cute.Tensor,
        first_tile: Int32,
        tile_step: Int32,
        tile_end: Int32,
        num_m_blocks: Int32,
        heads: Int32,
    ) -> None:
        hd = self.head_dim
        group = heads // cute.size(mK.shape[2])
        # Single CTA (no cluster): coordinate 0 in a trivial CTA layout.
        one = cute.make_layout(1)
        q_state = cpipe.make_pipeline_state(cpipe.PipelineUserType.Producer, 1)
        # On entry to a tile: the stage its first K goes to (the rings run on across tiles).
        kv_state = cpipe.make_pipeline_state(cpipe.PipelineUserType.Producer, self.num_stages)
        for it in cutlass.range(first_tile, tile_end, tile_step, unroll=1):
            tile = mTiles[it] if const_expr(self.tile_list) else it
            m_block, head, batch, n_block_max = self._tile(
                tile, num_m_blocks, heads, mQ.shape[0], mK.shape[0]
            )
            head_kv = head // group  # GQA: q head h reads kv head h // (heads // kv_heads)
            gQ = cute.local_tile(mQ[None, None, head, batch], (self.tile_m, hd), (m_block, 0))
            gK = cute.local_tile(mK[None, None, head_kv, batch], (self.tile_n, hd), (None, 0))
            gV = cute.local_tile(mV[None, None, head_kv, batch], (self.tile_n, hd), (None, 0))
            tQs, tQg = cpasync.tma_partition(
                tma_q, 0, one, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2)
            )
            tKs, tKg = cpasync.tma_partition(
                tma_k, 0, one, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2)
            )
            tVs, tVg = cpasync.tma_partition(
                tma_v, 0, one, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2)
            )
            # Key blocks are walked high -> low (masked diagonal blocks first). K of block j is
            # issued before V of block j+1, the order in which the consumers need them.
            # Persistent, the first K goes before Q: Q's buffer is free only once the consumers
            # are done with the previous tile's Q, its first K stage earlier. Q is waited on by
            # the consumers even for tiles that see no key, so it is always loaded.
            if const_expr(not self.persistent):
                self._load_q(tma_q, tQg, tQs, pipe_q, q_state)
            if n_block_max > 0:
                pipe_k.producer_acquire(kv_state)
                cute.copy(tma_k, tKg[None, n_block_max - 1], tKs[None, kv_state.index],
                          tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))  # fmt: skip
            if const_expr(self.persistent):
                self._load_q(tma_q, tQg, tQs, pipe_q, q_state)
            q_state.advance()
            if n_block_max > 0:
                for i in cutlass.range(n_block_max - 1, unroll=1):
                    n_prev = n_block_max - 1 - i
                    prev_state = kv_state.clone()
                    kv_state.advance()
                    pipe_k.producer_acquire(kv_state)
                    cute.copy(tma_k, tKg[None, n_prev - 1], tKs[None, kv_state.index],
                              tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))  # fmt: skip
                    pipe_v.producer_acquire(prev_state)
                    cute.copy(tma_v, tVg[None, n_prev], tVs[None, prev_state.index],
                              tma_bar_ptr=pipe_v.producer_get_barrier(prev_state))  # fmt: skip
                pipe_v.producer_acquire(kv_state)
                cute.copy(tma_v, tVg[None, 0], tVs[None, kv_state.index],
                          tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))  # fmt: skip
                kv_state.advance()

    @cute.jit
    def _load_q(self, tma_q, tQg, tQs, pipe_q: cpipe.PipelineTmaAsync, q_state) -> None:
        pipe_q.producer_acquire(q_state)
        cute.copy(tma_q, tQg, tQs, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
