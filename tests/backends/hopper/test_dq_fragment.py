"""The fragment-order dQ layout (``hopper/dq_fragment.py``): a bijection between the MMA
threads' registers and the tile's elements, whose inverse is what the cast kernel evaluates.
(That it is the MMA's own layout is checked when a kernel compiles: ``HopperAttnBwd``
compares it with the tiled MMA's coordinates at trace time.)"""

from __future__ import annotations

import pytest

from dash_attn.backends.hopper import dq_fragment

# (block_m, head_dim) of the hopper backward: hd 128 causal and full, hd 96, hd 64.
TILES = [(64, 128), (80, 128), (64, 96), (128, 64)]


@pytest.mark.parametrize("block_m,head_dim", TILES)
def test_fragment_order_is_a_bijection_with_its_inverse(block_m: int, head_dim: int) -> None:
    registers = dq_fragment.registers(block_m, head_dim)
    assert registers * dq_fragment.MMA_THREADS == block_m * head_dim
    offsets, coords = set(), set()
    for thread in range(dq_fragment.MMA_THREADS):
        for index in range(registers):
            row, col = dq_fragment.fragment_coords(block_m, head_dim, thread, index)
            assert 0 <= row < block_m and 0 <= col < head_dim
            offset = dq_fragment.fragment_offset(block_m, head_dim, thread, index)
            assert dq_fragment.tile_offset(block_m, head_dim, row, col) == offset
            offsets.add(offset)
            coords.add((row, col))
    assert offsets == set(range(block_m * head_dim))
    assert len(coords) == block_m * head_dim


def test_worked_example_and_16_byte_chunks() -> None:
    # The module docstring's example.
    assert dq_fragment.fragment_coords(64, 128, 37, 6) == (25, 10)
    assert dq_fragment.fragment_offset(64, 128, 37, 6) == 662
    # With 80 rows the accumulator is dQ^T: the same register of thread 128 + 37.
    assert dq_fragment.fragment_coords(80, 128, 165, 6) == (10, 89)
    assert dq_fragment.fragment_offset(80, 128, 165, 6) == 5782
    assert dq_fragment.tile_offset(80, 128, 10, 89) == 5782
    # A thread's registers 4j..4j+3 are contiguous and 16-byte aligned; a warp's chunk j covers
    # 512 contiguous bytes (32 threads x 16 B).
    for j in range(8):
        starts = [dq_fragment.fragment_offset(64, 128, t, 4 * j) for t in range(32)]
        assert starts == list(range(512 * j, 512 * j + 128, 4))
        assert [dq_fragment.fragment_offset(64, 128, 5, 4 * j + e) for e in range(4)] == [
            starts[5] + e for e in range(4)
        ]
    # Warpgroup 1 holds the right half of the head dim (64- and 80-row tiles), the lower rows
    # (128); with 80 rows a thread's neighbouring registers are neighbouring Q rows.
    assert dq_fragment.fragment_coords(64, 128, 128, 0) == (0, 64)
    assert dq_fragment.fragment_coords(80, 128, 128, 0) == (0, 64)
    assert dq_fragment.fragment_coords(80, 128, 128, 1) == (1, 64)
    assert dq_fragment.fragment_coords(128, 64, 128, 0) == (64, 0)


@pytest.mark.parametrize("block_m,head_dim", TILES)
def test_each_warpgroup_holds_one_contiguous_half(block_m: int, head_dim: int) -> None:
    # What lets each warpgroup hand its half to the dQ writer on its own: one flat bulk
    # reduce of 16-byte aligned, contiguous memory per warpgroup.
    half = dq_fragment.half_size(block_m, head_dim)
    assert half * 4 % 16 == 0
    registers = dq_fragment.registers(block_m, head_dim)
    for wg in range(2):
        threads = range(128 * wg, 128 * (wg + 1))
        offsets = {
            dq_fragment.fragment_offset(block_m, head_dim, t, i)
            for t in threads
            for i in range(registers)
        }
        assert offsets == set(range(wg * half, (wg + 1) * half))


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="block_m must be 64, 80 or 128"):
        dq_fragment.wg_split(96)
    with pytest.raises(ValueError, match="out of range"):
        dq_fragment.fragment_coords(64, 128, 256, 0)
    with pytest.raises(ValueError, match="out of range"):
        dq_fragment.fragment_coords(64, 128, 0, 32)
