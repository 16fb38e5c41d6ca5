"""Where each Q row's LSE2 and delta lie in memory for the backward kernels with ``stat_vec``.

An MMA thread of the backward holds, per step, the S^T accumulator elements of the Q columns
``8 j + 2 c + e`` (``c = lane % 4``, ``j < block_m / 8``, ``e < 2``: the WGMMA accumulator's
layout), so it needs ``block_m / 4`` LSE2 values and as many delta values per step. In row
order they come in pairs, one 64-bit shared load each (``block_m / 8`` loads per statistic).
In *lane order* the preprocess writes them grouped by ``c``: group ``c`` holds the rows
``8 j + 2 c + e`` at ``2 j + e``, so the thread reads its group with ``block_m / 16`` 128-bit
loads. Each group is followed by ``STAT_PAD`` unused floats, so that the four groups a warp
reads at once start in different bank quads (no bank conflicts).

Worked example, ``block_m = 16``: group length 8, tile length 32;
rows 0, 1, 8, 9 at 0-3 (c = 0), rows 2, 3, 10, 11 at 8-11 (c = 1), ..., rows 6, 7, 14, 15 at
24-27 (c = 3). Tile ``t``'s rows follow at ``32 t``.

Plain integer arithmetic: the same functions serve the host (tests) and the kernels (CuTe-DSL
``Int32`` values).
"""

from __future__ import annotations

from typing import Any

# Unused floats after each lane's group: 16 bytes, so that group c starts in bank quad
# (block_m / 16 + 1) * c mod 8, distinct for c < 4 at block_m = 64, 80 and 128.
STAT_PAD = 4


def stat_group(block_m: int) -> int:
    """Floats per lane group: the thread's ``block_m / 4`` values and the padding."""
    return block_m // 4 + STAT_PAD


def stat_tile_len(block_m: int) -> int:
    """Floats per Q tile in lane order (the TMA box of one step's LSE2 or delta)."""
    return 4 * stat_group(block_m)


def stat_slot(row: Any, block_m: int) -> Any:
    """Position of Q-tile row ``row`` (``0 <= row < block_m``) within its tile in lane order."""
    return (row % 8) // 2 * stat_group(block_m) + row // 8 * 2 + row % 2


def stat_position(row: Any, block_m: int) -> Any:
    """Position of Q row ``row`` (any tile) in a (batch x head)'s lane-order row."""
    return row // block_m * stat_tile_len(block_m) + stat_slot(row % block_m, block_m)


def check_block_m(block_m: int) -> None:
    """Lane order needs whole 128-bit loads per thread: ``block_m`` a multiple of 16."""
    if block_m % 16:
        raise ValueError(f"lane-ordered statistics need block_m % 16 == 0, got {block_m}")
