"""Execute a ``BackwardPlan`` (and the forward) with the Triton kernels."""

from __future__ import annotations

import torch

from ...device import is_interpreter
from ...plan import BackwardPlan
from .. import backward
from . import _versions  # noqa: F401  (an unsupported Triton fails at this import, clearly)
from .bwd import attn_bwd_main
from .fwd import attn_fwd


def refuse_interpreter_bf16(dtype: torch.dtype, interpret: bool) -> None:
    """Triton's interpreter computes bf16 ``tl.dot`` wrong (errors ~1e8, no warning): refuse
    rather than return silently wrong results (``dash_attn_func`` refuses first, with the same
    reason; this guards direct calls of the custom ops)."""
    if interpret and dtype == torch.bfloat16:
        raise NotImplementedError(
            "dash-attn: bfloat16 is not supported in Triton's CPU interpreter "
            "(TRITON_INTERPRET=1), whose bf16 matmuls give wrong results; use float16 there "
            "(bf16 runs on the GPU)"
        )


def run_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    window: tuple[int, int] = (-1, -1),
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out like q and the natural-log lse in fp32: ``(batch, heads, seqlen_q)``, or for packed
    sequences (``cu_seqlens_q``/``cu_seqlens_k`` int32 ``[batch + 1]`` on q's device, q
    ``(total_q, heads, headdim)``) ``(heads, total_q)``. ``window`` is flash-attn's
    ``window_size`` (-1 = unbounded side). The caller has validated the inputs (the interface
    does); ``max_seqlen_k`` is accepted for flash-attn's signature and not needed."""
    refuse_interpreter_bf16(q.dtype, is_interpreter())
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        for name, value in (
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
            ("max_seqlen_q", max_seqlen_q),
        ):
            if value is None:
                raise ValueError(f"{name} is required for packed sequences (varlen)")
    return attn_fwd(
        q, k, v, causal=causal, softmax_scale=softmax_scale, window=window,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
    )  # fmt: skip


def run_backward(
    plan: BackwardPlan,
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    sync_check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of one attention call by the plan's schedule and tiles on the Triton kernel
    (``backends.backward.run_backward`` says what the varlen arguments and ``sync_check`` do;
    the mask and window are the plan's)."""
    refuse_interpreter_bf16(q.dtype, plan.device.is_interpreter)
    return backward.run_backward(
        plan, attn_bwd_main, dout, q, k, v, out, lse, softmax_scale,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, sync_check=sync_check,
    )  # fmt: skip
