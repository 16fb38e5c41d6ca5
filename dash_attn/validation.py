"""The input contract of ``dash_attn_func``, stated once.

``check_inputs`` either returns the problem's ``AttnShape`` or raises, naming the argument, what
was expected and what was got:

* TypeError: a wrong kind of object (q, k, v not tensors; flags not bool; softmax_scale not a real
  number; sm_margin not an int; schedule not a str) or an unsupported dtype (only torch.float16 and
  torch.bfloat16: the kernels load 16-bit operands for tensor cores) or q, k, v dtypes that differ.
* ValueError: shapes that do not fit together, empty sequences or heads, a non-positive or
  non-finite softmax_scale, a last dimension that is not contiguous, tensors on different devices,
  a negative sm_margin, an unknown schedule or one made for the other mask, an unknown backend.
* NotImplementedError: a head dimension the kernels have no tile configuration for; flash-attn
  arguments dash-attn does not implement (``dropout_p > 0``, ``softcap``, ``alibi_slopes``,
  ``return_attn_probs=True``), each named.

``check_varlen_inputs`` does the same for ``dash_attn_varlen_func`` on the shapes, dtypes and
devices; ``check_cu_seqlens_values`` checks the values of ``cu_seqlens_q``/``cu_seqlens_k`` once
they are on the host (inside the custom op, which copies them there anyway to build the tables).

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
from .schedule import Mask, schedule_names
from .schedule.generators import SCHEDULE_MASKS

__all__ = [
    "AttnShape",
    "SUPPORTED_DTYPES",
    "check_cu_seqlens_values",
    "check_flash_attn_extras",
    "check_inputs",
    "check_varlen_inputs",
    "mask_of",
    "normalize_window",
    "valid_schedule_names",
]

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
        causal, window: the mask, normalised as ``Mask`` does (``causal`` sets the right side
            of ``window`` to 0; a window ``(x, 0)`` is causal). Plain values, not a ``Mask``:
            this runs inside ``torch.compile``'d code, which cannot build one.

    For packed sequences (``check_varlen_inputs``) ``batch`` is the number of sequences and
    ``seqlen_q``/``seqlen_k`` are the total token counts.
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    headdim: int
    dtype: torch.dtype
    causal: bool = False
    window: tuple[int, int] = (-1, -1)

    @property
    def mask(self) -> Mask:
        return Mask(causal=self.causal, window_left=self.window[0], window_right=self.window[1])

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
        kind = type(value)
        where = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
        raise TypeError(f"{name} must be a bool, got {where}{kind.__name__} ({value!r})")


def _check_real_scale(softmax_scale: object) -> None:
    if softmax_scale is None:
        return
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(
            f"softmax_scale must be None or a real number, got "
            f"{type(softmax_scale).__name__} ({softmax_scale!r})"
        )
    if not math.isfinite(softmax_scale) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")


UNBOUNDED_WINDOW = 2**30


def normalize_window(causal: bool, window_size: object) -> tuple[bool, tuple[int, int]]:
    """``(causal, (left, right))`` of flash-attn's ``causal`` and ``window_size`` (-1: unbounded),
    normalised as ``Mask`` normalises them: ``causal`` sets ``right = 0``, and ``right == 0`` is
    causal."""
    _check_bool("causal", causal)
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in window_size)
    ):
        raise TypeError(
            f"window_size must be a pair of ints (left, right), -1 for an unbounded side, got "
            f"{window_size!r}"
        )
    left, right = (int(x) for x in window_size)
    if left < -1 or right < -1:
        raise ValueError(
            f"window_size entries must be >= -1 (-1: unbounded), got {tuple(window_size)}"
        )
    # A side of 2**30 or more reaches past any sequence the kernels take (their row indices are
    # int32, and such a sequence would not fit in memory): unbounded, as -1. Passed on as is,
    # row + 2**31 - 1 wrapped in the kernels' int32 arithmetic and masked the wrong keys.
    left, right = (-1 if side >= UNBOUNDED_WINDOW else side for side in (left, right))
    if causal or right == 0:
        return True, (left, 0)
    return False, (left, right)


def _mask_kind_and_name(window: tuple[int, int]) -> tuple[str, str]:
    # Mask.kind and Mask.name, from plain values (see AttnShape).
    left, right = window
    if left < 0 and right < 0:
        return "full", "full"
    if left < 0 and right == 0:
        return "causal", "causal"
    return "local", f"local({left},{right})"


def mask_of(causal: bool, window_size: object) -> Mask:
    """The ``Mask`` of ``causal`` and flash-attn's ``window_size=(left, right)``.

    >>> mask_of(True, (-1, -1)).name, mask_of(True, (256, -1)).name
    ('causal', 'local(256,0)')
    """
    causal, (left, right) = normalize_window(causal, window_size)
    return Mask(causal=causal, window_left=left, window_right=right)


def check_flash_attn_extras(
    dropout_p: object, softcap: object, alibi_slopes: object, return_attn_probs: object
) -> None:
    """flash-attn's arguments that dash-attn accepts for drop-in use but does not implement:
    anything but their neutral value raises NotImplementedError naming the argument."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0:
        raise NotImplementedError(
            f"dropout_p={dropout_p!r}: attention dropout is not implemented by dash-attn "
            "(pass dropout_p=0.0; dropout in attention would also need a reproducible RNG)"
        )
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if softcap != 0:
        raise NotImplementedError(f"softcap={softcap!r}: logit soft-capping is not implemented")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi is not implemented (pass None)")
    _check_bool("return_attn_probs", return_attn_probs)
    if return_attn_probs:
        raise NotImplementedError(
            "return_attn_probs=True: the attention probabilities are not returned; for the "
            "log-sum-exp pass return_lse=True"
        )


def _check_options(
    *,
    window: tuple[int, int],
    softmax_scale: float | None,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    return_lse: bool,
    backend: str,
    invariant: bool,
    gqa_split: bool | None,
) -> None:
    _check_bool("deterministic", deterministic)
    _check_bool("return_lse", return_lse)
    _check_bool("invariant", invariant)
    if gqa_split is not None:
        _check_bool("gqa_split", gqa_split)
    _check_real_scale(softmax_scale)
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
    kind, name = _mask_kind_and_name(window)
    if schedule != "auto" and kind not in SCHEDULE_MASKS[schedule]:
        fitting = [n for n in SCHEDULE_MASKS if kind in SCHEDULE_MASKS[n] and n != schedule]
        raise ValueError(
            f"schedule={schedule!r} with the {name} mask: schedule {schedule!r} is for the "
            f"{' or '.join(SCHEDULE_MASKS[schedule])} mask, not the {name} mask; for that use "
            f"one of {['auto', *fitting]}"
        )
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__} ({backend!r})")
    if backend not in ("auto", *BACKEND_NAMES):
        raise ValueError(f"backend must be one of {['auto', *BACKEND_NAMES]}, got {backend!r}")


def _check_dtypes_devices(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q.dtype must be torch.float16 or torch.bfloat16, got {q.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name}.dtype must equal q.dtype ({q.dtype}), got {x.dtype}")
    for name, x in (("k", k), ("v", v)):
        if x.device != q.device:
            raise ValueError(f"{name} must be on the same device as q ({q.device}), got {x.device}")


def _check_heads_and_strides(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, kv_heads: int, headdim: int
) -> None:
    if heads % kv_heads:
        raise ValueError(
            f"q's heads ({heads}) must be a multiple of k's heads (kv heads, {kv_heads})"
        )
    if headdim not in SUPPORTED_HEADDIMS:
        raise NotImplementedError(
            f"headdim (q.shape[-1]) must be one of {list(SUPPORTED_HEADDIMS)}, got {headdim}"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(
                f"{name} must have a contiguous last dimension (stride 1), got strides "
                f"{tuple(x.stride())}; pass {name}.contiguous()"
            )


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
    window_size: tuple[int, int] = (-1, -1),
    invariant: bool = True,
    gqa_split: bool | None = None,
) -> AttnShape:
    """Validate the arguments of ``dash_attn_func`` and return the problem size.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim), torch.float16 or torch.bfloat16.
        k: (batch_size, seqlen_k, nheads_k, headdim), same dtype and device as q.
        v: (batch_size, seqlen_k, nheads_k, headdim), same dtype and device as q.
        causal: bool.
        softmax_scale: None or a positive finite real number.
        deterministic: bool.
        schedule: "auto" or a registered schedule that fits the mask.
        sm_margin: int >= 0, SMs to leave free.
        return_lse: bool.
        backend: "auto", "triton" or "hopper".
        window_size: (left, right) ints >= -1.
        invariant: bool.
        gqa_split: None or a bool.
    Return:
        AttnShape(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, dtype, causal, window).
    Raises:
        TypeError, ValueError, NotImplementedError: see the module docstring. The last dimension
        of each tensor must have stride 1 (copy first if needed); other strides are free.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    _check_dtypes_devices(q, k, v)
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
    _check_heads_and_strides(q, k, v, heads, kv_heads, headdim)
    causal, window = normalize_window(causal, window_size)
    _check_options(
        window=window, softmax_scale=softmax_scale, deterministic=deterministic, schedule=schedule,
        sm_margin=sm_margin, return_lse=return_lse, backend=backend, invariant=invariant,
        gqa_split=gqa_split,
    )  # fmt: skip
    return AttnShape(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, q.dtype, causal, window)


def _check_cu_seqlens(name: str, cu: object, device: torch.device) -> torch.Tensor:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name}.dtype must be torch.int32 (as flash-attn), got {cu.dtype}")
    if cu.ndim != 1 or cu.numel() < 2:
        raise ValueError(
            f"{name} must be 1-D with batch + 1 >= 2 entries (0, end of sequence 0, ...), got "
            f"shape {tuple(cu.shape)}"
        )
    if cu.device != device:
        raise ValueError(f"{name} must be on q's device ({device}), got {cu.device}")
    if not cu.is_contiguous():
        # The kernels read it by index from its data pointer (as flash-attn, which refuses it too).
        raise ValueError(
            f"{name} must be contiguous, got stride {cu.stride()} (pass {name}.contiguous())"
        )
    return cu


def check_varlen_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool,
    softmax_scale: float | None,
    deterministic: bool,
    schedule: str,
    sm_margin: int,
    return_lse: bool,
    backend: str = "auto",
    window_size: tuple[int, int] = (-1, -1),
    invariant: bool = True,
    gqa_split: bool | None = None,
) -> AttnShape:
    """Validate the arguments of ``dash_attn_varlen_func`` (everything the host can see without
    reading ``cu_seqlens``; :func:`check_cu_seqlens_values` checks those values).

    Arguments:
        q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim).
        cu_seqlens_q, cu_seqlens_k: int32, 1-D, batch + 1 entries each, on q's device.
        max_seqlen_q, max_seqlen_k: int >= 1.
    Return:
        AttnShape with batch = number of sequences, seqlen_q/seqlen_k = total tokens.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 3:
            raise ValueError(
                f"{name} must be 3-D (total_tokens, heads, headdim) for dash_attn_varlen_func, "
                f"got {x.ndim}-D with shape {tuple(x.shape)}"
            )
    _check_dtypes_devices(q, k, v)
    total_q, heads, headdim = q.shape
    total_k, kv_heads = k.shape[0], k.shape[1]
    if tuple(v.shape[:2]) != (total_k, kv_heads):
        raise ValueError(
            f"v.shape[:2] must equal k.shape[:2] ({(total_k, kv_heads)}), got {tuple(v.shape[:2])}"
        )
    for name, x in (("k", k), ("v", v)):
        if x.shape[2] != headdim:
            raise ValueError(
                f"{name}.shape[2] (headdim) must equal q.shape[2] ({headdim}), got {x.shape[2]}"
            )
    for label, value in (("q.shape[1] (heads)", heads), ("k.shape[1] (kv heads)", kv_heads)):
        if value == 0:
            raise ValueError(f"{label} must be >= 1, got 0")
    _check_heads_and_strides(q, k, v, heads, kv_heads, headdim)
    cu_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    cu_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_q.numel() != cu_k.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
            f"{cu_q.numel()} and {cu_k.numel()}"
        )
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    causal, window = normalize_window(causal, window_size)
    _check_options(
        window=window, softmax_scale=softmax_scale, deterministic=deterministic, schedule=schedule,
        sm_margin=sm_margin, return_lse=return_lse, backend=backend, invariant=invariant,
        gqa_split=gqa_split,
    )  # fmt: skip
    return AttnShape(
        cu_q.numel() - 1, total_q, total_k, heads, kv_heads, headdim, q.dtype, causal, window
    )


def check_cu_seqlens_values(
    cu_q: list[int], cu_k: list[int], total_q: int, total_k: int, max_q: int, max_k: int
) -> tuple[tuple[int, int], ...]:
    """Check ``cu_seqlens_q``/``cu_seqlens_k`` (as host lists) against the tensors and
    ``max_seqlen_*``; return every sequence's ``(seqlen_q, seqlen_k)``."""
    for name, cu, total, longest, max_name in (
        ("cu_seqlens_q", cu_q, total_q, max_q, "max_seqlen_q"),
        ("cu_seqlens_k", cu_k, total_k, max_k, "max_seqlen_k"),
    ):
        if cu[0] != 0:
            raise ValueError(f"{name}[0] must be 0, got {cu[0]}")
        steps = [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)]
        if any(step < 0 for step in steps):
            bad = next(i for i, step in enumerate(steps) if step < 0)
            raise ValueError(
                f"{name} must be non-decreasing, got {name}[{bad}] = {cu[bad]} > "
                f"{name}[{bad + 1}] = {cu[bad + 1]}"
            )
        if cu[-1] != total:
            side = "q" if name.endswith("_q") else "k"
            raise ValueError(
                f"{name}[-1] must equal the number of tokens in {side} ({total}), got {cu[-1]}"
            )
        if max(steps) > longest:
            raise ValueError(
                f"{max_name} ({longest}) is smaller than the longest sequence in {name} "
                f"({max(steps)})"
            )
    return tuple((cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]) for i in range(len(cu_q) - 1))
