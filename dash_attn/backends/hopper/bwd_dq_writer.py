"""The backward's dQ warps (warp 1, and warp 2 with ``dq_writers=2``, of
``bwd.HopperAttnBwd``): each step's fp32 dQ partial from shared memory into the accumulator by
bulk reduce-add, in deterministic mode at the rank's turn of the dQ tile's semaphore (bounded
wait, error flag and NaN on timeout) with the release after the adds have landed; with
``nondet_first_store`` the same, but a partial other than the first waits only for the first
one's store (so the adds after it are in arrival order)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.experimental.primitives as cute_prims
from cutlass import Float32, Int32, Int64, const_expr

from .bwd_sync import (
    BAR_DQ_EMPTY,
    BAR_DQ_FULL,
    BAR_WRITERS,
    F_DONE,
    F_LAST,
    F_QUIET,
    I_BATCH,
    I_FLAGS,
    I_QH,
    I_QT,
    I_RANK,
)


class DqWriterMixin:
    """``HopperAttnBwd``'s dQ warps."""

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
                    self._dq_barrier(BAR_DQ_EMPTY, Int32(buf0), Int32(p), wait=False)
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
                self._dq_barrier(BAR_DQ_FULL, buf, Int32(0), wait=True)
            sdQ_buf = cute.make_tensor(
                sdQ.iterator + cute.assume(buf * (bm * hd), divby=bm * hd),
                cute.make_layout(bm * hd),
            )
            # The step's metadata, from its load-ring slot (released here once read: the MMA
            # warpgroups release it only after this barrier, so it is still valid; with
            # early_turn the slot cannot be refilled before this warp's release either).
            info = sInfo[None, stage]
            done = info[I_FLAGS] & F_DONE
            if done == 0:
                last = info[I_FLAGS] & F_LAST
                b = info[I_BATCH]
                qh = info[I_QH]
                qt = info[I_QT]
                rank = info[I_RANK]
                cute.arch.sync_warp()
                if lane == 0:
                    cute.arch.mbarrier_arrive(storage.empty_bar.data_ptr() + stage)
                # This warp's next step: the next stage, or with two warps the one after it.
                for _ in cutlass.range_constexpr(self.dq_writers):
                    stage, phase = self._next_stage(stage, phase)
                sem_ptr = mFlags.iterator + (2 + (b * heads + qh) * q_tiles + qt)
                if const_expr(two and not self.early_turn):
                    # The turn after the partial's first part is in, as with one warp.
                    self._dq_barrier(BAR_DQ_FULL, buf, Int32(0), wait=True)
                if const_expr(self.takes_turns):
                    if lane == 0:
                        sDqFail[fail] = self._wait_dq_turn(sem_ptr, rank, timeout_ns)
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
                        self._dq_barrier(BAR_DQ_FULL, buf, Int32(p), wait=True)
                    if const_expr(self.takes_turns):
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
                    self._dq_barrier(BAR_DQ_EMPTY, buf, Int32(p), wait=False)
                if const_expr(self.dq_double and not two):
                    buf = buf ^ 1
                if const_expr(self.takes_turns):
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
                # other warp's (F_QUIET) without.
                if const_expr(self.dq_shared_writers):
                    self._writers_handover(writer, handover, wait=True)
                if info[I_FLAGS] & F_QUIET == 0:
                    self._writer_stop(buf, parts, ring_first)
                    if const_expr(self.dq_shared_writers):
                        # The quiet terminator, the last slot, takes this hand-over.
                        self._writers_handover(writer, Int32(1), wait=False)
            else:
                self._writer_stop(buf, parts, ring_first)
        # Bulk reductions must be complete before the CTA exits.
        cute.arch.cp_async_bulk_wait_group(0, read=False)

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
                cute.arch.barrier(barrier_id=BAR_WRITERS + 1 - writer, number_of_threads=64)
        else:
            cute.arch.barrier_arrive(barrier_id=BAR_WRITERS + writer, number_of_threads=64)

    @cute.jit
    def _writer_stop(
        self, buf: Int32, parts: cutlass.Constexpr[int], ring_first: cutlass.Constexpr
    ):
        """The dQ warp's side of the MMA warpgroups' stop handshake: one more hand-off per
        part (part 0's was already waited for unless the step started at its ring slot)."""
        for p in cutlass.range_constexpr(parts):
            if const_expr(p > 0 or ring_first):
                self._dq_barrier(BAR_DQ_FULL, buf, Int32(p), wait=True)

    @cute.jit
    def _reduce_part(self, tile: cute.Tensor, sdQ_buf: cute.Tensor, offset: int, size: int):
        """Bulk reduce-add of ``size`` fp32 values of the staged partial into the
        accumulator's tile (both in fragment order), from ``offset``."""
        cute_prims.cp_reduce_async_bulk_global_shared_cta(
            tile.iterator + offset, sdQ_buf.iterator + offset, size * 4,
            op=cute_prims.CpReduceOp.ADD, type=cute_prims.CpReduceType.F32,
        )  # fmt: skip
