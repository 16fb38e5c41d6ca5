"""The input contract of ``dash_attn_func``, stated once.

``check_inputs`` either returns the problem's ``AttnShape`` or raises, naming the argument, what
was expected and what was got:

* TypeError: a wrong kind of object (q, k, v not tensors; flags not bool; softmax_scale not a real
  number; sm_margin not an int; schedule not a str) or an unsupported dtype (only torch.float16 and
  torch.bfloat16: the kernels load 16-bit operands for tensor cores) or q, k, v dtypes that differ.
* ValueError: shapes that do not fit together, empty sequences or heads, a non-positive or
  non-finite softmax_scale, a last dimension that is not contiguous, tensors on different devices,
  a negative sm_margin, an unknown schedule or one made for the other mask, an unknown backend.
* NotImplementedError: a head dimension the kernels have no tile configuration for.

Whether the device is CUDA is left to the caller: the reference paths run anywhere, the kernels do
not, and only the caller knows which one it is about to take. ``requires_grad`` is irrelevant here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .backends import BACKEND_NAMES
from .backends.triton.tiles import SUPPORTED_HEADDIMS
from .schedule import CAUSAL, FULL, check_schedule_fits, schedule_names

__all__ = ["AttnShape", "SUPPORTED_DTYPES", "check_inputs", "valid_schedule_names"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class AttnShape:
    """The validated problem size of one attention call.

    Attributes:
        batch: batch size.
        seqlen_q, seqlen_k: query and key/value sequence lengths.
        heads, kv_heads: query heads and key/value heads (heads % kv_heads == 0).
        headdim: head dimension of q, k and v.
        dtype: dtype shared by q, k and v.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    headdim: int
    dtype: torch.dtype

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads


def valid_schedule_names() -> tuple[str, ...]:
    """Every accepted value of ``schedule``: ``"auto"`` and the registered generators."""
    return ("auto", *schedule_names())


def _check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(
            f"{name} must be 4-D (batch, seqlen, heads, headdim), got {x.ndim}-D with shape "
            f"{tuple(x.shape)}"
        )
    return x


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} ({value!r})")


def check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float | None,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    return_lse: bool,
    backend: str = "auto",
) -> AttnShape:
    """Validate the arguments of ``dash_attn_func`` and return the problem size.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim), torch.float16 or torch.bfloat16.
        k: (batch_size, seqlen_k, nheads_k, headdim), same dtype and device as q.
        v: (batch_size, seqlen_k, nheads_k, headdim), same dtype and device as q.
        causal: bool.
        softmax_scale: None or a positive finite real number.
        deterministic: bool.
        schedule: "auto", "fa3", "descending", "shift" (full mask only) or "symmetric_shift"
            (causal only).
        sm_margin: int >= 0, SMs to leave free.
        return_lse: bool.
        backend: "auto", "triton" or "hopper".
    Return:
        AttnShape(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, dtype).
    Raises:
        TypeError, ValueError, NotImplementedError: see the module docstring. The last dimension
        of each tensor must have stride 1 (copy first if needed); other strides are free.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q.dtype must be torch.float16 or torch.bfloat16, got {q.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name}.dtype must equal q.dtype ({q.dtype}), got {x.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.device != q.device:
            raise ValueError(f"{name} must be on the same device as q ({q.device}), got {x.device}")

    batch, seqlen_q, heads, headdim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    for name, x in (("k", k), ("v", v)):
        if x.shape[0] != batch:
            raise ValueError(
                f"{name}.shape[0] (batch) must equal q.shape[0] ({batch}), got {x.shape[0]}"
            )
        if x.shape[3] != headdim:
            raise ValueError(
                f"{name}.shape[3] (headdim) must equal q.shape[3] ({headdim}), got {x.shape[3]}"
            )
    if v.shape[1] != seqlen_k:
        raise ValueError(
            f"v.shape[1] (seqlen_k) must equal k.shape[1] ({seqlen_k}), got {v.shape[1]}"
        )
    if v.shape[2] != kv_heads:
        raise ValueError(
            f"v.shape[2] (kv heads) must equal k.shape[2] ({kv_heads}), got {v.shape[2]}"
        )
    for label, value in (
        ("q.shape[0] (batch)", batch),
        ("q.shape[1] (seqlen_q)", seqlen_q),
        ("k.shape[1] (seqlen_k)", seqlen_k),
        ("q.shape[2] (heads)", heads),
        ("k.shape[2] (kv heads)", kv_heads),
    ):
        if value == 0:
            raise ValueError(f"{label} must be >= 1, got 0")
    if heads % kv_heads:
        raise ValueError(
            f"q.shape[2] (heads) must be a multiple of k.shape[2] (kv heads, {kv_heads}), "
            f"got {heads}"
        )
    if headdim not in SUPPORTED_HEADDIMS:
        raise NotImplementedError(
            f"headdim (q.shape[3]) must be one of {list(SUPPORTED_HEADDIMS)}, got {headdim}"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(
                f"{name} must have a contiguous last dimension (stride 1), got strides "
                f"{tuple(x.stride())}; pass {name}.contiguous()"
            )

    _check_bool("causal", causal)
    _check_bool("deterministic", deterministic)
    _check_bool("return_lse", return_lse)
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
            raise TypeError(
                f"softmax_scale must be None or a real number, got "
                f"{type(softmax_scale).__name__} ({softmax_scale!r})"
            )
        if not math.isfinite(softmax_scale) or softmax_scale <= 0:
            raise ValueError(
                f"softmax_scale must be a positive finite number, got {softmax_scale!r}"
            )
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, numbers.Integral):
        raise TypeError(
            f"sm_margin must be an int >= 0, got {type(sm_margin).__name__} ({sm_margin!r})"
        )
    if sm_margin < 0:
        raise ValueError(f"sm_margin must be an int >= 0, got {sm_margin}")

    if not isinstance(schedule, str):
        raise TypeError(f"schedule must be a str, got {type(schedule).__name__} ({schedule!r})")
    names = valid_schedule_names()
    if schedule not in names:
        raise ValueError(f"schedule must be one of {list(names)}, got {schedule!r}")
    if schedule != "auto":
        try:
            check_schedule_fits(schedule, CAUSAL if causal else FULL)
        except ValueError as exc:
            raise ValueError(f"schedule={schedule!r} with causal={causal}: {exc}") from None
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__} ({backend!r})")
    if backend not in ("auto", *BACKEND_NAMES):
        raise ValueError(f"backend must be one of {['auto', *BACKEND_NAMES]}, got {backend!r}")

    return AttnShape(
        batch=batch,
        seqlen_q=seqlen_q,
        seqlen_k=seqlen_k,
        heads=heads,
        kv_heads=kv_heads,
        headdim=headdim,
        dtype=q.dtype,
    )
