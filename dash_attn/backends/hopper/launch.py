"""Execute a ``BackwardPlan`` (and the forward) with the CuTe-DSL Hopper kernels.

The host side of the backward (the Triton preprocess, the error flag, the dQ cast) is the
shared ``backends.backward.run_backward``: only the main kernels differ.
"""

from __future__ import annotations

import torch

from ...plan import BackwardPlan
from ...schedule import Dispatch
from .. import backward
from . import BWD_VARIANT
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
    """dq, dk, dv by the plan's schedule on the warp-specialised kernel (same contract as the
    Triton backend's ``run_backward``)."""
    return backward.run_backward(
        plan, _main, dout, q, k, v, out, lse, softmax_scale, sync_check=sync_check
    )


def _main(
    plan: BackwardPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse2: torch.Tensor,
    delta: torch.Tensor,
    tables: dict[str, torch.Tensor],
    softmax_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    spec, tiles = plan.spec, plan.tiles
    return hopper_bwd_main(
        q, k, v, dout, lse2, delta, tables,
        block_m=tiles.block_m, block_n=tiles.block_n, num_workers=plan.grid,
        q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains,
        causal=spec.mask.causal, softmax_scale=softmax_scale,
        deterministic=plan.deterministic, dynamic=plan.dispatch is Dispatch.DYNAMIC,
        timeout_ns=int(plan.timeout_s * 1e9),
        variant=BWD_VARIANT[plan.problem.headdim],
    )  # fmt: skip
