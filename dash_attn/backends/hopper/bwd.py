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

This module holds the kernel class: its options (the constructor), the shared-memory layout
and the launch, and the kernel entry that assigns the warp roles. Each role's device code is a
mixin of its own module: ``bwd_producer`` (warp 0), ``bwd_dq_writer`` (the dQ warps),
``bwd_step`` and ``bwd_step_swapped`` (the MMA warpgroups' step loops), ``bwd_epilogue``
(a chain's dK/dV out) and ``bwd_sync`` (barrier ids, the ring slot's metadata, the waits
they share). ``bwd_launch`` compiles and launches it from torch tensors.

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
             release (and always adds), unless ``nondet_first_store``: then rank 0 stores,
             the others wait for that store only, and every add releases. With
             ``dq_writers=2`` warp 2 is a second dQ writer: each takes every other step (one
             ring stage and one staging buffer each, or, without dq_double, the one buffer
             in turn).
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
``dkv_smem`` takes the chain's dK/dV through shared memory (full sectors); ``dq_first_store`` copies
each dQ tile's rank-0 partial instead of adding it; ``pdl`` launches the kernel as a programmatic
dependent; ``cast_trigger`` lets the polled dQ cast start beside it; ``drain_ticket`` has the
producer take a dynamic ticket only after the chain's last dQ turn is released (with
``drain_at_turn``, once that turn is taken); ``stages`` is the depth of the Q/dO ring;
``nondet_first_store`` gives the
non-deterministic kernel the first store and the counting releases (only the first add ordered).

(The next step's S^T issued inside this step measured 0.91-0.95x
once this step's dQ GEMM is done, probably waiting for the next ring slot's load, and 0.98-0.99x
after the dQ hand-off; ptxas keeps no wgmma in flight across the step loop's back edge.
benchmarks/NOTES.md item 157, code in git history at f1921c2.)
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from ._cute_utils import SMEM_LIMIT, select_modes
from .bwd_dq_writer import DqWriterMixin
from .bwd_epilogue import DkvSums, EpilogueMixin
from .bwd_producer import ProducerMixin
from .bwd_step import StepMixin
from .bwd_step_swapped import SwappedStepMixin
from .bwd_sync import INFO_WORDS, SyncMixin
from .exp2_poly import EXP2_POLY_COEFFS

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)
SUPPORTED_TILES = ((64, 128), (80, 128), (128, 128), (64, 96), (64, 48))
# Head dims whose step runs the swapped layout (``dkv_swap``), with its only tiles: dK/dV of a
# chain do not fit in registers as 64 KV rows x head dim per warpgroup there.
SWAPPED_TILES = {192: (64, 96), 256: (64, 48)}


class HopperAttnBwd(
    ProducerMixin,
    DqWriterMixin,
    StepMixin,
    SwappedStepMixin,
    EpilogueMixin,
    SyncMixin,
):
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
        cast_trigger: bool = False,
        kv_on_full: bool = False,
        gemm_before_flags: bool = False,
        nondet_first_store: bool = False,
        step_trace: int = 0,
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
        # nondet_first_store (non-deterministic mode, with dq_first_store): the rank-0 partial
        #   of each dQ tile is still stored first, but every other partial waits only for that
        #   store to land (the tile's semaphore >= 1, not == its rank) and then adds in arrival
        #   order; every partial releases the semaphore once its adds have landed, as in
        #   deterministic mode, so the semaphore counts them and the polled dQ cast can run
        #   beside this kernel (cast_trigger). A non-deterministic kernel without it adds every
        #   partial into a zero-filled accumulator, and its cast runs after it: ~40 us of zero
        #   fill and ~47 us of cast per backward of 16k tokens x hidden 2048, which its
        #   deterministic twin does not pay (that made our non-det backward 1.1-1.3x slower
        #   than our det one up to 2k tokens; session58-066a382 call4). The waits are a subset
        #   of the deterministic ones (a turn of rank r implies the rank-0 store), so every
        #   table that is deadlock-free for the deterministic kernel is for this one; they are
        #   bounded by the same timeout, error flag and NaN.
        if nondet_first_store and not dq_first_store:
            raise ValueError("nondet_first_store needs dq_first_store (the first store it orders)")
        self.nondet_first_store = nondet_first_store and not deterministic
        self.takes_turns = deterministic or self.nondet_first_store
        self.dq_first_store = dq_first_store and self.takes_turns
        # pdl: launched as a programmatic dependent of the preprocess (PDL, as FA4's backward):
        #   the grid may start while the preprocess finishes; every thread waits for the
        #   preprocess's completion (griddepcontrol.wait) after the prologue, before any read of
        #   LSE2, delta, the flags or the accumulator; the producer lets the dQ cast launch
        #   (launch_dependents) once it has issued its last loads. Saves the launch gaps.
        self.pdl = pdl
        # cast_trigger (deterministic, or nondet_first_store): every CTA lets the programmatic
        #   dependents start (launch_dependents) as soon as its prologue is done, so that the
        #   polled dQ cast (bwd_pre_post.DqFragmentCastPolled) runs beside this kernel on the
        #   SMs a plan on fewer workers than SMs leaves free, each of its CTAs waiting for its
        #   tile's last release. Nothing of this kernel's work changes.
        self.cast_trigger = cast_trigger and self.takes_turns
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
        #   of the two warps, one per direction, BAR_WRITERS + w), since a third party on a
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
        # kv_on_full: a chain's K/V tiles arrive on its first step's ring barrier (FA4 counts
        #   them into its first Q stage), not on a barrier of their own. gemm_before_flags
        #   (needs kv_on_full, which makes K ready with every step's barrier): the MMA
        #   warpgroups issue each step's S^T GEMM right after that barrier, before they read
        #   the step's flags from shared memory (the read, its conversion to a uniform register
        #   and two branches otherwise run between the wait and the first GEMM of every step);
        #   at the terminator slot that GEMM reads stale tiles and its result is dropped. The
        #   same arithmetic: the bits do not change. Not with the swapped dK/dV layout.
        if kv_on_full and dkv_swap:
            raise NotImplementedError("kv_on_full: not with the swapped dK/dV layout (dkv_swap)")
        if gemm_before_flags and not kv_on_full:
            raise ValueError("gemm_before_flags needs kv_on_full (K ready at every step's barrier)")
        self.kv_on_full = kv_on_full
        self.gemm_before_flags = gemm_before_flags
        # step_trace = n (> 0: a probe, never shipped): the MMA warps of the step loop at head
        #   dims 64-128 write their SM clock at bwd_step.TRACE_POINTS of each of a CTA's first
        #   n steps (later steps overwrite the last) into the buffer the kernel takes for the
        #   GQA split's dK/dV sums, read as int32 words (without dkv_sum the kernel never reads
        #   it, so a probe passes a buffer of its own: tools/hopper/step_trace.py). Which
        #   warpgroup reaches the dS barrier last, and how long the other waits there.
        if step_trace < 0:
            raise ValueError(f"step_trace must be >= 0, got {step_trace}")
        if step_trace and (dkv_sum or dkv_swap):
            raise ValueError("step_trace: not with dkv_sum (its buffer) or dkv_swap (its loop)")
        self.step_trace = step_trace

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
            info: cute.struct.MemRange[Int32, st * INFO_WORDS]
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
        if const_expr(self.cast_trigger):
            cute.arch.griddepcontrol_launch_dependents()
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
        sInfo = storage.info.get_tensor(cute.make_layout((INFO_WORDS, self.stages)))
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
            dkv_sums = DkvSums(
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
