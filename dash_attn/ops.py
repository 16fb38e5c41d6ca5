"""``torch.library`` custom ops: the one boundary torch.compile sees for each direction.

``dash_attn::fwd``/``bwd`` (padded batch) and ``dash_attn::varlen_fwd``/``varlen_bwd`` (packed
sequences) are opaque to the compiler: their host code builds plans and schedule tables (for
packed sequences it reads ``cu_seqlens`` on the host) and launches persistent kernels, so a model
using them compiles with ``fullgraph=True`` and no graph break; the fake implementations give the
compiler the shapes. Every output is contiguous whatever the inputs' strides (the backends
allocate them so), and the fakes say the same: inductor checks the real strides against them.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import dispatch

__all__ = ["call"]


def _fwd_body(
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


fwd = torch.library.custom_op("dash_attn::fwd", _fwd_body, mutates_args=())


@fwd.register_fake
def _fwd_fake(q: torch.Tensor, *_: object, **__: object) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen_q, heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


def _bwd_body(
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
    gqa_split: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dispatch.backward(
        dout, q, k, v, out, lse,
        causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        schedule=schedule, sm_margin=sm_margin, backend=backend,
        window_left=window_left, window_right=window_right, invariant=invariant,
        gqa_split=gqa_split,
    )  # fmt: skip


bwd = torch.library.custom_op("dash_attn::bwd", _bwd_body, mutates_args=())


@bwd.register_fake
def _bwd_fake(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _varlen_fwd_body(
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


varlen_fwd = torch.library.custom_op("dash_attn::varlen_fwd", _varlen_fwd_body, mutates_args=())


@varlen_fwd.register_fake
def _varlen_fwd_fake(
    q: torch.Tensor, *_: object, **__: object
) -> tuple[torch.Tensor, torch.Tensor]:
    total_q, heads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((heads, total_q), dtype=torch.float32)


def _varlen_bwd_body(
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
    gqa_split: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dispatch.varlen_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        schedule=schedule, sm_margin=sm_margin, backend=backend,
        window_left=window_left, window_right=window_right, invariant=invariant,
        gqa_split=gqa_split,
    )  # fmt: skip


varlen_bwd = torch.library.custom_op("dash_attn::varlen_bwd", _varlen_bwd_body, mutates_args=())


@varlen_bwd.register_fake
def _varlen_bwd_fake(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: object
):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# The Python body of each op, for the direct call below.
_BODIES = {"fwd": _fwd_body, "bwd": _bwd_body, "varlen_fwd": _varlen_fwd_body,
           "varlen_bwd": _varlen_bwd_body}  # fmt: skip


def call(name: str, *args: object) -> tuple[torch.Tensor, ...]:
    """``torch.ops.dash_attn.<name>(*args)``, or the op's body called directly in plain eager
    mode.

    The dispatcher round trip of a Python custom op costs ~0.1 ms of host time per call (measured
    on the H200 machine), as much as a small backward's kernels. It buys nothing when nothing
    traces or intercepts the call, so the op goes through the dispatcher only under
    torch.compile, a TorchDispatchMode (fake tensors, selective activation checkpointing, flop
    counters) or tensor subclasses; the results are the same either way.
    """
    if (
        not torch.compiler.is_compiling()
        and _get_current_dispatch_mode() is None
        and all(type(a) is torch.Tensor for a in args if isinstance(a, torch.Tensor))
    ):
        return _BODIES[name](*args)
    return getattr(torch.ops.dash_attn, name)(*args)
