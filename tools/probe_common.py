"""What the tuning probes share: the paper-grid configs, their inputs, FLOPs and the timer.

Configs are ``HEADDIM:MASK:SEQLEN`` items as ``dash-attn bench --configs`` takes them (parsed by
``dash_attn.bench.sweep.parse_configs``), on the paper's grid: 16,384 tokens, hidden 2048.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import triton

from dash_attn.bench.sweep import DEFAULT_HIDDEN, DEFAULT_TOKENS, parse_configs
from dash_attn.bench.timing import attention_flops


@dataclass(frozen=True)
class ProbeConfig:
    """One config of a probe run and its paper-grid shape."""

    label: str  # the item as given, e.g. "128:c:16384"
    headdim: int
    causal: bool
    seqlen: int
    batch: int
    heads: int

    @property
    def bwd_flops(self) -> float:
        return attention_flops(
            self.batch, self.seqlen, self.seqlen, self.heads, self.headdim, self.causal
        )

    def inputs(
        self, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, *, small: bool = False
    ) -> tuple[torch.Tensor, ...]:
        """Seeded q, k, v, dout; ``small`` keeps the seqlen but uses batch 1 and 2 heads."""
        batch, heads = (1, 2) if small else (self.batch, self.heads)
        torch.manual_seed(0)
        shape = (batch, self.seqlen, heads, self.headdim)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
        return q, k, v, torch.randn_like(q)


def probe_configs(text: str) -> Iterator[ProbeConfig]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item, (headdim, causal, seqlen) in zip(items, parse_configs(text), strict=True):
        heads, batch = DEFAULT_HIDDEN // headdim, max(1, DEFAULT_TOKENS // seqlen)
        yield ProbeConfig(item, headdim, causal, seqlen, batch, heads)


def gradients(fn: Callable, q, k, v, dout) -> list[torch.Tensor]:
    """dq, dk, dv of ``fn(q, k, v).backward(dout)`` on fresh leaves (to compare variants)."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    fn(q, k, v).backward(dout)
    return [q.grad, k.grad, v.grad]


def time_backward(fn: Callable, q, k, v, dout) -> float:
    """Median ms of ``fn(q, k, v).backward(dout)`` (forward once, backward repeated)."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    return triton.testing.do_bench(
        lambda: out.backward(dout, retain_graph=True), warmup=50, rep=300, grad_to_none=[q, k, v]
    )
