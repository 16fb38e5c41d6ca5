"""``torch.library`` custom ops: the one boundary torch.compile sees for each direction.

``dash_attn::fwd``/``bwd`` (padded batch) and ``dash_attn::varlen_fwd``/``varlen_bwd`` (packed
sequences) are opaque to the compiler: their host code builds plans and schedule tables (for
packed sequences it reads ``cu_seqlens`` on the host) and launches persistent kernels, so a model
using them compiles with ``fullgraph=True`` and no graph break; the fake implementations give the
compiler the shapes.
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
    window_left: int = -1,
    window_right: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    return dispatch.forward(
        q, k, v, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window_left=window_left, window_right=window_right,
    )  # fmt: skip


@fwd.register_fake
def _fwd_fake(q: torch.Tensor, *_: object, **__: object) -> tuple[torch.Tensor, torch.Tensor]:
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
    window_left: int = -1,
    window_right: int = -1,
    invariant: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dispatch.backward(
        dout, q, k, v, out, lse,
        causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        schedule=schedule, sm_margin=sm_margin, backend=backend,
        window_left=window_left, window_right=window_right, invariant=invariant,
    )  # fmt: skip


@bwd.register_fake
def _bwd_fake(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("dash_attn::varlen_fwd", mutates_args=())
def varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    softmax_scale: float,
    backend: str,
    window_left: int,
    window_right: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    return dispatch.varlen_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=causal, softmax_scale=softmax_scale, backend=backend,
        window_left=window_left, window_right=window_right,
    )  # fmt: skip


@varlen_fwd.register_fake
def _varlen_fwd_fake(
    q: torch.Tensor, *_: object, **__: object
) -> tuple[torch.Tensor, torch.Tensor]:
    total_q, heads, _ = q.shape
    return torch.empty_like(q), q.new_empty((heads, total_q), dtype=torch.float32)


@torch.library.custom_op("dash_attn::varlen_bwd", mutates_args=())
def varlen_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    softmax_scale: float,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    backend: str,
    window_left: int,
    window_right: int,
    invariant: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dispatch.varlen_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        schedule=schedule, sm_margin=sm_margin, backend=backend,
        window_left=window_left, window_right=window_right, invariant=invariant,
    )  # fmt: skip


@varlen_bwd.register_fake
def _varlen_bwd_fake(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object
):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
