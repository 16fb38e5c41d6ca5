"""tools/hopper/backwards_for_ncu.py: its shape argument (CPU; the runs need a GPU)."""

from __future__ import annotations

import pytest

from tools.hopper import backwards_for_ncu


def test_parse_shape_reads_batch_seqlen_heads_head_dim_and_mask() -> None:
    assert backwards_for_ncu.parse_shape("16:1024:8:256:causal") == (16, 1024, 8, 256, True)
    assert backwards_for_ncu.parse_shape("2:8192:8:192:full") == (2, 8192, 8, 192, False)


@pytest.mark.parametrize("text", ["16:1024:8:256", "16:1024:8:256:sliding", "a:1:1:64:full"])
def test_parse_shape_names_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match="shape"):
        backwards_for_ncu.parse_shape(text)


def test_parse_runs_reads_mode_schedule_and_variant_suffix() -> None:
    runs = backwards_for_ncu.parse_runs("det:auto,nondet:descending,nondet:auto:_kf0")
    assert runs == [(True, "auto", ""), (False, "descending", ""), (False, "auto", "_kf0")]


@pytest.mark.parametrize("text", ["det", "maybe:auto", "nondet:", "det:auto,,", "det:auto:_a:_b"])
def test_parse_runs_names_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match="run"):
        backwards_for_ncu.parse_runs(text)
