"""Schedules as data: the problem description and the integer tables a backward kernel executes.

Coordinate system
-----------------
The attention backward is cut into tiles. Query rows are grouped in Q tiles of ``BLOCK_M`` rows
(index ``i``, ``0 <= i < M``), key/value rows in KV tiles of ``BLOCK_N`` rows (index ``j``,
``0 <= j < N``), usually with ``BLOCK_N = tile_ratio * BLOCK_M`` (a spec given in token lengths
may take any BLOCK_N, e.g. 80 x 128 tiles: its tile ranges are exact either way). A *tile task*
``(b, h, i, j)`` is the work of KV tile ``j`` against Q tile ``i`` for batch ``b`` and query
head ``h``: recompute P, add to dK_j and dV_j, and produce a partial dQ_i that must be added
into the fp32 dQ accumulator.

A *chain* is everything one KV tile ``(b, kv_head, j)`` does: its tasks for every query head of its
GQA group, executed back to back by one worker, so that dK_j and dV_j stay in registers. A chain is
an ordered list of *steps* ``(q_head, q_tile, rank)``. ``rank`` is the position of that contribution
in the fixed summation order of dQ tile ``(b, q_head, q_tile)``: the kernel waits until the dQ
tile's semaphore equals ``rank``, adds, then increments the semaphore.

Masks and sequences. Which tile pairs a problem needs comes from ``Mask`` (full, causal or a
sliding window, flash-attn's row rule, bottom-right aligned per sequence) and, with ``seqlens``,
from each sequence's own lengths: ``q_tile_range(b, j)`` / ``kv_tile_range(b, i)`` are exact to
the token (``geometry``). Packed (varlen) sequences share one padded tile grid of the longest
sequence's tiles; a shorter sequence's extra chains and dQ tiles are padding. A spec given in tiles
(no ``seqlens``) keeps the old rule: causal KV tile ``j`` meets Q tiles
``max(0, j * tile_ratio - causal_offset) .. M - 1``, ``causal_offset`` being
``ceil((seqlen_k - seqlen_q) / BLOCK_M)`` (zero for square attention).

Worked example (full mask, M = N = 4, 1 head, 4 workers, ``shift``)::

    step        0        1        2        3
    worker 0  q0 (r0)  q1 (r1)  q2 (r2)  q3 (r3)     chain kv0
    worker 1  q1 (r0)  q2 (r1)  q3 (r2)  q0 (r3)     chain kv1
    worker 2  q2 (r0)  q3 (r1)  q0 (r2)  q1 (r3)     chain kv2
    worker 3  q3 (r0)  q0 (r1)  q1 (r2)  q2 (r3)     chain kv3

At every step the four workers touch four different dQ tiles, and each dQ tile is summed in the
order its contributions arrive (dQ0: kv0, kv3, kv2, kv1), so nobody ever waits.

Dispatch. ``static``: worker ``w`` runs the chains ``order[worker_start[w]:worker_start[w + 1]]``
(a persistent kernel; needs every worker co-resident). ``dynamic``: workers pull tickets from an
atomic counter and ticket ``t`` runs chain ``order[t]`` (what the hardware block scheduler does for
a non-persistent grid); ranks then only ever wait on chains with a smaller ticket.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .geometry import SeqGeometry, tile_geometry, token_geometry
from .mask import CAUSAL, FULL, MASK_KINDS, MASK_NAMES, Mask

__all__ = [
    "CAUSAL",
    "FULL",
    "MASK_KINDS",
    "MASK_NAMES",
    "TABLE_FIELDS",
    "Dispatch",
    "Mask",
    "Schedule",
    "ScheduleSpec",
    "RangeTables",
    "SeqGeometry",
    "range_tables",
]


class Dispatch(str, enum.Enum):
    """How chains are handed to workers."""

    STATIC = "static"
    DYNAMIC = "dynamic"


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _tile_ratio(block_m: int, block_n: int) -> int:
    """``ScheduleSpec.tile_ratio`` of token-level tiles: BLOCK_N / BLOCK_M when whole, else 1."""
    return block_n // block_m if block_n % block_m == 0 else 1


@dataclass(frozen=True)
class ScheduleSpec:
    """The tile-level shape of one attention backward, and the number of workers running it.

    Attributes:
        batch: batch size B (the number of sequences).
        q_heads: number of query heads H.
        kv_heads: number of key/value heads (H % kv_heads == 0; fewer means GQA/MQA).
        q_tiles: number of Q tiles M per (batch, head): the largest sequence's when ``seqlens``
            is set (a padded tile grid).
        kv_tiles: number of KV tiles N per (batch, kv head), likewise.
        mask: which (query, key) pairs attend (``Mask``: full, causal or a window).
        tile_ratio: s = BLOCK_N / BLOCK_M (Q tiles per KV tile along the diagonal) of a spec
            given in tiles; 1 for token-level tiles whose BLOCK_N is no multiple of BLOCK_M
            (their geometry comes from ``block_m`` and ``block_n``).
        workers: number of persistent workers P (SMs given to the kernel).
        causal_offset: ceil((seqlen_k - seqlen_q) / BLOCK_M) of a spec given in tiles; 0 for
            square causal attention. Unused when ``seqlens`` is set.
        seqlens: per sequence ``(seqlen_q, seqlen_k)`` in tokens, or None for a spec given in
            tiles (every sequence then has M x N tiles). With it, the tile pairs each sequence
            needs are exact to the token (``q_tile_range``, ``kv_tile_range``).
        block_m: rows of a Q tile (tokens); needed with ``seqlens``.
        block_n: rows of a KV tile (tokens); defaults to ``block_m * tile_ratio``.
        invariant: the summation order of every dQ tile depends only on its sequence's lengths,
            the tile sizes, the mask and the schedule name (never on the batch, the other
            sequences, the heads or the workers). False keeps the worker-dependent shift rules
            (see ``generators``).
        dkv_sum_group: 1, or the group size G of a grouped-query backward split by q head
            (``plan.BackwardPlan.gqa_split``, with ``q_heads == kv_heads`` here) whose kernel
            adds the dK/dV of the G chains ``(b, G g + r, j)``, ``r = 0 .. G - 1``, into one
            accumulator in the order of ``r``: the chain of rank ``r`` ends only after the one
            of rank ``r - 1`` has ended (``validate.dkv_predecessors``), a dependency the
            validator and the simulator include. 1: every chain writes its own dK/dV.

    Ids are on the padded grid: chain ``(b * kv_heads + g) * N + j``, dQ tile
    ``(b * H + h) * M + i``. Chains with ``j >= kv_tiles_b`` and dQ tiles with ``i >= q_tiles_b``
    are padding: they hold no step.
    """

    batch: int
    q_heads: int
    kv_heads: int
    q_tiles: int
    kv_tiles: int
    mask: Mask
    tile_ratio: int = 1
    workers: int = 1
    causal_offset: int = 0
    seqlens: tuple[tuple[int, int], ...] | None = None
    block_m: int | None = None
    invariant: bool = True
    block_n: int | None = None
    dkv_sum_group: int = 1

    def __post_init__(self) -> None:
        for name in (
            "batch",
            "q_heads",
            "kv_heads",
            "q_tiles",
            "kv_tiles",
            "tile_ratio",
            "workers",
            "dkv_sum_group",
        ):
            _check_int(name, getattr(self, name), 1)
        if self.dkv_sum_group > 1 and (
            self.q_heads != self.kv_heads or self.kv_heads % self.dkv_sum_group
        ):
            raise ValueError(
                f"dkv_sum_group={self.dkv_sum_group} needs one chain per q head (q_heads == "
                f"kv_heads, got {self.q_heads} and {self.kv_heads}) and kv_heads a multiple of it"
            )
        if not isinstance(self.mask, Mask):
            raise TypeError(f"mask must be a Mask, got {type(self.mask).__name__}")
        if isinstance(self.causal_offset, bool) or not isinstance(
            self.causal_offset, (int, np.integer)
        ):
            raise TypeError(
                f"causal_offset must be an int, got {type(self.causal_offset).__name__}"
            )
        if not isinstance(self.invariant, bool):
            raise TypeError(f"invariant must be a bool, got {type(self.invariant).__name__}")
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.block_n is None:
            if self.block_m is not None:
                _check_int("block_m", self.block_m, 1)
                object.__setattr__(self, "block_n", self.block_m * self.tile_ratio)
        else:
            _check_int("block_n", self.block_n, 1)
            if self.block_m is None:
                raise ValueError("block_n needs block_m (the rows of a Q tile)")
            _check_int("block_m", self.block_m, 1)
            ratio = _tile_ratio(self.block_m, self.block_n)
            if self.tile_ratio != ratio:
                raise ValueError(
                    f"tile_ratio={self.tile_ratio} does not match block_m={self.block_m}, "
                    f"block_n={self.block_n} (expected {ratio})"
                )
        if self.seqlens is not None:
            self._check_seqlens()
            return
        if self.block_n is not None and self.block_n % self.block_m:  # type: ignore[operator]
            raise ValueError(
                f"a spec given in tiles needs block_n ({self.block_n}) to be a multiple of "
                f"block_m ({self.block_m}): give seqlens"
            )
        if self.mask.kind == "local":
            raise ValueError(
                f"a {self.mask.name} mask needs token lengths: give seqlens and block_m "
                "(ScheduleSpec.from_shape or from_seqlens)"
            )
        if self.mask.causal:
            # Every KV tile must meet at least one Q tile, or the chain would be empty.
            last = self.first_q_tile(self.kv_tiles - 1)
            if last >= self.q_tiles:
                raise ValueError(
                    f"causal_offset={self.causal_offset} leaves KV tile {self.kv_tiles - 1} "
                    f"with no Q tile (first Q tile {last} >= q_tiles {self.q_tiles})"
                )

    def _check_seqlens(self) -> None:
        try:
            pairs = tuple((a, b) for a, b in self.seqlens)  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise TypeError(
                f"seqlens must be a sequence of (seqlen_q, seqlen_k) pairs, got {self.seqlens!r}"
            ) from None
        for index, (seqlen_q, seqlen_k) in enumerate(pairs):
            _check_int(f"seqlens[{index}][0] (seqlen_q)", seqlen_q, 0)
            _check_int(f"seqlens[{index}][1] (seqlen_k)", seqlen_k, 0)
        pairs = tuple((int(a), int(b)) for a, b in pairs)
        object.__setattr__(self, "seqlens", pairs)  # hashable and canonical
        if len(pairs) != self.batch:
            raise ValueError(f"seqlens has {len(pairs)} sequences, but batch is {self.batch}")
        if self.block_m is None:
            raise ValueError("seqlens needs block_m (the rows of a Q tile)")
        block_n = int(self.block_n)  # type: ignore[arg-type]  # set with block_m above
        q_tiles = max(1, max(-(-a // self.block_m) for a, _ in pairs))
        kv_tiles = max(1, max(-(-b // block_n) for _, b in pairs))
        if (self.q_tiles, self.kv_tiles) != (q_tiles, kv_tiles):
            raise ValueError(
                f"q_tiles={self.q_tiles}, kv_tiles={self.kv_tiles} do not match seqlens with "
                f"block_m={self.block_m}, block_n={block_n} (expected {q_tiles}, {kv_tiles})"
            )

    @classmethod
    def from_shape(
        cls,
        *,
        batch: int,
        seqlen_q: int,
        seqlen_k: int,
        q_heads: int,
        kv_heads: int,
        block_m: int,
        block_n: int,
        mask: Mask,
        workers: int,
        invariant: bool = True,
    ) -> ScheduleSpec:
        """Tile a padded batch with BLOCK_M x BLOCK_N tiles."""
        for name, value in (
            ("seqlen_q", seqlen_q),
            ("seqlen_k", seqlen_k),
            ("block_m", block_m),
            ("block_n", block_n),
        ):
            _check_int(name, value, 1)
        _check_int("batch", batch, 1)
        offset = -((seqlen_q - seqlen_k) // block_m) if mask.causal else 0  # ceil((sk - sq) / bm)
        return cls(
            batch=batch,
            q_heads=q_heads,
            kv_heads=kv_heads,
            q_tiles=-(-seqlen_q // block_m),
            kv_tiles=-(-seqlen_k // block_n),
            mask=mask,
            tile_ratio=_tile_ratio(block_m, block_n),
            workers=workers,
            causal_offset=offset,
            seqlens=((seqlen_q, seqlen_k),) * batch,
            block_m=block_m,
            invariant=invariant,
            block_n=block_n,
        )

    @classmethod
    def from_seqlens(
        cls,
        *,
        seqlens: Sequence[tuple[int, int]],
        q_heads: int,
        kv_heads: int,
        block_m: int,
        block_n: int,
        mask: Mask,
        workers: int,
        invariant: bool = True,
    ) -> ScheduleSpec:
        """Tile packed sequences (varlen): ``seqlens[b] = (seqlen_q, seqlen_k)`` of sequence b.

        Lengths may be 0. The tile grid is padded to the longest sequence; ids as in the class
        docstring.
        """
        for name, value in (("block_m", block_m), ("block_n", block_n)):
            _check_int(name, value, 1)
        try:
            pairs = tuple((a, b) for a, b in seqlens)
        except (TypeError, ValueError):
            raise TypeError(
                f"seqlens must be a sequence of (seqlen_q, seqlen_k) pairs, got {seqlens!r}"
            ) from None
        if not pairs:
            raise ValueError("seqlens must hold at least one sequence")
        for index, (seqlen_q, seqlen_k) in enumerate(pairs):
            _check_int(f"seqlens[{index}][0] (seqlen_q)", seqlen_q, 0)
            _check_int(f"seqlens[{index}][1] (seqlen_k)", seqlen_k, 0)
        return cls(
            batch=len(pairs),
            q_heads=q_heads,
            kv_heads=kv_heads,
            q_tiles=max(1, max(-(-int(a) // block_m) for a, _ in pairs)),
            kv_tiles=max(1, max(-(-int(b) // block_n) for _, b in pairs)),
            mask=mask,
            tile_ratio=_tile_ratio(block_m, block_n),
            workers=workers,
            seqlens=pairs,
            block_m=block_m,
            invariant=invariant,
            block_n=block_n,
        )

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.q_heads // self.kv_heads

    @property
    def num_chains(self) -> int:
        """Chains of the padded grid (``chain_start`` has one more entry)."""
        return self.batch * self.kv_heads * self.kv_tiles

    def geometry(self, batch: int) -> SeqGeometry:
        """The tile ranges of sequence ``batch`` (cached per distinct sequence)."""
        if not 0 <= batch < self.batch:
            raise ValueError(f"batch must be in 0..{self.batch - 1}, got {batch}")
        if self.seqlens is None:
            return tile_geometry(
                self.q_tiles,
                self.kv_tiles,
                self.tile_ratio,
                int(self.causal_offset),
                self.mask.causal,
            )
        seqlen_q, seqlen_k = self.seqlens[batch]
        block_m = int(self.block_m or 0)  # __post_init__ demands block_m with seqlens
        return token_geometry(seqlen_q, seqlen_k, block_m, int(self.block_n or 0), self.mask)

    def seq_tiles(self, batch: int) -> tuple[int, int]:
        """``(q_tiles_b, kv_tiles_b)``: the tiles sequence ``batch`` really has."""
        geometry = self.geometry(batch)
        return geometry.q_tiles, geometry.kv_tiles

    def q_tile_range(self, batch: int, kv_tile: int) -> tuple[int, int]:
        """Half-open range of the Q tiles KV tile ``kv_tile`` of sequence ``batch`` meets."""
        return self.geometry(batch).q_range(kv_tile)

    def kv_tile_range(self, batch: int, q_tile: int) -> tuple[int, int]:
        """Half-open range of the KV tiles Q tile ``q_tile`` of sequence ``batch`` meets: its
        contributions, whose ranks are ``0 .. hi - lo - 1``."""
        return self.geometry(batch).kv_range(q_tile)

    def is_uniform(self) -> bool:
        """Every sequence has the same lengths (a padded batch, or a spec given in tiles)."""
        return self.seqlens is None or len(set(self.seqlens)) == 1

    def _dense_geometry(self, what: str) -> SeqGeometry:
        if not self.is_uniform() or self.mask.kind == "local":
            raise ValueError(
                f"{what} describes a dense full or causal spec; use q_tile_range / kv_tile_range "
                f"for varlen or windowed specs (mask {self.mask.name})"
            )
        return self.geometry(0)

    def first_q_tile(self, kv_tile: int) -> int:
        """The lowest Q tile that KV tile ``kv_tile`` meets (it meets all tiles above it too).

        Dense full/causal specs only (every sequence alike); ``q_tiles`` when it meets none.
        """
        if self.seqlens is None:
            if not self.mask.causal:
                return 0
            return max(0, kv_tile * self.tile_ratio - self.causal_offset)
        return self._dense_geometry("first_q_tile").q_range(kv_tile)[0]

    def kv_tiles_of(self, q_tile: int) -> int:
        """How many KV tiles (0, 1, ...) Q tile ``q_tile`` meets: its number of dQ contributions.

        Dense full/causal specs only (their ranges start at KV tile 0).
        """
        return self._dense_geometry("kv_tiles_of").kv_range(q_tile)[1]

    def num_tasks(self) -> int:
        """Tile tasks the mask needs: the total number of steps of any schedule."""
        pairs = sum(self.geometry(b).num_pairs for b in range(self.batch))
        return pairs * self.q_heads

    def chain_id(self, batch: int, kv_head: int, kv_tile: int) -> int:
        """Canonical chain index: KV tile fastest, then KV head, then batch."""
        return (batch * self.kv_heads + kv_head) * self.kv_tiles + kv_tile

    def dq_tile_id(self, batch: int, q_head: int, q_tile: int) -> int:
        """Index of the semaphore (and the dQ accumulator tile) of ``(batch, q_head, q_tile)``."""
        return (batch * self.q_heads + q_head) * self.q_tiles + q_tile

    def dkv_placement(self, batch: np.ndarray, kv_head: np.ndarray) -> np.ndarray:
        """Where the chains of (``batch``, ``kv_head``) go in placement or ticket order under
        dK/dV sums (``dkv_sum_group`` = G > 1): rank in the sum first, then sequence, then sum
        (``kv_head % G``, ``batch``, ``kv_head // G``), as one integer each.

        A chain of rank ``r`` adds its dK/dV only after the chain of rank ``r - 1`` of its
        sequence and KV tile, so consecutive ranks that run side by side and end together wait
        for each other's epilogue in turn: up to G - 1 epilogues one after another if a sum's
        heads were placed together, as in (batch, head) order. Rank-major order puts the ranks
        of a sum as far apart as the launch allows. It changes the dispatch only, no bit.
        """
        group = self.dkv_sum_group
        batch, kv_head = np.asarray(batch, np.int64), np.asarray(kv_head, np.int64)
        sums = self.kv_heads // group
        return ((kv_head % group) * self.batch + batch) * sums + kv_head // group

    def live_chains(self) -> np.ndarray:
        """Chain ids with ``kv_tile < kv_tiles_b``, ascending: the chains ``order`` lists."""
        per_batch = [self.seq_tiles(b)[1] for b in range(self.batch)]
        tiles = np.arange(self.kv_tiles)
        live = np.concatenate(
            [
                (b * self.kv_heads + g) * self.kv_tiles + tiles[:count]
                for b, count in enumerate(per_batch)
                for g in range(self.kv_heads)
            ]
        )
        return live.astype(np.int64)


# The integer tables a backward kernel reads, in the order the launchers pass them.
TABLE_FIELDS = ("chain_start", "step_q_head", "step_q_tile", "step_rank", "order", "worker_start")


def _frozen(array: np.ndarray) -> np.ndarray:
    out = np.ascontiguousarray(array, dtype=np.int32)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Schedule:
    """Integer tables for one backward. All arrays are read-only int32.

    Attributes:
        name: the generator that made it (``fa3``, ``descending``, ``shift``, ...).
        spec: the problem it covers.
        dispatch: ``static`` or ``dynamic``.
        chain_start: ``[C + 1]`` offsets of each chain's steps in the step arrays; chain ``c`` is
            ``(batch, kv_head, kv_tile)`` with ``c = spec.chain_id(...)``.
        step_q_head, step_q_tile, step_rank: ``[S]`` per step, chains concatenated in chain order.
        order: ``[C]`` chains in execution order: worker lists concatenated (static) or tickets
            (dynamic).
        worker_start: ``[P + 1]`` offsets of each worker's list in ``order`` (static); for dynamic
            dispatch it is ``[0, C]``.
    """

    name: str
    spec: ScheduleSpec
    dispatch: Dispatch
    chain_start: np.ndarray
    step_q_head: np.ndarray
    step_q_tile: np.ndarray
    step_rank: np.ndarray
    order: np.ndarray
    worker_start: np.ndarray

    def __post_init__(self) -> None:
        for field in TABLE_FIELDS:
            object.__setattr__(self, field, _frozen(getattr(self, field)))
        object.__setattr__(self, "dispatch", Dispatch(self.dispatch))

    @property
    def num_chains(self) -> int:
        return len(self.chain_start) - 1

    @property
    def num_steps(self) -> int:
        return len(self.step_q_tile)

    def chain_coords(self, chain: int) -> tuple[int, int, int]:
        """``(batch, kv_head, kv_tile)`` of a chain index."""
        spec = self.spec
        kv_tile = chain % spec.kv_tiles
        rest = chain // spec.kv_tiles
        return rest // spec.kv_heads, rest % spec.kv_heads, kv_tile

    def chain_steps(self, chain: int) -> list[tuple[int, int, int]]:
        """``(q_head, q_tile, rank)`` of every step of a chain, in execution order."""
        lo, hi = int(self.chain_start[chain]), int(self.chain_start[chain + 1])
        return list(
            zip(
                self.step_q_head[lo:hi].tolist(),
                self.step_q_tile[lo:hi].tolist(),
                self.step_rank[lo:hi].tolist(),
                strict=True,
            )
        )

    def worker_chains(self, worker: int) -> list[int]:
        """Chains of a static worker, in execution order."""
        if self.dispatch is not Dispatch.STATIC:
            raise ValueError("worker_chains is defined for static dispatch only")
        lo, hi = int(self.worker_start[worker]), int(self.worker_start[worker + 1])
        return self.order[lo:hi].tolist()

    def step_chain(self) -> np.ndarray:
        """``[S]`` the chain index of every step."""
        lengths = np.diff(self.chain_start)
        return np.repeat(np.arange(self.num_chains, dtype=np.int64), lengths)

    def step_batch_kv(self) -> tuple[np.ndarray, np.ndarray]:
        """``[S]`` batch and KV tile of every step."""
        chain = self.step_chain()
        spec = self.spec
        return chain // (spec.kv_tiles * spec.kv_heads), chain % spec.kv_tiles

    def step_dq_tile(self) -> np.ndarray:
        """``[S]`` the dQ tile (semaphore index) every step adds into."""
        batch, _ = self.step_batch_kv()
        spec = self.spec
        return (batch * spec.q_heads + self.step_q_head) * spec.q_tiles + self.step_q_tile

    def dq_tile_counts(self) -> np.ndarray:
        """``[batch * q_heads * q_tiles]`` int32: how many steps add into each dQ tile, i.e.
        the value its semaphore reaches once every turn is released (a consumer of the
        finished sum waits for it).

        >>> from dash_attn.schedule import CAUSAL, ScheduleSpec, make_schedule
        >>> spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=3, kv_tiles=3,
        ...                     mask=CAUSAL, workers=2)
        >>> make_schedule("descending", spec).dq_tile_counts().tolist()
        [1, 2, 3]
        """
        spec = self.spec
        tiles = spec.batch * spec.q_heads * spec.q_tiles
        return np.bincount(self.step_dq_tile(), minlength=tiles).astype(np.int32)

    def busiest_worker_steps(self) -> int:
        """Static dispatch: the most steps any worker's chains have (a lower bound of the
        launch's length in steps).

        >>> from dash_attn.schedule import FULL, ScheduleSpec, make_schedule
        >>> spec = ScheduleSpec(batch=1, q_heads=3, kv_heads=3, q_tiles=2, kv_tiles=2, mask=FULL,
        ...                     workers=4)
        >>> make_schedule("shift", spec).busiest_worker_steps()  # 6 chains of 2 steps on 4
        4
        """
        if self.dispatch is not Dispatch.STATIC:
            raise ValueError(f"busiest_worker_steps: {self.name!r} dispatches dynamically")
        # Steps of the chains in worker-list order, summed per worker's slice of ``order``.
        steps = np.concatenate(([0], np.cumsum(np.diff(self.chain_start)[self.order])))
        per_worker = steps[self.worker_start[1:]] - steps[self.worker_start[:-1]]
        return int(per_worker.max(initial=0))

    def starts_every_dq_tile(self) -> bool:
        """Whether every dQ tile has exactly one step of rank 0, so that a deterministic kernel
        may store that first partial instead of adding it to a zeroed accumulator.

        False where some tile gets no contribution (causal rows that see no key, padding of
        packed sequences) or where the ranks do not start at 0 (a broken table).

        >>> from dash_attn.schedule import CAUSAL, FULL, ScheduleSpec, make_schedule
        >>> spec = ScheduleSpec(batch=1, q_heads=2, kv_heads=2, q_tiles=3, kv_tiles=3, mask=FULL,
        ...                     workers=4)
        >>> make_schedule("shift", spec).starts_every_dq_tile()
        True

        Causal with 200 queries and 64 keys in 64-token tiles: the first two Q tiles see no key.

        >>> spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=4, kv_tiles=1,
        ...                     mask=CAUSAL, seqlens=((200, 64),), block_m=64, block_n=64)
        >>> make_schedule("descending", spec).starts_every_dq_tile()
        False
        """
        spec = self.spec
        tiles = spec.batch * spec.q_heads * spec.q_tiles
        first = self.step_dq_tile()[self.step_rank == 0]
        return bool(np.array_equal(np.bincount(first, minlength=tiles), np.ones(tiles)))


@dataclass(frozen=True, eq=False)
class RangeTables:
    """Every sequence's tile ranges on the padded grid (padding: empty ranges ``(0, 0)``).

    Attributes:
        q_lo, q_hi: ``[B, N]`` the Q tiles KV tile ``j`` of sequence ``b`` meets.
        kv_lo, kv_hi: ``[B, M]`` the KV tiles Q tile ``i`` of sequence ``b`` meets.
        q_tiles, kv_tiles: ``[B]`` each sequence's own tile counts.
    """

    q_lo: np.ndarray
    q_hi: np.ndarray
    kv_lo: np.ndarray
    kv_hi: np.ndarray
    q_tiles: np.ndarray
    kv_tiles: np.ndarray


@lru_cache(maxsize=64)
def range_tables(spec: ScheduleSpec) -> RangeTables:
    """The ``RangeTables`` of ``spec`` (cached: the validator and generators index them)."""
    shape_q, shape_kv = (spec.batch, spec.kv_tiles), (spec.batch, spec.q_tiles)
    q_lo, q_hi = np.zeros(shape_q, np.int64), np.zeros(shape_q, np.int64)
    kv_lo, kv_hi = np.zeros(shape_kv, np.int64), np.zeros(shape_kv, np.int64)
    q_tiles, kv_tiles = np.zeros(spec.batch, np.int64), np.zeros(spec.batch, np.int64)
    for b in range(spec.batch):
        geometry = spec.geometry(b)
        n, m = geometry.kv_tiles, geometry.q_tiles
        q_lo[b, :n], q_hi[b, :n] = geometry.q_lo, geometry.q_hi
        kv_lo[b, :m], kv_hi[b, :m] = geometry.kv_lo, geometry.kv_hi
        q_tiles[b], kv_tiles[b] = m, n
    for array in (q_lo, q_hi, kv_lo, kv_hi, q_tiles, kv_tiles):
        array.setflags(write=False)
    return RangeTables(q_lo, q_hi, kv_lo, kv_hi, q_tiles, kv_tiles)
