"""How evenly the per-tile causal forward's launch order fills the SMs: a cost model.

The hopper forward at head dims 192 and 256 (and 128 above 8192 keys) launches a CTA per
query tile, one CTA per SM (its shared memory), and the GPU's block scheduler starts the
next CTA of the launch order on the first SM that is free. Under a causal mask the tiles
differ in length, so the order decides how ragged the end of the launch is. This replays
that scheduler with known tile costs (``fwd_tiles.tile_costs``: key blocks + 1, as
``causal_tile_lists`` counts them) for two orders:

``heads``    the shipped one: each (batch, head) pair's tiles in turn, longest first;
``grouped``  ``lpt_order`` (``fwd_tiles.grouped_tile``): L2 groups of pairs, longest tiles
             first within a group, the pairs fastest.

and prints, per shape, the busiest SM's load over the mean for each (1.0 is a perfect fill)
and the makespan ratio, the gain the model predicts for ``lpt_order``. The model knows
nothing of L2 hits, the tile's start and end overlapping its neighbours, or clocks: it
says where the order can matter, the GPU says by how much (benchmarks/NOTES.md, item 210).

    python3 tools/hopper/launch_order_model.py          # the sweep's causal shapes

Worked example: 3 query tiles of 128 rows under 128 keys per block (costs 4, 3, 2 by
m_rank), 2 pairs, 2 SMs. ``heads`` starts the tiles (m_rank, pair) (0, 0), (1, 0), (2, 0),
(0, 1), ...: the second pair's longest tile starts fourth and one SM ends with 10 against 8;
``grouped`` starts both pairs' longest first and both end at 9:

>>> costs = tile_costs(num_m_blocks=3, tile_m=128, tile_n=128, seqlen_q=384, seqlen_k=384)
>>> costs
[4, 3, 2]
>>> [round(busiest_over_mean(order, costs, 3, 2), 3) for order in
...  (heads_order(3, 2), grouped_order(3, 2, group=2))]
[1.111, 1.0]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dash_attn.backends.hopper import FWD_PERSISTENT_MAX_SEQLEN_K
from dash_attn.backends.hopper.fwd_tiles import deal_tiles, grouped_tile, l2_group, tile_costs


def heads_order(num_m_blocks: int, head_batches: int) -> list[int]:
    """The shipped launch order's tile ids (``m_rank + num_m_blocks * pair``)."""
    return list(range(num_m_blocks * head_batches))


def grouped_order(num_m_blocks: int, head_batches: int, group: int) -> list[int]:
    """``lpt_order``'s tile ids in launch order."""
    return [
        grouped_tile(t, num_m_blocks, head_batches, group)
        for t in range(num_m_blocks * head_batches)
    ]


def busiest_over_mean(
    order: Sequence[int], costs: Sequence[int], num_m_blocks: int, sms: int
) -> float:
    """The busiest SM's load over the mean when each tile of ``order`` starts on the SM that
    is free first (one CTA per SM: ``fwd_tiles.deal_tiles``)."""
    _, loads = deal_tiles(order, costs, num_m_blocks, sms)
    return max(loads) / (sum(loads) / sms)


def main(argv: list[str]) -> int:
    del argv
    sms, tokens = 132, 16384
    print("head_dim seqlen pairs group heads grouped gain")
    # The sweep's causal shapes that run the per-tile kernel (hidden 2048 at 128 and 256, 3072
    # at 192: 16 heads; 16k tokens); the persistent kernel deals its own tile lists.
    persistent_up_to = FWD_PERSISTENT_MAX_SEQLEN_K["causal"]
    for head_dim, tile_n, heads in ((256, 64, 8), (192, 96, 16), (128, 128, 16)):
        for seqlen in (1024, 2048, 4096, 8192, 16384):
            if seqlen <= persistent_up_to.get(head_dim, 0):
                continue
            num_m = -(-seqlen // 128)
            pairs = heads * (tokens // seqlen)
            costs = tile_costs(
                num_m_blocks=num_m, tile_m=128, tile_n=tile_n, seqlen_q=seqlen, seqlen_k=seqlen
            )
            group = l2_group(4 * seqlen * head_dim, pairs)
            shipped = busiest_over_mean(heads_order(num_m, pairs), costs, num_m, sms)
            grouped = busiest_over_mean(grouped_order(num_m, pairs, group), costs, num_m, sms)
            print(
                f"{head_dim} {seqlen} {pairs} {group} {shipped:.3f} {grouped:.3f} "
                f"{shipped / grouped:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
