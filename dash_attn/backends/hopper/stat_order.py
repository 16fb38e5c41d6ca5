"""The fragment order of the backward's per-row statistics (LSE2 and delta, ``stat_frag``).

The backward's S^T accumulator (KV rows x Q rows, the WGMMA m64nN C fragment) gives lane ``l``
of every warp the Q columns ``8 j + 2 (l % 4) + c`` (j < block_m / 8, c < 2): a quarter of the
tile's rows, in pairs 8 apart, which in row order a thread reads as block_m / 8 separate 8-byte
loads per statistic and step. In fragment order the quarter of lane class ``q = l % 4`` is in
register order ``r = 2 j + c``, in 16-byte chunks, and the four quarters' chunks alternate::

    position(row) = tile * block_m + 16 (r // 4) + 4 q + r % 4
    where row = tile * block_m + 8 j + 2 q + c and r = 2 j + c

A thread reads its quarter with block_m / 16 16-byte loads, and the four lane classes' k-th
loads cover 64 contiguous bytes: one shared-memory wavefront per warp. (Quarters stored one
after the other would put the four chunks of a load 128 bytes apart at 128-row tiles, in the
same banks: four wavefronts, and the kernel measured 0.80-0.84x at hd 64, session 15.)
block_m / 4 is a multiple of 4 for the 64, 80 and 128-row tiles. The preprocess writes this
order (``BwdPreprocess`` with ``stat_block``); the Triton path reorders its rows with
``bwd_launch.reorder_rows``.

Worked example (block_m 128): row 300 is tile 2, local row 44 = 8 * 5 + 2 * 2 + 0, so
j = 5, q = 2, c = 0 and r = 10: position 256 + 16 * 2 + 4 * 2 + 2 = 298; lane 6 (q = 2) finds
it in register 10, the third element of its third 16-byte load (floats 296..299 of the tile).

Pure Python (the functions also work on CuTe-DSL integers): no torch, cutlass or triton.
"""
from __future__ import annotations

from typing import TypeVar

Index = TypeVar("Index")  # int, or a CuTe-DSL Int32 inside a kernel


def position(row: Index, block_m: int) -> Index:
    """Where the statistic of Q ``row`` lives in fragment order (rows are per batch x head,
    padded to whole tiles)."""
    local = row % block_m
    reg = (local // 8) * 2 + local % 2
    return row - local + (reg // 4) * 16 + ((local // 2) % 4) * 4 + reg % 4


def column(lane: int, index: int) -> int:
    """The S^T column (local Q row) of accumulator element ``index`` of ``lane``: element
    ``c + 2 r + 4 j`` (c: column pair bit, r: row half, j: 8-column group)."""
    return 8 * (index // 4) + 2 * (lane % 4) + index % 2


def register(index: int) -> int:
    """The register (of the thread's block_m / 4) that holds the statistic of accumulator
    element ``index``."""
    return (index // 4) * 2 + index % 2


def chunk_offset(lane: int, chunk: int) -> int:
    """Float offset in the tile of the ``chunk``-th 16-byte load of ``lane`` (its registers
    4 chunk .. 4 chunk + 3)."""
    return 16 * chunk + 4 * (lane % 4)
