"""Public API: ``dash_attn_func``."""

from __future__ import annotations

import math

import torch

from . import ops  # noqa: F401  (registers torch.ops.dash_attn.*)
from .device import is_interpreter
from .validation import check_inputs


def _maybe_contiguous(x: torch.Tensor) -> torch.Tensor:
    # The kernels take every stride but the last; copy only when the last one is not 1.
    return x if x.stride(-1) == 1 else x.contiguous()


class DashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        softmax_scale: float,
        deterministic: bool,
        schedule: str,
        sm_margin: int,
        backend: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = torch.ops.dash_attn.fwd(q, k, v, causal, softmax_scale, backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        ctx.softmax_scale = softmax_scale
        ctx.deterministic = deterministic
        ctx.schedule = schedule
        ctx.sm_margin = sm_margin
        ctx.backend = backend
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout: torch.Tensor, dlse: torch.Tensor | None):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.dash_attn.bwd(
            _maybe_contiguous(dout), q, k, v, out, lse,
            ctx.causal, ctx.softmax_scale, ctx.deterministic, ctx.schedule, ctx.sm_margin,
            ctx.backend,
        )  # fmt: skip
        return dq, dk, dv, None, None, None, None, None, None


def dash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    deterministic: bool = True,
    schedule: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with a bitwise-reproducible backward.

    Same calling convention as ``flash_attn_func``. Multi-query and grouped-query attention are
    supported by passing k and v with fewer heads than q: the number of heads in q must be
    divisible by the number of heads in k and v, and q head ``h`` attends to kv head
    ``h // (nheads // nheads_k)``. With ``nheads = 6`` and ``nheads_k = 2``, q heads 0, 1, 2 use
    kv head 0 and q heads 3, 4, 5 use kv head 1.

    If ``causal=True`` the mask is aligned to the bottom-right corner of the attention matrix
    (as flash-attn >= 2.1). With ``seqlen_q = 2`` and ``seqlen_k = 5`` (1 = kept)::

        1 1 1 1 0
        1 1 1 1 1

    and with ``seqlen_q = 5``, ``seqlen_k = 2``::

        0 0
        0 0
        0 0
        1 0
        1 1

    A query row that sees no key gets output 0 (and LSE -inf) and zero gradients.

    Determinism: the forward is always deterministic. With ``deterministic=True`` the backward
    adds the contributions to every dQ tile in a fixed order (the schedule's ranks, enforced by a
    semaphore per dQ tile), so dq, dk and dv are bitwise equal across runs for the same inputs,
    schedule, GPU and software versions. Different schedules may differ in the last bits. With
    ``deterministic=False`` the same kernel adds dQ in arrival order, without waiting for a turn
    (slightly faster, not reproducible).

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``, fp16 or bf16, on a CUDA device.
        k: ``(batch, seqlen_k, nheads_k, headdim)``, same dtype and device.
        v: ``(batch, seqlen_k, nheads_k, headdim)``, same dtype and device.
        causal: apply the bottom-right aligned causal mask.
        softmax_scale: scaling of QK^T before the softmax; default ``1 / sqrt(headdim)``.
        deterministic: fixed-order dQ accumulation in the backward (default True).
        schedule: ``"auto"``, ``"fa3"``, ``"descending"``, ``"shift"`` (full mask only) or
            ``"symmetric_shift"`` (causal only): which DASH schedule the backward runs. ``"auto"``
            is a pure function of the shape: the DAG model's fastest applicable schedule (ties
            to the mask's shift schedule) up to 2048 tile tasks, else ``shift`` for the full mask
            and ``symmetric_shift`` for causal; never a timing-based choice. (In Triton's CPU
            interpreter, which runs programs one after another, ``"auto"`` takes a dynamic
            schedule where a static one would wait for a later program.)
        sm_margin: multiprocessors to leave free for concurrent kernels (e.g. communication);
            the persistent backward runs on ``SM count - sm_margin`` workers.
        return_lse: also return the log-sum-exp of each query row.
        backend: ``"auto"``, ``"triton"`` or ``"hopper"``: which kernels run the backward.
            ``"auto"`` takes the fastest one that covers the call; ``last_launch_info()`` says
            which ran and why. Naming a backend that cannot run the call raises.

    Returns:
        out: ``(batch, seqlen_q, nheads, headdim)``, like q.
        lse (if ``return_lse``): ``(batch, nheads, seqlen_q)`` fp32, natural log.

    Raises:
        TypeError, ValueError, NotImplementedError: bad inputs, with the argument named.
        RuntimeError: tensors not on CUDA; or a backward whose dQ wait timed out (reported at the
            next backward call or by ``dash_attn.check_errors()``; the gradients of that call
            are poisoned with NaN, never silently wrong).

    Example::

        import torch
        from dash_attn import dash_attn_func

        q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        out = dash_attn_func(q, k, v, causal=True)
        out.sum().backward()  # q.grad, k.grad, v.grad: bitwise reproducible
    """
    # Copy only a tensor whose last dim is strided; validation then sees what the kernels get.
    q, k, v = (_maybe_contiguous(x) if isinstance(x, torch.Tensor) else x for x in (q, k, v))
    shape = check_inputs(
        q, k, v,
        causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        schedule=schedule, sm_margin=sm_margin, return_lse=return_lse, backend=backend,
    )  # fmt: skip
    if q.device.type != "cuda" and not is_interpreter():
        raise RuntimeError(
            f"dash_attn_func needs CUDA tensors, got q on {q.device} (set TRITON_INTERPRET=1 "
            "before importing dash_attn to run the kernels in Triton's CPU interpreter, float16 "
            "only)"
        )
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(shape.headdim)
    out, lse = DashAttnFunction.apply(
        q, k, v, causal, float(softmax_scale), deterministic, schedule, sm_margin, backend,
    )  # fmt: skip
    return (out, lse) if return_lse else out
