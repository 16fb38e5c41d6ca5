"""The two small kernels around the Hopper backward's main kernel, in CuTe DSL and launched
through TVM-FFI like it: the per-row preprocess (which also zeroes the dQ accumulator and the
semaphores) and the dQ cast out of fragment order (which also reports a timed-out dQ wait to
the host).

Why not Triton (the backend's first version used the Triton kernels of ``backends.triton``): a
Triton launch costs ~20-30 us of host time on the H200 machine and a TVM-FFI launch ~10, and a
small backward's GPU work (b32 x 512 tokens: ~0.45 ms) is no longer than its host time
(benchmarks/NOTES.md, items 42-47). With these two kernels a backward is three launches and one
fill fewer.

Both are plain memory-bound kernels (no TMA); the loads of each thread are all issued before
its first store:

* ``BwdPreprocess``: per (64-row block, batch x head) CTA of 128 threads, ``delta = rowsum(dO *
  O)`` in fp32 (each thread sums its 16-byte vectors of one row in order, then a butterfly over
  the row's lanes: a fixed order, so delta is bitwise repeatable) and the LSE in log2 units,
  ``rows_pad`` rows per (batch x head): rows past seqlen_q (and rows that saw no key) get
  LSE2 = +inf and delta = 0, as the Triton preprocess writes them. Every CTA also zeroes its
  share of the region it is given (16-byte stores): the flags, and the dQ accumulator before
  them unless the main kernel stores each tile's first partial (``bwd_launch.FullBackward``).
* ``DqFragmentCast``: per (Q tile, batch x head) CTA of 256 threads, thread ``t`` reads the
  accumulator registers the main kernel's MMA thread ``t`` wrote (``dq_fragment``: 16-byte
  loads, a warp reads 512 contiguous bytes), scales them, rounds to q's dtype (round to nearest
  even, as the Triton cast: the same bits) and writes them row-major into shared memory; after
  one barrier the CTA stores the tile in 16-byte vectors, whole rows per warp, rows past
  seqlen_q dropped. CTA (0, 0) also copies the launch's device error flag, if set, into the
  host-mapped error word (``errors.mapped_launch``).
* ``DqFragmentCastPolled``: the same cast per tile, run beside a deterministic main kernel
  instead of after it (on SMs its plan leaves free), each CTA waiting for its tile's semaphore
  to count all of the tile's contributions.
"""

from __future__ import annotations

from typing import Any

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from . import kernel_cache
from .bwd_sync import wait_value
from .dq_fragment import WG_THREADS, half_size, wg_split

LOG2_E = 1.4426950408889634
PRE_ROWS = 64  # rows per preprocess CTA
PRE_THREADS = 128
VEC = 8  # 16-bit elements per 16-byte load
CAST_THREADS = 256  # the main kernel's two MMA warpgroups
SMEM_PAD = 8  # 16-bit elements of padding per shared-memory row in the cast


def _row_lanes(head_dim: int) -> int:
    """Threads per row in the preprocess: 8 where the row has a multiple of 8 vectors (a warp
    then reads 4 rows of 128 contiguous bytes per load), else 4."""
    vectors = head_dim // VEC
    return 8 if vectors % 8 == 0 else 4


@cute.jit
def load_row_vectors(
    o_row: cute.Tensor, do_row: cute.Tensor, o_vecs: list, do_vecs: list, lane: Int32,
    lanes: cutlass.Constexpr[int],
):  # fmt: skip
    """This lane's 16-byte vectors of one row of O and dO (``lane``, ``lane + lanes``, ...)
    into ``o_vecs`` and ``do_vecs`` (one register tensor per vector)."""
    for v in cutlass.range_constexpr(len(o_vecs)):
        chunk = lane + v * lanes
        cute.autovec_copy(cute.local_tile(o_row, (VEC,), (chunk,)), o_vecs[v])
        cute.autovec_copy(cute.local_tile(do_row, (VEC,), (chunk,)), do_vecs[v])


@cute.jit
def row_dot(o_vecs: list, do_vecs: list, valid, lanes: cutlass.Constexpr[int]) -> Float32:
    """delta of one row from its ``lanes`` adjacent lanes' vectors (``load_row_vectors``):
    each lane sums its products in order (0 where not ``valid``), then a butterfly over the
    lanes leaves the row's sum in each of them. A fixed order: the same bits wherever a row is
    computed."""
    total = Float32(0.0)
    if valid:
        for v in cutlass.range_constexpr(len(o_vecs)):
            prod = o_vecs[v].load().to(Float32) * do_vecs[v].load().to(Float32)
            for e in cutlass.range_constexpr(VEC):
                total = total + prod[e]
    offset = lanes // 2
    while const_expr(offset > 0):
        total = total + cute.arch.shuffle_sync_bfly(total, offset)
        offset //= 2
    return total


class BwdPreprocess:
    """LSE2 and delta of every row, and the zero fill of the flags (and of the dQ accumulator
    where the main kernel adds every partial; see the module)."""

    def __init__(
        self,
        dtype: type[cutlass.Numeric],
        head_dim: int,
        pdl: bool = False,
        rows: int = PRE_ROWS,
        threads: int = PRE_THREADS,
        heads_fastest: bool = False,
    ) -> None:
        if head_dim % (4 * VEC):
            raise ValueError(f"head_dim must be a multiple of {4 * VEC}, got {head_dim}")
        self.dtype = dtype
        self.head_dim = head_dim
        # rows, threads: rows and threads per CTA; heads_fastest: the grid's first axis walks
        # the (batch x head)s, so that CTAs launched together read neighbouring heads of the
        # same rows, contiguous in (b, s, h, d) memory (probe knobs,
        # tools/hopper/preprocess_rows_ab.py; rows a multiple of what one pass of the threads
        # covers).
        self.rows = rows
        self.threads = threads
        self.heads_fastest = heads_fastest
        # pdl: let the main kernel (a programmatic dependent launch) start once this CTA's loads
        # are issued; the main kernel waits for this grid's end before reading its outputs.
        self.pdl = pdl
        self.lanes = _row_lanes(head_dim)
        self.per_lane = head_dim // VEC // self.lanes  # vectors per thread and row
        self.rows_per_pass = threads // self.lanes
        if rows % self.rows_per_pass:
            raise ValueError(f"rows must be a multiple of {self.rows_per_pass}, got {rows}")

    @cute.jit
    def __call__(
        self,
        mO: cute.Tensor,  # (b, seqlen_q, heads, hd)
        mdO: cute.Tensor,
        mLSE: cute.Tensor,  # (b, heads, seqlen_q) fp32, natural log
        mLSE2: cute.Tensor,  # (b * heads, rows_pad) fp32
        mDelta: cute.Tensor,
        mZero: cute.Tensor,  # (n, 4) fp32 zeroed here: the flags (and the dQ accumulator)
        stream: cuda.CUstream,
    ):
        batch, heads = mO.shape[0], mO.shape[2]
        blocks = (mLSE2.shape[1] + self.rows - 1) // self.rows
        grid = [blocks, batch * heads, 1]
        if const_expr(self.heads_fastest):
            grid = [batch * heads, blocks, 1]
        self.kernel(mO, mdO, mLSE, mLSE2, mDelta, mZero).launch(
            grid=grid, block=[self.threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mO: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mZero: cute.Tensor,
    ):
        tid, _, _ = cute.arch.thread_idx()
        block, bh, _ = cute.arch.block_idx()
        blocks, bhs, _ = cute.arch.grid_dim()
        if const_expr(self.heads_fastest):
            block, bh, blocks, bhs = bh, block, bhs, blocks
        heads = mO.shape[2]
        seqlen_q = mO.shape[1]
        rows_pad = mLSE2.shape[1]
        b = bh // heads
        h = bh % heads

        # Three phases, so that every load of the CTA's rows is in flight at once: the loads,
        # the sums, the stores. Interleaved (load a row, store its delta, load the next), each
        # row would wait a whole memory latency: the compiler cannot move a load above a store
        # it cannot prove is to another address (the first version ran at about half the
        # Triton preprocess's bandwidth on the H200, session 13).
        lane = tid % self.lanes
        passes = self.rows // self.rows_per_pass
        o_vecs = [
            [cute.make_rmem_tensor((VEC,), self.dtype) for _ in range(self.per_lane)]
            for _ in range(passes)
        ]
        do_vecs = [
            [cute.make_rmem_tensor((VEC,), self.dtype) for _ in range(self.per_lane)]
            for _ in range(passes)
        ]
        lses = cute.make_rmem_tensor((passes,), Float32)
        for p in cutlass.range_constexpr(passes):
            row = block * self.rows + p * self.rows_per_pass + tid // self.lanes
            lses[p] = -Float32.inf
            if row < seqlen_q:
                load_row_vectors(
                    mO[b, row, h, None], mdO[b, row, h, None], o_vecs[p], do_vecs[p], lane,
                    self.lanes,
                )  # fmt: skip
                lses[p] = mLSE[b, h, row]
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        totals = cute.make_rmem_tensor((passes,), Float32)
        for p in cutlass.range_constexpr(passes):
            row = block * self.rows + p * self.rows_per_pass + tid // self.lanes
            totals[p] = row_dot(o_vecs[p], do_vecs[p], row < seqlen_q, self.lanes)
        for p in cutlass.range_constexpr(passes):
            row = block * self.rows + p * self.rows_per_pass + tid // self.lanes
            if lane == 0 and row < rows_pad:
                lse2 = Float32(float("inf"))
                if lses[p] != -Float32.inf:  # rows past seqlen_q were left at -inf
                    lse2 = lses[p] * LOG2_E
                mLSE2[bh, row] = lse2
                mDelta[bh, row] = totals[p]

        # This CTA's share of the zeroing: 16-byte rows cta, cta + ctas, ... (coalesced), after
        # the row work so that its stores do not hold the loads back.
        zeros = cute.make_rmem_tensor((4,), Float32)
        zeros.fill(0.0)
        cta = bh * blocks + block
        for i in cutlass.range(
            cta * self.threads + tid, mZero.shape[0], bhs * blocks * self.threads
        ):
            cute.autovec_copy(zeros, mZero[i, None])


class DqFragmentCast:
    """dq = dq_acc * softmax_scale in q's dtype, from the fragment-order accumulator (see the
    module); reports the launch's error flag to the host-mapped word."""

    def __init__(
        self, dtype: type[cutlass.Numeric], head_dim: int, block_m: int, pdl: bool = False
    ) -> None:
        self.dtype = dtype
        self.head_dim = head_dim
        self.block_m = block_m
        # pdl: launched as a programmatic dependent of the main kernel; waits for its end
        # (griddepcontrol.wait) before the first read.
        self.pdl = pdl
        self.split = wg_split(block_m)
        self.half = half_size(block_m, head_dim)
        if self.half % (WG_THREADS * 4):
            raise ValueError(f"block_m={block_m}, head_dim={head_dim}: no whole 16-byte chunks")
        self.chunks = self.half // (WG_THREADS * 4)  # 16-byte loads per thread

    @cute.jit
    def __call__(
        self,
        mAcc: cute.Tensor,  # (b, heads, q_tiles, block_m * hd) fp32
        mdQ: cute.Tensor,  # (b, seqlen_q, heads, hd)
        mFlags: cute.Tensor,  # int32: ticket, error flag, semaphores
        softmax_scale: Float32,
        error_addr: Int64,  # device address of the host-mapped error word, 0 for none
        launch_id: Int32,
        stream: cuda.CUstream,
    ):
        batch, heads, q_tiles = mAcc.shape[0], mAcc.shape[1], mAcc.shape[2]
        self.kernel(mAcc, mdQ, mFlags, softmax_scale, error_addr, launch_id).launch(
            grid=[q_tiles, batch * heads, 1], block=[CAST_THREADS, 1, 1], stream=stream,
            use_pdl=self.pdl,
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        mAcc: cute.Tensor,
        mdQ: cute.Tensor,
        mFlags: cute.Tensor,
        softmax_scale: Float32,
        error_addr: Int64,
        launch_id: Int32,
    ):
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        tid, _, _ = cute.arch.thread_idx()
        tile, bh, _ = cute.arch.block_idx()
        self._cast_tile(mAcc, mdQ, softmax_scale, tile, bh, tid)
        # One thread of the grid reads the flag (nested: the DSL evaluates every operand of an
        # `and` of runtime values).
        if tile == 0 and bh == 0 and tid == 0 and error_addr != 0:  # noqa: SIM102
            if mFlags[1] != 0:
                _report_error(error_addr, launch_id)

    @cute.jit
    def _cast_tile(
        self,
        mAcc: cute.Tensor,
        mdQ: cute.Tensor,
        softmax_scale: Float32,
        tile: Int32,
        bh: Int32,
        tid: Int32,
    ):
        """Q tile ``tile`` of (batch x head) ``bh``: read, scale, cast and store (the CTA's
        ``CAST_THREADS`` threads, one barrier)."""
        heads = mAcc.shape[1]
        seqlen_q = mdQ.shape[1]
        b = bh // heads
        h = bh % heads
        wg = tid // WG_THREADS
        t = tid % WG_THREADS
        warp = t // 32
        lane = t % 32
        acc_tile = mAcc[b, h, tile, None]
        # Every load first (a load after a store waits for nothing, but a store's data waits
        # for its load: interleaved, each chunk costs one memory latency).
        raws = [cute.make_rmem_tensor((4,), Float32) for _ in range(self.chunks)]
        for n8 in cutlass.range_constexpr(self.chunks):
            start = wg * (self.half // 4) + n8 * WG_THREADS + t
            cute.autovec_copy(cute.local_tile(acc_tile, (4,), (start,)), raws[n8])

        # Through shared memory, row-major: stored from the fragments directly, a warp's 32-bit
        # stores would touch 8 rows 16 bytes each, and the cast ran at ~40% of the Triton one's
        # bandwidth on the H200 (session 13). Rows are padded by 16 bytes so that the pair
        # writes of a warp (8 rows x 4 lanes) fall in 32 distinct banks.
        smem = cutlass.memory.SmemAllocator()
        pitch = self.head_dim + SMEM_PAD
        sTile = smem.allocate_tensor(
            self.dtype, cute.make_layout((self.block_m, pitch), stride=(pitch, 1)), 16
        )
        out = cute.make_rmem_tensor((4,), self.dtype)
        for n8 in cutlass.range_constexpr(self.chunks):
            # Registers 4 n8 .. 4 n8 + 3 of MMA thread (wg, t): (k, j) = (0, 0), (1, 0), (0, 1),
            # (1, 1), i.e. rows r and r + 8, columns c and c + 1 of the accumulator.
            out.store((raws[n8].load() * softmax_scale).to(self.dtype))
            for j in cutlass.range_constexpr(2):
                r = 16 * warp + lane // 4 + 8 * j
                c = 8 * n8 + 2 * (lane % 4)
                if const_expr(self.split == "swap"):
                    # dQ^T: accumulator row r is head-dim column 64 wg + r, columns c, c + 1
                    # are Q rows.
                    for k in cutlass.range_constexpr(2):
                        sTile[c + k, 64 * wg + r] = out[2 * j + k]
                else:
                    if const_expr(self.split == "cols"):
                        row = r
                        col = wg * (self.head_dim // 2) + c
                    else:
                        row = 64 * wg + r
                        col = c
                    cute.autovec_copy(
                        cute.local_tile(out, (2,), (j,)),
                        cute.local_tile(sTile[row, None], (2,), (col // 2,)),
                    )
        cute.arch.sync_threads()

        # Out in 16-byte vectors: a warp stores whole rows (two of 256 bytes at head dim 128).
        row_vecs = self.head_dim // VEC
        tile_vecs = self.block_m * row_vecs
        rounds = -(-tile_vecs // CAST_THREADS)
        vecs = [cute.make_rmem_tensor((VEC,), self.dtype) for _ in range(rounds)]
        for i in cutlass.range_constexpr(rounds):
            v = tid + i * CAST_THREADS
            if v < tile_vecs:
                src = cute.local_tile(sTile[v // row_vecs, None], (VEC,), (v % row_vecs,))
                cute.autovec_copy(src, vecs[i])
        for i in cutlass.range_constexpr(rounds):
            v = tid + i * CAST_THREADS
            row = tile * self.block_m + v // row_vecs
            if v < tile_vecs and row < seqlen_q:
                cute.autovec_copy(
                    vecs[i], cute.local_tile(mdQ[b, row, h, None], (VEC,), (v % row_vecs,))
                )


@cute.jit
def _report_error(error_addr: Int64, launch_id: Int32):
    """Write ``launch_id`` into the host-mapped error word at ``error_addr``."""
    word = cute.make_tensor(
        cute.make_ptr(Int32, error_addr, cute.AddressSpace.gmem, assumed_align=4),
        cute.make_layout(1),
    )
    word[0] = launch_id


class DqFragmentCastPolled(DqFragmentCast):
    """``DqFragmentCast`` that runs beside the main kernel instead of after it.

    Launched as a programmatic dependent of a main kernel that lets its dependents start as
    soon as all its CTAs are resident (``HopperAttnBwd``'s ``cast_trigger``), so its CTAs take
    the SMs the main kernel leaves free (a plan on fewer workers than SMs) and, once the main
    kernel's CTAs end, the rest. Each CTA waits (thread 0, acquire loads, bounded by
    ``timeout_ns``) until its tile's dQ semaphore has counted all of the tile's contributions
    (``counts``, from the schedule): the dQ warp releases a turn only after its adds have
    landed, so the sum is then complete in the accumulator. Deterministic kernels only: the
    non-deterministic ones take no turns. A timed-out wait raises the launch's error flag, and
    a raised flag (a wait of the main kernel's timed out too) ends every other CTA's wait: the
    result is an error then, and thousands of tiles must not wait out a bound each. The CTA
    that ends last (a counter after the semaphores, ``flags[2 + tiles]``) waits for the main
    kernel's end (``griddepcontrol.wait``, one thread): a programmatic dependent that never
    waits could end before its primary, and the stream's next work would then run beside the
    main kernel's last dK/dV stores. Then it copies the flag to the host-mapped word. A CTA
    that finds the flag raised after its wait writes its tile as NaN.
    """

    def __init__(self, dtype: type[cutlass.Numeric], head_dim: int, block_m: int) -> None:
        super().__init__(dtype, head_dim, block_m, pdl=True)

    @cute.jit
    def __call__(
        self,
        mAcc: cute.Tensor,  # (b, heads, q_tiles, block_m * hd) fp32
        mdQ: cute.Tensor,  # (b, seqlen_q, heads, hd)
        mFlags: cute.Tensor,  # int32: ticket, error flag, semaphores, then the CTA counter
        mCounts: cute.Tensor,  # int32: each dQ tile's number of contributions
        softmax_scale: Float32,
        timeout_ns: Int64,
        error_addr: Int64,
        launch_id: Int32,
        stream: cuda.CUstream,
    ):
        batch, heads, q_tiles = mAcc.shape[0], mAcc.shape[1], mAcc.shape[2]
        self.kernel(
            mAcc, mdQ, mFlags, mCounts, softmax_scale, timeout_ns, error_addr, launch_id
        ).launch(
            grid=[q_tiles, batch * heads, 1], block=[CAST_THREADS, 1, 1], stream=stream,
            use_pdl=True,
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        mAcc: cute.Tensor,
        mdQ: cute.Tensor,
        mFlags: cute.Tensor,
        mCounts: cute.Tensor,
        softmax_scale: Float32,
        timeout_ns: Int64,
        error_addr: Int64,
        launch_id: Int32,
    ):
        # No griddepcontrol.wait: that would wait for the main kernel's end.
        tid, _, _ = cute.arch.thread_idx()
        tile, bh, _ = cute.arch.block_idx()
        q_tiles, bhs, _ = cute.arch.grid_dim()
        index = bh * q_tiles + tile
        if tid == 0:  # noqa: SIM102 (one thread waits: the DSL would evaluate both operands)
            # Acquire loads of the tile's semaphore; the other threads' loads of the tile come
            # after the barrier below, which orders them after this thread's acquire.
            sem_ptr, flag_ptr = mFlags.iterator + (2 + index), mFlags.iterator + 1
            if wait_value(sem_ptr, mCounts[index], timeout_ns, abort_ptr=flag_ptr) != 0:
                mFlags[1] = Int32(1)
        cute.arch.sync_threads()
        # A raised flag (this tile's wait timed out, or another's did and ended this wait
        # early) leaves this tile's sum possibly incomplete: it is cast as NaN, never as a
        # finite partial sum. The barrier above orders thread 0's store before these loads.
        scale = softmax_scale
        if mFlags[1] != 0:
            scale = Float32(float("nan"))
        self._cast_tile(mAcc, mdQ, scale, tile, bh, tid)
        if tid == 0:
            done = cute.arch.atomic_add(
                mFlags.iterator + (2 + bhs * q_tiles), Int32(1), sem="acq_rel", scope="gpu"
            )
            if done == bhs * q_tiles - 1:
                # The last CTA waits for the main kernel's end (its last dK/dV stores may come
                # after its last dQ release): this grid then ends after it, so whatever the
                # stream runs next sees dq, dk and dv complete, as with the plain cast. No other
                # CTA waits: each would hold its SM until the main kernel ends.
                cute.arch.griddepcontrol_wait()
                if error_addr != 0:  # noqa: SIM102
                    if mFlags[1] != 0:
                        _report_error(error_addr, launch_id)


def row_stat_fakes(dtype: type[cutlass.Numeric], head_dim: int) -> tuple:
    """The compile-time stand-ins of a preprocess's first five arguments: O and dO (q's dtype,
    (b, seqlen_q, heads, hd)), the LSE (fp32, (b, heads, seqlen_q)), LSE2 and delta (fp32,
    (b * heads, rows))."""
    from ._tensor_args import fake_tensor

    return (
        fake_tensor(dtype, 4, head_dim, 16),
        fake_tensor(dtype, 4, head_dim, 16),
        fake_tensor(Float32, 3, cute.sym_int(), 4),
        fake_tensor(Float32, 2, cute.sym_int(), 16),
        fake_tensor(Float32, 2, cute.sym_int(), 16),
    )


def compile_preprocess(
    dtype: type[cutlass.Numeric],
    head_dim: int,
    arch: str = "sm_90a",
    *,
    pdl: bool = False,
    extra_options: str = "",
) -> Any:
    """The compiled ``BwdPreprocess`` for q's dtype and head dim (every shape); ``pdl``: it
    lets a programmatic dependent launch start early (``BwdPreprocess``); ``extra_options``:
    further CuTe-DSL compile options (tests keep the PTX with them)."""
    from cutlass.cute.runtime import make_fake_stream

    from ._tensor_args import fake_tensor

    kernel = BwdPreprocess(dtype, head_dim, pdl)

    def build() -> Any:
        return cute.compile(
            kernel,
            *row_stat_fakes(dtype, head_dim),
            fake_tensor(Float32, 2, 4, 16),
            make_fake_stream(use_tvm_ffi_env_stream=True),
            options=f"--gpu-arch {arch} --enable-tvm-ffi {extra_options}".strip(),
        )

    key = ("bwd_pre", dtype.__name__, head_dim, arch, extra_options) + (("pdl",) if pdl else ())
    return kernel_cache.compile_once(key, build, disk=not extra_options)


def compile_dq_cast(
    dtype: type[cutlass.Numeric],
    head_dim: int,
    block_m: int,
    arch: str = "sm_90a",
    *,
    pdl: bool = False,
    poll: bool = False,
    extra_options: str = "",
) -> Any:
    """The compiled ``DqFragmentCast`` for q's dtype, the head dim and the Q tile rows;
    ``pdl``: launched as a programmatic dependent of the main kernel; ``poll``: the
    ``DqFragmentCastPolled`` that runs beside it (its own signature, always a programmatic
    dependent); ``extra_options`` as ``compile_preprocess``'s."""
    from cutlass.cute.runtime import make_fake_stream

    from ._tensor_args import fake_tensor

    if poll:
        kernel: DqFragmentCast = DqFragmentCastPolled(dtype, head_dim, block_m)
    else:
        kernel = DqFragmentCast(dtype, head_dim, block_m, pdl)
    # The polled cast's counts and timeout come after the flags.
    polled_args = (fake_tensor(Int32, 1, cute.sym_int(), 4), Float32(1.0), Int64(0))

    def build() -> Any:
        tensors = (
            fake_tensor(Float32, 4, block_m * head_dim, 16),
            fake_tensor(dtype, 4, head_dim, 16),
            fake_tensor(Int32, 1, cute.sym_int(), 4),
        )
        scalars = polled_args if poll else (Float32(1.0),)
        return cute.compile(
            kernel, *tensors, *scalars, Int64(0), Int32(0),
            make_fake_stream(use_tvm_ffi_env_stream=True),
            options=f"--gpu-arch {arch} --enable-tvm-ffi {extra_options}".strip(),
        )  # fmt: skip

    key = ("dq_cast", dtype.__name__, head_dim, block_m, arch, extra_options)
    key += ("poll",) if poll else ("pdl",) if pdl else ()
    return kernel_cache.compile_once(key, build, disk=not extra_options)
