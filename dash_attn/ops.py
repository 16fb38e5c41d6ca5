"""``torch.library`` custom ops: the one boundary torch.compile sees for each direction.

``dash_attn::fwd`` and ``dash_attn::bwd`` are opaque to the compiler (their host code builds
plans and schedule tables and launches persistent kernels), so a model using them compiles with
``fullgraph=True`` and no graph break; the fake implementations give the compiler the shapes.
"""

from __future__ import annotations

import torch

from . import dispatch


@torch.library.custom_op("dash_attn::fwd", mutates_args=())
def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    softmax_scale: float,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    return dispatch.forward(q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend)


@fwd.register_fake
def _fwd_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    softmax_scale: float,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen_q, heads, _ = q.shape
    return torch.empty_like(q), q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("dash_attn::bwd", mutates_args=())
def bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    softmax_scale: float,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dispatch.backward(
        dout, q, k, v, out, lse,
        causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        schedule=schedule, sm_margin=sm_margin, backend=backend,
    )  # fmt: skip


@bwd.register_fake
def _bwd_fake(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
