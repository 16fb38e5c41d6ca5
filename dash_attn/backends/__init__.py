"""Backends execute a ``BackwardPlan``: the same schedule tables, different kernel engines.

``triton`` runs everywhere Triton does (and in its CPU interpreter) and is the reference;
``hopper`` is the warp-specialised CuTe-DSL backend for sm_90. Choosing one is pure Python (the
plan is made without torch); running one imports its kernels on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import hopper
from .triton.tiles import BackwardTiles, backward_tiles

if TYPE_CHECKING:
    from ..plan import DeviceInfo, Problem

BACKEND_NAMES = ("triton", "hopper")

# Where ``auto`` takes the hopper kernels (when they cover the call): the head dims, and per
# head dim the shortest sequence, at which committed side-by-side runs measured them faster than
# the Triton ones (benchmarks/results/h200/session8-2c6fcbc/, in git history at e17a55e: the
# backward sweep; the forward from 512 tokens at both head dims since session 18's forward
# sweep, session18-b97d714/call2-b97d714/fwd/bench.csv in git history at 96f6fcc, where the
# hopper forward, persistent on full masks, is 1.05x Triton's at hd 64 full x 512, 1.00x causal,
# 1.05-1.61x on the other 22 configs; at hd 64 x 512 it had been 0.89-1.01x; session 28's,
# session28-96f6fcc/call4-96f6fcc/fwd/bench.csv.gz: 1.05-1.64x on all 24 configs, and the
# backward 1.71-2.18x in session 28's full run). At hd 96 from session 37's sweeps (32 heads,
# 16k tokens, 512 to 16k; session37-a31ae6c/call1-0a5e68d/bwd96/): the backward 2.01-2.40x
# Triton's on all 12 configs; the forward 1.53-1.78x there, 1.63-1.94x with session 38's
# 192-row tiles (session38-ace4448/call2/fwd96/). The forward at hd 192 and 256 from session
# 42's run (session42-8a8b3d3/call7/fwd-large/, hidden 3072 and 2048, 512 to 16k, three
# rounds): 2.47-3.54x Triton's at hd 192, 1.40-2.10x at hd 256 (session 39's run, in git
# history at ebee550, read 1.00x at hd 256 causal 512, its first config). The backward at hd
# 192 and 256 from session 40's run (session40-19760df/call3/bwd-large/, the same grid, two
# rounds): 1.56-5.31x Triton's on all 24 configs, 1.44-1.67x of it at hd 256, 2.53-5.30x at
# 192. Elsewhere they run when asked for by name.
AUTO_HOPPER_HEADDIMS = {"fwd": (64, 96, 128, 192, 256), "bwd": (64, 96, 128, 192, 256)}
AUTO_HOPPER_MIN_SEQLEN = {
    "fwd": {64: 512, 96: 512, 128: 512, 192: 512, 256: 512},
    "bwd": {64: 512, 96: 512, 128: 512, 192: 512, 256: 512},
}


def hopper_unsupported(problem: Problem, device: DeviceInfo, direction: str = "bwd") -> str | None:
    """Why the hopper backend cannot run ``problem`` on ``device``; None if it can."""
    return hopper.unsupported(problem, device, direction)


def _choose(
    problem: Problem, device: DeviceInfo, requested: str, direction: str
) -> tuple[str, str]:
    gap = hopper_unsupported(problem, device, direction)
    if requested == "hopper":
        if gap is not None:
            raise NotImplementedError(f"backend='hopper' cannot run this {direction}: {gap}")
        return "hopper", "asked for by name"
    if requested == "triton":
        return "triton", "asked for by name"
    if gap is not None:
        return "triton", f"auto: hopper {gap}"
    if problem.headdim not in AUTO_HOPPER_HEADDIMS[direction]:
        return "triton", f"auto: the hopper {direction} at head dim {problem.headdim} is opt-in"
    min_seqlen = AUTO_HOPPER_MIN_SEQLEN[direction][problem.headdim]
    if min(problem.seqlen_q, problem.seqlen_k) < min_seqlen:
        short = f"below {min_seqlen} tokens"
        return "triton", f"auto: {short} the hopper {direction} is opt-in"
    return "hopper", "auto: covered, and measured faster than triton"


def choose_backend(
    problem: Problem, device: DeviceInfo, requested: str, dq_reduce: str
) -> tuple[str, str, BackwardTiles]:
    """``(backend, why, tiles)`` of the backward for ``"auto"``, ``"triton"`` or ``"hopper"``.

    ``auto`` takes hopper where it covers the problem and was measured faster
    (``AUTO_HOPPER_HEADDIMS``, ``AUTO_HOPPER_MIN_SEQLEN``), else triton, and says why; a named
    backend that cannot run raises NotImplementedError.
    """
    name, reason = _choose(problem, device, requested, "bwd")
    if name == "hopper":
        return name, reason, hopper.bwd_tiles(problem.headdim, problem.mask.causal)
    return name, reason, backward_tiles(problem.headdim, dq_reduce)


def choose_forward_backend(problem: Problem, device: DeviceInfo, requested: str) -> tuple[str, str]:
    """``(backend, why)`` of the forward, by the same rules as the backward's."""
    return _choose(problem, device, requested, "fwd")
