"""The host side of a backward, shared by the backends: the per-row preprocess (Triton), the
backend's main kernel, the error flag, and the dQ cast. Only the main kernel differs.

Everything here runs eagerly inside the ``dash_attn::bwd`` custom op, so torch.compile treats it
as one opaque call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..errors import record_status
from ..plan import BackwardPlan
from .tables import device_tables
from .triton.bwd import INTERPRETER_MAX_POLLS, attn_bwd_preprocess, mask_window
from .triton.captured_status import load_reporting_kernel, report_captured_status
from .triton.dq_cast import scale_cast
from .triton.group_sum import sum_kv_groups
from .triton.varlen import varlen_rows

# (plan, q, k, v, dout, lse2, delta, tables, softmax_scale) -> (dq_acc fp32 unscaled, dk, dv,
# status int32[2]: ticket counter, error flag); a main kernel that runs packed sequences also
# takes ``varlen=VarlenRows`` (the Triton one does, the Hopper one does not). With
# ``plan.gqa_split`` dk and dv are the per-q-head partials (the spec's kv heads are the chain
# heads: q's), summed here.
MainKernel = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


def run_backward(
    plan: BackwardPlan,
    main: MainKernel,
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
    cast_dq: Callable[[torch.Tensor, float, torch.dtype], torch.Tensor] = scale_cast,
    reports_errors: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv in q/k/v's dtype, by ``main`` running the plan's tables.

    ``cast_dq(dq_acc, softmax_scale, dtype)`` makes dq from ``main``'s fp32 accumulator; the
    default is for an accumulator shaped like q (a backend whose kernel keeps another layout
    passes its own).

    Packed sequences: ``cu_seqlens_q``/``cu_seqlens_k`` (int32 [batch + 1] on the device) with
    q/dout/out ``(total_q, H, D)``, k/v ``(total_k, Hkv, D)`` and lse ``(H, total_q)``; the
    per-sequence lengths are the plan's (``plan.spec.seqlens``), which must be what the tensors
    hold (the caller validated them; reading them here would sync). The window is the plan's
    mask.

    ``reports_errors`` (default: the plan's ``deterministic``): whether ``main``'s kernel
    waits on the semaphores, so that its error flag is read (a counted non-deterministic
    hopper kernel does too).

    ``sync_check`` waits for the kernel and raises at once on a timed-out wait (always so under
    the interpreter, where the launch has already run); otherwise the error surfaces at the next
    backward or at ``dash_attn.check_errors()``.
    """
    varlen = None
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (varlen)")
        if plan.spec.seqlens is None:
            raise ValueError(
                "cu_seqlens_q was given but the plan has no per-sequence lengths "
                "(plan.spec.seqlens is None): make the plan from a Problem with seqlens"
            )
        if plan.spec.block_m not in (None, plan.tiles.block_m):
            raise ValueError(
                f"plan.spec.block_m ({plan.spec.block_m}) differs from the kernel's BLOCK_M "
                f"({plan.tiles.block_m}): the tables were made for other tiles"
            )
        varlen = varlen_rows(
            plan.spec.seqlens, plan.tiles.block_m, cu_seqlens_q, cu_seqlens_k, q.shape[0]
        )
    if plan.backend != "triton":
        check_padded_full_or_causal(plan, packed=varlen is not None)
    lse2, delta = attn_bwd_preprocess(
        out, dout, lse, plan.spec.q_tiles * plan.tiles.block_m, varlen=varlen
    )
    tables = device_tables(plan.schedule, q.device)
    extra = {} if varlen is None else {"varlen": varlen}
    dq_acc, dk, dv, status = main(plan, q, k, v, dout, lse2, delta, tables, softmax_scale, **extra)
    if plan.deterministic if reports_errors is None else reports_errors:
        description = functools.partial(timeout_error, plan)
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            # In a CUDA graph the queued flag copy would run at capture only (no host code at
            # replay): a reporting kernel, replayed with the rest, writes the mapped word.
            report_captured_status(status, description)
        else:
            record_status(status[1], description, sync_check or plan.device.is_interpreter)
            if q.is_cuda:
                load_reporting_kernel(q.device)
    if varlen is not None:
        # The accumulator pads every sequence to whole Q tiles: keep the real rows.
        dq_acc = dq_acc.index_select(0, varlen.row_index)
    if plan.gqa_split and not plan.dkv_sum:
        dk, dv = sum_kv_groups(dk, dv, k.shape[-2])
    # The scale is applied once here rather than to every partial in the kernel (dK, which stays
    # in registers for a whole chain, is scaled in the kernel).
    return cast_dq(dq_acc, softmax_scale, q.dtype), dk, dv


def check_padded_full_or_causal(plan: BackwardPlan, *, packed: bool) -> None:
    """Raise for what only the Triton backward runs: packed sequences and sliding windows."""
    if packed or mask_window(plan.spec.mask)[0] == "local":
        raise NotImplementedError(
            f"the {plan.backend} backward runs padded batches with full or causal masks only; "
            "packed sequences and sliding windows run on the triton backend"
        )


def timeout_error(plan: BackwardPlan) -> str:
    """The RuntimeError text of a deterministic launch whose dQ (or in-kernel dK/dV) wait gave
    up."""
    if plan.device.is_interpreter:
        # No concurrent kernel here: the interpreter runs programs one after another, so a wait
        # for a later program can never be met (the plan refuses the static schedules that do
        # that; what is left is a broken table).
        return (
            f"dash-attn backward: a dQ wait timed out after {INTERPRETER_MAX_POLLS} polls in "
            f"Triton's interpreter ({plan.describe()}); its gradients were poisoned with NaN. The "
            "interpreter runs programs one after another, so a wait for a contribution of a later "
            "program never ends: the schedule's tables do not fit that order (a broken schedule)."
        )
    # With in-kernel dK/dV sums the kernel also waits for a q head's turn at a chain's end.
    waits = "dQ or dK/dV" if plan.dkv_sum else "dQ"
    return (
        f"dash-attn backward: a {waits} wait timed out after {plan.timeout_s:g} s "
        f"({plan.describe()}); its gradients were poisoned with NaN. Likely causes: SMs held by "
        "a concurrent kernel (raise sm_margin) or a broken schedule."
    )
