"""Which tiles each CTA of the persistent causal forward runs, in which order: a table made on
the host once per shape, as the backward's schedule tables are.

A causal mask's query tiles differ in length (the last one sees every key, the first one a
tile's worth), so a persistent CTA that walks a fixed stride of tiles ends up with more or
less work than its neighbours (a stride over tiles sorted longest first, every other wave
reversed, left the busiest of 132 CTAs 5-9% over the mean at hd 64 and 60-70% at hd 128 on the
benchmark's shapes: grouping heads for L2 breaks the sorted order at every group). Here the
host replays what a dynamic scheduler would do with known tile costs: tiles in the order the
GPU should start them (groups of heads whose K and V fit in a third of L2, longest tiles first
within a group), each handed to the CTA that is least busy so far. No atomics, no per-launch
zeroing, and the same shape always gets the same table.

Tile ids are the per-tile kernel's: ``m_rank + num_m_blocks * (head + heads * batch)``, where
``m_rank`` 0 is the longest tile (the last query block). Pure Python and numpy: no GPU.

Worked example: 4 query blocks of 128 rows, 128-key blocks, 2 heads, 3 CTAs, seqlen 512. Tile
costs (key blocks + 1 for the tile's start and end) are 5, 4, 3, 2 by m_rank; both heads fit in
one L2 group, so the order is (m_rank, head) = (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), ...:

>>> lists = causal_tile_lists(num_m_blocks=4, heads=2, batch=1, tile_m=128, tile_n=128,
...                           seqlen_q=512, seqlen_k=512, head_dim=64, workers=3)
>>> [lists.tiles[a:b].tolist() for a, b in zip(lists.starts[:-1], lists.starts[1:])]
[[0, 2, 3], [4, 6, 7], [1, 5]]

CTAs 0 and 1 take the two longest tiles (cost 5 each), CTA 2 the next one (4) and, still the
least busy, the one after (4); then CTAs 0 and 1 take the cost-3 tiles and the two shortest:
loads 10, 10 and 8.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Bytes of K and V (both heads' worth of a (batch, kv head)) that a group of (batch, head)
# pairs may have: a third of the H100/H200's 50 MB L2, so that the CTAs running one group's
# tiles side by side read each key block from L2 after its first use.
L2_GROUP_BYTES = 16 << 20
# A tile's cost beyond its key blocks, in key blocks: its start (Q and first K loads) and end
# (the O store), mostly overlapped with the neighbouring tiles in the persistent kernel.
TILE_OVERHEAD_BLOCKS = 1


@dataclass(frozen=True)
class TileLists:
    """Per CTA ``w``, the tile ids ``tiles[starts[w]:starts[w + 1]]`` in the order it runs them
    (int32, read-only), and the cost model's load of the busiest CTA over the mean."""

    tiles: np.ndarray
    starts: np.ndarray
    imbalance: float


def causal_key_blocks(m_block: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int) -> int:
    """Key blocks query block ``m_block`` reads under a bottom-right causal mask (the kernel's
    ``n_block_max``): key n is visible to row m iff n <= m + seqlen_k - seqlen_q."""
    last_key = min(seqlen_k, (m_block + 1) * tile_m + seqlen_k - seqlen_q)
    return -(-max(last_key, 0) // tile_n)


def l2_group(heads_kv_bytes: int, head_batches: int) -> int:
    """(batch, head) pairs per L2 group: as many as fit in ``L2_GROUP_BYTES``, at least one."""
    return max(1, min(head_batches, L2_GROUP_BYTES // max(heads_kv_bytes, 1)))


def grouped_tile(launch: int, num_m_blocks: int, head_batches: int, group: int) -> int:
    """The ``launch``-th tile id of the order the GPU should start a causal forward's tiles
    in: groups of ``group`` (batch, head) pairs, longest tiles first within a group, the pairs
    fastest. ``causal_tile_lists`` deals tiles in this order; the per-tile kernel with
    ``lpt_order`` launches them in it (``HopperFwd._grouped_tile``, its device copy).

    >>> [grouped_tile(t, num_m_blocks=3, head_batches=3, group=2) for t in range(9)]
    [0, 3, 1, 4, 2, 5, 6, 7, 8]
    """
    group_tiles = group * num_m_blocks
    first_pair = launch // group_tiles * group
    pairs = min(group, head_batches - first_pair)
    within = launch - first_pair * num_m_blocks
    m_rank = within // pairs
    return m_rank + num_m_blocks * (first_pair + within - m_rank * pairs)


def tile_costs(
    *, num_m_blocks: int, tile_m: int, tile_n: int, seqlen_q: int, seqlen_k: int
) -> list[int]:
    """The cost model's cost of the tile of each m_rank (0: the last query block, the
    longest): its key blocks plus ``TILE_OVERHEAD_BLOCKS``."""
    return [
        causal_key_blocks(num_m_blocks - 1 - r, tile_m, tile_n, seqlen_q, seqlen_k)
        + TILE_OVERHEAD_BLOCKS
        for r in range(num_m_blocks)
    ]


def deal_tiles(
    order: Iterable[int], costs: Sequence[int], num_m_blocks: int, workers: int
) -> tuple[list[list[int]], list[int]]:
    """Each tile of ``order`` to the worker that is least busy so far (what a GPU's block
    scheduler does with one CTA per SM): the workers' tile lists and loads."""
    heap = [(0, w) for w in range(workers)]  # (load, worker): the least busy first
    lists: list[list[int]] = [[] for _ in range(workers)]
    for tile in order:
        load, w = heapq.heappop(heap)
        lists[w].append(tile)
        heapq.heappush(heap, (load + costs[tile % num_m_blocks], w))
    loads = [0] * workers
    for load, w in heap:
        loads[w] = load
    return lists, loads


@functools.lru_cache(maxsize=64)
def causal_tile_lists(
    *,
    num_m_blocks: int,
    heads: int,
    batch: int,
    tile_m: int,
    tile_n: int,
    seqlen_q: int,
    seqlen_k: int,
    head_dim: int,
    workers: int,
) -> TileLists:
    """The tiles of a causal forward dealt to ``workers`` CTAs (see the module docstring).

    Raises ValueError for a non-positive size or more workers than tiles (the launcher
    launches ``min(SMs, tiles)`` CTAs)."""
    sizes = {
        "num_m_blocks": num_m_blocks, "heads": heads, "batch": batch, "tile_m": tile_m,
        "tile_n": tile_n, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "head_dim": head_dim,
        "workers": workers,
    }  # fmt: skip
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    head_batches = heads * batch
    total = num_m_blocks * head_batches
    if workers > total:
        raise ValueError(f"workers={workers} exceeds the {total} tiles")
    # m_rank 0 is the last query block (the longest tile); the kernel reverses it back.
    costs = tile_costs(
        num_m_blocks=num_m_blocks, tile_m=tile_m, tile_n=tile_n, seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
    )  # fmt: skip
    group = l2_group(4 * seqlen_k * head_dim, head_batches)  # K and V, 16-bit
    order = (grouped_tile(t, num_m_blocks, head_batches, group) for t in range(total))
    lists, loads = deal_tiles(order, costs, num_m_blocks, workers)
    tiles = np.fromiter((t for lst in lists for t in lst), dtype=np.int32, count=total)
    starts = np.zeros(workers + 1, dtype=np.int32)
    np.cumsum([len(lst) for lst in lists], out=starts[1:])
    tiles.setflags(write=False)
    starts.setflags(write=False)
    return TileLists(tiles, starts, max(loads) / (sum(loads) / workers))
