"""tools/hopper/bwd_probe.py on the CPU: the reference itself meets the rule, a perturbed
gradient fails it, and grads() leaves the graph for another call."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tools.hopper import bwd_probe  # noqa: E402


def test_rule_accepts_the_reference_and_rejects_a_perturbed_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (
        torch.randn(1, 37, 2, 16, generator=gen, dtype=torch.bfloat16) for _ in range(4)
    )
    ref, same = bwd_probe.grad_references(q, k, v, dout, causal=True)
    assert bwd_probe.grad_verdict("same", same, ref, same) == "rule ok"
    bad = [g.clone() for g in same]
    bad[1][0, 5, 1, 3] += 1.0
    assert bwd_probe.grad_verdict("bad", bad, ref, same).startswith("FAILS dk bad")


def test_grads_keeps_the_graph() -> None:
    leaves = [torch.randn(1, 5, 1, 8, requires_grad=True) for _ in range(3)]
    out = (leaves[0] * leaves[1] + leaves[2]).sum(-1, keepdim=True).expand(1, 5, 1, 8)
    dout = torch.ones_like(out)
    first, again = bwd_probe.grads(out, leaves, dout), bwd_probe.grads(out, leaves, dout)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
