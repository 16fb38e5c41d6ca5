"""tools/hopper/polled_cast_ab.py on the CPU: its configs and arguments (the A/B itself needs an
sm_90 GPU)."""

from __future__ import annotations

import doctest

import pytest

from tools.hopper import polled_cast_ab


def test_configs_are_on_the_sweep_grid() -> None:
    cfg = polled_cast_ab.parse_config("256:4096:full")
    assert (cfg.headdim, cfg.seqlen, cfg.causal, cfg.batch, cfg.heads) == (256, 4096, False, 4, 8)
    assert polled_cast_ab.parse_config("128:16384:causal").batch == 1


@pytest.mark.parametrize("text", ["96:2048", "80:2048:full", "64:3000:full", "64:2048:sliding"])
def test_bad_configs_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        polled_cast_ab.parse_config(text)


def test_arguments() -> None:
    args = polled_cast_ab.parse_args(["--rounds", "5", "96:1024:full", "192:8192:causal"])
    assert args.rounds == 5 and args.repeats == 3
    assert [c.label for c in args.configs] == ["d96 full 1024 b16 h32", "d192 causal 8192 b2 h16"]


def test_doctests() -> None:
    assert doctest.testmod(polled_cast_ab).failed == 0
