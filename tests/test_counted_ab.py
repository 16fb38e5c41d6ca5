"""tools/hopper/counted_ab.py on the CPU: its arguments (the A/B itself needs an sm_90 GPU)."""

from __future__ import annotations

import pytest

from tools.hopper import counted_ab


def test_arguments_take_the_sweep_shapes() -> None:
    argv = ["--headdim", "128", "--rounds", "5", "4096:full", "1000:causal:4"]
    args = counted_ab.parse_args(argv)
    assert (args.headdim, args.rounds, args.rule_max) == (128, 5, 4096)
    assert [(c.seqlen, c.causal, c.batch, c.heads, c.kv_heads) for c in args.configs] == [
        (4096, False, 4, 16, 16), (1000, True, 3, 16, 4),
    ]  # fmt: skip


@pytest.mark.parametrize("argv", [["--rounds", "0", "1024:full"], [], ["1024:window"]])
def test_bad_arguments_exit(argv: list[str]) -> None:
    with pytest.raises((SystemExit, ValueError)):
        counted_ab.parse_args(argv)
