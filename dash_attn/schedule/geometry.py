"""Which tile pairs a mask needs, per sequence: the tile ranges every generator and check reads.

Two sources of truth, one shape of answer (``SeqGeometry``):

* ``token_geometry``: from token lengths, block sizes and the mask (``Mask.keeps`` at tile level).
  Exact: tile pair ``(i, j)`` is listed iff some kept ``(m, n)`` has ``m`` in Q tile ``i``
  (``m < seqlen_q``) and ``n`` in KV tile ``j`` (``n < seqlen_k``).
* ``tile_geometry``: from tile counts and a causal offset, for specs built in tiles (tests, the
  CLI's ``--q-tiles``): the rule the engine had before sequences carried token lengths.

Why the ranges are contiguous: row ``m`` sees the keys ``[m + d - L, m + d + R]`` (a side is
unbounded when its window is -1). Both ends grow with ``m`` and each interval holds at least one
key, so the rows of a Q tile together see one interval ``[m0 + d - L, m1 + d + R]``; the tile
pair meets iff that interval overlaps the KV tile's keys ``[c0, c1]``, i.e.
``c0 <= m1 + d + R`` and ``m0 + d - L <= c1``. Each condition holds on a prefix or a suffix of
the tiles, so the tiles meeting a given tile form one range, found by binary search.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .mask import Mask


@dataclass(frozen=True, eq=False)
class SeqGeometry:
    """The tile pairs one sequence needs.

    Attributes:
        q_tiles, kv_tiles: the sequence's own tile counts (ceil of its lengths).
        q_lo, q_hi: ``[kv_tiles]`` KV tile ``j`` meets Q tiles ``q_lo[j] .. q_hi[j] - 1``.
        kv_lo, kv_hi: ``[q_tiles]`` Q tile ``i`` meets KV tiles ``kv_lo[i] .. kv_hi[i] - 1``.
    Empty ranges have ``lo == hi``. Arrays are read-only int64.
    """

    q_tiles: int
    kv_tiles: int
    q_lo: np.ndarray
    q_hi: np.ndarray
    kv_lo: np.ndarray
    kv_hi: np.ndarray

    def __post_init__(self) -> None:
        for name in ("q_lo", "q_hi", "kv_lo", "kv_hi"):
            array = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
            array.setflags(write=False)
            object.__setattr__(self, name, array)

    @property
    def num_pairs(self) -> int:
        """Tile pairs of one (query head of this) sequence."""
        return int(np.sum(self.q_hi - self.q_lo))

    def q_range(self, kv_tile: int) -> tuple[int, int]:
        """Q tiles met by ``kv_tile``; ``(0, 0)`` past the sequence's last KV tile (padding)."""
        if not 0 <= kv_tile < self.kv_tiles:
            return 0, 0
        return int(self.q_lo[kv_tile]), int(self.q_hi[kv_tile])

    def kv_range(self, q_tile: int) -> tuple[int, int]:
        """KV tiles met by ``q_tile``; ``(0, 0)`` past the sequence's last Q tile (padding)."""
        if not 0 <= q_tile < self.q_tiles:
            return 0, 0
        return int(self.kv_lo[q_tile]), int(self.kv_hi[q_tile])


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, max(lo, hi))``: an empty range sits at ``lo``."""
    return lo, np.maximum(lo, hi)


@lru_cache(maxsize=4096)
def token_geometry(
    seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, mask: Mask
) -> SeqGeometry:
    """The exact tile ranges of one sequence (see the module docstring for the derivation)."""
    q_tiles, kv_tiles = -(-seqlen_q // block_m), -(-seqlen_k // block_n)
    d = seqlen_k - seqlen_q
    left, right = mask.window
    i = np.arange(q_tiles, dtype=np.int64)
    j = np.arange(kv_tiles, dtype=np.int64)
    m0, m1 = i * block_m, np.minimum((i + 1) * block_m, seqlen_q) - 1  # rows of each Q tile
    c0, c1 = j * block_n, np.minimum((j + 1) * block_n, seqlen_k) - 1  # keys of each KV tile
    # KV tile j: "c0 <= m1 + d + R" holds from some Q tile up, "m0 + d - L <= c1" up to some.
    q_from = np.searchsorted(m1, c0 - d - right) if right >= 0 else np.zeros_like(j)
    q_upto = np.searchsorted(m0, c1 - d + left, "right") if left >= 0 else np.full_like(j, q_tiles)
    # Q tile i: the first condition holds up to some KV tile, the second from some KV tile on.
    kv_upto = (
        np.searchsorted(c0, m1 + d + right, "right") if right >= 0 else np.full_like(i, kv_tiles)
    )
    kv_from = np.searchsorted(c1, m0 + d - left) if left >= 0 else np.zeros_like(i)
    q_lo, q_hi = _ranges(q_from, q_upto)
    kv_lo, kv_hi = _ranges(kv_from, kv_upto)
    return SeqGeometry(q_tiles, kv_tiles, q_lo, q_hi, kv_lo, kv_hi)


@lru_cache(maxsize=1024)
def tile_geometry(
    q_tiles: int, kv_tiles: int, tile_ratio: int, causal_offset: int, causal: bool
) -> SeqGeometry:
    """Tile ranges of a spec given in tiles: full, or causal shifted by ``causal_offset`` tiles.

    Causal: KV tile ``j`` meets Q tiles ``max(0, j * tile_ratio - causal_offset) .. M - 1``
    (``causal_offset = ceil((seqlen_k - seqlen_q) / BLOCK_M)``, which ``token_geometry`` agrees
    with for every token shape).
    """
    j = np.arange(kv_tiles, dtype=np.int64)
    i = np.arange(q_tiles, dtype=np.int64)
    if not causal:
        return SeqGeometry(
            q_tiles,
            kv_tiles,
            np.zeros_like(j),
            np.full_like(j, q_tiles),
            np.zeros_like(i),
            np.full_like(i, kv_tiles),
        )
    q_lo = np.minimum(np.maximum(0, j * tile_ratio - causal_offset), q_tiles)
    # q_lo[j] <= i  <=>  j * s - offset <= i  <=>  j <= (i + offset) / s
    kv_hi = np.clip((i + causal_offset) // tile_ratio + 1, 0, kv_tiles)
    return SeqGeometry(q_tiles, kv_tiles, q_lo, np.full_like(j, q_tiles), np.zeros_like(i), kv_hi)
