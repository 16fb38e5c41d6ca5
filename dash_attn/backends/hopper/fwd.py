"""Hopper (sm_90a) attention forward in CuTe DSL: warp-specialised, TMA + WGMMA.

Same function as the Triton forward (`dash_attn.backends.triton.fwd`): out like q and a
natural-log LSE (batch, heads, seqlen_q) in fp32; causal is bottom-right aligned; rows that see
no key get out = 0 and lse = -inf. This module holds the kernel class (options, shared memory,
launch, the kernel entry); its warp roles are mixins of ``fwd_producer`` and ``fwd_consumer``,
and ``fwd_launch`` compiles it and launches it from torch tensors.

Layout of one CTA (384 threads, one (m_block, head, batch) tile of 128 query rows; causal
launches the longest tiles, i.e. the highest m_block, first):

- warpgroup 0 (producer): drops to 24 registers; its warp 0 issues TMA loads of Q once and of
  K and V through two 2-stage mbarrier rings. K runs one block ahead of V because the consumers
  issue QK^T of block j before PV of block j+1 (see below).
- warpgroups 1 and 2 (consumers): 240 registers each; each owns 64 query rows (at hd 64 from
  8192 query tokens: three consumer warpgroups at 160 registers, 192-row tiles). Per key block:
  S = Q K^T (SS WGMMA), mask, online softmax in base 2, P -> bf16/fp16 registers, O += P V
  (RS WGMMA, P never touches smem).
- Overlap: inside a warpgroup the QK^T of the next key block and the PV of the previous one are
  in flight while the softmax of the next block runs; between warpgroups two named barriers
  hand the tensor cores back and forth so one warpgroup's softmax hides under the other's GEMMs.
- Epilogue: O / rowsum -> 16-bit -> smem (aliasing sQ, after both warpgroups are done with Q)
  -> one TMA store (TMA clips rows past seqlen_q); LSE straight from registers.
- Persistent (head dims <= 128, ``persistent=True``): at most one CTA per SM, each walking the
  tiles blockIdx.x, blockIdx.x + gridDim.x, ... (query block fastest) on a full mask, and on a
  causal one the list of tiles the host dealt it (``fwd_tiles.causal_tile_lists``). The K/V
  rings run on across tiles; the consumers release Q after the tile's last QK^T, so the producer
  loads the next tile's first K and then its Q during the last PV and the epilogue; O goes
  through its own smem buffer, whose TMA store is waited for only before the next tile's O
  is written. Each tile's arithmetic is the per-tile kernel's (bitwise equal outputs).

Head dims 64, 96, 128 use 128-wide key blocks, 192 uses 96 and 256 uses 64 (smem: Q + 2-stage
K and V must fit in 227 KiB). One compiled kernel per (head_dim, dtype, causal) (and the
warpgroup count): batch, seqlens, heads and all strides are runtime values
(`mark_layout_dynamic`), so a new shape never recompiles.
"""

from __future__ import annotations

import math
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as cpipe
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup

from ._cute_utils import gmem_tensor, select_modes
from .fwd_consumer import FwdConsumerMixin
from .fwd_producer import FwdProducerMixin
from .fwd_tiles import L2_GROUP_BYTES

# Key-block width per head dim. 128 while Q + 2-stage K and V fit in smem (227 KiB); narrower
# for 192/256 so the rings still fit (hd 192: 48+72+72 KiB; hd 256: 64+64+64 KiB) and the
# O accumulator (hd/2 fp32 registers per thread) leaves room for S and P under 240 registers.
TILE_N = {64: 128, 96: 128, 128: 128, 192: 96, 256: 64}
SUPPORTED_HEAD_DIMS = tuple(TILE_N)
LOG2_E = math.log2(math.e)

# (consumer, producer) registers per thread for 2 or 3 consumer warpgroups; both fill the SM's
# 65536 registers at 1 CTA/SM: 128 * (2*240 + 24) = 64512, 128 * (3*160 + 32) = 65536.
CONSUMER_REGS = {2: (240, 24), 3: (160, 32)}


def fwd_smem_bytes(
    head_dim: int, consumer_wgs: int, tile_n: int, persistent: bool, p_smem: bool
) -> int:
    """Shared memory of a ``HopperFwd`` config, laid out as its storage struct is: the
    mbarriers, then 1024-byte aligned Q, two K and two V stages, O (its own tile when
    persistent, else it aliases Q) and P (p_smem), 16-bit elements.

    >>> fwd_smem_bytes(96, 3, 128, persistent=True, p_smem=True) // 1024  # KiB, of 227
    217
    >>> fwd_smem_bytes(96, 3, 144, persistent=True, p_smem=True) // 1024  # over the 227
    235
    """

    def aligned(offset: int) -> int:
        return -(-offset // 1024) * 1024

    stages, elem = 2, 2
    tile_m = 64 * consumer_wgs
    offset = 8 * (2 + 4 * stages)  # mbarriers: Q's 2, K's and V's 2 per stage
    offset = aligned(offset) + tile_m * head_dim * elem  # Q
    offset = aligned(offset) + stages * tile_n * head_dim * elem  # K
    offset = aligned(offset) + stages * tile_n * head_dim * elem  # V
    offset = aligned(offset) + (tile_m * head_dim * elem if persistent else elem)  # O
    if p_smem:
        offset = aligned(offset) + tile_m * tile_n * elem  # P
    return offset


def _smem_layout(dtype: type[cutlass.Numeric], rows: int, cols: int, stages: int | None) -> Any:
    """K-major (row-major) swizzled smem layout for a (rows, cols[, stages]) tile.

    The swizzle width is the widest that divides a row (128 B for hd 64/128 in 16-bit), which
    is what both TMA and WGMMA descriptors want for bank-conflict-free access.
    """
    row_bits = cols * dtype.width
    kind = warpgroup.SmemLayoutAtomKind
    if row_bits % 1024 == 0:
        atom_kind = kind.K_SW128
    elif row_bits % 512 == 0:
        atom_kind = kind.K_SW64
    elif row_bits % 256 == 0:
        atom_kind = kind.K_SW32
    else:
        atom_kind = kind.K_INTER
    atom = warpgroup.make_smem_layout_atom(atom_kind, dtype)
    if stages is None:
        return cute.tile_to_shape(atom, (rows, cols), order=(0, 1))
    return cute.tile_to_shape(atom, (rows, cols, stages), order=(0, 1, 2))


class HopperFwd(FwdProducerMixin, FwdConsumerMixin):
    """Compile-time configuration + host launch + device kernel of the forward."""

    def __init__(
        self,
        dtype: type[cutlass.Numeric],
        head_dim: int,
        causal: bool,
        consumer_wgs: int = 2,
        persistent: bool = False,
        p_smem: bool = False,
        tile_n: int | None = None,
        skip_unit_rescale: bool = True,
        lpt_order: bool = False,
    ) -> None:
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise NotImplementedError(
                f"head_dim={head_dim} not supported; supported: {SUPPORTED_HEAD_DIMS}"
            )
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        if consumer_wgs not in CONSUMER_REGS:
            raise ValueError(f"consumer_wgs={consumer_wgs} not supported; use 2 or 3")
        self.tile_m = 64 * consumer_wgs  # each consumer warpgroup owns 64 query rows
        # tile_n: keys per block (``TILE_N`` per head dim unless given; ``fwd_launch.compile_fwd``
        #   checks it). The online softmax rescales O once per key block, so another width gives
        #   other bits: a backend must not let it depend on the sequence length.
        self.tile_n = TILE_N[head_dim] if tile_n is None else tile_n
        self.num_stages = 2
        self.num_consumer_wg = consumer_wgs
        self.num_threads = 128 * (self.num_consumer_wg + 1)
        self.num_consumer_threads = 128 * self.num_consumer_wg
        self.consumer_regs, self.producer_regs = CONSUMER_REGS[consumer_wgs]
        # persistent: a grid of at most max_ctas CTAs (one per SM), each walking tiles
        #   blockIdx.x, blockIdx.x + gridDim.x, ... (query block fastest, so the CTAs side by side
        #   share a head's K and V in L2). A CTA per tile pays its start (barrier init, the Q and
        #   first K loads before the first GEMM) and its end (the O store) on every tile; with
        #   few key blocks per tile (d64 full at 512 tokens: four) that is a large part of the
        #   tile's time. Persistent, the producer loads the next tile's first K and its Q while
        #   the consumers finish the last PV and store O, and the O store leaves through its
        #   own buffer while the next tile computes. Head dims up to 128 (the O buffer must fit
        #   beside Q and the K/V rings).
        # A causal mask's tiles differ in length, so there a fixed stride would leave CTAs with
        #   unequal work: the persistent causal kernel takes per-CTA tile lists from the host
        #   (fwd_tiles.causal_tile_lists: longest first in L2-sized groups of heads, each tile
        #   to the least busy CTA) through call_tensors_tiled, the TVM-FFI entry only.
        if persistent and head_dim > 128:
            raise NotImplementedError(
                f"the persistent forward covers head dims up to 128, not head_dim={head_dim}"
            )
        self.persistent = persistent
        self.tile_list = persistent and causal
        # p_smem: P goes to shared memory (stmatrix, one 64 x tile_n slab per consumer
        #   warpgroup) and PV reads it there (SS WGMMA), instead of staying in registers as the
        #   RS WGMMA's A operand across the next block's QK^T. Frees the 16-bit P registers
        #   (tile_n / 4 per thread) at the cost of a store, a fence and a warpgroup barrier per
        #   block; FA4's sm90 forward does so at hd 96 with 192-row tiles, where three
        #   warpgroups at 160 registers spill with P in registers. Bitwise the outputs of P in
        #   registers (the same per-row arithmetic; benchmarks/NOTES.md, session 38).
        self.p_smem = p_smem
        # skip_unit_rescale (shipped): a step leaves O as it is where every row of the warp
        #   kept its maximum (each factor exactly 1.0, so O * 1.0 == O: the same bits), one warp
        #   vote instead of head_dim / 2 FMULs per thread (128 at hd 256) on the path between
        #   one PV and the next. Once the rows' maxima settle, most steps skip it. 1.004-1.074x
        #   the kernel without it at head dims 64-256, outputs torch.equal (session 42, call 6,
        #   14 configs in interleaved rounds beside FA4).
        self.skip_unit_rescale = skip_unit_rescale
        # lpt_order: the per-tile causal kernel's CTAs take their tiles in the persistent
        #   kernel's dealing order (fwd_tiles.grouped_tile: groups of (batch, head) pairs whose
        #   K and V fit in L2_GROUP_BYTES, longest tiles first within a group), instead of each
        #   head's tiles in turn, longest first. With a head at a time the last head's longest
        #   tile starts among the launch's last CTAs. Which CTA runs a tile: the same bits.
        #   The backend turns it on at hd 192 and 256 up to 8k keys (1.04-1.10x at hd 256
        #   causal 1k-8k; ``FWD_LPT_ORDER_MAX_SEQLEN_K``).
        self.lpt_order = lpt_order and causal and not persistent

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(
        self,
        q_addr: Int64,
        k_addr: Int64,
        v_addr: Int64,
        o_addr: Int64,
        lse_addr: Int64,
        batch: Int32,
        seqlen_q: Int32,
        seqlen_k: Int32,
        heads: Int32,
        kv_heads: Int32,
        q_stride_b: Int64,
        q_stride_s: Int64,
        q_stride_h: Int64,
        k_stride_b: Int64,
        k_stride_s: Int64,
        k_stride_h: Int64,
        v_stride_b: Int64,
        v_stride_s: Int64,
        v_stride_h: Int64,
        scale_log2: Float32,
        max_ctas: Int32,
        stream: cuda.CUstream,
    ) -> None:
        """Host side. Takes raw addresses, sizes and strides (elements) rather than tensors: a
        call then marshals plain ints (~1 us each) instead of five DLPack conversions (~50 us
        each), which would otherwise dominate short launches. q/k/v are (b, s, h, d) with a
        unit-stride d; out is compact (b, s_q, h, d) and lse compact (b, h, s_q) fp32."""
        dt = self.dtype
        hd = self.head_dim
        o_stride_h = Int64(hd)
        o_stride_s = Int64(heads) * hd
        o_stride_b = Int64(seqlen_q) * o_stride_s
        mQ_in, mK_in, mV_in, mO_in = [
            gmem_tensor(dt, addr, (batch, s, h, hd), strides, 16)
            for addr, s, h, strides in (
                (q_addr, seqlen_q, heads, (q_stride_b, q_stride_s, q_stride_h)),
                (k_addr, seqlen_k, kv_heads, (k_stride_b, k_stride_s, k_stride_h)),
                (v_addr, seqlen_k, kv_heads, (v_stride_b, v_stride_s, v_stride_h)),
                (o_addr, seqlen_q, heads, (o_stride_b, o_stride_s, o_stride_h)),
            )
        ]
        lse_ptr = cute.make_ptr(Float32, lse_addr, cute.AddressSpace.gmem, assumed_align=4)
        lse_stride_h = Int64(seqlen_q)
        mLSE = cute.make_tensor(
            lse_ptr,
            cute.make_layout(
                (batch, heads, seqlen_q), stride=(Int64(heads) * lse_stride_h, lse_stride_h, 1)
            ),
        )
        self._host(mQ_in, mK_in, mV_in, mO_in, mLSE, scale_log2, max_ctas, stream)

    @cute.jit
    def call_tensors(
        self,
        mQ_in: cute.Tensor,  # (b, s_q, h, d)
        mK_in: cute.Tensor,  # (b, s_k, h_kv, d)
        mV_in: cute.Tensor,
        mO_in: cute.Tensor,  # (b, s_q, h, d)
        mLSE: cute.Tensor,  # (b, h, s_q) fp32
        scale_log2: Float32,
        max_ctas: Int32,
        stream: cuda.CUstream,
    ) -> None:
        """The same launch from tensors, for the TVM-FFI path: compiled from symbolic fake
        tensors (``fwd_launch._fake_fwd_args``) and called with the torch tensors, whose DLPack
        exchange TVM-FFI does in C (a few us per tensor, no Python per argument)."""
        self._host(mQ_in, mK_in, mV_in, mO_in, mLSE, scale_log2, max_ctas, stream)

    @cute.jit
    def call_tensors_tiled(
        self,
        mQ_in: cute.Tensor,  # (b, s_q, h, d)
        mK_in: cute.Tensor,  # (b, s_k, h_kv, d)
        mV_in: cute.Tensor,
        mO_in: cute.Tensor,  # (b, s_q, h, d)
        mLSE: cute.Tensor,  # (b, h, s_q) fp32
        mTiles: cute.Tensor,  # (tiles,) int32: every CTA's tile ids, CTA after CTA
        mStarts: cute.Tensor,  # (ctas + 1,) int32: where each CTA's list starts
        scale_log2: Float32,
        max_ctas: Int32,
        stream: cuda.CUstream,
    ) -> None:
        """``call_tensors`` of the persistent causal kernel, which walks the host's tile lists
        (``fwd_tiles.causal_tile_lists``; ``max_ctas`` must be their CTA count)."""
        self._host(mQ_in, mK_in, mV_in, mO_in, mLSE, scale_log2, max_ctas, stream, mTiles, mStarts)

    @cute.jit
    def _host(
        self,
        mQ_in: cute.Tensor,
        mK_in: cute.Tensor,
        mV_in: cute.Tensor,
        mO_in: cute.Tensor,
        mLSE: cute.Tensor,
        scale_log2: Float32,
        max_ctas: Int32,
        stream: cuda.CUstream,
        mTiles: cute.Tensor | None = None,
        mStarts: cute.Tensor | None = None,
    ) -> None:
        """TMA atoms, shared storage and the launch, from (b, s, h, d) global tensors and the
        (b, h, s_q) LSE tensor. ``max_ctas`` bounds the persistent grid (the SM count; with
        tile lists, their CTA count)."""
        if const_expr(mTiles is None):
            # Kernels without tile lists never read these parameters.
            mTiles, mStarts = mLSE, mLSE
        dt = self.dtype
        # (b, s, h, d) -> (s, d, h, b): TMA tiles the first two modes; head, batch index the rest.
        mQ, mK, mV, mO = [select_modes(t, [1, 3, 2, 0]) for t in (mQ_in, mK_in, mV_in, mO_in)]
        tm, tn, hd, st = self.tile_m, self.tile_n, self.head_dim, self.num_stages

        tiled_mma_qk = sm90.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
            atom_layout_mnk=(self.num_consumer_wg, 1, 1), tiler_mn=(64, tn),
        )  # fmt: skip
        # PV: A = P from registers (p_smem: from shared memory); B = V^T, i.e. V in smem read
        # N-major (MN).
        p_source = warpgroup.OperandSource.SMEM if self.p_smem else warpgroup.OperandSource.RMEM
        tiled_mma_pv = sm90.make_trivial_tiled_mma(
            dt, dt, OperandMajorMode.K, OperandMajorMode.MN, Float32,
            atom_layout_mnk=(self.num_consumer_wg, 1, 1), tiler_mn=(64, hd), a_source=p_source,
        )  # fmt: skip

        sQ_layout = _smem_layout(dt, tm, hd, None)
        sK_layout = _smem_layout(dt, tn, hd, st)
        sV_layout = _smem_layout(dt, tn, hd, st)
        sO_layout = sQ_layout
        # O aliases Q's buffer, except in the persistent kernel, where the next tile's Q may
        # arrive while this tile's O is still being stored.
        o_words = cute.cosize(sO_layout) if const_expr(self.persistent) else 1
        # P (p_smem): (tile_m, tile_n), keys contiguous (PV's A operand, K-major).
        sP_layout = _smem_layout(dt, tm, tn, None)

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * st]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * st]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[dt, o_words], 1024]

        @cute.struct
        class SharedStorageP:
            base: SharedStorage
            sP: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sP_layout)], 1024]

        # Kernels without p_smem keep the storage they had (no P buffer at all).
        self.shared_storage = SharedStorageP if const_expr(self.p_smem) else SharedStorage
        self.bytes_q = cute.size_in_bytes(dt, sQ_layout)
        self.bytes_kv = cute.size_in_bytes(dt, cute.select(sK_layout, mode=[0, 1]))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(g2s, mQ, sQ_layout, (tm, hd))
        tma_k, tK = cpasync.make_tiled_tma_atom(
            g2s, mK, cute.select(sK_layout, mode=[0, 1]), (tn, hd)
        )
        tma_v, tV = cpasync.make_tiled_tma_atom(
            g2s, mV, cute.select(sV_layout, mode=[0, 1]), (tn, hd)
        )
        tma_o, tO = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO, sO_layout, (tm, hd)
        )

        seqlen_q = mQ.shape[0]
        grid = (cute.ceil_div(seqlen_q, tm), cute.size(mQ.shape[2]), cute.size(mQ.shape[3]))
        if const_expr(self.persistent):
            tiles = grid[0] * grid[1] * grid[2]
            grid = (cutlass.min(tiles, max_ctas), 1, 1)
        self.kernel(
            tQ, tK, tV, tO, mLSE, mTiles, mStarts, tma_q, tma_k, tma_v, tma_o, scale_log2,
            sQ_layout, sK_layout, sV_layout, sO_layout, sP_layout, tiled_mma_qk, tiled_mma_pv,
        ).launch(
            grid=grid,
            block=[self.num_threads, 1, 1],
            stream=stream,
            # Without this ptxas ignores setmaxnreg (C7508) and the consumers starve for registers.
            min_blocks_per_mp=1,
        )  # fmt: skip

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mTiles: cute.Tensor,
        mStarts: cute.Tensor,
        tma_q: cute.CopyAtom,
        tma_k: cute.CopyAtom,
        tma_v: cute.CopyAtom,
        tma_o: cute.CopyAtom,
        scale_log2: Float32,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        sO_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
    ) -> None:
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        # Tiles as one index, query block fastest: this CTA's first, the step to its next, and
        # the end. A CTA per tile: its block index, and a single step. With tile lists these
        # index the list (mTiles[i] is the tile).
        num_m_blocks = cute.ceil_div(mQ.shape[0], self.tile_m)
        heads = cute.size(mQ.shape[2])
        bid_x, bid_y, bid_z = cute.arch.block_idx()
        grid_x, _, _ = cute.arch.grid_dim()
        if const_expr(self.tile_list):
            first_tile = mStarts[bid_x]
            tile_step = Int32(1)
            tile_end = mStarts[bid_x + 1]
        elif const_expr(self.persistent):
            first_tile = bid_x
            tile_step = grid_x
            tile_end = num_m_blocks * heads * cute.size(mQ.shape[3])
        else:
            first_tile = bid_x + num_m_blocks * (bid_y + heads * bid_z)
            if const_expr(self.lpt_order):
                first_tile = self._grouped_tile(
                    first_tile, num_m_blocks, heads * cute.size(mQ.shape[3]), mK.shape[0]
                )
            tile_step = Int32(1)
            tile_end = first_tile + 1

        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v, tma_o):
                cpasync.prefetch_descriptor(atom)

        storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
        sP = None
        if const_expr(self.p_smem):
            sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
            storage = storage.base
        producer = cpipe.CooperativeGroup(cpipe.Agent.Thread, 1)
        # PipelineTmaAsync releases with lane 0 of each consumer warp: arrive count = #warps.
        consumers = cpipe.CooperativeGroup(cpipe.Agent.Thread, self.num_consumer_threads // 32)
        pipe_q = cpipe.PipelineTmaAsync.create(
            num_stages=1, producer_group=producer, consumer_group=consumers,
            tx_count=self.bytes_q, barrier_storage=storage.mbar_q.data_ptr(), defer_sync=True,
        )  # fmt: skip
        pipe_k = cpipe.PipelineTmaAsync.create(
            num_stages=self.num_stages, producer_group=producer, consumer_group=consumers,
            tx_count=self.bytes_kv, barrier_storage=storage.mbar_k.data_ptr(), defer_sync=True,
        )  # fmt: skip
        pipe_v = cpipe.PipelineTmaAsync.create(
            num_stages=self.num_stages, producer_group=producer, consumer_group=consumers,
            tx_count=self.bytes_kv, barrier_storage=storage.mbar_v.data_ptr(), defer_sync=True,
        )  # fmt: skip
        # One fence + CTA barrier for all three rings instead of one per ring.
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        # O reuses Q's buffer (both consumer warpgroups pass the epilogue barrier before
        # writing), or, persistent, has its own.
        o_store = storage.sO if const_expr(self.persistent) else storage.sQ
        sO = o_store.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.load(
                    mQ, mK, mV, sQ, sK, sV, tma_q, tma_k, tma_v, pipe_q, pipe_k, pipe_v,
                    mTiles, first_tile, tile_step, tile_end, num_m_blocks, heads,
                )  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consume(
                mO, mLSE, sQ, sK, sV, sO, sP, tma_o, pipe_q, pipe_k, pipe_v, tiled_mma_qk,
                tiled_mma_pv, scale_log2, tidx - 128, mTiles, first_tile, tile_step, tile_end,
                num_m_blocks, heads, mK.shape[0],
            )  # fmt: skip

    @cute.jit
    def _grouped_tile(
        self, launch: Int32, num_m_blocks: Int32, head_batches: Int32, seqlen_k: Int32
    ) -> Int32:
        """``fwd_tiles.grouped_tile`` on the device: the tile CTA ``launch`` runs (lpt_order),
        with the L2 group of ``fwd_tiles.l2_group`` (K and V of a (batch, head), 16-bit)."""
        kv_bytes = cutlass.max(Int64(seqlen_k) * (4 * self.head_dim), Int64(1))
        fit = Int64(L2_GROUP_BYTES) // kv_bytes
        group = Int32(cutlass.max(cutlass.min(fit, Int64(head_batches)), Int64(1)))
        first_pair = launch // (group * num_m_blocks) * group
        pairs = cutlass.min(group, head_batches - first_pair)
        within = launch - first_pair * num_m_blocks
        m_rank = within // pairs
        return m_rank + num_m_blocks * (first_pair + within - m_rank * pairs)

    @cute.jit
    def _tile(
        self, tile: Int32, num_m_blocks: Int32, heads: Int32, seqlen_q: Int32, seqlen_k: Int32
    ) -> tuple[Int32, Int32, Int32, Int32]:
        """(m_block, head, batch, n_block_max) of tile index ``tile`` (query block fastest)."""
        m_block = tile % num_m_blocks
        head_batch = tile // num_m_blocks
        head = head_batch % heads
        batch = head_batch // heads
        n_block_max = cute.ceil_div(seqlen_k, self.tile_n)
        if const_expr(self.causal):
            # Causal work grows with m_block: launch the longest tiles first so the short ones
            # fill the tail of the wave instead of one long tile running alone at the end.
            m_block = num_m_blocks - 1 - m_block
            # Bottom-right causal: key n is visible to row m iff n <= m + (seqlen_k - seqlen_q).
            last_key = cutlass.min(seqlen_k, (m_block + 1) * self.tile_m + seqlen_k - seqlen_q)
            n_block_max = (cutlass.max(last_key, 0) + self.tile_n - 1) // self.tile_n
        return m_block, head, batch, n_block_max
