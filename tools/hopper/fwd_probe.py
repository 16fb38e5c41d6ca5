"""Pieces the forward A/B probes under benchmarks/results/h200/ share (sessions 37-39): the
flash-attn rule's verdict on one (out, lse) as a line, with a repeat check, the sweep's inputs
for one length, and a timed comparison of contenders at one length.

    verdict = rule_verdict("W144 full", out, lse, *references(q, k, v, causal))
    print(check_line("W144 full", lambda: candidate(q, k, v), *references(q, k, v, causal)))
    q, k, v = sweep_qkv(seqlen, heads=32, head_dim=96)
    time_contenders({"A": shipped, "B": candidate}, rounds=10, label="fwd d96 full 8192")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from dash_attn.reference.attention import attention_ref
from dash_attn.testing import assert_close_to_ref
from tools.hopper.interleaved import medians_line, ratio_line, run_rounds

Pair = tuple[torch.Tensor, torch.Tensor]


def references(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[Pair, Pair]:
    """(out, lse) in fp32 and the same computation in the inputs' dtype: the rule's two sides."""
    return attention_ref(q, k, v, causal=causal), attention_ref(
        q, k, v, causal=causal, upcast=False
    )


def rule_verdict(tag: str, out: torch.Tensor, lse: torch.Tensor, ref: Pair, same: Pair) -> str:
    """``meets the rule`` or ``FAILS: <the first 300 characters of why>`` for out and lse."""
    try:
        assert_close_to_ref(f"out {tag}", out, ref[0], same[0], atol=1e-3)
        assert_close_to_ref(f"lse {tag}", lse, ref[1], same[1], atol=1e-3)
    except AssertionError as err:
        return f"FAILS: {str(err)[:300]}"
    return "meets the rule"


def check_line(tag: str, run: Callable[[], Pair], ref: Pair, same: Pair) -> str:
    """``check <tag>: <rule verdict>; repeats bitwise <bool>`` for a contender's ``run`` (its
    (out, lse)), called twice."""
    out, lse = run()
    again = run()
    repeats = torch.equal(out, again[0]) and torch.equal(lse, again[1])
    return f"check {tag}: {rule_verdict(tag, out, lse, ref, same)}; repeats bitwise {repeats}"


def sweep_qkv(
    seqlen: int, *, heads: int, head_dim: int, tokens: int = 16384, device: str = "cuda"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sweep's bf16 q, k, v at this length (batch = tokens / seqlen), seeded by it."""
    gen = torch.Generator(device=device).manual_seed(seqlen)
    shape = (max(1, tokens // seqlen), seqlen, heads, head_dim)
    return tuple(  # type: ignore[return-value]
        torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(3)
    )


def time_contenders(fns: Mapping[str, Callable[[], object]], rounds: int, label: str) -> None:
    """Warm every contender up, run the interleaved rounds and print the medians and each
    contender's ratio against the first one."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = run_rounds(fns, rounds)
    print(f"{label}:", medians_line(times))
    base, *others = fns
    for key in others:
        print(ratio_line(times, base, key), flush=True)
