"""The transformer block of ``dash_attn.bench.e2e`` on the CPU."""

from __future__ import annotations

import torch

from dash_attn.bench import report
from dash_attn.bench.providers import Case, Provider
from dash_attn.bench.timing import wall_clock_ms

from .helpers import META, broken, eager


def test_e2e_block_on_cpu() -> None:
    from dash_attn.bench import e2e

    cfg = e2e.BlockConfig("tiny", 64, 4, 2, 16, 96, True, "swiglu", 10000.0)
    block = e2e.make_block(cfg, "cpu", seed=0)
    again = e2e.make_block(cfg, "cpu", seed=0)
    pairs = zip(block.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)

    def attn(q, k, v):  # GQA by repeating kv heads, (b, s, h, d)
        rep = q.shape[2] // k.shape[2]
        k, v = (x.repeat_interleave(rep, dim=2) for x in (k, v))
        out = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(1, 2).float() for x in (q, k, v)), is_causal=True
        )
        return out.transpose(1, 2).to(q.dtype)

    block.attn = attn
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    y = block(x)
    y.float().sum().backward()
    assert y.shape == x.shape and x.grad is not None and block.wqkv.grad is not None
    assert [s[1] for s in e2e.quick_shapes()] == [8192, 8192, 4096]
    vit = e2e.MODELS["vit-h-like"]
    assert vit.heads * vit.headdim == vit.hidden and "80" in vit.note


def test_e2e_loop_on_cpu() -> None:
    from dash_attn.bench import e2e

    tiny = {"tiny": e2e.BlockConfig("tiny", 64, 4, 2, 16, 96, True, "swiglu", 10000.0)}

    def gqa_eager(case: Case, device: object):
        def fn(q, k, v):
            rep = q.shape[2] // k.shape[2]
            k, v = (x.repeat_interleave(rep, dim=2) for x in (k, v))
            return eager("bshd")(case, device)(q, k, v)

        return fn

    def providers(case: Case, workers: int) -> list[Provider]:
        return [
            Provider("dash_auto", "test", True, gqa_eager),
            Provider("dash_fa3", "test", True, gqa_eager),
            Provider("fa4_det", "test", True, broken),
        ]

    rows = e2e.run_e2e(
        meta=META, patterns=None, quick=False, seed=0, device="cpu", workers=4,
        shapes=[("tiny", 16, 2)], timer=wall_clock_ms, warmup=0.0, rep=1.0, models=tiny,
        make_providers=providers,
    )  # fmt: skip
    assert [r["provider"] for r in rows] == ["dash_auto", "dash_fa3"]
    assert rows[1]["speedup_vs_dash_fa3"] == 1.0 and rows[0]["tokens"] == 32
    assert "tiny" in report.e2e_table(rows)
