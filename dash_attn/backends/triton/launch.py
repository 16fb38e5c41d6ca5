"""Execute a ``BackwardPlan`` with the Triton kernels: preprocess, the persistent kernel, dQ cast.

Everything here runs eagerly inside the ``dash_attn::bwd`` custom op, so torch.compile treats it
as one opaque call.
"""

from __future__ import annotations

import torch

from ...errors import record_status
from ...plan import BackwardPlan
from ...schedule import Dispatch
from ..tables import device_tables
from .bwd import attn_bwd_main, attn_bwd_preprocess
from .fwd import attn_fwd

# The interpreter has no clock: it bounds the number of polls instead (checked every 256 polls).
INTERPRETER_MAX_POLLS = 512


def run_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """out like q and lse ``(batch, heads, seqlen_q)`` fp32 (natural log)."""
    return attn_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale)


def timeout_error(plan: BackwardPlan) -> str:
    """The RuntimeError text of a deterministic launch whose dQ wait gave up."""
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
