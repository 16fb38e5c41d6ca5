"""Execute a ``BackwardPlan`` with the Triton kernels: preprocess, the persistent kernel, dQ cast.

Everything here runs eagerly inside the ``dash_attn::bwd`` custom op, so torch.compile treats it
as one opaque call.
"""

from __future__ import annotations

import torch

from ...device import is_interpreter
from ...errors import record_status
from ...plan import BackwardPlan
from ...schedule import Dispatch
from ..tables import device_tables
from . import _versions  # noqa: F401  (first: an unsupported Triton fails here, clearly)
from .bwd import attn_bwd_main, attn_bwd_preprocess
from .fwd import attn_fwd

# The interpreter has no clock: it bounds the number of polls instead (checked every 256 polls).
INTERPRETER_MAX_POLLS = 512


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
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """out like q and lse ``(batch, heads, seqlen_q)`` fp32 (natural log)."""
    refuse_interpreter_bf16(q.dtype, is_interpreter())
    return attn_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale)


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
    sync_check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of one attention call, in q/k/v's dtype, by the plan's schedule and tiles.

    ``sync_check`` waits for the kernel and raises at once on a timed-out wait (always so under
    the interpreter, where the launch has already run); otherwise the error surfaces at the next
    backward or at ``dash_attn.check_errors()``.
    """
    spec, tiles = plan.spec, plan.tiles
    interpret = plan.device.is_interpreter
    refuse_interpreter_bf16(q.dtype, interpret)
    lse2, delta = attn_bwd_preprocess(out, dout, lse, spec.q_tiles * tiles.block_m)
    dq_acc, dk, dv, status = attn_bwd_main(
        q, k, v, dout, lse2, delta, device_tables(plan.schedule, q.device),
        tiles=tiles, num_workers=plan.grid,
        q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains,
        causal=spec.mask.causal, softmax_scale=softmax_scale,
        deterministic=plan.deterministic, dynamic=plan.dispatch is Dispatch.DYNAMIC,
        timed_wait=not interpret,
        timeout=INTERPRETER_MAX_POLLS if interpret else int(plan.timeout_s * 1e9),
        cooperative=plan.dispatch is Dispatch.STATIC and not interpret,
        dq_tma=plan.dq_reduce == "tma",
    )  # fmt: skip
    if plan.deterministic:
        record_status(status[1], timeout_error(plan), sync_check or interpret)
    return finish_dq(dq_acc, softmax_scale, q.dtype), dk, dv


def finish_dq(dq_acc: torch.Tensor, softmax_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """dQ from its fp32 accumulator. The scale is applied here, once, rather than to every
    partial in the kernel (dK, which stays in registers for a whole chain, is scaled there)."""
    return (dq_acc * softmax_scale).to(dtype)
