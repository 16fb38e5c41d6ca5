"""The grid of ``dash-attn bench`` (``dash_attn.bench.configs``)."""

from __future__ import annotations

import argparse
import doctest

import pytest

from dash_attn.bench import configs, main

from .helpers import parse_bench_args


def test_defaults_are_the_paper_grid() -> None:
    args = parse_bench_args([])
    cases = configs.resolve_cases(args)
    assert len(cases) == 24 and configs.is_default_grid(args)
    assert {(c.batch * c.seqlen, c.heads * c.headdim) for c in cases} == {(16384, 2048)}
    assert (args.mode, args.warmup, args.rep, args.dtype) == ("bwd", 25.0, 100.0, "bf16")
    assert args.determinism and args.model and not args.e2e
    # Grouped by (head dim, mask), seqlen growing: one compile per group; hdim 128 causal first.
    keys = [(-c.headdim, not c.causal, c.seqlen) for c in cases]
    assert keys == sorted(keys) and (cases[0].headdim, cases[0].causal) == (128, True)


def test_grid_options_and_quick() -> None:
    args = parse_bench_args(["--headdims", "128", "--seqlens", "1024,4096", "--masks", "causal"])
    assert [(c.headdim, c.seqlen, c.causal) for c in configs.resolve_cases(args)] == [
        (128, 1024, True),
        (128, 4096, True),
    ]
    quick = parse_bench_args(["--quick"])
    assert [c.seqlen for c in configs.resolve_cases(quick)][:2] == list(configs.QUICK_SEQLENS)
    assert (quick.warmup, quick.rep, quick.determinism_repeats) == (
        main.QUICK_WARMUP_MS,
        main.QUICK_REP_MS,
        3,
    )


def test_hidden_per_head_dim() -> None:
    """``--hidden 2048,96:3072`` sweeps head dim 96 at 32 heads beside 64 and 128 at 2048."""
    args = parse_bench_args(
        [
            "--headdims",
            "64,96,128",
            "--seqlens",
            "2048",
            "--masks",
            "full",
            "--hidden",
            "2048,96:3072",
        ]
    )
    cases = configs.resolve_cases(args)
    assert {(c.headdim, c.heads, c.batch) for c in cases} == {
        (64, 32, 8),
        (96, 32, 8),
        (128, 16, 8),
    }
    assert str(args.hidden) == "2048,96:3072" and not configs.is_default_grid(args)
    assert configs.parse_hidden(" 4096 ") == configs.HiddenSizes(4096)
    assert doctest.testmod(configs).failed == 0  # HiddenSizes' worked example
    for bad in ("96:3072", "2048,4096", "2048,x:3", "0", "2048,96:0"):
        with pytest.raises(argparse.ArgumentTypeError, match="--hidden"):
            configs.parse_hidden(bad)
    with pytest.raises(ValueError, match="--hidden 2048 is not a multiple of head dim 96"):
        configs.resolve_cases(parse_bench_args(["--headdims", "96"]))
