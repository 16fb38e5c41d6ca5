"""Hopper (sm_90a) attention backward in CuTe DSL that executes dash-attn schedule tables.

Same semantics, tables and error contract as the Triton kernel ``attn_bwd_kernel`` (see the
glossary of ``dash_attn/backends/triton/bwd.py``): a persistent grid of workers, each running chains
(one KV tile of one (batch, kv head): K, V loaded once, dK, dV kept in registers) made of steps
(q head, Q tile, rank). A grouped-query backward split by q head (``BackwardPlan.gqa_split``)
passes dK/dV with q's heads: a chain is then one q head's, it loads K/V of kv head
``head // group`` and writes its own dK/dV partial; or, with ``dkv_sum``, the kernel adds the
group's chains into fp32 dK/dV accumulators itself, in q-head order (see the epilogue below).
The dQ partial of every step is added into
an fp32 accumulator; in deterministic mode the addition of dQ tile (b, h, i) waits until its
semaphore equals the step's rank and increments it afterwards.

CTA layout (384 threads, 3 warpgroups)
--------------------------------------
warp 0       producer: the only reader of the schedule tables (and of the dynamic ticket
             counter). For every step it waits for a free stage of a 2-stage ring, writes the
             step's metadata into that stage's shared-memory slot, and issues TMA loads of Q, dO
             and the step's LSE2/delta rows; at the first step of a chain it also loads K and V
             (single-buffered, freed by the consumers at the chain's end). After the last chain
             it publishes a "done" slot.
warp 1       dQ writer: takes each step's fp32 dQ partial from shared memory, (deterministic)
             spins until the dQ tile's semaphore equals the rank (bounded by %globaltimer; a
             timeout raises status[1] and poisons the partial with NaN), issues the bulk
             reduce-add into dq_acc (one flat reduce of the tile in fragment order, or TMA
             tensor reduces that clip rows past seqlen_q; with ``dq_first_store`` rank 0's
             partial is copied instead, so dq_acc need not be zeroed), frees the buffer once
             it has been read, then waits for the adds' full completion and releases the
             semaphore (red.release.gpu). Non-deterministic mode skips the wait and the
             release (and always adds). With ``dq_writers=2`` warp 2 is a second dQ writer:
             each takes every other step (one ring stage and one staging buffer each, or,
             without dq_double, the one buffer in turn).
warps 2-3    idle (they only give registers back), but for warp 2 with ``dq_writers=2``.
WG 1, WG 2   MMA warpgroups (below: the usual step; hd 192/256 run ``mma_swapped``): each owns
             64 KV rows of the chain's tile. Per step
             S^T = K Q^T and dP^T = V dO^T (SS WGMMA), P^T = exp2(S^T*scale_log2 - lse2) with
             the masks, dS^T = P^T (dP^T - delta), dV += P^T dO and dK += dS^T Q (RS WGMMA from
             registers), dS to shared memory, dQ = dS K (SS, the two WGs split the head dim or
             the rows), then each WG's half of the dQ partial goes to the dQ writer's buffer.

Chain epilogue with ``dkv_sum`` (GQA split, dK/dV of the kv heads): each MMA warpgroup owns its
64 rows of the chain's dK/dV and a semaphore per (batch, kv head, KV tile, warpgroup). The chain
of the group's q head r (its rank) waits until that semaphore equals r (bounded, as the dQ
waits), then rank 0 stores its fp32 dK/dV into the accumulator, ranks 1 .. G-2 add theirs
(``red.add.v2.f32``), and each releases (fence, warpgroup barrier, ``red.release``); rank G-1
reads the sum, adds its own and writes dK/dV in 16 bits. So every element is
((p0 + p1) + ...) + p_{G-1} in fp32, rounded once: the order of the q heads, whatever the
schedule. A timed-out wait raises status[1] and stores NaN.

Synchronisation: mbarriers for the load ring (full: 1 arrival + TMA bytes; empty: 256 MMA
threads + the dQ writer) and for K/V; named barriers for dS (the 256 MMA threads) and for the
dQ buffers, "empty" and "full": per warpgroup half with ``dq_wg`` (128 MMA threads + the dQ
warp: a warpgroup that has its dQ half ready hands it over without waiting for the other), else
per buffer (256 MMA threads + the dQ warp). TMA copies are issued by whole warps (``cute.copy``
elects the issuing lane with a full-mask elect.sync).

Registers: 168 per thread at launch (384 threads), then setmaxnreg: 24 for warpgroup 0 and
240 for each MMA warpgroup (24 + 2 x 240 = 504 <= 512; a larger producer budget would leave
the MMA increase unable to allocate). Launched with ``min_blocks_per_mp=1`` so that ptxas keeps
setmaxnreg. Shared memory at hd 128: ~194 KiB (one CTA per SM, as static dispatch needs).

Per step, besides the five GEMMs: masks only in tiles that cross a key bound (one
warp-uniform test selects a masked or a plain copy of the exponential loop); dS^T stored by
stmatrix; FA4's order around the dS barrier (dS stored, dV issued, dQ queued behind it); the
dQ writer reads the step's metadata from the load-ring slot; the producer reads a step's tables
before it waits for the free stage, and takes a dynamic ticket only once its CTA has finished
the chain; dK/dV leave as 32-bit pairs, or (``dkv_smem``, shipped) through the K/V tiles in
shared memory as 16-byte chunks of whole rows. 128 x 128 tiles at hd 64; 64 x 128 at hd 96 (K
in 32-byte swizzled rows: each warpgroup's half of the dQ GEMM reads 48 of its columns, whole
atoms of that swizzle only); at hd 128 64 x 128, or
80 x 128 (FA4's tile for the full mask: dQ^T = K^T dS^T, since 80 rows are no multiple of the
64-row WGMMA atom, dS in 32-byte swizzled rows of 160 bytes, 226 KiB of shared memory). At hd
192 and 256, 64 x 96 and 64 x 48 with another step (``dkv_swap``, ``mma_swapped``: FA4's
layout there): S = Q K^T and dP = dO V^T with the KV rows split over the warpgroups, P and dS
through shared memory, dK^T and dV^T accumulated with the head dim as M.

The dQ partial is staged and accumulated in the MMA fragments' own order (``dq_fragment.py``;
16-byte stores, one flat bulk reduce per step, decoded by the final cast). Constructor options
(``bwd_launch.VARIANTS`` names combinations): ``dq_double`` gives the dQ writer two staging
buffers; ``dq_wg`` lets each MMA warpgroup hand its half of the partial over on its own (FA4's
hand-off); ``early_turn`` has the dQ writer take the turn while the step is computed; ``exp_tail``
moves the wait for dP^T before the last of the exponentials; ``early_meta`` reads the step's tile
indices before its GEMMs; ``do_single`` gives dO one buffer of its own (a second dQ buffer then
fits at 80-row tiles); ``ds_guard`` orders the warpgroups' use of the single dS buffer by a
barrier; ``exp_poly`` computes a share of the exponentials by a polynomial on the FMA pipe;
``dkv_smem`` takes the chain's dK/dV through shared memory (full sectors); ``dq_first_store``
copies each dQ tile's rank-0 partial instead of adding it; ``pdl`` launches the kernel as a
programmatic dependent; ``drain_ticket`` has the producer take a dynamic ticket only after the
chain's last dQ turn is released (with ``drain_at_turn``, once that turn is taken); ``stages`` is
the depth of the Q/dO ring.

(The next step's S^T issued inside this step measured 0.91-0.95x
once this step's dQ GEMM is done, probably waiting for the next ring slot's load, and 0.98-0.99x
after the dQ hand-off; ptxas keeps no wgmma in flight across the step loop's back edge.
benchmarks/NOTES.md item 157, code in git history at f1921c2.)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.experimental.primitives as cute_prims
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import dq_fragment
from ._cute_utils import (
    SMEM_LIMIT,
    acc_to_operand_a,
    pack_16bit_pair,
    select_modes,
    transpose_view,
    wgmma,
)
from .exp2_poly import EXP2_POLY_COEFFS, exp2_poly
from .gmem_pairs import load_f32_cg, red_add_f32x2, store_f32x2

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
SUPPORTED_TILES = ((64, 128), (80, 128), (128, 128), (64, 96), (64, 48))
# Head dims whose step runs the swapped layout (``dkv_swap``), with its only tiles: dK/dV of a
# chain do not fit in registers as 64 KV rows x head dim per warpgroup there.
SWAPPED_TILES = {192: (64, 96), 256: (64, 48)}

# Named barrier ids (0 is __syncthreads).
_BAR_DS = 1  # dS of a step fully in shared memory (256 MMA threads)
_BAR_DQ_EMPTY = 2  # dQ buffer free (dQ warp arrives, MMA threads wait)
_BAR_DQ_FULL = 3  # dQ buffer written (MMA threads arrive, dQ warp waits)
# Per dQ buffer b (dq_double) and, with dq_wg, warpgroup half w: _BAR_DQ_EMPTY + 2 (b + bufs w)
# and _BAR_DQ_FULL + 2 (b + bufs w) (ids 2-9; _dq_barrier).
_BAR_DQ_READ = 10  # ds_guard: + w, warpgroup w's dQ GEMM done (w arrives, the other waits)
_BAR_DKV = 12  # dkv_sum / dkv_smem: + w, warpgroup w's chain epilogue (its 128 threads)
_BAR_KV_FREE = 14  # dkv_smem: both warpgroups' last GEMMs of a chain done (256 MMA threads)
# dq_shared_writers: + w, dQ warp w hands the staging buffer to the other (64 threads). One
# barrier per direction: on a single one, a warp that arrived and then waited for the next
# hand-over would complete a generation by itself. Ids 6-7 belong to dq_double's second
# buffer otherwise, which a shared buffer excludes.
_BAR_WRITERS = 6

# Step metadata slot (int32 words per stage).
_INFO_WORDS = 8
_I_BATCH, _I_KVH, _I_KVT, _I_QH, _I_QT, _I_RANK, _I_FLAGS = range(7)
_F_FIRST = 1  # first step of its chain: K/V of the chain arrive with it
_F_LAST = 2  # last step of its chain: epilogue and K/V release after it
_F_DONE = 4  # no more work: leave the loop
_F_QUIET = 8  # with _F_DONE: no stop handshake (the second dQ warp's terminator, dq_writers=2)


class _DkvSums(NamedTuple):
    """What the chain epilogue of ``dkv_sum`` needs beyond the chain (runtime values)."""

    acc: cute.Tensor  # fp32 [2 * b * seqlen_k * kv_heads * hd]: dK's accumulator, then dV's
    flags: cute.Tensor  # int32: [1] the error flag, from [sem_base] the dK/dV semaphores
    fail: cute.Tensor  # shared int32 [4]: [2 + w] warpgroup w's wait gave up
    kv_group: Int32  # q heads per kv head
    kv_tiles: Int32
    sem_base: Int32
    timeout_ns: Int64


def _pair_rows(coords0, pairs: int) -> list[tuple[int, list[tuple[int, int]]]]:
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


def _fragment_rows(coords0, size: int) -> tuple[list[int], list[int]]:
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


class HopperAttnBwd:
    """One compiled backward per (dtype, head dim, causal, deterministic, tiles).

    All shapes (batch, sequence lengths, heads), strides and the schedule tables are runtime
    values, so one compiled kernel serves every problem and every schedule.
    """

    num_threads = 384
    num_mma_threads = 256
    producer_regs = 24
    mma_regs = 240

    def __init__(
        self,
        dtype: type[cutlass.Numeric],
        head_dim: int,
        causal: bool,
        deterministic: bool,
        block_m: int = 64,
        block_n: int = 128,
        stages: int = 2,
        *,
        dq_double: bool = False,
        dq_wg: bool = False,
        early_turn: bool = False,
        exp_tail: int = 0,
        early_meta: bool = False,
        do_single: bool = False,
        ds_guard: bool = False,
        dkv_row_ptr: bool = False,
        exp_poly: tuple[int, int] = (0, 1),
        exp_poly_degree: int = 5,
        dkv_sum: bool = False,
        dkv_smem: bool = False,
        dkv_smem_unroll: int = 1,
        dq_first_store: bool = False,
        pdl: bool = False,
        drain_ticket: bool = False,
        drain_at_turn: bool = False,
        dq_writers: int = 1,
        dkv_swap: bool = False,
        kv_prefetch: int | None = None,
        dkv_stage: bool = False,
    ) -> None:
        if dtype not in (cutlass.BFloat16, cutlass.Float16):
            raise ValueError(f"dtype must be BFloat16 or Float16, got {dtype}")
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise NotImplementedError(
                f"head_dim={head_dim} is not supported by the Hopper backward "
                f"(supported: {SUPPORTED_HEAD_DIMS})"
            )
        if (
            (block_m, block_n) not in SUPPORTED_TILES
            or (block_m == 128 and head_dim != 64)
            or (block_m == 80 and head_dim != 128)
            or ((block_m, block_n) in SWAPPED_TILES.values())
            != (SWAPPED_TILES.get(head_dim) == (block_m, block_n))
        ):
            raise NotImplementedError(
                f"tiles (block_m={block_m}, block_n={block_n}) are not supported at "
                f"head_dim={head_dim} (supported: {SUPPORTED_TILES}; 128 x 128 at hd 64 only, "
                "80 x 128 at hd 128 only, 64 x 96 at hd 192 only, 64 x 48 at hd 256 only)"
            )
        if stages < 2:
            raise ValueError(f"stages must be >= 2, got {stages}")
        self.dtype = dtype
        self.head_dim = head_dim
        self.causal = causal
        self.deterministic = deterministic
        self.block_m = block_m
        self.block_n = block_n
        self.stages = stages
        # The dQ partial is staged and accumulated in fragment order (dq_fragment.py): each
        #   thread's registers as 16-byte stores (half the store instructions of a swizzled
        #   row-major tile's 8-byte ones, which queue in the MIO pipe with the exponentials),
        #   and one flat bulk reduce per step instead of a TMA tensor reduce per 32 columns.
        #   The accumulator is (batch, heads, q_tiles, block_m * head_dim) and the final cast
        #   (dq_cast.scale_cast_fragments) decodes it. (Sessions 5-8's swizzled row-major
        #   tile, dq_swizzle, is in git history at aca05d6.)
        # dq_double: two dQ staging buffers, so the MMA warpgroups wait for the dQ writer only
        #   when it is two steps behind (the largest stall left in the session-8 profile was
        #   the wait for the single buffer). The shared memory comes from a single-buffered dS
        #   tile: dS of step s+1 is written only after every MMA thread passed step s's "dQ
        #   buffer free" barrier, which each passes after its dQ = dS K of step s completed.
        self.dq_double = dq_double
        self.dq_bufs = 2 if dq_double else 1
        # dq_wg: each MMA warpgroup hands its half of the dQ partial to the dQ writer on its
        #   own (named barriers of 160 threads: one warpgroup and the dQ warp), and the writer
        #   reduces each half as soon as it is there (FA4's hand-off). Without it, both
        #   warpgroups and the dQ warp meet at one 288-thread barrier per buffer state, a
        #   second point per step (after the dS barrier) where a warpgroup waits for the other.
        self.dq_wg = dq_wg
        # 80-row Q tiles (FA4's tile at hd 128 without a causal mask: a quarter more work per
        # step for the same per-step costs) are no multiple of the 64-row WGMMA atom, so dQ is
        # computed transposed, dQ^T = K^T dS^T: M = the head dim (64 rows per warpgroup),
        # N = 80 (dq_fragment's "swap" split). One dQ buffer only, unless dO has one buffer
        # (do_single): with it (40 KiB) the kernel takes 226 KiB of the 227 KiB a CTA may have.
        self.dq_swap = block_m % 64 != 0
        # The (M, N) of the dQ GEMM's accumulator: (Q rows, head dim), transposed with dq_swap.
        self.dq_mma_shape = (head_dim, block_m) if self.dq_swap else (block_m, head_dim)
        if self.dq_swap and dq_double and not do_single:
            raise NotImplementedError(
                f"block_m={block_m} computes dQ transposed: a second dQ buffer needs do_single "
                "(shared memory)"
            )
        # do_single: dO has one shared-memory buffer instead of one per ring stage, with its own
        #   "full"/"empty" mbarriers: step s+1's dO is loaded once step s's dV GEMM (its last
        #   reader) is done, and the MMA warpgroups wait for it just before dP^T, after S^T is
        #   issued, so the load has the dQ and dK GEMMs of step s and S^T of step s+1 to land
        #   (FA4 single-buffers dO at hd 192 the same way). It frees 20 KiB at 80-row tiles:
        #   with dS single-buffered (dq_double) a second 40 KiB dQ buffer then fits (226 KiB).
        self.do_single = do_single
        # ds_guard: with one dS buffer (dq_double) and per-warpgroup dQ hand-offs (dq_wg), a
        #   warpgroup may write step s+1's dS before the other warpgroup's step-s dQ GEMM, which
        #   reads all of dS, has completed: nothing but the tensor pipe's issue order keeps them
        #   apart (NOTES item 82). With ds_guard each warpgroup arrives on a named barrier once
        #   its dQ GEMM is done, and the other waits on it before its next dS store.
        if ds_guard and not (dq_double and dq_wg):
            raise ValueError("ds_guard guards the single dS buffer of dq_double with dq_wg")
        self.ds_guard = ds_guard
        # early_turn: the dQ warp reads a step's metadata from its ring slot as soon as the
        #   slot is loaded (its "full" mbarrier) and, deterministic, waits for the dQ tile's
        #   turn then, while the MMA warpgroups still compute the step; only then does it wait
        #   for the partial (FA4's order). Without it the turn is taken after the partial is
        #   in shared memory, so the acquire's L2 round trip (and any wait for another CTA)
        #   delays the reduce and the buffer's release, which the next step's dQ store waits
        #   for (session 15's profile at hd 64 causal 4k: twice FA4's barrier stalls there).
        #   Measured faster at hd 64, slower with two dQ buffers (hd 128 causal).
        self.early_turn = early_turn
        # (Measured and not kept, code in git history at 102690c: the exponentials' arguments
        #   in a pass of their own, split_exp, no faster, ptxas interleaves them already,
        #   session 9; S^T and dP^T awaited together with P^T and dS^T in one block,
        #   joint_wait, 0.97-1.06x, session 15; the LSE2 rows read into registers while S^T
        #   runs, early_lse, 0.92-0.97x det at hd 128, session 22.)
        # exp_tail: the last exp_tail of each thread's exponentials (all, if it has fewer:
        #   64 per step at hd 64, 32 or 40 at hd 128) are computed after the wait for dP^T,
        #   in one basic block with dS^T, so that ptxas issues them between the dS arithmetic
        #   of the elements already done while the others still overlap the dP^T GEMM.
        #   Without it the exponential loop (one basic block per mask path) ends in a run of
        #   ~40 back-to-back MUFUs (their FFMAs are all done) before the wait for dP^T.
        #   Measured 1.03x (geomean) at hd 64 with 24 of 64, neutral at hd 128 (session 16).
        if exp_tail < 0:
            raise ValueError(f"exp_tail must be >= 0, got {exp_tail}")
        self.exp_tail = exp_tail
        # early_meta: the step's tile indices (and the edge test) are read from the ring slot
        #   before S^T and dP^T are issued, not after the wait for S^T: there the shared load
        #   waited behind the MIO queue before the first exponential could start (the largest
        #   stall over FA4's at hd 128 full 8k, session 16's profile). No measurable effect
        #   (session 16: 1.014x at hd 64 where the same kernel under another name read
        #   1.012x, 0.98-1.02x at hd 128).
        self.early_meta = early_meta
        # dkv_row_ptr: the chain's dK/dV stores (32-bit pairs from registers) share one bounds
        #   test and one 64-bit row address per row of the thread's fragment, with constant
        #   column offsets, and the chain's indices are read from the ring slot at its last
        #   step only. Without it every pair computes its own address behind its own bounds
        #   branch, and each store's data register is overwritten by the next pair's address
        #   arithmetic before the store has read it (session 21's profile of hd 128 causal 2k:
        #   1061 instructions per warp and chain, 13% of the stall samples). Kernel time at a
        #   fixed clock: 1.00-1.05x at hd 128 (most at 512 tokens), but 0.93x at hd 64 full
        #   16k in det mode (not explained).
        self.dkv_row_ptr = dkv_row_ptr
        # exp_poly = (k, n): k of every n exponentials (fragment elements i with i % n >= n - k)
        #   are computed by a polynomial on the FMA pipe (exp2_poly.py, relative error 1.7e-7
        #   at degree 5, as ex2.approx's) instead of the MUFU unit, which takes 16 per SM and
        #   clock: at hd 64 a step's 16384 exponentials need ~1024 clocks of it against the
        #   ~512 of the dP^T GEMM they overlap with. Measured (session 22, fixed clock): slower
        #   at hd 64 (1 of 4 0.97-0.99x, 1 of 2 0.91x), neutral at hd 128 causal, 1.02x at hd
        #   128 full from 8k keys with 1 of 4 (shipped there).
        count, period = exp_poly
        if not 0 <= count <= period or period < 1:
            raise ValueError(f"exp_poly must be (k, n) with 0 <= k <= n and n >= 1, got {exp_poly}")
        if exp_poly_degree not in EXP2_POLY_COEFFS:
            raise ValueError(
                f"exp_poly_degree must be one of {sorted(EXP2_POLY_COEFFS)}, got {exp_poly_degree}"
            )
        self.exp_poly = (count, period)
        self.exp_poly_degree = exp_poly_degree
        # dkv_sum: a GQA split's chains (one per q head) add their dK/dV into fp32
        #   accumulators of the kv heads in q-head order (the chain epilogue in the module
        #   docstring) instead of writing per-q-head 16-bit partials for a pass after the
        #   kernel: FA4-det's memory (dK/dV of the kv heads in fp32) instead of G partials.
        self.dkv_sum = dkv_sum
        # dkv_smem: the chain's dK/dV leave through shared memory: stmatrix into the K/V tiles
        #   (free once both warpgroups' last GEMMs are done, a 256-thread barrier), then each
        #   thread copies 16-byte chunks of whole rows to global memory, and K/V are released
        #   after that. Without it each 32-bit store of a register pair writes 8 rows x 16
        #   bytes (half sectors, 8 L2 requests per instruction, 64 instructions per thread at hd
        #   128): removing the stores altogether made the kernel 1.02-1.57x faster at a fixed
        #   clock from 512 to 8k tokens (session 25, call 1), far more than their bytes.
        #   Storing only dV early, while the last step's dQ and dK GEMMs run (predicated
        #   stores: a divergent branch there makes ptxas serialise the GEMMs), measured
        #   1.00-1.08x, less (session 25; code in git history at 2fbfb69, early_dv).
        #   Needs dkv_row_ptr's epilogue; not with dkv_sum (its own epilogue).
        if dkv_smem and not dkv_row_ptr:
            raise ValueError("dkv_smem needs dkv_row_ptr")
        self.dkv_smem = dkv_smem and not dkv_sum
        # dkv_smem_unroll: the read-back loop's unroll (its loads of the next rows issued before
        #   the stores of these).
        if dkv_smem_unroll < 1:
            raise ValueError(f"dkv_smem_unroll must be >= 1, got {dkv_smem_unroll}")
        self.dkv_smem_unroll = dkv_smem_unroll
        # dkv_stage (with dkv_smem, hd 64 or 96): the chain's dK/dV are staged in a buffer of
        #   their own after the dQ staging buffers (32 KiB at hd 64: what those kernels had
        #   left of the 227 KiB; 48 KiB at hd 96, of 65) instead of the K/V tiles, so each MMA
        #   thread frees K/V as soon as its last GEMM is done: the next chain's K/V load runs
        #   beside the epilogue instead of after it, and no barrier of both warpgroups
        #   precedes the staging (each warpgroup writes and reads back only its own 64 rows).
        #   (Not with dkv_sum, whose epilogue is its own.)
        if dkv_stage and not (dkv_smem and head_dim in (64, 96)):
            raise ValueError("dkv_stage needs dkv_smem at hd 64 or 96")
        self.dkv_stage = dkv_stage and self.dkv_smem
        # dq_first_store: in deterministic mode the rank-0 contribution to each dQ tile is
        #   stored (a bulk copy) instead of added, so the accumulator needs no zero fill: the
        #   preprocess then zeroes the flags only (``bwd_launch.FullBackward``), which saves
        #   writing a tile-padded fp32 copy of dQ per backward (134 MB at the sweep's 16k
        #   tokens: ~40 us on the H200). The same bits as adding to zero but for the sign of a
        #   zero (0 + -0 is +0). The caller must zero the accumulator where some dQ tile has no
        #   rank-0 step (``Schedule.starts_every_dq_tile``); non-deterministic kernels add
        #   every partial (no order says which is first).
        self.dq_first_store = dq_first_store and deterministic
        # pdl: launched as a programmatic dependent of the preprocess (PDL, as FA4's backward):
        #   the grid may start while the preprocess finishes; every thread waits for the
        #   preprocess's completion (griddepcontrol.wait) after the prologue, before any read of
        #   LSE2, delta, the flags or the accumulator; the producer lets the dQ cast launch
        #   (launch_dependents) once it has issued its last loads. Saves the launch gaps.
        self.pdl = pdl
        # drain_ticket (deterministic only): under dynamic dispatch the producer takes the next
        #   ticket only once the dQ writer has released the chain's last dQ turn, not as soon as
        #   the MMA warpgroups are done with it. Otherwise a chain whose last partial waits long
        #   for its turn (the short KV columns of a causal mask in fa3 or descending order) has
        #   the CTA start the next ticket's chain, whose first partial then waits behind that
        #   one for the single staging buffer: the new chain, which later chains of its own
        #   head wait for, stalls on an unrelated head's turn, and the stalls chain across
        #   heads (benchmarks/NOTES.md, item 128). The Triton kernel, whose MMA warps wait for
        #   their own turns, never holds a new chain this way. The barrier is dO's "empty" one,
        #   unused without do_single. Static dispatch never waits on it.
        if drain_ticket and do_single:
            raise NotImplementedError("drain_ticket reuses do_single's barrier: not both")
        self.drain_ticket = drain_ticket and deterministic
        # drain_at_turn (with drain_ticket): the writer lets the producer take the next ticket
        #   once the chain's last partial has its turn, not after its adds have landed. From
        #   then on the partial leaves its buffer within one bulk reduce, whatever other chains
        #   do, so the stalls above cannot chain; the reduce's latency (a few us) then overlaps
        #   the next chain's K/V load instead of preceding it (drain_ticket measured 5-10%
        #   slower than without at causal descending 512 and 16k, session 29; with
        #   drain_at_turn descending is 1.02-1.13x drain_ticket's speed, fa3 0.99-1.01x,
        #   session 30).
        if drain_at_turn and not drain_ticket:
            raise ValueError("drain_at_turn moves drain_ticket's arrival: needs drain_ticket")
        self.drain_at_turn = drain_at_turn and self.drain_ticket
        # dq_writers = 2: two dQ warps, one per staging buffer, each handling every other step
        #   (its ring stage and its buffer), so that one warp's wait for its adds to land and
        #   its release overlap the other's turn and reduce. With one warp that cycle (acquire,
        #   reduce, wait for the writes, release) runs step after step in series. At hd 64
        #   full, the non-deterministic kernel without its exponentials, or without the
        #   warpgroups' per-step barriers, was 1.04x faster and the deterministic one was not
        #   (session 31, NOTES item 146): that cycle may be as long as the step. Each warp
        #   reads its steps from the ring slots (as early_turn does; it must see its
        #   terminator, which has no partial behind it) and takes the turn where early_turn
        #   says. The order of the adds is the ranks' either way (the same bits). Needs two ring
        #   stages (a warp's stage stays fixed), and either the two buffers (dq_double: one per
        #   warp) or early_turn: then both warps share the one buffer (head dims 192/256, where
        #   a second does not fit), taking it in turn (below).
        if dq_writers not in (1, 2):
            raise ValueError(f"dq_writers must be 1 or 2, got {dq_writers}")
        if dq_writers == 2 and not ((dq_double or early_turn) and stages == 2):
            raise ValueError(
                "dq_writers=2 needs dq_double or early_turn, and stages=2 (one warp per ring "
                "stage; per staging buffer, or sharing one)"
            )
        self.dq_writers = dq_writers
        # Two dQ warps and one staging buffer: a warp waits for the buffer's "written" barriers
        #   only after the other warp has passed its own for the previous slot (named barriers
        #   of the two warps, one per direction, _BAR_WRITERS + w), since a third party on a
        #   named barrier of 160 threads would complete it early. Each warp takes its step's
        #   turn before that wait, so one warp's turn overlaps the other's reduce, and its wait
        #   for the adds to land and its release overlap the other's whole step. Deterministic
        #   runs at head dims 192/256 take it (1.05-1.25x one dQ warp, session 41).
        self.dq_shared_writers = dq_writers == 2 and not dq_double
        # dkv_swap (head dims 192 and 256; FA4's layout there): the step keeps Q rows as the MMA
        #   rows, S = Q K^T and dP = dO V^T, with the warpgroups splitting the KV columns (64 x 48
        #   each at hd 192, 64 x 24 at hd 256), so the LSE2/delta rows are two per thread. P and
        #   dS go to shared memory (each warpgroup's dK/dV GEMMs read the other's columns at hd
        #   256, the dQ GEMM always does), and dK/dV accumulate transposed, dV^T += dO^T P and
        #   dK^T += Q^T dS (M = the head dim; both operands from shared memory), split by KV
        #   columns at hd 192 (72 + 72 registers) and by head-dim rows at hd 256 (48 + 48). Our
        #   usual layout would hold dK and dV of 64 KV rows x head dim per warpgroup, 192 or 256
        #   registers per thread for them alone. dQ = dS K with the warpgroups splitting the head
        #   dim. dO has one buffer (do_single), P and dS one each, reused only after both
        #   warpgroups' GEMMs of the step have read them (a named barrier per warpgroup, as
        #   ds_guard's). The chain's dK/dV leave through the K/V tiles (transposing stmatrix,
        #   then 16-byte chunks of whole rows, as dkv_smem).
        #   Shared memory: 216 KiB at hd 192, 220 KiB at hd 256.
        self.dkv_swap = dkv_swap
        if (head_dim in SWAPPED_TILES) != dkv_swap:
            raise NotImplementedError(
                f"head_dim={head_dim} {'needs' if head_dim in SWAPPED_TILES else 'cannot take'} "
                f"the swapped dK/dV layout (dkv_swap; head dims {sorted(SWAPPED_TILES)})"
            )
        if dkv_swap:
            swap_needs = {"dq_wg": dq_wg, "do_single": do_single}
            swap_excludes = {
                "dq_double": dq_double, "exp_tail": exp_tail, "exp_poly": exp_poly != (0, 1),
                "dkv_smem": dkv_smem, "stages != 2": stages != 2,
            }  # fmt: skip
            missing = [k for k, v in swap_needs.items() if not v]
            extra = [k for k, v in swap_excludes.items() if v]
            if missing or extra:
                raise ValueError(
                    f"dkv_swap needs {sorted(swap_needs)} and none of {sorted(swap_excludes)}; "
                    f"missing {missing}, set {extra}"
                )
        # How the warpgroups split the transposed dK/dV tiles: by KV columns ("n") at hd 192,
        # by head-dim rows ("m") at hd 256 (FA4's choices; split by its 48 KV columns, each
        # warpgroup would read all of dO^T and Q^T, 32 KiB each, per step for 24 columns).
        self.dkv_split = "n" if head_dim == 192 else "m"
        # kv_prefetch = a (>= 0; None: off): under static dispatch the producer asks the L2
        #   for the next chain's K and V (TMA prefetches, no shared memory) when it issues the
        #   loads of the step a steps before the current chain's last (its first if the chain
        #   is shorter).
        #   The next chain's K/V load waits for this chain's epilogue to free the K/V tiles
        #   and then reads HBM: the first step's S^T wait was ~2200 cycles longer than a
        #   mid-chain one at d64 full 8k (benchmarks/NOTES.md item 164), a cost per chain that
        #   grows with shorter chains. Dynamic tickets do not know the next chain; nothing
        #   else changes, so the bits do not either.
        if kv_prefetch is not None and kv_prefetch < 0:
            raise ValueError(f"kv_prefetch must be None or >= 0, got {kv_prefetch}")
        self.kv_prefetch = kv_prefetch
        self.kv_prefetch_ahead = kv_prefetch or 0  # (a plain int for the traced code)

    # ------------------------------------------------------------------ host-side setup

    def _smem_layout(
        self, rows: int, cols: int, stages: int | None, part_cols: int | None = None
    ) -> cute.ComposedLayout:
        """A swizzled K-major layout (cols contiguous) that WGMMA reads both as a K-major
        operand and, through a transposed view, as an MN-major one. The widest swizzle whose
        atom divides a row (and ``part_cols`` columns, where one warpgroup's MMA reads only
        that many: an MN-major operand is partitioned by whole swizzle atoms): 128 bytes for
        rows of 128 or 256 bytes, 64 bytes for hd 96's 192-byte rows, 32 bytes for the dS
        tile's 160-byte rows with 80-row Q tiles (80 = 5 x 16) and for K at hd 96, whose dQ
        GEMM gives each warpgroup 48 of the 96 columns."""
        row_bytes = cols * self.dtype.width // 8
        part_bytes = (part_cols or cols) * self.dtype.width // 8
        kinds = warpgroup.SmemLayoutAtomKind
        kind = next(
            k for k, width in ((kinds.K_SW128, 128), (kinds.K_SW64, 64), (kinds.K_SW32, 32))
            if row_bytes % width == 0 and part_bytes % width == 0
        )  # fmt: skip
        atom = warpgroup.make_smem_layout_atom(kind, self.dtype)
        shape = (rows, cols) if stages is None else (rows, cols, stages)
        order = (0, 1) if stages is None else (0, 1, 2)
        return cute.tile_to_shape(atom, shape, order=order)

    def _tiled_mmas(self):
        if self.dkv_swap:
            return self._swapped_tiled_mmas()
        bm, hd = self.block_m, self.head_dim
        K_major = cute.nvgpu.OperandMajorMode.K
        MN_major = cute.nvgpu.OperandMajorMode.MN
        # S^T = K Q^T and dP^T = V dO^T: M = KV rows split over the two WGs.
        mma_sdp = sm90_helpers.make_trivial_tiled_mma(
            self.dtype, self.dtype, K_major, K_major, Float32,
            atom_layout_mnk=(2, 1, 1), tiler_mn=(64, bm),
        )  # fmt: skip
        # dV += P^T dO and dK += dS^T Q: A from registers, B = dO / Q read MN-major.
        mma_dkv = sm90_helpers.make_trivial_tiled_mma(
            self.dtype, self.dtype, K_major, MN_major, Float32,
            atom_layout_mnk=(2, 1, 1), tiler_mn=(64, hd),
            a_source=warpgroup.OperandSource.RMEM,
        )  # fmt: skip
        # dQ = dS K: A = dS and B = K, both read MN-major. With 64 Q rows the two WGs split
        # the head dim; with 128 rows they split the rows. With 80 rows (dq_swap) it is
        # dQ^T = K^T dS^T: A = K^T, B = dS^T (both MN-major), the WGs split the head dim (M).
        if self.dq_swap:
            atom_dq, tiler_dq = (2, 1, 1), (64, bm)
        elif bm == 64:
            atom_dq, tiler_dq = (1, 2, 1), (64, hd // 2)
        else:
            atom_dq, tiler_dq = (2, 1, 1), (64, hd)
        mma_dq = sm90_helpers.make_trivial_tiled_mma(
            self.dtype, self.dtype, MN_major, MN_major, Float32,
            atom_layout_mnk=atom_dq, tiler_mn=tiler_dq,
        )  # fmt: skip
        return mma_sdp, mma_dkv, mma_dq

    def _swapped_tiled_mmas(self):
        """The tiled MMAs of the dkv_swap step (see its comment in __init__)."""
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
    def __call__(
        self,
        mQ: cute.Tensor,  # (b, seqlen_q, heads, hd)
        mK: cute.Tensor,  # (b, seqlen_k, kv_heads, hd)
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,  # (b * heads, rows_pad) fp32
        mDelta: cute.Tensor,
        mdQacc: cute.Tensor,  # (b, heads, q_tiles, bm * hd) fp32, in fragment order
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        mdKVacc: cute.Tensor,  # dkv_sum: fp32 [2 * b * seqlen_k * kv_heads * hd], dK then dV
        # int32 [2 + b * heads * q_tiles (+ 2 * b * kv_heads * kv_tiles with dkv_sum)]: ticket,
        # error, dQ semaphores (then dK/dV semaphores)
        mFlags: cute.Tensor,
        mChainStart: cute.Tensor,
        mStepHead: cute.Tensor,
        mStepTile: cute.Tensor,
        mStepRank: cute.Tensor,
        mOrder: cute.Tensor,
        mWorkerStart: cute.Tensor,
        q_tiles: Int32,
        kv_tiles: Int32,
        num_chains: Int32,
        num_workers: Int32,
        dynamic: Int32,
        softmax_scale: Float32,
        timeout_ns: Int64,
        stream: cuda.CUstream,
    ):
        self._host(
            mQ, mK, mV, mdO, mLSE, mDelta, mdQacc, mdK, mdV, mdKVacc, mFlags,
            mChainStart, mStepHead, mStepTile, mStepRank, mOrder, mWorkerStart,
            q_tiles, kv_tiles, num_chains, num_workers, dynamic, softmax_scale, timeout_ns,
            stream,
        )  # fmt: skip

    @cute.jit
    def _host(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mDelta: cute.Tensor,
        mdQacc: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        mdKVacc: cute.Tensor,
        mFlags: cute.Tensor,
        mChainStart: cute.Tensor,
        mStepHead: cute.Tensor,
        mStepTile: cute.Tensor,
        mStepRank: cute.Tensor,
        mOrder: cute.Tensor,
        mWorkerStart: cute.Tensor,
        q_tiles: Int32,
        kv_tiles: Int32,
        num_chains: Int32,
        num_workers: Int32,
        dynamic: Int32,
        softmax_scale: Float32,
        timeout_ns: Int64,
        stream: cuda.CUstream,
    ):
        bm, bn, hd, st = self.block_m, self.block_n, self.head_dim, self.stages
        sQ_layout = self._smem_layout(bm, hd, st)
        sdO_layout = self._smem_layout(bm, hd, 1 if const_expr(self.do_single) else st)
        # K is dQ's B operand (dQ = dS K, read MN-major): with 64-row Q tiles each warpgroup
        # takes half the head dim of it.
        dq_cols = hd // 2 if const_expr(bm == 64 and not self.dq_swap) else hd
        sK_layout = self._smem_layout(bn, hd, None, dq_cols)
        if const_expr(self.dkv_swap):
            # dS (stage 0) and P (stage 1) as (Q rows, KV rows), KV rows contiguous, as the S
            # accumulator holds them; at hd 192 each warpgroup's dK/dV GEMMs read half the KV
            # rows (whole swizzle atoms of that half).
            part = bn // 2 if const_expr(self.dkv_split == "n") else bn
            sdS_layout = self._smem_layout(bm, bn, 2, part)
        else:
            # dS is stored transposed, (KV rows, Q rows) with Q rows contiguous: the S^T
            # accumulator then writes pairs of neighbouring elements as one 32-bit store, and
            # dQ = dS K reads it as an MN-major A operand.
            sdS_layout = self._smem_layout(bn, bm, 1 if const_expr(self.dq_double) else st)
        # Flat: the MMA threads' fragments in order, one tile per buffer (dq_fragment.py).
        sdQ_layout = cute.make_layout(bm * hd * self.dq_bufs)
        # One stage of LSE2/delta rows per 128 bytes at least: TMA writes to 128-byte aligned
        # shared memory (80 rows are 320 bytes).
        lse_stride = -(-bm // 32) * 32
        sLSE_layout = cute.make_layout((bm, st), stride=(1, lse_stride))
        mma_sdp, mma_dkv, mma_dq = self._tiled_mmas()

        # TMA views: (rows, hd, head, batch) for the 4-D tensors, (rows, batch*head) for rows.
        qkv_modes = [1, 3, 2, 0]
        mQ_t, mK_t, mV_t, mdO_t = [select_modes(t, qkv_modes) for t in (mQ, mK, mV, mdO)]
        mLSE_t, mDelta_t = [select_modes(t, [1, 0]) for t in (mLSE, mDelta)]
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tma_tQ = cpasync.make_tiled_tma_atom(
            g2s, mQ_t, cute.select(sQ_layout, mode=[0, 1]), (bm, hd)
        )
        tma_do, tma_tdO = cpasync.make_tiled_tma_atom(
            g2s, mdO_t, cute.select(sdO_layout, mode=[0, 1]), (bm, hd)
        )
        tma_k, tma_tK = cpasync.make_tiled_tma_atom(g2s, mK_t, sK_layout, (bn, hd))
        tma_v, tma_tV = cpasync.make_tiled_tma_atom(g2s, mV_t, sK_layout, (bn, hd))
        tma_lse, tma_tLSE = cpasync.make_tiled_tma_atom(g2s, mLSE_t, cute.make_layout(bm), (bm,))
        tma_delta, tma_tDelta = cpasync.make_tiled_tma_atom(
            g2s, mDelta_t, cute.make_layout(bm), (bm,)
        )

        elem = self.dtype.width // 8
        # The bytes the ring's "full" mbarrier expects per step: Q, LSE2, delta, and dO unless
        # it has its own buffer and mbarriers (do_single).
        self.bytes_do = bm * hd * elem
        self.bytes_step = (1 if const_expr(self.do_single) else 2) * bm * hd * elem + 2 * bm * 4
        self.bytes_kv = 2 * bn * hd * elem

        # dkv_stage's buffer in 32-bit words: two 16-bit (bn, hd) tiles.
        dkv_words = cute.cosize(sK_layout) if const_expr(self.dkv_stage) else 0

        @cute.struct
        class Storage:
            full_bar: cute.struct.MemRange[Int64, st]
            empty_bar: cute.struct.MemRange[Int64, st]
            kv_full: cute.struct.MemRange[Int64, 1]
            kv_empty: cute.struct.MemRange[Int64, 1]
            do_full: cute.struct.MemRange[Int64, 1]
            do_empty: cute.struct.MemRange[Int64, 1]
            info: cute.struct.MemRange[Int32, st * _INFO_WORDS]
            dq_fail: cute.struct.MemRange[Int32, 4]
            sLSE: cute.struct.Align[cute.struct.MemRange[Float32, lse_stride * st], 128]
            sDelta: cute.struct.Align[cute.struct.MemRange[Float32, lse_stride * st], 128]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdO_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sdS_layout)], 1024]
            # (dkv_stage: the chain's dK and dV tiles, in K's layout, after the dQ buffers.)
            sdQ: cute.struct.Align[
                cute.struct.MemRange[Float32, bm * hd * self.dq_bufs + dkv_words], 1024
            ]

        # The shared memory a CTA may have on sm_90: a kernel over it would fail at launch.
        smem_bytes = Storage.size_in_bytes()
        if const_expr(smem_bytes > SMEM_LIMIT):
            raise ValueError(
                f"these options need {smem_bytes} bytes of shared memory, more than the "
                f"{SMEM_LIMIT} a CTA may have"
            )
        scale_log2 = softmax_scale * math.log2(math.e)
        # Chains run dK/dV's heads: K/V's, or q's with per-q-head partials (GQA split), or q's
        # adding into dK/dV of K/V's heads (dkv_sum); their K/V are those of head // kv_group.
        chain_heads = cute.size((mQ if self.dkv_sum else mdK).shape[2])
        self.kernel(
            # (dQ leaves by flat bulk reduces from plain addresses: no TMA atom.)
            tma_tQ, tma_tK, tma_tV, tma_tdO, tma_tLSE, tma_tDelta, mdQacc,
            tma_q, tma_k, tma_v, tma_do, tma_lse, tma_delta,
            mdK, mdV, mdKVacc, mFlags,
            mChainStart, mStepHead, mStepTile, mStepRank, mOrder, mWorkerStart,
            q_tiles, kv_tiles, num_chains, dynamic,
            scale_log2, softmax_scale, timeout_ns,
            cute.size(mQ.shape[1]), cute.size(mK.shape[1]),
            cute.size(mQ.shape[2]), chain_heads, chain_heads // cute.size(mK.shape[2]),
            cute.size(mQ.shape[0]),
            sQ_layout, sdO_layout, sK_layout, sdS_layout, sdQ_layout, sLSE_layout,
            mma_sdp, mma_dkv, mma_dq, Storage,
        ).launch(
            grid=[num_workers, 1, 1],
            block=[self.num_threads, 1, 1],
            stream=stream,
            # setmaxnreg is only honoured with .minnctapersm (ptxas C7508 otherwise).
            min_blocks_per_mp=1,
            use_pdl=self.pdl,
        )  # fmt: skip

    # ------------------------------------------------------------------ device code

    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mDelta: cute.Tensor,
        mdQ: cute.Tensor,
        tma_q: cute.CopyAtom,
        tma_k: cute.CopyAtom,
        tma_v: cute.CopyAtom,
        tma_do: cute.CopyAtom,
        tma_lse: cute.CopyAtom,
        tma_delta: cute.CopyAtom,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        mdKVacc: cute.Tensor,
        mFlags: cute.Tensor,
        mChainStart: cute.Tensor,
        mStepHead: cute.Tensor,
        mStepTile: cute.Tensor,
        mStepRank: cute.Tensor,
        mOrder: cute.Tensor,
        mWorkerStart: cute.Tensor,
        q_tiles: Int32,
        kv_tiles: Int32,
        num_chains: Int32,
        dynamic: Int32,
        scale_log2: Float32,
        softmax_scale: Float32,
        timeout_ns: Int64,
        seqlen_q: Int32,
        seqlen_k: Int32,
        heads: Int32,
        kv_heads: Int32,
        kv_group: Int32,
        batch: Int32,
        sQ_layout: cute.ComposedLayout,
        sdO_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sdS_layout: cute.ComposedLayout,
        sdQ_layout,
        sLSE_layout: cute.Layout,
        mma_sdp: cute.TiledMma,
        mma_dkv: cute.TiledMma,
        mma_dq: cute.TiledMma,
        Storage: cutlass.Constexpr,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()

        if warp_idx == 0:
            for atom in (tma_q, tma_k, tma_v, tma_do, tma_lse, tma_delta):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(Storage)
        if tidx == 0:
            for s in cutlass.range_constexpr(self.stages):
                cute.arch.mbarrier_init(storage.full_bar.data_ptr() + s, 1)
                # Released by the 256 MMA threads and by the dQ writer, which reads the
                # step's metadata from the slot.
                cute.arch.mbarrier_init(storage.empty_bar.data_ptr() + s, self.num_mma_threads + 1)
            cute.arch.mbarrier_init(storage.kv_full.data_ptr(), 1)
            cute.arch.mbarrier_init(storage.kv_empty.data_ptr(), self.num_mma_threads)
            if const_expr(self.do_single):
                cute.arch.mbarrier_init(storage.do_full.data_ptr(), 1)
                cute.arch.mbarrier_init(storage.do_empty.data_ptr(), self.num_mma_threads)
            if const_expr(self.drain_ticket):
                # One arrival per chain: the dQ writer's, after the chain's last release
                # (with drain_at_turn, once its last turn is taken).
                cute.arch.mbarrier_init(storage.do_empty.data_ptr(), 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if const_expr(self.pdl):
            # Everything above touches only shared memory and the kernel's parameters; from
            # here on the preprocess's outputs are read (and the accumulator written).
            cute.arch.griddepcontrol_wait()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        sdQ = storage.sdQ.get_tensor(sdQ_layout)
        sLSE = storage.sLSE.get_tensor(sLSE_layout)
        sDelta = storage.sDelta.get_tensor(sLSE_layout)
        sInfo = storage.info.get_tensor(cute.make_layout((_INFO_WORDS, self.stages)))
        sDqFail = storage.dq_fail.get_tensor(cute.make_layout(4))

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                self.producer(
                    mQ, mK, mV, mdO, mLSE, mDelta, tma_q, tma_k, tma_v, tma_do, tma_lse,
                    tma_delta, mFlags, mChainStart, mStepHead, mStepTile, mStepRank, mOrder,
                    mWorkerStart, kv_tiles, num_chains, dynamic, heads, kv_heads, kv_group,
                    sQ, sK, sV, sdO, sLSE, sDelta, sInfo, storage,
                )  # fmt: skip
            if warp_idx == 1:
                self.dq_writer(
                    mdQ, mFlags, q_tiles, heads, timeout_ns, sdQ, sDqFail,
                    sInfo, storage, 0,
                )  # fmt: skip
            if const_expr(self.dq_writers == 2):  # noqa: SIM102 (compile-time, then runtime)
                if warp_idx == 2:
                    self.dq_writer(
                        mdQ, mFlags, q_tiles, heads, timeout_ns, sdQ, sDqFail,
                        sInfo, storage, 1,
                    )  # fmt: skip
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            # The dK/dV semaphores (dkv_sum) follow the dQ tiles' in mFlags.
            dkv_sums = _DkvSums(
                mdKVacc, mFlags, sDqFail, kv_group, kv_tiles,
                2 + batch * heads * q_tiles, timeout_ns,
            )  # fmt: skip
            mma_args = (
                mdK, mdV, scale_log2, softmax_scale, seqlen_q, seqlen_k,
                sQ, sK, sV, sdO, sdS, sdQ, sLSE, sDelta, sInfo, storage,
                mma_sdp, mma_dkv, mma_dq, tidx - 128, dkv_sums,
            )  # fmt: skip
            if const_expr(self.dkv_swap):
                self.mma_swapped(*mma_args)
            else:
                # Where the chain's dK/dV are staged: their own buffer (dkv_stage) or K/V's.
                sK_out, sV_out = sK, sV
                if const_expr(self.dkv_stage):
                    words = self.block_m * self.head_dim * self.dq_bufs
                    half = cute.cosize(sK_layout) // 2
                    sK_out, sV_out = [
                        cute.make_tensor(
                            cute.recast_ptr(
                                storage.sdQ.data_ptr() + words + i * half, sK_layout.inner,
                                dtype=self.dtype,
                            ),
                            sK_layout.outer,
                        )
                        for i in (0, 1)
                    ]  # fmt: skip
                self.mma(*mma_args, sK_out, sV_out)

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
                        flags = flags | _F_FIRST
                    if step == hi - 1:
                        flags = flags | _F_LAST
                    sInfo[_I_BATCH, stage] = b
                    sInfo[_I_KVH, stage] = kvh
                    sInfo[_I_KVT, stage] = kvt
                    sInfo[_I_QH, stage] = qh
                    sInfo[_I_QT, stage] = qt
                    sInfo[_I_RANK, stage] = rank
                    sInfo[_I_FLAGS, stage] = flags
                    # The arrive releases the metadata stores above to the consumers.
                    cute.arch.mbarrier_arrive_and_expect_tx(full, self.bytes_step)
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
            sInfo[_I_FLAGS, stage] = Int32(_F_DONE)
            cute.arch.mbarrier_arrive(storage.full_bar.data_ptr() + stage)
        if const_expr(self.dq_writers == 2):
            # The other dQ warp waits on the other stage: a terminator there too, without the
            # MMA warpgroups' stop handshake (they left at the first one).
            stage, phase = self._next_stage(stage, phase)
            cute.arch.mbarrier_wait(storage.empty_bar.data_ptr() + stage, phase ^ 1)
            if lane == 0:
                sInfo[_I_FLAGS, stage] = Int32(_F_DONE | _F_QUIET)
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

    @cute.jit
    def dq_writer(
        self,
        mdQ: cute.Tensor,
        mFlags: cute.Tensor,
        q_tiles: Int32,
        heads: Int32,
        timeout_ns: Int64,
        sdQ: cute.Tensor,
        sDqFail: cute.Tensor,
        sInfo: cute.Tensor,
        storage,
        writer: cutlass.Constexpr[int] = 0,
    ):
        """dQ warp ``writer`` (of ``dq_writers``): the steps of ring stage ``writer`` and
        its staging buffer with two warps, every step with one."""
        bm, hd = self.block_m, self.head_dim
        lane = cute.arch.lane_idx()
        two = const_expr(self.dq_writers == 2)
        # Hand-offs per step: one per warpgroup half with dq_wg (each reduced as soon as its
        # warpgroup has written it), else one of the whole tile.
        parts = 2 if const_expr(self.dq_wg) else 1
        part = bm * hd // parts
        # The buffers start free; afterwards each is freed as soon as the TMA unit has read it,
        # so the MMA warpgroups write the next partial while this one's adds complete.
        for buf0 in cutlass.range_constexpr(self.dq_bufs):
            if const_expr(not two or buf0 == writer):
                for p in cutlass.range_constexpr(parts):
                    self._dq_barrier(_BAR_DQ_EMPTY, Int32(buf0), Int32(p), wait=False)
        done = Int32(0)
        stage = Int32(writer)
        phase = Int32(0)  # of the ring's "full" mbarriers (early_turn)
        # The staging buffer of this step (always 0 without dq_double; the warp's own with
        # two warps and two buffers).
        buf = Int32(0 if const_expr(self.dq_shared_writers) else writer)
        # dq_shared_writers: writer 0's first slot is the first; every other slot waits for
        # the other warp's hand-over.
        handover = Int32(writer)
        fail = writer  # this warp's word in sDqFail
        # Where a step starts: at its ring slot's "full" mbarrier (early_turn, and always with
        # two warps: a warp must see its terminator, which has no partial behind it), else at
        # its partial's hand-off.
        ring_first = const_expr(self.early_turn or two)
        while done == 0:
            if const_expr(ring_first):
                cute.arch.mbarrier_wait(storage.full_bar.data_ptr() + stage, phase)
            else:
                self._dq_barrier(_BAR_DQ_FULL, buf, Int32(0), wait=True)
            sdQ_buf = cute.make_tensor(
                sdQ.iterator + cute.assume(buf * (bm * hd), divby=bm * hd),
                cute.make_layout(bm * hd),
            )
            # The step's metadata, from its load-ring slot (released here once read: the MMA
            # warpgroups release it only after this barrier, so it is still valid; with
            # early_turn the slot cannot be refilled before this warp's release either).
            info = sInfo[None, stage]
            done = info[_I_FLAGS] & _F_DONE
            if done == 0:
                last = info[_I_FLAGS] & _F_LAST
                b = info[_I_BATCH]
                qh = info[_I_QH]
                qt = info[_I_QT]
                rank = info[_I_RANK]
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                # This warp's next step: the next stage, or with two warps the one after it.
                for _ in cutlass.range_constexpr(self.dq_writers):
                    stage, phase = self._next_stage(stage, phase)
                sem_ptr = mFlags.iterator + (2 + (b * heads + qh) * q_tiles + qt)
                if const_expr(two and not self.early_turn):
                    # The turn after the partial's first part is in, as with one warp.
                    self._dq_barrier(_BAR_DQ_FULL, buf, Int32(0), wait=True)
                if const_expr(self.deterministic):
                    if lane == 0:
                        sDqFail[fail] = self._wait_turn(sem_ptr, rank, timeout_ns)
                        if const_expr(self.drain_at_turn):  # noqa: SIM102 (compile-time, then runtime)
                            if last != 0:
                                cute.arch.mbarrier_arrive(storage.do_empty.data_ptr())
                        # Order the bulk reduce (async proxy) after the acquire.
                        cute.arch.fence_proxy("async.global")
                    cute.arch.sync_warp()
                if const_expr(self.dq_shared_writers):
                    # The other warp has passed the buffer's "written" barriers of its slot.
                    self._writers_handover(writer, handover, wait=True)
                    handover = Int32(1)
                for p in cutlass.range_constexpr(parts):
                    if const_expr(p > 0 or self.early_turn):
                        self._dq_barrier(_BAR_DQ_FULL, buf, Int32(p), wait=True)
                    if const_expr(self.deterministic):
                        if sDqFail[fail] != 0:
                            # Never a silent wrong result: poison what this step adds and
                            # raise the error flag (a plain store: every writer writes 1).
                            nan = Float32(float("nan"))
                            for i in cutlass.range(
                                p * part + lane, (p + 1) * part, cute.arch.WARP_SIZE, unroll=4
                            ):
                                sdQ_buf[i] = nan
                            cute.arch.fence_view_async_shared()
                            if lane == 0:
                                mFlags[1] = Int32(1)
                        cute.arch.sync_warp()
                    # One flat bulk reduce per part (the accumulator's tile is in the same
                    # fragment order), issued and committed by lane 0.
                    if lane == 0:
                        tile = mdQ[b, qh, qt, None]
                        if const_expr(self.dq_first_store):
                            # The tile's first contribution in the fixed order: a copy.
                            if rank == 0:
                                cute_prims.cp_async_bulk_global_shared_cta(
                                    tile.iterator + p * part, sdQ_buf.iterator + p * part,
                                    part * 4,
                                )  # fmt: skip
                            else:
                                self._reduce_part(tile, sdQ_buf, p * part, part)
                        else:
                            self._reduce_part(tile, sdQ_buf, p * part, part)
                        cute.arch.cp_async_bulk_commit_group()
                if const_expr(self.dq_shared_writers):
                    self._writers_handover(writer, handover, wait=False)
                # Each part may be overwritten once the TMA unit has read it (oldest first).
                for p in cutlass.range_constexpr(parts):
                    cute.arch.cp_async_bulk_wait_group(parts - 1 - p, read=True)
                    cute.arch.sync_warp()
                    self._dq_barrier(_BAR_DQ_EMPTY, buf, Int32(p), wait=False)
                if const_expr(self.dq_double and not two):
                    buf = buf ^ 1
                if const_expr(self.deterministic):
                    # Release only once the adds have been performed in global memory (the wait
                    # for the shared-memory read alone is too weak), ordered before the
                    # generic-proxy release by the proxy fence. Every lane waits for its own
                    # groups (whichever lane was elected), then lane 0 releases.
                    cute.arch.cp_async_bulk_wait_group(0, read=False)
                    cute.arch.fence_proxy("async.global")
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.red(
                            sem_ptr, Int32(1), op="add", dtype="s32", sem="release", scope="gpu"
                        )
                        if const_expr(self.drain_ticket and not self.drain_at_turn):  # noqa: SIM102
                            if last != 0:
                                cute.arch.mbarrier_arrive(storage.do_empty.data_ptr())
                    cute.arch.sync_warp()
            elif const_expr(two):
                # The first terminator comes with the MMA warpgroups' stop handshake, the
                # other warp's (_F_QUIET) without.
                if const_expr(self.dq_shared_writers):
                    self._writers_handover(writer, handover, wait=True)
                if info[_I_FLAGS] & _F_QUIET == 0:
                    self._writer_stop(buf, parts, ring_first)
                    if const_expr(self.dq_shared_writers):
                        # The quiet terminator, the last slot, takes this hand-over.
                        self._writers_handover(writer, Int32(1), wait=False)
            else:
                self._writer_stop(buf, parts, ring_first)
        # Bulk reductions must be complete before the CTA exits.
        cute.arch.cp_async_bulk_wait_group(0, read=False)

    @cute.jit
    def _next_stage(self, stage: Int32, phase: Int32) -> tuple[Int32, Int32]:
        """The load ring's next stage, and the parity of its mbarriers' phase (it flips where
        the ring wraps)."""
        stage = stage + 1
        if stage == self.stages:
            stage = Int32(0)
            phase = phase ^ 1
        return stage, phase

    @cute.jit
    def _writers_handover(
        self, writer: cutlass.Constexpr[int], handover: Int32, wait: cutlass.Constexpr[bool]
    ):
        """dq_shared_writers: dQ warp ``writer`` hands the staging buffer to the other one
        (``wait`` False: it has passed the buffer's "written" barriers of its slot), or waits
        for the other's hand-over (unless ``handover`` is 0: writer 0's first slot, the first
        of all). The two warps' slots alternate (ring stages), so the hand-overs do too, each
        direction on its own barrier."""
        if const_expr(wait):
            if handover != 0:
                cute.arch.barrier(barrier_id=_BAR_WRITERS + 1 - writer, number_of_threads=64)
        else:
            cute.arch.barrier_arrive(barrier_id=_BAR_WRITERS + writer, number_of_threads=64)

    @cute.jit
    def _writer_stop(
        self, buf: Int32, parts: cutlass.Constexpr[int], ring_first: cutlass.Constexpr
    ):
        """The dQ warp's side of the MMA warpgroups' stop handshake: one more hand-off per
        part (part 0's was already waited for unless the step started at its ring slot)."""
        for p in cutlass.range_constexpr(parts):
            if const_expr(p > 0 or ring_first):
                self._dq_barrier(_BAR_DQ_FULL, buf, Int32(p), wait=True)

    @cute.jit
    def _reduce_part(self, tile: cute.Tensor, sdQ_buf: cute.Tensor, offset: int, size: int):
        """Bulk reduce-add of ``size`` fp32 values of the staged partial into the
        accumulator's tile (both in fragment order), from ``offset``."""
        cute_prims.cp_reduce_async_bulk_global_shared_cta(
            tile.iterator + offset, sdQ_buf.iterator + offset, size * 4,
            op=cute_prims.CpReduceOp.ADD, type=cute_prims.CpReduceType.F32,
        )  # fmt: skip

    @cute.jit
    def _wait_turn(self, sem_ptr, rank: Int32, timeout_ns: Int64) -> Int32:
        """Spin (acquire loads) until *sem_ptr == rank; 1 if timeout_ns passed first."""
        seen = cute.arch.load(sem_ptr, Int32, sem="acquire", scope="gpu")
        failed = Int32(0)
        if seen != rank:
            start = cute.arch.globaltimer()
            waiting = Int32(1)
            while waiting != 0:
                seen = cute.arch.load(sem_ptr, Int32, sem="acquire", scope="gpu")
                if seen == rank:
                    waiting = Int32(0)
                else:
                    if cute.arch.globaltimer() - start > timeout_ns:
                        failed = Int32(1)
                        waiting = Int32(0)
        return failed

    @cute.jit
    def _chain_epilogue(
        self, storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv, softmax_scale,
        seqlen_k, sK, sV, tidx, wg,
    ):  # fmt: skip
        """The last step of a chain: release its ring stage and K/V (after reading the chain's
        batch, kv head and kv tile from the stage's slot), then dK/dV from registers to
        global memory (with dkv_smem through sK/sV: the K/V tiles, which are released after,
        or with dkv_stage a buffer of their own)."""
        b = sInfo[_I_BATCH, stage]
        kvh = sInfo[_I_KVH, stage]
        kvt = sInfo[_I_KVT, stage]
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
            cute.arch.barrier(barrier_id=_BAR_KV_FREE, number_of_threads=self.num_mma_threads)
        self._stmatrix_dkv(rdK, rdV, sK, sV, mma_dkv, tidx)
        # Each warpgroup reads back only its own 64 rows.
        cute.arch.barrier(barrier_id=_BAR_DKV + wg, number_of_threads=128)
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
    def _sum_chain_epilogue(
        self, storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv, softmax_scale,
        seqlen_k, sums: _DkvSums, tidx, wg,
    ):  # fmt: skip
        """The last step of a chain of a GQA split with ``dkv_sum``: release the stage and K/V,
        then add this warpgroup's rows of dK/dV into the kv head's sum at this q head's turn
        (module docstring, "Chain epilogue")."""
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
        rows0 = _pair_rows(coords0, pairs)
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
                        # the group has one head, which a split never has).
                        if rank > 0:
                            k0 = load_f32_cg(addr_k) + k0
                            k1 = load_f32_cg(addr_k + 4) + k1
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
    def _dkv_sum_turn(self, storage, sInfo, stage, acc_dK, acc_dV, mdK, sums: _DkvSums, tidx, wg):
        """The start of a ``dkv_sum`` chain epilogue: release the ring stage and K/V, then wait
        (one thread per warpgroup, bounded) until the (batch, kv head, KV tile, warpgroup)
        semaphore equals this q head's rank in its group; a timed-out wait raises the error flag
        and turns the warpgroup's dK/dV into NaN. Returns (batch, kv head, KV tile, kv heads,
        rank, last rank, semaphore pointer, warpgroup barrier id)."""
        b = sInfo[_I_BATCH, stage]
        q_head = sInfo[_I_KVH, stage]  # the chain's head: a q head (GQA split)
        kvt = sInfo[_I_KVT, stage]
        cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
        cute.arch.mbarrier_arrive(storage.kv_empty.data_ptr())
        kv_heads = cute.size(mdK.shape[2])
        kvh = q_head // sums.kv_group
        rank = q_head - kvh * sums.kv_group
        last = sums.kv_group - 1
        sem = sums.sem_base + ((b * kv_heads + kvh) * sums.kv_tiles + kvt) * 2 + wg
        sem_ptr = sums.flags.iterator + sem
        bar = _BAR_DKV + wg
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
            rows0 = _pair_rows(coords0, cute.size(words))
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
    def _dq_barrier(self, base: int, buf: Int32, wg: Int32, wait: cutlass.Constexpr[bool]):
        """Wait on (``wait``) or arrive at the named barrier ``base`` of dQ buffer ``buf``
        (of warpgroup ``wg``'s half with dq_wg): ``base + 2 (buf + dq_bufs wg)``, ids 2-9.
        With dq_wg the barrier holds that warpgroup and the dQ warp (160 threads), else both
        MMA warpgroups and the dQ warp (288)."""
        index = Int32(0)
        if const_expr(self.dq_double):
            index = index + buf
        if const_expr(self.dq_wg):
            index = index + self.dq_bufs * wg
        threads = (128 if const_expr(self.dq_wg) else self.num_mma_threads) + cute.arch.WARP_SIZE
        if const_expr(wait):
            cute.arch.barrier(barrier_id=base + 2 * index, number_of_threads=threads)
        else:
            cute.arch.barrier_arrive(barrier_id=base + 2 * index, number_of_threads=threads)

    def _check_dq_fragment(self, mma_dq: cute.TiledMma, registers: int) -> None:
        """Trace time (plain Python, not staged): the layout the cast kernel decodes must be
        this MMA's. Its fragment coordinates are compared with dq_fragment.fragment_coords for
        every register of every lane of warp 0 and of the first and last thread of the other
        seven warps (the map is affine per warp; all 256 threads cost seconds of compile)."""
        bm, hd = self.block_m, self.head_dim
        ident = cute.make_identity_tensor(self.dq_mma_shape)
        threads = [*range(32), *(t for w in range(1, 8) for t in (32 * w, 32 * w + 31))]
        for t in threads:
            coords = mma_dq.get_slice(t).partition_C(ident)
            for i in range(registers):
                expected = dq_fragment.fragment_coords(bm, hd, t, i)
                # (dq_swap: the MMA's coordinates are (head dim, Q row))
                got = tuple(coords[i])[:: -1 if self.dq_swap else 1]
                if got != expected:
                    raise AssertionError(
                        f"dQ fragment of thread {t}, register {i}: the MMA has {got}, "
                        f"dq_fragment says {expected}"
                    )

    @cute.jit
    def _store_dq_fragment(
        self, acc: cute.Tensor, flat: cute.Tensor, buf: Int32, tidx: Int32, mma_dq: cute.TiledMma
    ):
        """acc_dQ of MMA thread ``tidx`` into staging buffer ``buf`` in fragment order
        (dq_fragment.py): registers 4 j .. 4 j + 3 as one 16-byte store at 512 j + 4 (tidx %
        128) in its warpgroup's half."""
        bm, hd = self.block_m, self.head_dim
        self._check_dq_fragment(mma_dq, cute.size(acc))
        wg = cute.arch.make_warp_uniform(tidx // 128)
        base = buf * (bm * hd) + wg * dq_fragment.half_size(bm, hd) + (tidx % 128) * 4
        for j in cutlass.range_constexpr(cute.size(acc) // 4):
            off = cute.assume(base + dq_fragment.fragment_offset(bm, hd, 0, 4 * j), divby=4)
            dst = cute.make_tensor(flat.iterator + off, cute.make_layout(4))
            for e in cutlass.range_constexpr(4):
                dst[e] = acc[4 * j + e]

    @cute.jit
    def _grad_scores(
        self,
        acc_S: cute.Tensor,
        acc_dP: cute.Tensor,
        tScS: cute.Tensor,
        sDelta: cute.Tensor,
        stage: Int32,
    ):
        """dS^T = P^T (dP^T - delta) in place of dP^T (acc_S holds P^T)."""
        for i in cutlass.range_constexpr(cute.size(acc_dP)):
            _, m = tScS[i]
            acc_dP[i] = acc_S[i] * (acc_dP[i] - sDelta[m, stage])

    @cute.jit
    def _step_tiles(self, sInfo: cute.Tensor, stage: Int32, seqlen_q: Int32, seqlen_k: Int32):
        """(n0, m0, shift, edge) of the step in ring slot ``stage``: its first key and query
        rows, the causal diagonal's offset and whether any (key, query) pair of the tile needs
        a mask. Warp-uniform: the largest key must be < seqlen_k and, causal, <= the smallest
        query's limit. Interior tiles (all but the diagonal and the last KV tile) then skip
        the per-element compares and selects, which otherwise outnumber the exponentials."""
        bm, bn = self.block_m, self.block_n
        n0 = sInfo[_I_KVT, stage] * bn
        m0 = sInfo[_I_QT, stage] * bm
        shift = seqlen_k - seqlen_q
        edge = Int32(0)
        if n0 + bn > seqlen_k:
            edge = Int32(1)
        if const_expr(self.causal):  # noqa: SIM102 (compile-time, then runtime test)
            if n0 + bn - 1 > m0 + shift:
                edge = Int32(1)
        return n0, m0, shift, edge

    @cute.jit
    def _probs(
        self,
        acc_S: cute.Tensor,
        tScS: cute.Tensor,
        sLSE: cute.Tensor,
        stage: Int32,
        scale_log2: Float32,
        n0: Int32,
        m0: Int32,
        shift: Int32,
        seqlen_k: Int32,
        masked: cutlass.Constexpr,
        first: cutlass.Constexpr[int] = 0,
        end: cutlass.Constexpr[int | None] = None,
    ):
        """P^T = exp2(S^T * scale_log2 - lse2) in place, for the fragment's elements
        first..end; with ``masked``, zero for keys past seqlen_k (TMA gave zeros there, not
        -inf) and, causal, keys after the bottom-right diagonal. Rows past seqlen_q have
        lse2 = +inf, so P = 0 there without a mask. The LSE2 values come from the stage's
        ``sLSE`` rows."""
        end = cute.size(acc_S) if const_expr(end is None) else end
        poly_count, poly_period = self.exp_poly
        for i in cutlass.range_constexpr(first, end):
            n, m = tScS[i]
            x = acc_S[i] * scale_log2 - sLSE[m, stage]
            if const_expr(i % poly_period >= poly_period - poly_count):
                p = exp2_poly(x, self.exp_poly_degree)
            else:
                p = cute.math.exp2(x, fastmath=True)
            if const_expr(masked):
                p = self._mask_prob(p, n, m, n0, m0, shift, seqlen_k)
            acc_S[i] = p

    def _mma_slices(
        self, mma_sdp: cute.TiledMma, mma_dkv: cute.TiledMma, mma_dq: cute.TiledMma, tidx: Int32
    ):
        """(warpgroup, this thread's slices of the three tiled MMAs, then its warpgroup's: the
        operand fragments are made from the warpgroup's first thread's)."""
        wg = cute.arch.make_warp_uniform(tidx // 128)
        wg_base = wg * 128
        return (
            wg, mma_sdp.get_slice(tidx), mma_dkv.get_slice(tidx), mma_dq.get_slice(tidx),
            mma_sdp.get_slice(wg_base), mma_dkv.get_slice(wg_base), mma_dq.get_slice(wg_base),
        )  # fmt: skip

    @cute.jit
    def _stop_dq_writer(self, buf: Int32, wg: Int32, guarded: cutlass.Constexpr[bool]):
        """At the "done" slot: one more handshake on the dQ buffer tells the dQ writer to stop;
        with a guarded P/dS buffer (``guarded``) the other warpgroup's last arrival is taken
        (after its last GEMMs)."""
        self._dq_barrier(_BAR_DQ_EMPTY, buf, wg, wait=True)
        self._dq_barrier(_BAR_DQ_FULL, buf, wg, wait=False)
        if const_expr(guarded):
            cute.arch.barrier(
                barrier_id=_BAR_DQ_READ + 1 - wg, number_of_threads=self.num_mma_threads
            )

    @cute.jit
    def mma(
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
        sdS: cute.Tensor,
        sdQ: cute.Tensor,
        sLSE: cute.Tensor,
        sDelta: cute.Tensor,
        sInfo: cute.Tensor,
        storage,
        mma_sdp: cute.TiledMma,
        mma_dkv: cute.TiledMma,
        mma_dq: cute.TiledMma,
        tidx: Int32,
        dkv_sums: _DkvSums,
        sK_out: cute.Tensor,
        sV_out: cute.Tensor,
    ):
        bm, bn, hd = self.block_m, self.block_n, self.head_dim
        wg, thr_sdp, thr_dkv, thr_dq, wg_sdp, wg_dkv, wg_dq = self._mma_slices(
            mma_sdp, mma_dkv, mma_dq, tidx
        )

        # Operand fragments (descriptors into shared memory; the stage is the last mode).
        tSrK = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        tSrQ = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        tPrV = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        tPrdO = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        tVrdO = wg_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(sdO)))
        tKrQ = wg_dkv.make_fragment_B(wg_dkv.partition_B(transpose_view(sQ)))
        if const_expr(self.dq_swap):
            # dQ^T = K^T dS^T: K^T is the A operand, dS^T (the stage's tile) the B operand.
            tQrK = wg_dq.make_fragment_A(wg_dq.partition_A(transpose_view(sK)))
            tQrdS = wg_dq.make_fragment_B(wg_dq.partition_B(transpose_view(sdS)))
        else:
            tQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(transpose_view(sdS)))
            tQrK = wg_dq.make_fragment_B(wg_dq.partition_B(transpose_view(sK)))

        shape_st = (bn, bm)
        acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, hd)), Float32)
        acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, hd)), Float32)
        # Coordinates of every accumulator element: (kv row, q row) of S^T, (kv row, d) of dK.
        tScS = thr_sdp.partition_C(cute.make_identity_tensor(shape_st))
        tKcK = thr_dkv.partition_C(cute.make_identity_tensor((bn, hd)))
        # dS^T leaves by stmatrix (not transposed): it takes each thread's 16-bit pairs in
        # exactly the accumulator's layout and writes rows of sdS, whose Q rows are contiguous
        # (one 32-bit store and one address computation per register pair otherwise, queued
        # in the same MIO pipe as the exponentials).
        ds_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype
        )
        ds_copy = cute.make_tiled_copy_C(ds_atom, mma_sdp)
        thr_ds = ds_copy.get_slice(tidx)
        tDsdS = thr_ds.partition_D(sdS)

        stage = Int32(0)
        phase = Int32(0)
        kv_phase = Int32(0)
        do_phase = Int32(0)  # of dO's own mbarriers (do_single)
        done = Int32(0)
        buf = Int32(0)  # the dQ staging buffer of this step (always 0 without dq_double)
        if const_expr(self.ds_guard):
            # As if a step -1's dQ GEMM were done: the other warpgroup's first dS store passes.
            cute.arch.barrier_arrive(
                barrier_id=_BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
            )
        while done == 0:
            cute.arch.mbarrier_wait(storage.full_bar.data_ptr() + stage, phase)
            flags = sInfo[_I_FLAGS, stage]
            done = flags & _F_DONE
            # dS has one buffer with dq_double (see its comment in __init__), one per stage else.
            ds_stage = Int32(0) if const_expr(self.dq_double) else stage
            # dO's buffer: its one buffer with do_single, the step's ring stage else.
            do_stage = Int32(0) if const_expr(self.do_single) else stage
            if done != 0:
                self._stop_dq_writer(buf, wg, self.ds_guard)
            else:
                # Step metadata is read from the stage's slot where it is used (it stays valid
                # until this stage is released), so it does not occupy registers across the MMAs.
                if flags & _F_FIRST != 0:
                    cute.arch.mbarrier_wait(storage.kv_full.data_ptr(), kv_phase)
                    kv_phase = kv_phase ^ 1
                    acc_dK.fill(0.0)
                    acc_dV.fill(0.0)

                if const_expr(self.early_meta):
                    n0, m0, shift, edge = self._step_tiles(sInfo, stage, seqlen_q, seqlen_k)
                # S^T = K Q^T, dP^T = V dO^T (two commit groups).
                acc_S = cute.make_rmem_tensor(thr_sdp.partition_shape_C(shape_st), Float32)
                acc_dP = cute.make_rmem_tensor(thr_sdp.partition_shape_C(shape_st), Float32)
                wgmma(mma_sdp, acc_S, tSrK, tSrQ[None, None, None, stage], zero_init=True)
                if const_expr(self.do_single):
                    cute.arch.mbarrier_wait(storage.do_full.data_ptr(), do_phase)
                wgmma(mma_sdp, acc_dP, tPrV, tPrdO[None, None, None, do_stage], zero_init=True)
                warpgroup.wait_group(1)

                # P^T = exp2(S^T * scale_log2 - lse2), masked (_probs), the LSE2 rows read from
                # shared memory here.
                if const_expr(not self.early_meta):
                    n0, m0, shift, edge = self._step_tiles(sInfo, stage, seqlen_q, seqlen_k)
                probs_args = (acc_S, tScS, sLSE, stage, scale_log2, n0, m0, shift, seqlen_k)
                if const_expr(self.exp_tail > 0):
                    # The last exp_tail exponentials after the dP^T wait, in one block with dS^T.
                    # The wait sits in the block between the two branches: ptxas hoists a
                    # wgmma wait above every exponential of its own block.
                    split = max(cute.size(acc_S) - self.exp_tail, 0)
                    if edge != 0:
                        self._probs(*probs_args, True, 0, split)
                    else:
                        self._probs(*probs_args, False, 0, split)
                    warpgroup.wait_group(0)
                    if edge != 0:
                        self._probs(*probs_args, True, split)
                        self._grad_scores(acc_S, acc_dP, tScS, sDelta, stage)
                    else:
                        self._probs(*probs_args, False, split)
                        self._grad_scores(acc_S, acc_dP, tScS, sDelta, stage)
                else:
                    if edge != 0:
                        self._probs(*probs_args, True)
                    else:
                        self._probs(*probs_args, False)
                    warpgroup.wait_group(0)
                    self._grad_scores(acc_S, acc_dP, tScS, sDelta, stage)

                rP = cute.make_fragment_like(acc_S, self.dtype)
                rP.store(acc_S.load().to(self.dtype))
                rdS = cute.make_fragment_like(acc_dP, self.dtype)
                rdS.store(acc_dP.load().to(self.dtype))

                acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C(self.dq_mma_shape), Float32)
                # dS^T to shared memory first, then dV (FA4's order): dV runs through the dS
                # barrier and dQ queues behind it, so the tensor cores see dV, dQ, dK back to
                # back. P's registers stay live until dV is done.
                if const_expr(self.ds_guard):
                    # The other warpgroup's previous dQ GEMM has read the dS buffer.
                    cute.arch.barrier(
                        barrier_id=_BAR_DQ_READ + 1 - wg, number_of_threads=self.num_mma_threads
                    )
                cute.copy(ds_copy, thr_ds.retile(rdS), tDsdS[None, None, None, ds_stage])
                wgmma(
                    mma_dkv, acc_dV, acc_to_operand_a(rP), tVrdO[None, None, None, do_stage],
                    zero_init=False,
                )  # fmt: skip
                cute.arch.fence_view_async_shared()
                cute.arch.barrier(barrier_id=_BAR_DS, number_of_threads=self.num_mma_threads)
                if const_expr(self.dq_swap):
                    wgmma(mma_dq, acc_dQ, tQrK, tQrdS[None, None, None, ds_stage], zero_init=True)
                else:
                    wgmma(mma_dq, acc_dQ, tQrdS[None, None, None, ds_stage], tQrK, zero_init=True)
                warpgroup.wait_group(1)  # dV done: P's registers are free
                if const_expr(self.do_single):
                    # dV was dO's last reader: the producer may load the next step's dO.
                    cute.arch.mbarrier_arrive(storage.do_empty.data_ptr())
                    do_phase = do_phase ^ 1
                wgmma(
                    mma_dkv, acc_dK, acc_to_operand_a(rdS), tKrQ[None, None, None, stage],
                    zero_init=False,
                )  # fmt: skip
                warpgroup.wait_group(1)  # dQ done, dK may still run
                if const_expr(self.ds_guard):
                    cute.arch.barrier_arrive(
                        barrier_id=_BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
                    )

                # Hand the dQ partial to the dQ writer once its buffer is free.
                self._dq_barrier(_BAR_DQ_EMPTY, buf, wg, wait=True)
                self._store_dq_fragment(acc_dQ, sdQ, buf, tidx, mma_dq)
                cute.arch.fence_view_async_shared()
                self._dq_barrier(_BAR_DQ_FULL, buf, wg, wait=False)
                if const_expr(self.dq_double):
                    buf = buf ^ 1

                warpgroup.wait_group(0)
                if const_expr(self.dkv_sum):
                    if flags & _F_LAST == 0:
                        cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                    else:
                        self._sum_chain_epilogue(
                            storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv,
                            softmax_scale, seqlen_k, dkv_sums, tidx, wg,
                        )  # fmt: skip
                elif const_expr(self.dkv_row_ptr):
                    # The chain's (batch, kv head, kv tile) are read at its last step only:
                    # read at every step, ptxas moves them into uniform registers before the
                    # branch, and every step waits there for the shared load (queued behind
                    # the dQ partial's stores).
                    if flags & _F_LAST == 0:
                        cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                    else:
                        self._chain_epilogue(
                            storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, mma_dkv,
                            softmax_scale, seqlen_k, sK_out, sV_out, tidx, wg,
                        )  # fmt: skip
                else:
                    b = sInfo[_I_BATCH, stage]
                    kvh = sInfo[_I_KVH, stage]
                    kvt = sInfo[_I_KVT, stage]
                    # Q, dO, LSE2, delta and the metadata of this stage are no longer read.
                    cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                    if flags & _F_LAST != 0:
                        # K/V are free for the next chain; dK/dV leave from registers.
                        cute.arch.mbarrier_arrive(storage.kv_empty.data_ptr())
                        rdK = cute.make_fragment_like(acc_dK, self.dtype)
                        rdK.store((acc_dK.load() * softmax_scale).to(self.dtype))
                        rdV = cute.make_fragment_like(acc_dV, self.dtype)
                        rdV.store(acc_dV.load().to(self.dtype))
                        gdK = mdK[b, None, kvh, None]
                        gdV = mdV[b, None, kvh, None]
                        # 32-bit stores of two neighbouring 16-bit values (the accumulator
                        # holds column pairs), rows past seqlen_k dropped.
                        self._store_pairs(rdK, gdK, tKcK, mma_dkv, kvt * bn, seqlen_k)
                        self._store_pairs(rdV, gdV, tKcK, mma_dkv, kvt * bn, seqlen_k)

                stage, phase = self._next_stage(stage, phase)

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
        dkv_sums: _DkvSums,
    ):
        """The MMA warpgroups' step loop of ``dkv_swap`` (head dims 192 and 256; see its
        comment in __init__). Same ring, K/V, dQ hand-off and chain protocol as ``mma``; sPdS
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
        rows0, row_slot = _fragment_rows(coords0, n_regs)
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
            barrier_id=_BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
        )
        while done == 0:
            cute.arch.mbarrier_wait(storage.full_bar.data_ptr() + stage, phase)
            flags = sInfo[_I_FLAGS, stage]
            done = flags & _F_DONE
            if done != 0:
                self._stop_dq_writer(buf, wg, True)
            else:
                if flags & _F_FIRST != 0:
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
                    barrier_id=_BAR_DQ_READ + 1 - wg, number_of_threads=self.num_mma_threads
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
                cute.arch.barrier(barrier_id=_BAR_DS, number_of_threads=self.num_mma_threads)

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
                self._dq_barrier(_BAR_DQ_EMPTY, buf, wg, wait=True)
                self._store_dq_fragment(acc_dQ, sdQ, buf, tidx, mma_dq)
                cute.arch.fence_view_async_shared()
                self._dq_barrier(_BAR_DQ_FULL, buf, wg, wait=False)
                warpgroup.wait_group(0)  # dK^T done: this warpgroup no longer reads P and dS
                cute.arch.barrier_arrive(
                    barrier_id=_BAR_DQ_READ + wg, number_of_threads=self.num_mma_threads
                )
                if flags & _F_LAST == 0:
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
    def _mask_prob(
        self, p: Float32, n, m, n0: Int32, m0: Int32, shift: Int32, seqlen_k: Int32
    ) -> Float32:
        """``p`` of key row n0 + n and query row m0 + m, or zero for a key past seqlen_k (TMA
        gave zeros there, not -inf) and, causal, a key after the bottom-right diagonal."""
        if n0 + n >= seqlen_k:
            p = Float32(0.0)
        if const_expr(self.causal):  # noqa: SIM102 (compile-time, then runtime test)
            if n0 + n > m0 + m + shift:
                p = Float32(0.0)
        return p

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
        b = sInfo[_I_BATCH, stage]
        kvh = sInfo[_I_KVH, stage]
        kvt = sInfo[_I_KVT, stage]
        cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
        rdK = cute.make_fragment_like(acc_dK, self.dtype)
        rdK.store((acc_dK.load() * softmax_scale).to(self.dtype))
        rdV = cute.make_fragment_like(acc_dV, self.dtype)
        rdV.store(acc_dV.load().to(self.dtype))
        # Both warpgroups' GEMMs of the last step are done (S, dP and dQ read all of K and V).
        cute.arch.barrier(barrier_id=_BAR_KV_FREE, number_of_threads=self.num_mma_threads)
        st_atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype
        )
        st_copy = cute.make_tiled_copy_C(st_atom, mma_dkv)
        thr_st = st_copy.get_slice(tidx)
        cute.copy(st_copy, thr_st.retile(rdK), thr_st.partition_D(transpose_view(sK)))
        cute.copy(st_copy, thr_st.retile(rdV), thr_st.partition_D(transpose_view(sV)))
        # Every element is in place (each warpgroup's rows hold the other's columns at hd 256).
        cute.arch.barrier(barrier_id=_BAR_KV_FREE, number_of_threads=self.num_mma_threads)
        self._copy_rows_out(
            sK, sV, mdK[b, None, kvh, None], mdV[b, None, kvh, None], kvt, seqlen_k, tidx, wg
        )
        cute.arch.mbarrier_arrive(storage.kv_empty.data_ptr())

    @cute.jit
    def _sum_chain_epilogue_swapped(
        self, storage, sInfo, stage, acc_dK, acc_dV, mdK, mdV, tKcK, softmax_scale, seqlen_k,
        sums: _DkvSums, tidx, wg,
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
                        k0 = load_f32_cg(ptr_k.toint()) + k0
                        v0 = load_f32_cg(ptr_v.toint()) + v0
                    gdK[row, d] = k0.to(self.dtype)
                    gdV[row, d] = v0.to(self.dtype)
                elif rank == 0:
                    cute.make_tensor(ptr_k, cute.make_layout(1))[0] = k0
                    cute.make_tensor(ptr_v, cute.make_layout(1))[0] = v0
                else:
                    for ptr, value in ((ptr_k, k0), (ptr_v, v0)):
                        cute.arch.red(
                            ptr, value, op="add", dtype="f32", sem="relaxed", scope="gpu"
                        )
        self._dkv_sum_release(sem_ptr, bar, rank, last, tidx)
