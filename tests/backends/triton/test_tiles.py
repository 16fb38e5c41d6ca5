"""The Triton backward's tile table and the tile spelling the tools use (pure Python)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dash_attn.backends.triton.tiles import _BACKWARD_TILES as _DEFAULTS
from dash_attn.backends.triton.tiles import BackwardTiles, backward_tiles, parse_tiles


def test_pipeline_depth_follows_the_dq_reduction() -> None:
    # Head dim 64 pipelines two stages with TMA but one with atomics (which spill at two); the
    # block sizes, and with them the schedule, do not depend on the reduction.
    tma, atomic = backward_tiles(64, "tma"), backward_tiles(64, "atomic")
    assert (tma.num_stages, atomic.num_stages) == (2, 1)
    assert (tma.block_m, tma.block_n) == (atomic.block_m, atomic.block_n)
    assert tma.atomic_num_stages is None  # resolved tiles carry one depth only
    # Head dim 128: three stages with TMA; two with atomics, where three would not fit in an
    # A100's shared memory. The step tables are read ahead either way.
    tma, atomic = backward_tiles(128, "tma"), backward_tiles(128, "atomic")
    assert (tma.num_stages, atomic.num_stages) == (3, 2)
    assert tma.tables_ahead and atomic.tables_ahead


def test_parse_tiles_options() -> None:
    assert parse_tiles("64x128w4s3a") == BackwardTiles(64, 128, 4, 3, tables_ahead=True)
    assert parse_tiles("64x64w8s1r") == BackwardTiles(64, 64, 8, 1, release_after_qk=True)
    both = parse_tiles("64x128w8s2ar")
    assert (both.tables_ahead, both.release_after_qk, both.label) == (True, True, "64x128w8s2ar")


@pytest.mark.parametrize(
    "text, message",
    [
        ("64x128w8", "not BMxBNwWARPSsSTAGES"),
        ("64x128w8s2x", "not BMxBNwWARPSsSTAGES"),
        ("64x128w8s2ra", "not BMxBNwWARPSsSTAGES"),
        ("128x64w8s2", "BN must be a multiple of BM"),
    ],
)
def test_bad_tiles_say_what_is_expected(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tiles(text)


def test_tiles_label_round_trips() -> None:
    for tiles in _DEFAULTS.values():
        assert parse_tiles(tiles.label) == replace(tiles, atomic_num_stages=None)


def test_unsupported_head_dim_is_not_implemented() -> None:
    with pytest.raises(NotImplementedError, match="headdim must be one of"):
        backward_tiles(80)
