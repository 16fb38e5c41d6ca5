"""The backward's preprocess beside the main kernel instead of before it.

``bwd_pre_post.BwdPreprocess`` reads all of O and dO (134 MB at the sweep's 16k tokens, ~40 us
on the H200) before the main kernel may read a single delta: 2.7% of a d64 full 2k backward.
Where a plan leaves SMs free (``BackwardPlan.cast_sms``: the polled dQ cast runs there), this
kernel runs on them instead, beside the main kernel, Q tile by Q tile in the order the
schedule first needs them (``Schedule.dq_tiles_by_first_step``), and publishes each tile's
LSE2 and delta rows with a ready flag that the main kernel's producer waits for
(``HopperAttnBwd``'s ``pre_beside``) before it loads them, and counts the tiles done after the
flags: once the count is complete the producer checks no flag again.

Launch (``bwd_launch.FullBackward``): the host zeroes the flags (and the accumulator where
needed) first; this kernel is launched plainly, one CTA of 512 threads per free SM, and lets
its dependents launch at once; the main kernel is its programmatic dependent. A programmatic
launch starts only once every CTA of its primary is running, so these CTAs always hold their
SMs and every ready flag gets set whatever the main kernel does: its waits cannot hang on
SMs this kernel never got.

Each warp takes one Q tile (``block_m`` rows of one batch x head) at a time, every
``ctas x 16``-th tile of the order, in chunks of rows whose loads are all in flight at once
(16 vectors of 16 bytes per thread). Each row is summed by the same lanes in the same order as
in ``BwdPreprocess`` (``bwd_pre_post.row_dot``), so LSE2 and delta have the same bits. The
warp then orders its stores before the flag: a proxy fence (the main kernel reads the rows by
TMA, the async proxy), a warp barrier, release adds by lane 0 (the flag, then the count).
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from . import kernel_cache
from .bwd_pre_post import LOG2_E, VEC, _row_lanes, load_row_vectors, row_dot, row_stat_fakes

BESIDE_THREADS = 512  # 16 warps: one CTA per free SM
BESIDE_WARPS = BESIDE_THREADS // 32
VECTORS_IN_FLIGHT = 16  # per thread and chunk, of O and dO together (64 registers)


class BwdPreprocessBeside:
    """LSE2 and delta of every row, Q tile by Q tile in a given order, each tile published by a
    ready flag (see the module). Zeroes nothing: the host does before the launch."""

    def __init__(self, dtype: type[cutlass.Numeric], head_dim: int, block_m: int) -> None:
        if head_dim % (4 * VEC):
            raise ValueError(f"head_dim must be a multiple of {4 * VEC}, got {head_dim}")
        self.dtype = dtype
        self.head_dim = head_dim
        self.block_m = block_m
        self.lanes = _row_lanes(head_dim)
        self.per_lane = head_dim // VEC // self.lanes  # vectors per thread and row
        self.rows_per_pass = 32 // self.lanes  # rows per warp and pass
        if block_m % self.rows_per_pass:
            raise ValueError(
                f"block_m must be a multiple of {self.rows_per_pass} rows at head_dim "
                f"{head_dim}, got {block_m}"
            )
        # Passes per chunk: as many as VECTORS_IN_FLIGHT allows that make the tile a whole
        # number of chunks.
        self.passes = max(
            p for p in range(1, max(1, VECTORS_IN_FLIGHT // (2 * self.per_lane)) + 1)
            if block_m % (p * self.rows_per_pass) == 0
        )  # fmt: skip
        self.chunks = block_m // (self.rows_per_pass * self.passes)

    @cute.jit
    def __call__(
        self,
        mO: cute.Tensor,  # (b, seqlen_q, heads, hd)
        mdO: cute.Tensor,
        mLSE: cute.Tensor,  # (b, heads, seqlen_q) fp32, natural log
        mLSE2: cute.Tensor,  # (b * heads, q_tiles * block_m) fp32
        mDelta: cute.Tensor,
        mReady: cute.Tensor,  # (b * heads * q_tiles + 1,) int32, zeroed: 1 per tile, the count
        mOrder: cute.Tensor,  # int32: the tiles (b * heads + h) * q_tiles + t, in need order
        ctas: Int32,
        stream: cuda.CUstream,
    ):
        self.kernel(mO, mdO, mLSE, mLSE2, mDelta, mReady, mOrder).launch(
            grid=[ctas, 1, 1], block=[BESIDE_THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mO: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mReady: cute.Tensor,
        mOrder: cute.Tensor,
    ):
        # The main kernel may launch at once: every CTA of this grid runs by then.
        cute.arch.griddepcontrol_launch_dependents()
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        warp = tid // 32
        lane = tid % 32
        heads = mO.shape[2]
        seqlen_q = mO.shape[1]
        q_tiles = mLSE2.shape[1] // self.block_m
        row_lane = lane % self.lanes
        warp_row = lane // self.lanes  # this thread's row in a pass
        tiles = mOrder.shape[0]
        for i in cutlass.range(cta * BESIDE_WARPS + warp, tiles, ctas * BESIDE_WARPS):
            tile = mOrder[i]
            # An entry out of range is skipped: its tile, never made ready, then times out in
            # the main kernel's waits (an error), where a write past the flags could complete
            # the count (or corrupt memory) and give wrong gradients silently.
            if tile >= 0 and tile < tiles:
                bh = tile // q_tiles
                b = bh // heads
                h = bh % heads
                first_row = (tile % q_tiles) * self.block_m
                # A loop, not unrolled: unrolled, the compiler hoists every chunk's loads and
                # runs out of registers (255 and a stack frame at hd 64).
                for c in cutlass.range(self.chunks, unroll=1):
                    self._chunk(
                        mO, mdO, mLSE, mLSE2, mDelta, b, h, bh, seqlen_q, row_lane,
                        first_row + c * (self.passes * self.rows_per_pass) + warp_row,
                    )  # fmt: skip
                # The rows reach the main kernel's TMA loads (async proxy) through the flag.
                cute.arch.fence_proxy("async.global")
                cute.arch.sync_warp()
                if lane == 0:
                    done = cute.arch.atomic_add(
                        mReady.iterator + tile, Int32(1), sem="release", scope="gpu"
                    )
                    # The count of distinct tiles done, after the flags: once it has reached
                    # all of them the main kernel's producer checks no flag again. (A tile
                    # listed twice counts once, so the one it displaced still makes its
                    # waits time out; the twice-listed one's may too, its flag reading 2.)
                    if done == 0:
                        cute.arch.red(
                            mReady.iterator + tiles, Int32(1), op="add", dtype="s32",
                            sem="release", scope="gpu",
                        )  # fmt: skip

    @cute.jit
    def _chunk(self, mO, mdO, mLSE, mLSE2, mDelta, b, h, bh, seqlen_q, row_lane, thread_row):
        """One chunk of a tile: the loads of all its passes, then the sums, then the stores
        (one row per ``lanes`` threads per pass; ``thread_row`` is this thread's row in the
        chunk's first pass)."""
        o_vecs = [
            [cute.make_rmem_tensor((VEC,), self.dtype) for _ in range(self.per_lane)]
            for _ in range(self.passes)
        ]
        do_vecs = [
            [cute.make_rmem_tensor((VEC,), self.dtype) for _ in range(self.per_lane)]
            for _ in range(self.passes)
        ]
        lses = cute.make_rmem_tensor((self.passes,), Float32)
        for j in cutlass.range_constexpr(self.passes):
            row = thread_row + j * self.rows_per_pass
            lses[j] = -Float32.inf
            if row < seqlen_q:
                load_row_vectors(
                    mO[b, row, h, None], mdO[b, row, h, None], o_vecs[j], do_vecs[j],
                    row_lane, self.lanes,
                )  # fmt: skip
                lses[j] = mLSE[b, h, row]
        totals = cute.make_rmem_tensor((self.passes,), Float32)
        for j in cutlass.range_constexpr(self.passes):
            row = thread_row + j * self.rows_per_pass
            totals[j] = row_dot(o_vecs[j], do_vecs[j], row < seqlen_q, self.lanes)
        for j in cutlass.range_constexpr(self.passes):
            row = thread_row + j * self.rows_per_pass
            if row_lane == 0:
                lse2 = Float32(float("inf"))
                if lses[j] != -Float32.inf:  # rows past seqlen_q and rows that saw no key
                    lse2 = lses[j] * LOG2_E
                mLSE2[bh, row] = lse2
                mDelta[bh, row] = totals[j]


def compile_preprocess_beside(
    dtype: type[cutlass.Numeric],
    head_dim: int,
    block_m: int,
    arch: str = "sm_90a",
    *,
    extra_options: str = "",
) -> Any:
    """The compiled ``BwdPreprocessBeside`` for q's dtype, the head dim and the main kernel's
    Q tile rows (every shape); ``extra_options`` as ``bwd_pre_post.compile_preprocess``'s."""
    from cutlass.cute.runtime import make_fake_stream

    from ._tensor_args import fake_tensor

    kernel = BwdPreprocessBeside(dtype, head_dim, block_m)

    def build() -> Any:
        return cute.compile(
            kernel,
            *row_stat_fakes(dtype, head_dim),
            fake_tensor(Int32, 1, cute.sym_int(), 4),
            fake_tensor(Int32, 1, cute.sym_int(), 4),
            Int32(1),
            make_fake_stream(use_tvm_ffi_env_stream=True),
            options=f"--gpu-arch {arch} --enable-tvm-ffi {extra_options}".strip(),
        )

    key = ("bwd_pre_beside", dtype.__name__, head_dim, block_m, arch, extra_options)
    return kernel_cache.compile_once(key, build, disk=not extra_options)
