"""Pieces the backward A/B probes under benchmarks/results/h200/ share (session 45's lane,
stride and turn probes): gradients of one backward call, their fp32 and same-dtype references,
and the flash-attn rule's verdict on them as a line.

    refs = grad_references(q, k, v, dout, causal=True)
    print(f"check B: {grad_verdict('B', grads(out, leaves, dout), *refs)}")
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dash_attn.reference.attention import attention_ref
from dash_attn.testing import assert_close_to_ref

Grads = list[torch.Tensor]


def grads(out: torch.Tensor, leaves: Sequence[torch.Tensor], dout: torch.Tensor) -> Grads:
    """dq, dk, dv of ``out`` (graph kept, so a probe can call it again), cloned."""
    return [t.clone() for t in torch.autograd.grad(out, leaves, dout, retain_graph=True)]


def grad_references(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, *, causal: bool
) -> tuple[Grads, Grads]:
    """(fp32 gradients, gradients computed in the inputs' dtype), both as fp32 tensors: the two
    sides of the flash-attn rule."""
    sides = []
    for upcast in (True, False):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
        sides.append([g.float() for g in torch.autograd.grad(out, leaves, dout.to(out.dtype))])
    return sides[0], sides[1]


def grad_verdict(tag: str, got: Sequence[torch.Tensor], ref: Grads, same: Grads) -> str:
    """``rule ok`` or ``FAILS <the first 200 characters of why>`` for dq, dk and dv."""
    try:
        for name, g, r, s in zip(("dq", "dk", "dv"), got, ref, same, strict=True):
            assert_close_to_ref(f"{name} {tag}", g, r, s, atol=1e-3)
    except AssertionError as err:
        return f"FAILS {str(err)[:200]}"
    return "rule ok"
