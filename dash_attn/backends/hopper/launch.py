"""Execute a ``BackwardPlan`` (and the forward) with the CuTe-DSL Hopper kernels.

The host side of the backward (the Triton preprocess, the error flag, the dQ cast) is the
shared ``backends.backward.run_backward``: only the main kernels differ.
"""

from __future__ import annotations

import functools

import torch

from ...plan import BackwardPlan
from ...schedule import Dispatch
from .. import backward
from . import FWD_3WG_MIN_SEQLEN, bwd_variant
from .bwd_launch import BwdLaunch, cast_dq, prepare_bwd
from .fwd import hopper_fwd


def run_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """out like q and lse ``(batch, heads, seqlen_q)`` fp32 (natural log)."""
    return hopper_fwd(
        q, k, v, causal=causal, softmax_scale=softmax_scale,
        consumer_wgs=forward_consumer_wgs(q.shape[3], q.shape[1]),
    )  # fmt: skip


def forward_consumer_wgs(head_dim: int, seqlen_q: int) -> int:
    """Consumer warpgroups of the hopper forward for this shape (``FWD_3WG_MIN_SEQLEN``)."""
    return 3 if head_dim == 64 and seqlen_q >= FWD_3WG_MIN_SEQLEN else 2


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
    cast = functools.partial(
        cast_dq, seqlen_q=q.shape[1], head_dim=q.shape[3], block_m=plan.tiles.block_m,
        variant=bwd_variant(plan.problem.headdim, plan.problem.mask.causal),
    )  # fmt: skip
    return backward.run_backward(
        plan, _main, dout, q, k, v, out, lse, softmax_scale, sync_check=sync_check,
        cast_dq=cast,
    )  # fmt: skip


# The main-kernel launch of each recent plan, per device: made on the plan's first backward and
# reused (``bwd_launch.BwdLaunch``). Keyed by the plan's id, with the plan kept beside it so that
# the id cannot be reused while the entry exists (and is checked on lookup). Plans come from
# ``make_backward_plan``'s cache, so a training loop hits the same few entries.
_MAX_LAUNCHES = 256
_launches: dict[tuple[int, int | None], tuple[BackwardPlan, BwdLaunch]] = {}


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
    key = (id(plan), q.device.index)
    entry = _launches.get(key)
    if entry is None or entry[0] is not plan:
        entry = (plan, _prepare(plan, q, tables))
        if len(_launches) >= _MAX_LAUNCHES:
            _launches.pop(next(iter(_launches)))
        _launches[key] = entry
    return entry[1](q, k, v, dout, lse2, delta, softmax_scale)


def _prepare(plan: BackwardPlan, q: torch.Tensor, tables: dict[str, torch.Tensor]) -> BwdLaunch:
    """The plan's launch. The tensors' shapes, dtype and alignment are not checked again: the
    plan was made for them (dispatch checked them, the preprocess made lse2/delta for its
    tiles, the tables are its own)."""
    spec, tiles = plan.spec, plan.tiles
    return prepare_bwd(
        tuple(q.shape), q.dtype, tables,
        block_m=tiles.block_m, block_n=tiles.block_n, num_workers=plan.grid,
        q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains,
        causal=spec.mask.causal, deterministic=plan.deterministic,
        dynamic=plan.dispatch is Dispatch.DYNAMIC, timeout_ns=int(plan.timeout_s * 1e9),
        variant=bwd_variant(plan.problem.headdim, spec.mask.causal),
    )  # fmt: skip
