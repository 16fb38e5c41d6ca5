"""Tensors to plan to backend: what the custom ops run (eagerly, opaque to torch.compile)."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from .backends import choose_forward_backend
from .device import device_info
from .errors import check_errors
from .plan import CAUSAL, FULL, BackwardPlan, Problem, make_backward_plan

_last_plan: BackwardPlan | None = None
_last_forward: tuple[str, str] | None = None


def last_launch_info() -> BackwardPlan | None:
    """The plan of the most recent backward: backend and why, schedule, tiles, workers, grid."""
    return _last_plan


def tma_aligned(*tensors: torch.Tensor) -> bool:
    """Whether TMA can read every tensor as a tiled tensor: 16-byte aligned base pointer and
    outer strides, unit stride in the last dimension, no broadcast (zero-stride) dimension."""
    return all(
        x.stride(-1) == 1
        and x.data_ptr() % 16 == 0
        and all(stride > 0 and stride * x.element_size() % 16 == 0 for stride in x.stride()[:-1])
        for x in tensors
    )


def problem_of(q: torch.Tensor, k: torch.Tensor, causal: bool, *more: torch.Tensor) -> Problem:
    """The Problem of a call on q, k (and v, dout, ...: all checked for TMA alignment)."""
    batch, seqlen_q, heads, headdim = q.shape
    return Problem(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=k.shape[1],
        heads=heads,
        kv_heads=k.shape[2],
        headdim=headdim,
        mask=CAUSAL if causal else FULL,
        dtype=str(q.dtype).removeprefix("torch."),
        tma_aligned=tma_aligned(q, k, *more),
    )


def backend_module(name: str) -> ModuleType:
    # Imported on first use: the hopper kernels need cutlass, which plain imports must not load.
    return importlib.import_module(f"dash_attn.backends.{name}.launch")


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out and lse (natural log, ``(batch, heads, seqlen_q)`` fp32) by the chosen backend (the
    forward is deterministic on both; they may differ from each other in the last bits)."""
    global _last_forward
    name, reason = choose_forward_backend(
        problem_of(q, k, causal, v), device_info(q.device), backend
    )
    _last_forward = (name, reason)
    return backend_module(name).run_forward(q, k, v, causal=causal, softmax_scale=softmax_scale)


def last_forward_backend() -> tuple[str, str] | None:
    """``(backend, why)`` of the most recent forward."""
    return _last_forward


def backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv by the plan of this shape (made once per shape and options, then cached)."""
    global _last_plan
    # An earlier launch's timed-out wait surfaces here at the latest (no host sync per call).
    check_errors(synchronize=False)
    plan = make_backward_plan(
        problem_of(q, k, causal, v, dout),
        device=device_info(q.device),
        schedule=schedule,
        deterministic=deterministic,
        sm_margin=sm_margin,
        backend=backend,
    )
    _last_plan = plan
    return backend_module(plan.backend).run_backward(plan, dout, q, k, v, out, lse, softmax_scale)
