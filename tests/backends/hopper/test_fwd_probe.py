"""tools/hopper/fwd_probe.py: the forward probes' rule verdict and sweep inputs (CPU)."""

from __future__ import annotations

import torch

from dash_attn.testing import make_qkv
from tools.hopper import fwd_probe


def test_rule_verdict_passes_the_reference_and_names_a_wrong_output() -> None:
    q, k, v = make_qkv(1, 37, 53, 2, 1, 16, torch.bfloat16, "cpu", seed=1)
    ref, same = fwd_probe.references(q, k, v, causal=True)
    out, lse = same[0], same[1]
    assert fwd_probe.rule_verdict("same", out, lse, ref, same) == "meets the rule"
    verdict = fwd_probe.rule_verdict("off", out + 0.5, lse, ref, same)
    assert verdict.startswith("FAILS:") and "out off" in verdict


def test_sweep_qkv_keeps_the_token_count_and_its_seed() -> None:
    q, k, v = fwd_probe.sweep_qkv(64, heads=2, head_dim=16, tokens=256, device="cpu")
    assert q.shape == (4, 64, 2, 16) and q.dtype == torch.bfloat16
    again = fwd_probe.sweep_qkv(64, heads=2, head_dim=16, tokens=256, device="cpu")
    assert torch.equal(q, again[0]) and not torch.equal(q, k)


def test_check_line_reports_the_verdict_and_whether_two_calls_agree() -> None:
    q, k, v = make_qkv(1, 37, 53, 2, 1, 16, torch.bfloat16, "cpu", seed=2)
    ref, same = fwd_probe.references(q, k, v, causal=False)
    line = fwd_probe.check_line("A full", lambda: same, ref, same)
    assert line == "check A full: meets the rule; repeats bitwise True"
    other = same[0].clone()
    other[(0,) * other.dim()] += 0.5
    calls = iter([same, (other, same[1])])
    line = fwd_probe.check_line("B full", lambda: next(calls), ref, same)
    assert line.endswith("repeats bitwise False")
