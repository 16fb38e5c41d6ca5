"""Execute a ``BackwardPlan`` (and the forward) with the CuTe-DSL Hopper kernels.

The backward is three CuTe-DSL launches through TVM-FFI (``bwd_launch.FullBackward``: the
default, ``CUTE_PRE_POST``), or, with that switch off, the main kernel inside the shared
``backends.backward.run_backward`` (Triton preprocess and cast).
"""

from __future__ import annotations

import functools
import os

import torch

from ...errors import check_errors, mapped_launch, record_status
from ...plan import BackwardPlan
from ...schedule import Dispatch
from .. import backward
from ..tables import device_tables, dq_counts
from ..triton.group_sum import sum_kv_groups
from . import (
    FWD_3WG_MIN_SEQLEN,
    FWD_LPT_ORDER_MAX_SEQLEN_K,
    FWD_P_SMEM_HEADDIMS,
    FWD_PERSISTENT_MAX_SEQLEN_K,
    bwd_variant,
)
from .bwd_launch import (
    BwdLaunch,
    FullBackward,
    cast_dq,
    dq_first_store,
    prepare_bwd,
    prepare_full,
    takes_turns,
)
from .fwd_launch import hopper_fwd


def run_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """out like q and lse ``(batch, heads, seqlen_q)`` fp32 (natural log)."""
    head_dim = q.shape[3]
    consumer_wgs = forward_consumer_wgs(head_dim, q.shape[1], causal)
    persistent = forward_persistent(head_dim, k.shape[1], causal)
    return hopper_fwd(
        q, k, v, causal=causal, softmax_scale=softmax_scale, consumer_wgs=consumer_wgs,
        persistent=persistent, p_smem=consumer_wgs == 3 and head_dim in FWD_P_SMEM_HEADDIMS,
        lpt_order=forward_lpt_order(head_dim, k.shape[1], causal),
    )  # fmt: skip


def forward_consumer_wgs(head_dim: int, seqlen_q: int, causal: bool) -> int:
    """Consumer warpgroups of the hopper forward for this shape: 3 (192-row tiles) from
    ``FWD_3WG_MIN_SEQLEN`` query tokens on, per mask kind and head dim, else 2."""
    min_seqlen = FWD_3WG_MIN_SEQLEN["causal" if causal else "full"].get(head_dim)
    return 3 if min_seqlen is not None and seqlen_q >= min_seqlen else 2


def forward_persistent(head_dim: int, seqlen_k: int, causal: bool) -> bool:
    """Whether the hopper forward runs its persistent kernel for this shape
    (``FWD_PERSISTENT_MAX_SEQLEN_K``: per mask kind and head dim, up to a key length)."""
    limits = FWD_PERSISTENT_MAX_SEQLEN_K["causal" if causal else "full"]
    return seqlen_k <= limits.get(head_dim, 0)


def forward_lpt_order(head_dim: int, seqlen_k: int, causal: bool) -> bool:
    """Whether the causal forward launches its tiles in L2 groups, longest first
    (``FWD_LPT_ORDER_MAX_SEQLEN_K``: per head dim, up to a key length; the same bits). Only
    head dims the forward runs a CTA per tile at are listed there (and ``HopperFwd`` ignores
    the order in its persistent kernels)."""
    return causal and seqlen_k <= FWD_LPT_ORDER_MAX_SEQLEN_K.get(head_dim, 0)


def cute_pre_post_from_env(value: str | None) -> bool:
    """``DASH_ATTN_CUTE_PRE_POST``'s value as the switch: ``0``, ``off``, ``false`` or ``no``
    (any case) turn the CuTe host path off; unset, empty or anything else leave it on."""
    return (value or "").strip().lower() not in ("0", "off", "false", "no")


# Whether the backward runs as three CuTe-DSL launches (``bwd_launch.FullBackward``: CuTe
# preprocess that also zeroes the accumulator, the main kernel, CuTe dQ cast that reports a
# timed-out wait through a host-mapped word) instead of the Triton preprocess and cast with a zero
# fill and a flag copy per launch. On by default since session 13: on the H200 both paths' kernels
# take the same GPU time and the CuTe path's host time is about half, so it is 0.95-2.0x as fast on
# the 24 sweep configs (benchmarks/NOTES.md, items 49-50). ``DASH_ATTN_CUTE_PRE_POST=0`` takes the
# Triton path. Delta is summed in another order than by the Triton preprocess, so gradients differ
# between the paths in the last bits (each path is bitwise repeatable). Read when a plan's launch
# is made.
CUTE_PRE_POST = cute_pre_post_from_env(os.environ.get("DASH_ATTN_CUTE_PRE_POST"))

# A bound on one main-kernel step for the polled cast's waits (``_prepare``): a step takes 1-5
# us on the H200 (benchmarks/NOTES.md, item 164), so 50 us is far above any healthy one, slow
# clocks and a busy GPU included, while a table whose count is never met still raises within
# seconds.
CAST_WAIT_PER_STEP_NS = 50_000


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
    Triton backend's ``run_backward``).

    With ``CUTE_PRE_POST`` the backward runs as three TVM-FFI launches
    (``bwd_launch.FullBackward``) and reports a timed-out dQ wait through a host-mapped word
    (``errors.mapped_launch``); otherwise the backward takes the shared host path (Triton
    preprocess and cast, the flag copied per launch)."""
    captured = q.is_cuda and torch.cuda.is_current_stream_capturing()
    # (Its first call per plan checks the mask: full or causal.)
    launch = _launch(plan, q, captured=captured)
    main = launch.main if isinstance(launch, FullBackward) else launch
    # A kernel that waits on the semaphores (deterministic, or a counted non-det one) may time
    # out: its error flag is reported.
    reports = main.takes_turns
    if not isinstance(launch, FullBackward):
        cast = functools.partial(cast_dq, seqlen_q=q.shape[1], block_m=plan.tiles.block_m)
        return backward.run_backward(
            plan, _main, dout, q, k, v, out, lse, softmax_scale, sync_check=sync_check,
            cast_dq=cast, reports_errors=reports,
        )  # fmt: skip
    error_addr, launch_id = 0, 0
    if reports:
        error_text = functools.partial(backward.timeout_error, plan)
        # A launch captured in a CUDA graph reports under one number at every replay.
        error_addr, launch_id = mapped_launch(error_text, q.device.index, captured)
    dq, dk, dv, status = launch(dout, q, k, v, out, lse, softmax_scale, error_addr, launch_id)
    if plan.gqa_split and not plan.dkv_sum:
        dk, dv = sum_kv_groups(dk, dv, k.shape[2])
    if reports:
        if launch_id == 0:  # no mapped word: the flag is copied and queued
            record_status(status[1], error_text, sync_check)
        elif sync_check:
            check_errors(synchronize=True)
    return dq, dk, dv


# The main-kernel launch of each recent plan, per device: made on the plan's first backward and
# reused (``bwd_launch.BwdLaunch``). Keyed by the plan's id, with the plan kept beside it so that
# the id cannot be reused while the entry exists (and is checked on lookup). Plans come from
# ``make_backward_plan``'s cache, so a training loop hits the same few entries.
_MAX_LAUNCHES = 256
_launches: dict[tuple[int, int | None, bool], tuple[BackwardPlan, BwdLaunch | FullBackward]] = {}
# Launches a CUDA graph was captured with: a replay reads their tables and counts by address, so
# they are never dropped (as ``tables.upload_once``'s captured entries).
_pinned_launches: set[tuple[int, int | None, bool]] = set()


def _launch(
    plan: BackwardPlan, q: torch.Tensor, *, captured: bool = False
) -> BwdLaunch | FullBackward:
    """The plan's launch on q's device, made on its first backward; kept for the process if
    ``captured`` (a CUDA graph capture is running)."""
    key = (id(plan), q.device.index, CUTE_PRE_POST)
    entry = _launches.get(key)
    if entry is None or entry[0] is not plan:
        entry = (plan, _prepare(plan, q))
        if len(_launches) >= _MAX_LAUNCHES:
            oldest = next((k for k in _launches if k not in _pinned_launches), None)
            if oldest is not None:
                _launches.pop(oldest)
        _launches[key] = entry
    if captured:
        _pinned_launches.add(key)
    return entry[1]


def _variant(plan: BackwardPlan) -> str:
    """The kernel variant that runs the plan (by head dim, mask, key length and mode)."""
    problem = plan.problem
    return bwd_variant(problem.headdim, problem.mask.causal, problem.seqlen_k, plan.deterministic)


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
    launch = _launch(plan, q, captured=q.is_cuda and torch.cuda.is_current_stream_capturing())
    main = launch.main if isinstance(launch, FullBackward) else launch
    return main(q, k, v, dout, lse2, delta, softmax_scale)


def _prepare(plan: BackwardPlan, q: torch.Tensor) -> BwdLaunch | FullBackward:
    """The plan's launch. The tensors' shapes, dtype and alignment are not checked again: the
    plan was made for them (dispatch checked them, the preprocess makes lse2/delta for its
    tiles, the tables are its own)."""
    backward.check_padded_full_or_causal(plan, packed=False)
    spec, tiles = plan.spec, plan.tiles
    variant = _variant(plan)
    # Where the plan left SMs to it (plans whose kernel takes turns, without in-kernel dK/dV
    # sums), the dQ cast runs beside the main kernel, waiting for each tile's last release
    # (bwd_pre_post.DqFragmentCastPolled).
    polled = plan.cast_sms > 0
    turns = takes_turns(variant, plan.deterministic)
    if polled and not turns:
        raise ValueError(
            f"the plan leaves {plan.cast_sms} SMs to a polled dQ cast, but its kernel "
            f"({variant}, non-deterministic) does not count its dQ adds"
        )
    main = prepare_bwd(
        tuple(q.shape), q.dtype, device_tables(plan.schedule, q.device),
        block_m=tiles.block_m, block_n=tiles.block_n, num_workers=plan.grid,
        q_tiles=spec.q_tiles, kv_tiles=spec.kv_tiles, num_chains=spec.num_chains,
        causal=spec.mask.causal, deterministic=plan.deterministic,
        dynamic=plan.dispatch is Dispatch.DYNAMIC, timeout_ns=int(plan.timeout_s * 1e9),
        variant=variant, dkv_heads=spec.kv_heads, dkv_sum=plan.dkv_sum,
        kv_heads=plan.problem.kv_heads, seqlen_k=plan.problem.seqlen_k,
        cast_trigger=polled and CUTE_PRE_POST,
    )  # fmt: skip
    if not CUTE_PRE_POST:
        return main
    # A first-store kernel that takes turns writes every dQ tile before adding to it, where
    # the tables give each tile a rank-0 step; then only the flags need zeroing.
    first_stores = turns and dq_first_store(variant) and plan.schedule.starts_every_dq_tile()
    counts = dq_counts(plan.schedule, q.device) if polled else None
    # The polled cast's CTAs start with the main kernel and wait for their tiles from then on:
    # a tile the tables finish last is waited for about as long as the whole main kernel, which
    # a healthy long kernel (or a lowered timeout_s) can make longer than the plan's per-wait
    # timeout. So their bound is that timeout plus the busiest worker's steps at
    # CAST_WAIT_PER_STEP_NS each. A main kernel that raises its error flag ends the cast's
    # waits at once either way.
    cast_timeout_ns = 0
    if polled:
        steps = plan.schedule.busiest_worker_steps()
        cast_timeout_ns = int(plan.timeout_s * 1e9) + steps * CAST_WAIT_PER_STEP_NS
    return prepare_full(
        main, tuple(q.shape), q.dtype, variant, zero_acc=not first_stores, dq_counts=counts,
        cast_timeout_ns=cast_timeout_ns,
    )  # fmt: skip
