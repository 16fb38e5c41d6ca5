"""Synchronisation shared by the backward's warp roles (``bwd.HopperAttnBwd``): the named
barrier ids, the layout of a load-ring slot's step metadata, the ring's stage arithmetic, the dQ
buffers' named barriers and the bounded semaphore wait."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, const_expr

# Named barrier ids (0 is __syncthreads).
BAR_DS = 1  # dS of a step fully in shared memory (256 MMA threads)
BAR_DQ_EMPTY = 2  # dQ buffer free (dQ warp arrives, MMA threads wait)
BAR_DQ_FULL = 3  # dQ buffer written (MMA threads arrive, dQ warp waits)
# Per dQ buffer b (dq_double) and, with dq_wg, warpgroup half w: BAR_DQ_EMPTY + 2 (b + bufs w)
# and BAR_DQ_FULL + 2 (b + bufs w) (ids 2-9; _dq_barrier).
BAR_DQ_READ = 10  # ds_guard: + w, warpgroup w's dQ GEMM done (w arrives, the other waits)
BAR_DKV = 12  # dkv_sum / dkv_smem: + w, warpgroup w's chain epilogue (its 128 threads)
BAR_KV_FREE = 14  # dkv_smem: both warpgroups' last GEMMs of a chain done (256 MMA threads)
# dq_shared_writers: + w, dQ warp w hands the staging buffer to the other (64 threads). One
# barrier per direction: on a single one, a warp that arrived and then waited for the next
# hand-over would complete a generation by itself. Ids 6-7 belong to dq_double's second
# buffer otherwise, which a shared buffer excludes.
BAR_WRITERS = 6

# Step metadata slot (int32 words per stage).
INFO_WORDS = 8
I_BATCH, I_KVH, I_KVT, I_QH, I_QT, I_RANK, I_FLAGS = range(7)
F_FIRST = 1  # first step of its chain: K/V of the chain arrive with it
F_LAST = 2  # last step of its chain: epilogue and K/V release after it
F_DONE = 4  # no more work: leave the loop
F_QUIET = 8  # with F_DONE: no stop handshake (the second dQ warp's terminator, dq_writers=2)


class SyncMixin:
    """``HopperAttnBwd``'s ring stages, dQ-buffer barriers and semaphore wait (the kernel's
    options are read from ``self``, as in every mixin of the class)."""

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

    @cute.jit
    def _wait_turn(self, sem_ptr, rank: Int32, timeout_ns: Int64) -> Int32:
        """Spin (acquire loads) until *sem_ptr == rank; 1 if timeout_ns passed first."""
        return wait_value(sem_ptr, rank, timeout_ns)

    @cute.jit
    def _wait_dq_turn(self, sem_ptr, rank: Int32, timeout_ns: Int64) -> Int32:
        """A dQ partial's ``_wait_turn``; with ``nondet_first_store`` only until the tile's
        rank-0 store has landed: rank 0 takes no wait, every other rank waits for *sem_ptr >= 1.
        (The in-kernel dK/dV sums keep their strict turns: their last rank reads the sum.)"""
        if const_expr(self.nondet_first_store):
            failed = Int32(0)
            if rank != 0:
                failed = wait_value(sem_ptr, Int32(1), timeout_ns, at_least=True)
            return failed
        return self._wait_turn(sem_ptr, rank, timeout_ns)


@cute.jit
def wait_value(
    sem_ptr, value: Int32, timeout_ns: Int64, abort_ptr=None,
    at_least: cutlass.Constexpr[bool] = False,
) -> Int32:  # fmt: skip
    """Spin (acquire loads at gpu scope) until ``*sem_ptr == value`` (``>= value`` with
    ``at_least``); 1 if ``timeout_ns`` passed first or, with ``abort_ptr``, ``*abort_ptr``
    became non-zero meanwhile, else 0."""
    seen = cute.arch.load(sem_ptr, Int32, sem="acquire", scope="gpu")
    failed = Int32(0)
    if _short_of(seen, value, at_least):
        start = cute.arch.globaltimer()
        waiting = Int32(1)
        while waiting != 0:
            seen = cute.arch.load(sem_ptr, Int32, sem="acquire", scope="gpu")
            if _reached(seen, value, at_least):
                waiting = Int32(0)
            else:
                late = cute.arch.globaltimer() - start > timeout_ns
                if const_expr(abort_ptr is not None):
                    raised = cute.arch.load(abort_ptr, Int32, sem="relaxed", scope="gpu")
                    late = late or raised != 0
                if late:
                    failed = Int32(1)
                    waiting = Int32(0)
    return failed


@cute.jit
def _reached(seen: Int32, value: Int32, at_least: cutlass.Constexpr[bool]):
    """Whether a semaphore read ``seen`` ends a wait for ``value``."""
    if const_expr(at_least):
        return seen >= value
    return seen == value


@cute.jit
def _short_of(seen: Int32, value: Int32, at_least: cutlass.Constexpr[bool]):
    """Whether a semaphore read ``seen`` has not reached ``value`` (``_reached``'s negation,
    spelled as a comparison of its own)."""
    if const_expr(at_least):
        return seen < value
    return seen != value
