"""Tensors to plan to backend: what the custom ops run (eagerly, opaque to torch.compile)."""

from __future__ import annotations

import functools
import importlib
import weakref
from types import ModuleType

import torch

from .backends import choose_forward_backend
from .device import device_info
from .errors import check_errors
from .plan import BackwardPlan, Problem, make_backward_plan
from .schedule import Mask
from .validation import check_cu_seqlens_values

_last_plan: BackwardPlan | None = None
_last_forward: tuple[str, str] | None = None


def last_launch_info() -> BackwardPlan | None:
    """The plan of the most recent backward: backend and why, schedule, tiles, workers, grid."""
    return _last_plan


def tma_aligned(*tensors: torch.Tensor) -> bool:
    """Whether TMA can read every tensor as a tiled tensor: 16-byte aligned base pointer and
    outer strides, unit stride in the last dimension, no broadcast (zero-stride) dimension."""
    # Plain loops, each stride tuple read once: this runs on every call (generators over
    # x.stride(-1), x.stride() took ~13 us for four tensors).
    for x in tensors:
        strides = x.stride()
        if strides[-1] != 1 or x.data_ptr() % 16:
            return False
        size = x.element_size()
        for stride in strides[:-1]:
            if stride <= 0 or stride * size % 16:
                return False
    return True


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def problem_of(q: torch.Tensor, k: torch.Tensor, mask: Mask, *more: torch.Tensor) -> Problem:
    """The Problem of a padded-batch call on q, k (and v, dout, ...: all checked for TMA
    alignment)."""
    return _padded_problem(q.shape, k.shape, mask, q.dtype, tma_aligned(q, k, *more))


# One Problem per distinct call: a training loop asks for the same few on every layer, and
# building one (its checks included) took ~12 us of host time per call.
@functools.lru_cache(maxsize=256)
def _padded_problem(
    q_shape: torch.Size, k_shape: torch.Size, mask: Mask, dtype: torch.dtype, aligned: bool
) -> Problem:
    batch, seqlen_q, heads, headdim = q_shape
    return Problem(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=k_shape[1],
        heads=heads,
        kv_heads=k_shape[2],
        headdim=headdim,
        mask=mask,
        dtype=_dtype_name(dtype),
        tma_aligned=aligned,
    )


# The host copy of the last cu_seqlens pair: a model passes the same tensors to every layer, so
# one device-to-host copy serves a whole step (forward and backward) instead of one per call.
_seqlens_cache: tuple[weakref.ref, weakref.ref, int, int, tuple[tuple[int, int], ...]] | None = None


def _version(x: torch.Tensor) -> int:
    try:
        return x._version
    except RuntimeError:  # inference tensors have no version counter: never reuse their copy
        return -1


def host_seqlens(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    total_q: int,
    total_k: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> tuple[tuple[int, int], ...]:
    """Every packed sequence's ``(seqlen_q, seqlen_k)``, checked against the tensors.

    The schedule tables depend on the lengths, so the host must know them: this is one
    device-to-host copy (a synchronisation), skipped when the same unmodified cu_seqlens tensors
    come again (the next layer, the backward).
    """
    global _seqlens_cache
    if cu_seqlens_q.is_cuda and torch.cuda.is_current_stream_capturing():
        # Even a cached copy would be wrong at a replay with other values in the same tensors:
        # the tables a replay runs were made from the lengths seen here.
        raise RuntimeError(
            "dash-attn: the varlen functions cannot be captured in a CUDA graph: their schedule "
            "is made on the host from the values of cu_seqlens_q/cu_seqlens_k, which a replay "
            "would not read again. Capture the padded dash_attn_func, or run varlen eagerly."
        )
    cached = _seqlens_cache
    if (
        cached is not None
        and cached[0]() is cu_seqlens_q
        and cached[1]() is cu_seqlens_k
        and cached[2] == _version(cu_seqlens_q) != -1
        and cached[3] == _version(cu_seqlens_k) != -1
        and sum(q for q, _ in cached[4]) == total_q
        and sum(k for _, k in cached[4]) == total_k
        and max(q for q, _ in cached[4]) <= max_seqlen_q
        and max(k for _, k in cached[4]) <= max_seqlen_k
    ):
        return cached[4]
    seqlens = check_cu_seqlens_values(
        cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), total_q, total_k, max_seqlen_q, max_seqlen_k
    )
    _seqlens_cache = (
        weakref.ref(cu_seqlens_q),
        weakref.ref(cu_seqlens_k),
        _version(cu_seqlens_q),
        _version(cu_seqlens_k),
        seqlens,
    )
    return seqlens


def backend_module(name: str) -> ModuleType:
    # Imported on first use: the hopper kernels need cutlass, which plain imports must not load.
    return importlib.import_module(f"dash_attn.backends.{name}.launch")


@functools.lru_cache(maxsize=64)
def _mask(causal: bool, window_left: int, window_right: int) -> Mask:
    # Cached: a frozen Mask, built (and checked) once per window instead of on every call.
    return Mask(causal=causal, window_left=window_left, window_right=window_right)


def _forward_options(mask: Mask) -> dict[str, object]:
    # Only the Triton launcher takes a window (hopper falls back for local masks).
    return {"window": mask.window} if mask.kind == "local" else {}


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    backend: str,
    window_left: int = -1,
    window_right: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out and lse (natural log, ``(batch, heads, seqlen_q)`` fp32) by the chosen backend (the
    forward is deterministic on both; they may differ from each other in the last bits)."""
    global _last_forward
    mask = _mask(causal, window_left, window_right)
    name, reason = choose_forward_backend(problem_of(q, k, mask, v), device_info(q.device), backend)
    _last_forward = (name, reason)
    return backend_module(name).run_forward(
        q, k, v, causal=mask.causal, softmax_scale=softmax_scale, **_forward_options(mask)
    )


def varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool,
    softmax_scale: float,
    backend: str,
    window_left: int = -1,
    window_right: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out ``(total_q, heads, headdim)`` and lse ``(heads, total_q)`` of packed sequences."""
    global _last_forward
    mask = _mask(causal, window_left, window_right)
    seqlens = host_seqlens(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
    )
    problem = Problem.packed(
        seqlens, q.shape[1], k.shape[1], q.shape[2], mask, _dtype_name(q.dtype),
        tma_aligned(q, k, v),
    )  # fmt: skip
    name, reason = choose_forward_backend(problem, device_info(q.device), backend)
    _last_forward = (name, reason)
    return backend_module(name).run_forward(
        q, k, v, causal=mask.causal, softmax_scale=softmax_scale,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **_forward_options(mask),
    )  # fmt: skip


def last_forward_backend() -> tuple[str, str] | None:
    """``(backend, why)`` of the most recent forward."""
    return _last_forward


def _run_plan(
    problem: Problem,
    device: torch.device,
    tensors: tuple[torch.Tensor, ...],
    softmax_scale: float,
    *,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    backend: str,
    invariant: bool,
    gqa_split: bool | None,
    varlen: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    global _last_plan
    # An earlier launch's timed-out wait surfaces here at the latest (no host sync per call).
    check_errors(synchronize=False)
    plan = make_backward_plan(
        problem,
        device=device_info(device),
        schedule=schedule,
        deterministic=deterministic,
        sm_margin=sm_margin,
        backend=backend,
        invariant=invariant,
        gqa_split=gqa_split,
    )
    _last_plan = plan
    return backend_module(plan.backend).run_backward(plan, *tensors, softmax_scale, **varlen)


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
    window_left: int = -1,
    window_right: int = -1,
    invariant: bool = True,
    gqa_split: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv by the plan of this shape (made once per shape and options, then cached)."""
    mask = _mask(causal, window_left, window_right)
    return _run_plan(
        problem_of(q, k, mask, v, dout), q.device, (dout, q, k, v, out, lse), softmax_scale,
        deterministic=deterministic, schedule=schedule, sm_margin=sm_margin, backend=backend,
        invariant=invariant, gqa_split=gqa_split, varlen={},
    )  # fmt: skip


def varlen_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool,
    softmax_scale: float,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    backend: str,
    window_left: int = -1,
    window_right: int = -1,
    invariant: bool = True,
    gqa_split: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of packed sequences (the tables are cached by the sequence lengths)."""
    mask = _mask(causal, window_left, window_right)
    seqlens = host_seqlens(
        cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k
    )
    problem = Problem.packed(
        seqlens, q.shape[1], k.shape[1], q.shape[2], mask, _dtype_name(q.dtype),
        tma_aligned(q, k, v, dout),
    )  # fmt: skip
    return _run_plan(
        problem, q.device, (dout, q, k, v, out, lse), softmax_scale,
        deterministic=deterministic, schedule=schedule, sm_margin=sm_margin, backend=backend,
        invariant=invariant, gqa_split=gqa_split,
        varlen={"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k},
    )  # fmt: skip
