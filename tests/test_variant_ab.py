"""tools/hopper/variant_ab.py on the CPU: its configs and arguments (the A/B itself needs an
sm_90 GPU)."""

from __future__ import annotations

import doctest

import pytest

from tools.hopper import variant_ab


def test_configs_take_the_sweep_shapes() -> None:
    cfg = variant_ab.parse_config("2048:causal", 128)
    assert cfg == variant_ab.Config(2048, True, 8, 16, 16)
    assert cfg.label == "causal 2048 b8 h16/16"
    # Lengths that are not powers of two (tails) run three sequences; GQA by kv heads.
    assert variant_ab.parse_config("1000:full:8", 64) == variant_ab.Config(1000, False, 3, 32, 8)
    assert variant_ab.parse_config("16384:full", 64).batch == 1


@pytest.mark.parametrize("text", ["1024", "1024:window", "0:full", "1024:full:5", "a:full"])
def test_bad_configs_name_the_config(text: str) -> None:
    with pytest.raises(ValueError, match=text.split(":")[0] if text != "a:full" else "invalid"):
        variant_ab.parse_config(text, 64)


def test_arguments() -> None:
    args = variant_ab.parse_args(["--suffix", "_tma", "--rounds", "5", "1024:full", "512:causal"])
    assert args.suffix == "_tma" and args.rounds == 5 and args.bits == "same"
    assert [c.seqlen for c in args.configs] == [1024, 512]
    with pytest.raises(SystemExit):
        variant_ab.parse_args(["1024:full"])  # a suffix or a replacement is required
    with pytest.raises(SystemExit):
        variant_ab.parse_args(["--replace", "_st", "1024:full"])  # OLD=NEW
    assert args.variant_sm_margin == 0
    args = variant_ab.parse_args(["--suffix", "_x", "--variant-sm-margin", "4", "1024:full"])
    assert args.variant_sm_margin == 4
    with pytest.raises(SystemExit):
        variant_ab.parse_args(["--suffix", "_x", "--variant-sm-margin", "-1", "1024:full"])


def test_other_tiles() -> None:
    """--tiles alone names a variant: the shipped kernel on a plan with those tiles."""
    args = variant_ab.parse_args(["--tiles", "64x128", "--bits", "rule", "4096:full"])
    assert args.tiles == (64, 128) and args.suffix is None
    assert variant_ab.variant_name("t128_kp", args) == "t128_kp"
    assert variant_ab.variant_label(args) == "<shipped> on 64x128 tiles"
    args = variant_ab.parse_args(["--tiles", "80X128", "--suffix", "_x", "4096:full"])
    assert args.tiles == (80, 128)
    assert variant_ab.variant_label(args) == "<shipped>_x on 80x128 tiles"
    for bad in ("64", "64x", "0x128", "64x128x2", "ax128"):
        with pytest.raises(SystemExit):
            variant_ab.parse_args(["--tiles", bad, "4096:full"])
    with pytest.raises(SystemExit):  # its own plan either way: one at a time
        variant_ab.parse_args(["--tiles", "64x128", "--variant-sm-margin", "4", "4096:full"])


def test_backward_tiles_are_restored() -> None:
    """bwd_probe.backward_tiles: the plan's tiles inside, the shipped ones after (no GPU)."""
    pytest.importorskip("torch")
    from dash_attn.backends import hopper
    from tools.hopper.bwd_probe import backward_tiles

    shipped, causal = hopper.bwd_tiles(64, False), hopper.bwd_tiles(64, True)
    with backward_tiles(64, False, 64, 128):
        inside = hopper.bwd_tiles(64, False)
        assert (inside.block_m, inside.block_n) == (64, 128)
        assert inside.num_stages == shipped.num_stages
        assert hopper.bwd_tiles(64, True) == causal  # the other mask's kept
    assert hopper.bwd_tiles(64, False) == shipped


def test_variant_names() -> None:
    args = variant_ab.parse_args(["--replace", "_st=", "--suffix", "_x", "8192:full"])
    assert variant_ab.variant_name("t128_kp_w2_st", args) == "t128_kp_w2_x"
    assert variant_ab.variant_label(args) == "<shipped>.replace('_st', '')_x"
    # An empty suffix alone is an A/A.
    args = variant_ab.parse_args(["--suffix", "", "8192:full"])
    assert variant_ab.variant_name("t128_kp", args) == "t128_kp"
    with pytest.raises(ValueError, match="not in the shipped variant"):
        variant_ab.variant_name("sw_fs", variant_ab.parse_args(["--replace", "_st=", "1:full"]))


def test_worked_examples() -> None:
    assert doctest.testmod(variant_ab).failed == 0
