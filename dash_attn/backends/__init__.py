"""Backends execute a ``BackwardPlan``: the same schedule tables, different kernel engines.

``triton`` runs everywhere Triton does (and in its CPU interpreter) and is the reference;
``hopper`` is the warp-specialised CuTe-DSL backend for sm_90. Choosing one is pure Python (the
plan is made without torch); running one imports its kernels on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .triton.tiles import BackwardTiles, backward_tiles

if TYPE_CHECKING:
    from ..plan import DeviceInfo, Problem

BACKEND_NAMES = ("triton", "hopper")


def hopper_unsupported(problem: Problem, device: DeviceInfo) -> str | None:
    """Why the hopper backend cannot run ``problem`` on ``device``; None if it can."""
    del problem, device
    return "the hopper (CuTe DSL) backend is not part of this release yet"


def choose_backend(
    problem: Problem, device: DeviceInfo, requested: str, dq_reduce: str
) -> tuple[str, str, BackwardTiles]:
    """``(backend, why, tiles)`` for a request of ``"auto"``, ``"triton"`` or ``"hopper"``.

    ``auto`` takes hopper where it covers the problem, else triton, and says why; a named backend
    that cannot run raises NotImplementedError with the reason.
    """
    hopper_gap = hopper_unsupported(problem, device)
    if requested == "hopper" and hopper_gap is not None:
        raise NotImplementedError(f"backend='hopper' cannot run this call: {hopper_gap}")
    reason = "asked for by name" if requested == "triton" else f"auto: {hopper_gap}"
    return "triton", reason, backward_tiles(problem.headdim, dq_reduce)
