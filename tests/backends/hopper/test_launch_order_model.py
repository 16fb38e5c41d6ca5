"""tools/hopper/launch_order_model.py: the per-tile causal forward's launch orders under the
GPU's first-free-SM block scheduler (NOTES item 210). Pure Python: no cutlass, no GPU."""

from __future__ import annotations

import doctest

import pytest

import tools.hopper.launch_order_model as model
from dash_attn.backends.hopper.fwd_tiles import tile_costs


def test_docstring_example() -> None:
    assert doctest.testmod(model).failed == 0


def test_one_sm_is_always_a_perfect_fill() -> None:
    costs = tile_costs(num_m_blocks=5, tile_m=128, tile_n=64, seqlen_q=600, seqlen_k=600)
    for order in (model.heads_order(5, 3), model.grouped_order(5, 3, group=2)):
        assert model.busiest_over_mean(order, costs, 5, 1) == pytest.approx(1.0)


def test_grouped_order_evens_out_the_hd256_causal_sweep_shapes() -> None:
    """At hd 256 causal 4k (32 pairs of 32 tiles on 132 SMs) the shipped order leaves the
    busiest SM >= 10% over the mean, since the last pair's longest tile starts near the end;
    the grouped order starts every group's longest tiles first and fills to within 1%."""
    num_m, pairs = 32, 32
    costs = tile_costs(num_m_blocks=num_m, tile_m=128, tile_n=64, seqlen_q=4096, seqlen_k=4096)
    shipped = model.busiest_over_mean(model.heads_order(num_m, pairs), costs, num_m, 132)
    grouped = model.busiest_over_mean(model.grouped_order(num_m, pairs, group=4), costs, num_m, 132)
    assert shipped > 1.10
    assert grouped < 1.01
