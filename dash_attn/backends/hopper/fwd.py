"""Hopper (sm_90a) attention forward in CuTe DSL: warp-specialised, TMA + WGMMA.

Same function as the Triton forward (`dash_attn.backends.triton.fwd`): out like q and a
natural-log LSE (batch, heads, seqlen_q) in fp32; causal is bottom-right aligned; rows that see
no key get out = 0 and lse = -inf. ``fwd_launch`` compiles it and launches it from torch tensors.

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
import operator
from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as cpipe
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup

from ._cute_utils import gmem_tensor, pack_16bit_pair, select_modes
from .fwd_tiles import L2_GROUP_BYTES

# Key-block width per head dim. 128 while Q + 2-stage K and V fit in smem (227 KiB); narrower
# for 192/256 so the rings still fit (hd 192: 48+72+72 KiB; hd 256: 64+64+64 KiB) and the
# O accumulator (hd/2 fp32 registers per thread) leaves room for S and P under 240 registers.
TILE_N = {64: 128, 96: 128, 128: 128, 192: 96, 256: 64}
SUPPORTED_HEAD_DIMS = tuple(TILE_N)
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)

# (consumer, producer) registers per thread for 2 or 3 consumer warpgroups; both fill the SM's
# 65536 registers at 1 CTA/SM: 128 * (2*240 + 24) = 64512, 128 * (3*160 + 32) = 65536.
CONSUMER_REGS = {2: (240, 24), 3: (160, 32)}

# Named barrier ids (0 is __syncthreads). Epilogue: the 256 consumer threads, before O
# overwrites sQ and again before the TMA store reads sO.
_BAR_EPILOGUE = 1
# Scheduler barriers: consumer warpgroup w (1 or 2) waits on id _BAR_SCHED_BASE + w - 1.
_BAR_SCHED_BASE = 2
# p_smem: consumer warpgroup w's P tile fully in shared memory (its 128 threads), id
# _BAR_P_BASE + w - 1 (after the scheduler barriers of up to three warpgroups).
_BAR_P_BASE = 5


def fwd_smem_bytes(
    head_dim: int, consumer_wgs: int, tile_n: int, persistent: bool, p_smem: bool
) -> int:
    """Shared memory of a ``HopperFwd`` config, laid out as its storage struct is: the
    mbarriers, then 1024-byte aligned Q, two K and two V stages, O (its own tile when
    persistent, else it aliases Q) and P (p_smem), 16-bit elements.

    >>> fwd_smem_bytes(96, 3, 128, persistent=True, p_smem=True) // 1024  # KiB, of 227
    217
    >>> fwd_smem_bytes(96, 3, 144, persistent=True, p_smem=True) > SMEM_LIMIT
    True
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


def _acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """Re-view an fp32 S accumulator ((2, 2, N/8), M, N) as an RS A-fragment
    ((2, 2, 2), M, (N/16, N)).


    For 16-bit WGMMA the C fragment of QK^T and the A fragment of PV put the same (row, col) in
    the same thread, so converting P needs no shuffles, only this regrouping of the N/8 mode.
    """
    lay = cute.logical_divide(acc.layout, ((None, None, 2), None, None))
    shape = (
        (lay.shape[0][0], lay.shape[0][1], lay.shape[0][2][0]),
        lay.shape[1],
        (lay.shape[0][2][1], lay.shape[2]),
    )
    stride = (
        (lay.stride[0][0], lay.stride[0][1], lay.stride[0][2][0]),
        lay.stride[1],
        (lay.stride[0][2][1], lay.stride[2]),
    )
    return cute.make_tensor(acc.iterator, cute.make_layout(shape, stride=stride))


@cute.jit
def _convert_16bit(src: cute.Tensor, dst: cute.Tensor) -> None:
    """fp32 fragment -> 16-bit fragment of the same shape, packed pairwise.

    `TensorSSA.to()` does not always pair the conversions (seen for 96-wide P tiles): the
    16-bit halves are then re-packed with movs between WGMMAs and ptxas serialises them (C7519).
    """
    bf16 = const_expr(dst.element_type == cutlass.BFloat16)
    dst32 = cute.recast_tensor(dst, Int32)
    for i in cutlass.range(cute.size(dst32), unroll_full=True):
        dst32[i] = pack_16bit_pair(src[2 * i], src[2 * i + 1], bf16)


class HopperFwd:
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

    # --------------------------------------------------------------- consumer helpers
    @cute.jit
    def _gemm(
        self,
        tiled_mma: cute.TiledMma,
        acc: cute.Tensor,
        frag_a: cute.Tensor,
        frag_b: cute.Tensor,
        zero_init: cutlass.Constexpr[bool],
    ) -> None:
        """Issue one warpgroup's WGMMAs over the k-blocks and commit them as one group (no wait)."""
        warpgroup.fence()
        # A fresh atom per call: flipping ACCUMULATE on a shared atom breaks SSA dominance.
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
        for k in cutlass.range_constexpr(cute.size(frag_a.shape[2])):
            cute.gemm(atom, acc, frag_a[None, None, k], frag_b[None, None, k], acc)
            atom.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()

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
                self._gemm(tiled_mma_qk, acc_s, tSrQ, tSrK[None, None, None, kv_state.index], True)
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
                self._gemm(tiled_mma_pv, acc_o, tOrP, v_stage, False)
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
            _convert_16bit(acc_o, r_o)
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
        self._gemm(tiled_mma_qk, acc_s, tSrQ, tSrK[None, None, None, kv_state.index], True)
        pipe_v.consumer_wait(v_state)
        self._gemm(tiled_mma_pv, acc_o, tOrP, tOrVt[None, None, None, v_state.index], False)
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

    @cute.jit
    def _set_p(self, acc_s: cute.Tensor, tOrP: cute.Tensor, p_stage: Any, wg: Int32) -> None:
        """P (the softmax'ed S block) in 16 bits as the next PV's A operand: into its registers,
        or (p_smem, ``p_stage`` = (stmatrix atom, thread copy, its sP partition)) into this
        warpgroup's slab of sP, made visible to the WGMMA (async proxy) and awaited by the
        warpgroup's four warps, each of which issues its part of the PV."""
        if const_expr(p_stage is None):
            _convert_16bit(_acc_as_operand_a(acc_s), tOrP)
        else:
            p_atom, p_copy, p_dst = p_stage
            r_p = cute.make_rmem_tensor_like(acc_s, self.dtype)
            _convert_16bit(acc_s, r_p)
            cute.copy(p_atom, p_copy.retile(r_p), p_dst)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=_BAR_P_BASE - 1 + wg, number_of_threads=128)
