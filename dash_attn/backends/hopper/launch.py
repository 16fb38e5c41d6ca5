"""Execute a ``BackwardPlan`` (and the forward) with the CuTe-DSL Hopper kernels.

The per-row inputs of the backward (LSE in log2 units, delta) come from the Triton preprocess,
and dQ is finished (scaled, cast) as in the Triton backend: only the main kernels differ.
"""

from __future__ import annotations

import torch

from ...errors import record_status
from ...plan import BackwardPlan
from ...schedule import Dispatch
from ..tables import device_tables
from ..triton.bwd import attn_bwd_preprocess
from ..triton.launch import finish_dq, timeout_error
from .bwd_launch import hopper_bwd_main
from .fwd import hopper_fwd


def run_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """out like q and lse ``(batch, heads, seqlen_q)`` fp32 (natural log)."""
    return hopper_fwd(q, k, v, causal=causal, softmax_scale=softmax_scale)


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
    """dq, dk, dv by the plan's schedule on the warp-specialised kernel (same contract as
    ``backends.triton.launch.run_backward``)."""
    spec, tiles = plan.spec, plan.tiles
    lse2, delta = attn_bwd_preprocess(out, dout, lse, spec.q_tiles * tiles.block_m)
    dq_acc, dk, dv, status = hopper_bwd_main(
        q, k, v, dout, lse2, delta, device_tables(plan.schedule, q.device),
        block_m=tiles.block_m, block_n=tiles.block_n, num_workers=plan.grid,
        q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains,
        causal=spec.mask.causal, softmax_scale=softmax_scale,
        deterministic=plan.deterministic, dynamic=plan.dispatch is Dispatch.DYNAMIC,
        timeout_ns=int(plan.timeout_s * 1e9),
    )  # fmt: skip
    if plan.deterministic:
        record_status(status[1], timeout_error(plan), sync_check)
    return finish_dq(dq_acc, softmax_scale, q.dtype), dk, dv
