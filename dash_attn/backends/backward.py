"""The host side of a backward, shared by the backends: the per-row preprocess (Triton), the
backend's main kernel, the error flag, and the dQ cast. Only the main kernel differs.

Everything here runs eagerly inside the ``dash_attn::bwd`` custom op, so torch.compile treats it
as one opaque call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import record_status
from ..plan import BackwardPlan
from .tables import device_tables
from .triton.bwd import INTERPRETER_MAX_POLLS, attn_bwd_preprocess

# (plan, q, k, v, dout, lse2, delta, tables, softmax_scale) -> (dq_acc fp32 unscaled, dk, dv,
# status int32[2]: ticket counter, error flag)
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
    sync_check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv in q/k/v's dtype, by ``main`` running the plan's tables.

    ``sync_check`` waits for the kernel and raises at once on a timed-out wait (always so under
    the interpreter, where the launch has already run); otherwise the error surfaces at the next
    backward or at ``dash_attn.check_errors()``.
    """
    lse2, delta = attn_bwd_preprocess(out, dout, lse, plan.spec.q_tiles * plan.tiles.block_m)
    tables = device_tables(plan.schedule, q.device)
    dq_acc, dk, dv, status = main(plan, q, k, v, dout, lse2, delta, tables, softmax_scale)
    if plan.deterministic:
        record_status(status[1], timeout_error(plan), sync_check or plan.device.is_interpreter)
    # The scale is applied once here rather than to every partial in the kernel (dK, which stays
    # in registers for a whole chain, is scaled in the kernel).
    return (dq_acc * softmax_scale).to(q.dtype), dk, dv


def timeout_error(plan: BackwardPlan) -> str:
    """The RuntimeError text of a deterministic launch whose dQ wait gave up."""
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
    return (
        f"dash-attn backward: a dQ wait timed out after {plan.timeout_s:g} s ({plan.describe()}); "
        "its gradients were poisoned with NaN. Likely causes: SMs held by a concurrent kernel "
        "(raise sm_margin) or a broken schedule."
    )
