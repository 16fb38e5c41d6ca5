"""The persistent causal forward's tile lists (``hopper.fwd_tiles``): every tile once, balanced,
longest first within L2-sized groups of heads. Pure numpy: runs without cutlass or a GPU."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from dash_attn.backends.hopper import fwd_tiles
from dash_attn.backends.hopper.fwd_tiles import causal_key_blocks, causal_tile_lists

# (head dim, rows per query tile, seqlen, heads): the benchmark's causal shapes (16384 tokens,
# hidden 2048, the tile the hopper forward runs there), and two odd ones.
SHAPES = [
    (64, 192, 2048, 256), (64, 192, 4096, 128), (64, 192, 8192, 64), (64, 192, 16384, 32),
    (64, 128, 1024, 512), (128, 128, 1024, 256), (128, 128, 2048, 128), (128, 128, 4096, 64),
    (128, 128, 8192, 32), (128, 128, 16384, 16), (128, 128, 131072, 1), (64, 192, 4099, 7),
]  # fmt: skip


def _lists(hd: int, tile_m: int, seqlen: int, heads: int, workers: int = 132, **kw):
    num_m = -(-seqlen // tile_m)
    args = dict(
        num_m_blocks=num_m, heads=heads, batch=1, tile_m=tile_m, tile_n=128, seqlen_q=seqlen,
        seqlen_k=seqlen, head_dim=hd, workers=min(workers, num_m * heads),
    )  # fmt: skip
    args.update(kw)
    return causal_tile_lists(**args), args


def test_docstring_example() -> None:
    assert doctest.testmod(fwd_tiles).failed == 0


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d{}m{}s{}h{}".format(*s))
def test_every_tile_once_and_balanced(shape) -> None:
    lists, args = _lists(*shape)
    total = args["num_m_blocks"] * args["heads"]
    assert lists.tiles.dtype == np.int32 and lists.starts.dtype == np.int32
    assert sorted(lists.tiles.tolist()) == list(range(total))
    assert lists.starts[0] == 0 and lists.starts[-1] == total
    assert len(lists.starts) == args["workers"] + 1 and np.all(np.diff(lists.starts) >= 0)
    assert not lists.tiles.flags.writeable and not lists.starts.flags.writeable
    # Balance of the cost model: the busiest CTA within 3% of the mean where every CTA has
    # several tiles (the benchmark's shapes: the 7-head odd one has 2-3 per CTA).
    if total >= 8 * args["workers"]:
        assert lists.imbalance <= 1.03, lists.imbalance


def test_longest_first_within_each_l2_group() -> None:
    """The first wave of CTAs takes the group's longest tiles, and the tiles of one CTA run in
    the order of the global sequence: group by group, longest first inside a group."""
    hd, tile_m, seqlen, heads = 128, 128, 4096, 64
    lists, args = _lists(hd, tile_m, seqlen, heads)
    num_m = args["num_m_blocks"]
    group = fwd_tiles.l2_group(4 * seqlen * hd, heads)
    assert group == 8  # 2 MiB of K and V per head, 16 MiB per group

    def rank(tile: int) -> tuple[int, int, int]:
        m_rank, pair = tile % num_m, tile // num_m
        return (pair // group, m_rank, pair % group)

    firsts = [int(lists.tiles[lists.starts[w]]) for w in range(args["workers"])]
    # 132 CTAs take the first 132 tiles of the order: m_rank 0-16 of group 0's 8 heads.
    assert sorted(rank(t) for t in firsts) == [(0, r // group, r % group) for r in range(132)]
    for w in range(args["workers"]):
        mine = lists.tiles[lists.starts[w] : lists.starts[w + 1]].tolist()
        assert [rank(t) for t in mine] == sorted(rank(t) for t in mine)


def test_key_blocks_follow_the_bottom_right_diagonal() -> None:
    assert causal_key_blocks(0, 128, 128, 512, 512) == 1
    assert causal_key_blocks(3, 128, 128, 512, 512) == 4
    # Sq < Sk: the first query rows already see seqlen_k - seqlen_q keys.
    assert causal_key_blocks(0, 128, 128, 256, 1024) == 7
    # Sq > Sk: the first query rows see no key.
    assert causal_key_blocks(0, 128, 128, 1024, 256) == 0
    assert causal_key_blocks(7, 128, 128, 1024, 256) == 2


def test_same_shape_same_lists_and_bad_sizes_raise() -> None:
    a, _ = _lists(64, 192, 4096, 128)
    b, _ = _lists(64, 192, 4096, 128)
    assert a is b  # made once per shape
    with pytest.raises(ValueError, match="workers=9 exceeds the 8 tiles"):
        causal_tile_lists(
            num_m_blocks=4, heads=2, batch=1, tile_m=128, tile_n=128, seqlen_q=512,
            seqlen_k=512, head_dim=64, workers=9,
        )  # fmt: skip
    with pytest.raises(ValueError, match="heads must be >= 1"):
        _lists(64, 128, 512, 0)
    assert math.isfinite(a.imbalance)


@pytest.mark.parametrize(
    ("num_m", "head_batches", "group"), [(1, 1, 1), (3, 3, 2), (8, 5, 5), (32, 32, 4), (7, 10, 3)]
)
def test_grouped_tile_is_the_dealing_order(num_m: int, head_batches: int, group: int) -> None:
    """lpt_order's launch order (``grouped_tile``, computed by the per-tile kernel) is the order
    ``causal_tile_lists`` deals tiles in: L2 groups of pairs, longest first within a group, the
    pairs fastest; every tile once (a ragged last group included)."""
    dealt = [
        m_rank + num_m * pair
        for first in range(0, head_batches, group)
        for m_rank in range(num_m)
        for pair in range(first, min(first + group, head_batches))
    ]
    launched = [
        fwd_tiles.grouped_tile(t, num_m, head_batches, group) for t in range(num_m * head_batches)
    ]
    assert launched == dealt
    assert sorted(launched) == list(range(num_m * head_batches))
