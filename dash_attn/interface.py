"""Public API: ``dash_attn_func`` and ``dash_attn_varlen_func``, in flash-attn's calling
convention (positional order included), so ``from dash_attn import dash_attn_func as
flash_attn_func`` works in existing code."""

from __future__ import annotations

import math

import torch

from . import ops
from .determinism import alert_nondeterministic_backward
from .device import is_interpreter
from .validation import check_flash_attn_extras, check_inputs, check_varlen_inputs


def _maybe_contiguous(x: torch.Tensor) -> torch.Tensor:
    # The kernels take every stride but the last; copy only when the last one is not 1 (a
    # non-tensor or a 0-d tensor goes on to validation, which names it).
    if isinstance(x, torch.Tensor) and x.ndim > 0 and x.stride(-1) != 1:
        return x.contiguous()
    return x


def _needs_cuda(q: torch.Tensor, name: str) -> None:
    if q.device.type != "cuda" and not is_interpreter():
        raise RuntimeError(
            f"{name} needs CUDA tensors, got q on {q.device} (set TRITON_INTERPRET=1 before "
            "importing dash_attn to run the kernels in Triton's CPU interpreter, float16 only)"
        )


class DashAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        window: tuple[int, int],
        softmax_scale: float,
        deterministic: bool,
        schedule: str,
        sm_margin: int,
        backend: str,
        invariant: bool,
        gqa_split: bool | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = ops.call("fwd", q, k, v, causal, softmax_scale, backend, *window)
        # lse has no gradient: without this, autograd passes a zero tensor of its shape to
        # backward (an allocation and a fill launch per call).
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, softmax_scale, deterministic, schedule, sm_margin, backend)
        ctx.window, ctx.invariant, ctx.gqa_split = window, invariant, gqa_split
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout: torch.Tensor | None, dlse: torch.Tensor | None):
        if dout is None:  # out did not reach the loss: no gradient
            return (None,) * 12
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ops.call(
            "bwd", _maybe_contiguous(dout), q, k, v, out, lse, *ctx.options, *ctx.window,
            ctx.invariant, ctx.gqa_split,
        )  # fmt: skip
        return dq, dk, dv, *([None] * 9)


class DashAttnVarlenFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor | None,
        max_seqlen_q: int,
        max_seqlen_k: int,
        causal: bool,
        window: tuple[int, int],
        softmax_scale: float,
        deterministic: bool,
        schedule: str,
        sm_margin: int,
        backend: str,
        invariant: bool,
        gqa_split: bool | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # cu_seqlens_k is None when it is cu_seqlens_q (self-attention): torch.compile cannot
        # trace an autograd.Function that gets one tensor twice.
        same_k = cu_seqlens_k is None
        cu_k = cu_seqlens_q if same_k else cu_seqlens_k
        out, lse = ops.call(
            "varlen_fwd", q, k, v, cu_seqlens_q, cu_k, max_seqlen_q, max_seqlen_k,
            causal, softmax_scale, backend, *window,
        )  # fmt: skip
        ctx.same_k = same_k
        ctx.set_materialize_grads(False)  # (see DashAttnFunction)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, *(() if same_k else (cu_k,)))
        ctx.lengths = (max_seqlen_q, max_seqlen_k)
        ctx.options = (causal, softmax_scale, deterministic, schedule, sm_margin, backend)
        ctx.window, ctx.invariant, ctx.gqa_split = window, invariant, gqa_split
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout: torch.Tensor | None, dlse: torch.Tensor | None):
        if dout is None:
            return (None,) * 16
        q, k, v, out, lse, cu_q, *rest = ctx.saved_tensors
        cu_k = cu_q if ctx.same_k else rest[0]
        dq, dk, dv = ops.call(
            "varlen_bwd", _maybe_contiguous(dout), q, k, v, out, lse, cu_q, cu_k, *ctx.lengths,
            *ctx.options, *ctx.window, ctx.invariant, ctx.gqa_split,
        )  # fmt: skip
        return dq, dk, dv, *([None] * 13)


_SHARED_ARGS_DOC = """
        dropout_p: must be 0.0 (flash-attn's position; dropout is not implemented).
        softmax_scale: scaling of QK^T before the softmax; default ``1 / sqrt(headdim)``.
        causal: apply the causal mask, aligned to the bottom-right corner of each sequence's
            attention matrix (as flash-attn >= 2.1).
        window_size: ``(left, right)`` sliding window, -1 for an unbounded side (flash-attn's
            semantics): query row ``i`` sees keys ``j`` with
            ``i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right``.
            ``causal=True`` sets ``right = 0``.
        softcap, alibi_slopes: must be 0.0 / None (not implemented).
        deterministic: fixed-order dQ accumulation in the backward (default True).
        return_attn_probs: must be False (use ``return_lse`` for the log-sum-exp).
        schedule: ``"auto"``, ``"fa3"``, ``"descending"``, ``"shift"`` (full mask only),
            ``"symmetric_shift"`` (causal only) or ``"shift_descending"`` (full mask only: per
            sequence ``descending`` from 12288 tile tasks and 10240 x 10240 tokens on,
            ``shift`` below, ``generators.walks_down``): which DASH
            schedule the backward runs. ``"auto"`` is a pure function of each sequence's
            lengths, the mask and the head dim (never of timing or of the GPU when
            ``invariant=True``): ``symmetric_shift`` for causal, ``descending`` for a window,
            and on the full mask ``shift`` for short sequences, ``descending`` for long ones.
            A non-deterministic backward on the hopper backend takes ``descending`` at head dim
            256 from 1024 (full) / 2048 (causal) keys and at 192 causal from 8192
            (``hopper.NONDET_DESCENDING_MIN_SEQLEN_K``: measured faster there; its sums follow
            arrival order anyway).
        backend: ``"auto"``, ``"triton"`` or ``"hopper"``: which kernels run. ``"auto"`` takes
            the fastest one that covers the call; ``last_launch_info()`` says which ran and why.
            Naming a backend that cannot run the call raises.
        sm_margin: multiprocessors to leave free for concurrent kernels (e.g. communication);
            the persistent backward runs on ``SM count - sm_margin`` workers.
        return_lse: also return the log-sum-exp (natural log, fp32) of each query row. It
            carries no gradient (as flash-attn's): a loss that uses it gets none through it.
        invariant: the order-invariance contract (default True): the order in which the dQ
            contributions of one sequence are added, and the order in which each KV tile
            visits its queries, depend only on that sequence's lengths, the head dim, the mask
            and window, and the schedule name, never on the batch, the other sequences of a
            pack or their order, the number of heads, the SM count or ``sm_margin``. So one
            sequence's gradients are bitwise the same alone, in a batch, packed anywhere among
            others, with any ``sm_margin`` and on any Hopper GPU with the same software.
            ``invariant=False`` lets the shift schedules follow the worker count (what the
            DASH paper's tables do); gradients are then reproducible only for the same batch,
            heads, GPU model and ``sm_margin``. Cost: the invariant shift schedules give each
            (sequence, chain head) group at most 16 SMs (a chain head is a q head with the GQA
            split below, else a kv head), so with fewer than ~8 groups (batch 1 with few
            heads) ``auto`` leaves SMs idle on causal masks and short full-mask sequences;
            pass ``schedule="descending"`` (also invariant) or ``invariant=False`` there.
        gqa_split: with fewer kv heads than q heads, run the backward as one chain per q head
            (``None``, the default, and ``True``): every chain reads its group's K/V, and the
            dK/dV of each kv head's chains are added in q-head order. That gives a launch
            ``heads / kv_heads`` times more chains: batch 1 with a few kv heads fills the GPU
            (Qwen2.5-7B's 28/4 heads at 8k: 1.5x faster than one chain per kv head). The
            deterministic hopper kernel adds them itself, in fp32 accumulators of the kv heads
            (FA4-det's memory; one rounding); the Triton backend and the non-deterministic
            hopper kernel write a 16-bit partial per q head, added after the kernel (fp32 sum,
            one rounding), whose memory is ``heads / kv_heads`` times dk's and dv's for the
            duration of the backward. ``False``: one chain per kv head walks all its q heads
            (dK/dV summed in registers). They give different dk/dv bits; all keep every
            promise above. No effect without GQA.
"""


def dash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    backend: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
    invariant: bool = True,
    gqa_split: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention with a bitwise-reproducible backward.

    flash-attn's ``flash_attn_func`` calling convention, positional order included, with
    ``deterministic=True`` by default. Multi-query and grouped-query attention are supported by
    passing k and v with fewer heads than q: q head ``h`` attends to kv head
    ``h // (nheads // nheads_k)``. With ``nheads = 6`` and ``nheads_k = 2``, q heads 0, 1, 2
    use kv head 0 and q heads 3, 4, 5 use kv head 1.

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
    schedule, backend and software versions, and (``invariant=True``) independent of the batch,
    heads, GPU SM count and ``sm_margin``. Different schedules or backends may differ in the
    last bits. With ``deterministic=False`` the same kernel adds dQ in arrival order, without
    waiting for a turn (slightly faster, not reproducible); under
    ``torch.use_deterministic_algorithms(True)`` that raises.

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``, fp16 or bf16, on a CUDA device.
        k: ``(batch, seqlen_k, nheads_k, headdim)``, same dtype and device.
        v: ``(batch, seqlen_k, nheads_k, headdim)``, same dtype and device.
    {args}
    Returns:
        out: ``(batch, seqlen_q, nheads, headdim)``, like q.
        lse (if ``return_lse``): ``(batch, nheads, seqlen_q)`` fp32, natural log.

    Raises:
        TypeError, ValueError, NotImplementedError: bad inputs, with the argument named.
        RuntimeError: tensors not on CUDA; ``deterministic=False`` under
            ``torch.use_deterministic_algorithms(True)``; or a backward whose dQ wait timed
            out (reported at the next backward call or by ``dash_attn.check_errors()``; the
            gradients of that call are poisoned with NaN, never silently wrong).

    Example::

        import torch
        from dash_attn import dash_attn_func

        q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        out = dash_attn_func(q, k, v, causal=True)
        out.sum().backward()  # q.grad, k.grad, v.grad: bitwise reproducible
    """
    check_flash_attn_extras(dropout_p, softcap, alibi_slopes, return_attn_probs)
    # Copy only a tensor whose last dim is strided; validation then sees what the kernels get.
    q, k, v = (_maybe_contiguous(x) for x in (q, k, v))
    shape = check_inputs(
        q, k, v,
        causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        schedule=schedule, sm_margin=sm_margin, return_lse=return_lse, backend=backend,
        window_size=window_size, invariant=invariant, gqa_split=gqa_split,
    )  # fmt: skip
    alert_nondeterministic_backward(deterministic, _needs_grad(q, k, v), "dash_attn_func")
    _needs_cuda(q, "dash_attn_func")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(shape.headdim)
    out, lse = DashAttnFunction.apply(
        q, k, v, shape.causal, shape.window, float(softmax_scale), deterministic,
        schedule, sm_margin, backend, invariant, gqa_split,
    )  # fmt: skip
    return (out, lse) if return_lse else out


def dash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = True,
    return_attn_probs: bool = False,
    *,
    schedule: str = "auto",
    backend: str = "auto",
    sm_margin: int = 0,
    return_lse: bool = False,
    invariant: bool = True,
    gqa_split: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over packed variable-length sequences, with a bitwise-reproducible backward.

    flash-attn's ``flash_attn_varlen_func`` convention: the sequences of a batch are
    concatenated along the first dimension; sequence ``b`` is rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of
    k and v, and attends only to itself (the causal mask and window are per sequence, aligned
    to its own bottom-right corner). Empty sequences are allowed.

    Host cost: the schedule tables depend on the lengths, so the lengths are copied to the host
    (one synchronisation; skipped when the same unmodified ``cu_seqlens`` tensors come again, as
    in the next layer and in the backward), and the tables are built once per distinct set of
    lengths (cached, 64 entries). Tables hold ``sequences x kv_heads x longest KV tiles``
    entries. With ``invariant=True`` each sequence's gradients are bitwise the same wherever it
    sits in the pack and whatever else is packed with it.

    Args:
        q: ``(total_q, nheads, headdim)``, fp16 or bf16, on a CUDA device.
        k, v: ``(total_k, nheads_k, headdim)``, same dtype and device.
        cu_seqlens_q, cu_seqlens_k: int32 ``(batch + 1,)`` on q's device: 0, then the
            cumulative lengths (non-decreasing, last entry = total tokens).
        max_seqlen_q, max_seqlen_k: ints >= the longest sequence of each.
    {args}
    Returns:
        out: ``(total_q, nheads, headdim)``, like q.
        lse (if ``return_lse``): ``(nheads, total_q)`` fp32, natural log (flash-attn's layout).

    Raises:
        TypeError, ValueError, NotImplementedError: bad inputs, the argument named (bad
            ``cu_seqlens`` values are found when the call reads them on the host).
        RuntimeError: as ``dash_attn_func``.

    Example::

        lens = torch.tensor([0, 1000, 3000, 3500], dtype=torch.int32, device="cuda")
        q = torch.randn(3500, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(3500, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        out = dash_attn_varlen_func(q, k, v, lens, lens, 2000, 2000, causal=True)
    """
    check_flash_attn_extras(dropout_p, softcap, alibi_slopes, return_attn_probs)
    q, k, v = (_maybe_contiguous(x) for x in (q, k, v))
    shape = check_varlen_inputs(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
        schedule=schedule, sm_margin=sm_margin, return_lse=return_lse, backend=backend,
        window_size=window_size, invariant=invariant, gqa_split=gqa_split,
    )  # fmt: skip
    alert_nondeterministic_backward(deterministic, _needs_grad(q, k, v), "dash_attn_varlen_func")
    _needs_cuda(q, "dash_attn_varlen_func")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(shape.headdim)
    out, lse = DashAttnVarlenFunction.apply(
        q, k, v, cu_seqlens_q, None if cu_seqlens_k is cu_seqlens_q else cu_seqlens_k,
        int(max_seqlen_q), int(max_seqlen_k),
        shape.causal, shape.window, float(softmax_scale), deterministic, schedule,
        sm_margin, backend, invariant, gqa_split,
    )  # fmt: skip
    return (out, lse) if return_lse else out


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


dash_attn_func.__doc__ = dash_attn_func.__doc__.replace("    {args}", _SHARED_ARGS_DOC.rstrip())
dash_attn_varlen_func.__doc__ = dash_attn_varlen_func.__doc__.replace(
    "    {args}", _SHARED_ARGS_DOC.rstrip()
)
