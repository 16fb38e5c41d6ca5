"""Schedules as data: the problem description and the integer tables a backward kernel executes.

Coordinate system
-----------------
The attention backward is cut into tiles. Query rows are grouped in Q tiles of ``BLOCK_M`` rows
(index ``i``, ``0 <= i < M``), key/value rows in KV tiles of ``BLOCK_N`` rows (index ``j``,
``0 <= j < N``), with ``BLOCK_N = tile_ratio * BLOCK_M``. A *tile task* ``(b, h, i, j)`` is the work
of KV tile ``j`` against Q tile ``i`` for batch ``b`` and query head ``h``: recompute P, add to dK_j
and dV_j, and produce a partial dQ_i that must be added into the fp32 dQ accumulator.

A *chain* is everything one KV tile ``(b, kv_head, j)`` does: its tasks for every query head of its
GQA group, executed back to back by one worker, so that dK_j and dV_j stay in registers. A chain is
an ordered list of *steps* ``(q_head, q_tile, rank)``. ``rank`` is the position of that contribution
in the fixed summation order of dQ tile ``(b, q_head, q_tile)``: the kernel waits until the dQ
tile's semaphore equals ``rank``, adds, then increments the semaphore.

Masks. Full: every KV tile meets every Q tile. Causal (bottom-right aligned, as flash-attn): KV tile
``j`` meets Q tiles ``max(0, j * tile_ratio - causal_offset) .. M - 1``, where ``causal_offset`` is
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
from dataclasses import dataclass

import numpy as np


class Dispatch(str, enum.Enum):
    """How chains are handed to workers."""

    STATIC = "static"
    DYNAMIC = "dynamic"


@dataclass(frozen=True)
class Mask:
    """Which keys each query row attends to, in flash-attn's row semantics.

    Attributes:
        causal: query row ``m`` sees key ``n`` iff ``n <= m + seqlen_k - seqlen_q`` (aligned to the
            bottom-right corner of the attention matrix). Otherwise every key (the full mask).

    The schedule engine, the validator, the reference executor and both backends read the mask
    from here; sliding windows and packed sequences extend this value, not the call sites.

    >>> Mask.parse("causal")
    Mask(causal=True)
    >>> Mask(causal=False).name
    'full'
    """

    causal: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.causal, bool):
            raise TypeError(f"Mask.causal must be a bool, got {type(self.causal).__name__}")

    @property
    def name(self) -> str:
        """``"causal"`` or ``"full"``: the spelling of the CLI, the CSV files and the JSON."""
        return "causal" if self.causal else "full"

    @classmethod
    def parse(cls, name: str) -> Mask:
        """The mask spelled ``name`` (``"full"`` or ``"causal"``)."""
        if name not in MASK_NAMES:
            raise ValueError(f"mask must be one of {list(MASK_NAMES)}, got {name!r}")
        return cls(causal=name == "causal")


MASK_NAMES = ("full", "causal")
FULL = Mask(causal=False)
CAUSAL = Mask(causal=True)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class ScheduleSpec:
    """The tile-level shape of one attention backward, and the number of workers running it.

    Attributes:
        batch: batch size B.
        q_heads: number of query heads H.
        kv_heads: number of key/value heads (H % kv_heads == 0; fewer means GQA/MQA).
        q_tiles: number of Q tiles M per (batch, head).
        kv_tiles: number of KV tiles N per (batch, kv head).
        mask: which (query, key) pairs attend (``FULL`` or ``CAUSAL``).
        tile_ratio: s = BLOCK_N / BLOCK_M (Q tiles per KV tile along the diagonal).
        workers: number of persistent workers P (SMs given to the kernel).
        causal_offset: ceil((seqlen_k - seqlen_q) / BLOCK_M); 0 for square causal attention.
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

    def __post_init__(self) -> None:
        for name in (
            "batch",
            "q_heads",
            "kv_heads",
            "q_tiles",
            "kv_tiles",
            "tile_ratio",
            "workers",
        ):
            _check_int(name, getattr(self, name), 1)
        if not isinstance(self.mask, Mask):
            raise TypeError(f"mask must be a Mask, got {type(self.mask).__name__}")
        if isinstance(self.causal_offset, bool) or not isinstance(
            self.causal_offset, (int, np.integer)
        ):
            raise TypeError(
                f"causal_offset must be an int, got {type(self.causal_offset).__name__}"
            )
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"q_heads ({self.q_heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.mask.causal:
            # Every KV tile must meet at least one Q tile, or the chain would be empty.
            last = self.first_q_tile(self.kv_tiles - 1)
            if last >= self.q_tiles:
                raise ValueError(
                    f"causal_offset={self.causal_offset} leaves KV tile {self.kv_tiles - 1} "
                    f"with no Q tile (first Q tile {last} >= q_tiles {self.q_tiles})"
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
    ) -> ScheduleSpec:
        """Tile the problem with BLOCK_M x BLOCK_N tiles (BLOCK_N a multiple of BLOCK_M)."""
        for name, value in (
            ("seqlen_q", seqlen_q),
            ("seqlen_k", seqlen_k),
            ("block_m", block_m),
            ("block_n", block_n),
        ):
            _check_int(name, value, 1)
        if block_n % block_m:
            raise ValueError(f"block_n ({block_n}) must be a multiple of block_m ({block_m})")
        offset = -((seqlen_q - seqlen_k) // block_m) if mask.causal else 0  # ceil((sk - sq) / bm)
        return cls(
            batch=batch,
            q_heads=q_heads,
            kv_heads=kv_heads,
            q_tiles=-(-seqlen_q // block_m),
            kv_tiles=-(-seqlen_k // block_n),
            mask=mask,
            tile_ratio=block_n // block_m,
            workers=workers,
            causal_offset=offset,
        )

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.q_heads // self.kv_heads

    @property
    def num_chains(self) -> int:
        return self.batch * self.kv_heads * self.kv_tiles

    def first_q_tile(self, kv_tile: int) -> int:
        """The lowest Q tile that KV tile ``kv_tile`` meets (it meets all tiles above it too)."""
        if not self.mask.causal:
            return 0
        return max(0, kv_tile * self.tile_ratio - self.causal_offset)

    def kv_tiles_of(self, q_tile: int) -> int:
        """How many KV tiles (0, 1, ...) Q tile ``q_tile`` meets: its number of dQ contributions."""
        if not self.mask.causal:
            return self.kv_tiles
        # first_q_tile(j) <= i  <=>  j * s - d <= i  <=>  j <= (i + d) / s
        count = (q_tile + self.causal_offset) // self.tile_ratio + 1
        return max(0, min(self.kv_tiles, count))

    def num_tasks(self) -> int:
        """Tile tasks the mask needs: the total number of steps of any schedule."""
        per_head = sum(self.q_tiles - self.first_q_tile(j) for j in range(self.kv_tiles))
        return per_head * self.batch * self.q_heads

    def chain_id(self, batch: int, kv_head: int, kv_tile: int) -> int:
        """Canonical chain index: KV tile fastest, then KV head, then batch."""
        return (batch * self.kv_heads + kv_head) * self.kv_tiles + kv_tile

    def dq_tile_id(self, batch: int, q_head: int, q_tile: int) -> int:
        """Index of the semaphore (and the dQ accumulator tile) of ``(batch, q_head, q_tile)``."""
        return (batch * self.q_heads + q_head) * self.q_tiles + q_tile


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
