"""Every bad input to ``dash_attn_func`` raises the documented exception, naming the argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dash_attn.backends.triton.tiles import SUPPORTED_HEADDIMS
from dash_attn.validation import AttnShape, check_inputs, valid_schedule_names

B, SQ, SK, H, HK, D = 2, 16, 24, 4, 2, 64


def _tensor(*shape: int, dtype: torch.dtype = torch.float16, **kwargs: Any) -> torch.Tensor:
    return torch.randn(shape, **kwargs).to(dtype)


def _good() -> dict[str, Any]:
    return {
        "q": _tensor(B, SQ, H, D),
        "k": _tensor(B, SK, HK, D),
        "v": _tensor(B, SK, HK, D),
        "causal": False,
        "softmax_scale": None,
        "deterministic": True,
        "schedule": "auto",
        "sm_margin": 0,
        "return_lse": False,
    }


def _set(**changes: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation of the good kwargs; callables are evaluated lazily (fresh tensors per test)."""

    def apply(kwargs: dict[str, Any]) -> None:
        for key, value in changes.items():
            kwargs[key] = value(kwargs) if callable(value) else value

    return apply


def _last_dim_strided(x: torch.Tensor) -> torch.Tensor:
    # Same shape, but the headdim elements are two apart in memory.
    return torch.cat([x, x], dim=-1)[..., ::2]


BAD = [
    # wrong kind of object
    ("q-list", _set(q=[[1.0]]), TypeError, r"q must be a torch\.Tensor, got list"),
    ("k-numpy", _set(k=np.zeros((B, SK, HK, D))), TypeError, r"k must be a torch\.Tensor"),
    ("v-none", _set(v=None), TypeError, r"v must be a torch\.Tensor, got NoneType"),
    # rank
    ("q-3d", _set(q=_tensor(B, SQ, H)), ValueError, r"q must be 4-D .* got 3-D"),
    ("k-5d", _set(k=_tensor(B, SK, HK, D, 1)), ValueError, r"k must be 4-D .* got 5-D"),
    # dtypes
    (
        "q-fp32",
        _set(q=lambda kw: kw["q"].float()),
        TypeError,
        r"q\.dtype must be torch\.float16 or torch\.bfloat16, got torch\.float32",
    ),
    (
        "all-fp64",
        _set(**{n: (lambda kw, n=n: kw[n].double()) for n in "qkv"}),
        TypeError,
        r"q\.dtype .* got torch\.float64",
    ),
    (
        "k-bf16-q-fp16",
        _set(k=lambda kw: kw["k"].bfloat16()),
        TypeError,
        r"k\.dtype must equal q\.dtype \(torch\.float16\), got torch\.bfloat16",
    ),
    ("v-fp32", _set(v=lambda kw: kw["v"].float()), TypeError, r"v\.dtype must equal q\.dtype"),
    # devices
    (
        "k-other-device",
        _set(k=lambda kw: kw["k"].to("meta")),
        ValueError,
        r"k must be on the same device as q \(cpu\), got meta",
    ),
    # shapes
    ("k-batch", _set(k=_tensor(B + 1, SK, HK, D)), ValueError, r"k\.shape\[0\] \(batch\)"),
    ("v-batch", _set(v=_tensor(1, SK, HK, D)), ValueError, r"v\.shape\[0\] \(batch\) .* got 1"),
    ("k-headdim", _set(k=_tensor(B, SK, HK, 128)), ValueError, r"k\.shape\[3\] \(headdim\)"),
    ("v-headdim", _set(v=_tensor(B, SK, HK, 32)), ValueError, r"v\.shape\[3\] \(headdim\)"),
    (
        "v-seqlen",
        _set(v=_tensor(B, SK - 1, HK, D)),
        ValueError,
        r"v\.shape\[1\] \(seqlen_k\) must equal k\.shape\[1\] \(24\), got 23",
    ),
    ("v-kv-heads", _set(v=_tensor(B, SK, 1, D)), ValueError, r"v\.shape\[2\] \(kv heads\)"),
    (
        "heads-not-multiple",
        _set(q=_tensor(B, SQ, 3, D)),
        ValueError,
        r"q's heads \(3\) must be a multiple of k's heads \(kv heads, 2\)",
    ),
    ("seqlen-q-0", _set(q=_tensor(B, 0, H, D)), ValueError, r"q\.shape\[1\] \(seqlen_q\) .* got 0"),
    (
        "seqlen-k-0",
        _set(k=_tensor(B, 0, HK, D), v=_tensor(B, 0, HK, D)),
        ValueError,
        r"k\.shape\[1\] \(seqlen_k\) must be >= 1",
    ),
    (
        "batch-0",
        _set(q=_tensor(0, SQ, H, D), k=_tensor(0, SK, HK, D), v=_tensor(0, SK, HK, D)),
        ValueError,
        r"q\.shape\[0\] \(batch\) must be >= 1",
    ),
    (
        "headdim-80",
        _set(q=_tensor(B, SQ, H, 80), k=_tensor(B, SK, HK, 80), v=_tensor(B, SK, HK, 80)),
        NotImplementedError,
        r"headdim \(q\.shape\[-1\]\) must be one of \[64, 96, 128, 192, 256\], got 80",
    ),
    (
        "headdim-512",
        _set(q=_tensor(B, SQ, H, 512), k=_tensor(B, SK, HK, 512), v=_tensor(B, SK, HK, 512)),
        NotImplementedError,
        r"headdim .* got 512",
    ),
    # strides
    (
        "q-last-dim-strided",
        _set(q=lambda kw: _last_dim_strided(kw["q"])),
        ValueError,
        r"q must have a contiguous last dimension \(stride 1\)",
    ),
    (
        "v-transposed",
        _set(v=lambda kw: kw["v"].transpose(-1, -3).contiguous().transpose(-1, -3)),
        ValueError,
        r"v must have a contiguous last dimension",
    ),
    # flags
    ("causal-int", _set(causal=1), TypeError, r"causal must be a bool, got int"),
    ("causal-none", _set(causal=None), TypeError, r"causal must be a bool, got NoneType"),
    ("causal-numpy", _set(causal=np.bool_(True)), TypeError, r"causal must be a bool, got numpy"),
    ("deterministic-str", _set(deterministic="yes"), TypeError, r"deterministic must be a bool"),
    ("return-lse-numpy", _set(return_lse=np.bool_(True)), TypeError, r"return_lse must be a bool"),
    # softmax_scale
    ("scale-str", _set(softmax_scale="0.125"), TypeError, r"softmax_scale must be None or a real"),
    ("scale-bool", _set(softmax_scale=True), TypeError, r"softmax_scale .* got bool"),
    (
        "scale-tensor",
        _set(softmax_scale=torch.tensor(0.125)),
        TypeError,
        r"softmax_scale .* got Tensor",
    ),
    ("scale-zero", _set(softmax_scale=0.0), ValueError, r"softmax_scale must be a positive finite"),
    ("scale-negative", _set(softmax_scale=-1), ValueError, r"softmax_scale .* got -1"),
    ("scale-nan", _set(softmax_scale=float("nan")), ValueError, r"softmax_scale .* got nan"),
    ("scale-inf", _set(softmax_scale=float("inf")), ValueError, r"softmax_scale .* got inf"),
    # sm_margin
    (
        "sm-margin-negative",
        _set(sm_margin=-1),
        ValueError,
        r"sm_margin must be an int >= 0, got -1",
    ),
    ("sm-margin-float", _set(sm_margin=1.5), TypeError, r"sm_margin must be an int >= 0, got flo"),
    ("sm-margin-bool", _set(sm_margin=True), TypeError, r"sm_margin .* got bool"),
    ("gqa-split-int", _set(gqa_split=1), TypeError, r"gqa_split must be a bool"),
    ("gqa-split-str", _set(gqa_split="auto"), TypeError, r"gqa_split must be a bool"),
    # schedule
    ("schedule-none", _set(schedule=None), TypeError, r"schedule must be a str, got NoneType"),
    (
        "schedule-unknown",
        _set(schedule="ascending"),
        ValueError,
        r"schedule must be one of \['auto', 'fa3', 'descending', 'shift', 'symmetric_shift', "
        r"'shift_descending'\], got 'ascending'",
    ),
    ("schedule-case", _set(schedule="Shift"), ValueError, r"schedule must be one of .* 'Shift'"),
    (
        "shift-causal",
        _set(schedule="shift", causal=True),
        ValueError,
        r"schedule='shift' with the causal mask: .* full mask.* 'symmetric_shift'",
    ),
    (
        "symmetric-shift-full",
        _set(schedule="symmetric_shift"),
        ValueError,
        r"schedule='symmetric_shift' with the full mask: .* causal mask.* 'shift'",
    ),
]


@pytest.mark.parametrize(
    "mutate, exc, match", [pytest.param(*case[1:], id=case[0]) for case in BAD]
)
def test_bad_input_raises(mutate, exc, match):
    kwargs = _good()
    mutate(kwargs)
    with pytest.raises(exc, match=match):
        check_inputs(**kwargs)


def test_bad_inputs_are_distinct_and_numerous():
    assert len(BAD) >= 25
    assert len({case[0] for case in BAD}) == len(BAD)


def test_defaults_give_the_shape():
    got = check_inputs(**_good())
    assert got == AttnShape(
        batch=B, seqlen_q=SQ, seqlen_k=SK, heads=H, kv_heads=HK, headdim=D, dtype=torch.float16
    )
    assert got.group_size == 2


@pytest.mark.parametrize("headdim", SUPPORTED_HEADDIMS, ids=lambda d: f"d{d}")
def test_every_supported_headdim(headdim):
    kwargs = _good()
    kwargs.update(
        q=_tensor(1, 3, 2, headdim, dtype=torch.bfloat16),
        k=_tensor(1, 5, 1, headdim, dtype=torch.bfloat16, requires_grad=True),
        v=_tensor(1, 5, 1, headdim, dtype=torch.bfloat16),
    )
    assert check_inputs(**kwargs).headdim == headdim


def test_mqa_causal_with_every_option_set():
    # Packed qkv: views whose outer strides are not contiguous but whose last dim is.
    qkv = _tensor(B, SQ, 3, 1, 128, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(dim=2)
    q = q.expand(B, SQ, 8, 128)
    kwargs = {
        "q": q,
        "k": k,
        "v": v,
        "causal": True,
        "softmax_scale": np.float32(0.125),
        "deterministic": False,
        "schedule": "symmetric_shift",
        "sm_margin": np.int64(4),
        "return_lse": True,
    }
    got = check_inputs(**kwargs)
    assert (got.heads, got.kv_heads, got.group_size, got.dtype) == (8, 1, 8, torch.bfloat16)


@pytest.mark.parametrize("schedule", valid_schedule_names())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_schedule_names_accepted_for_their_mask(schedule, causal):
    kwargs = _good()
    kwargs.update(schedule=schedule, causal=causal)
    mismatched = (("shift", True), ("symmetric_shift", False), ("shift_descending", True))
    if (schedule, causal) in mismatched:
        with pytest.raises(ValueError, match="schedule="):
            check_inputs(**kwargs)
    else:
        assert check_inputs(**kwargs).seqlen_k == SK


def test_device_is_left_to_the_caller():
    # Same device everywhere is all the contract asks; CUDA-ness is decided by the caller.
    kwargs = _good()
    kwargs.update({n: kwargs[n].to("meta") for n in "qkv"})
    assert check_inputs(**kwargs).batch == B


def test_tma_aligned_needs_unit_last_stride_16_byte_strides_and_no_broadcast() -> None:
    from dash_attn.dispatch import tma_aligned

    q = torch.zeros(2, 100, 4, 64, dtype=torch.bfloat16)
    assert tma_aligned(q, q.clone())
    assert not tma_aligned(q, q[..., 1:])  # base 2 bytes past an aligned one
    assert not tma_aligned(q.transpose(2, 3))  # last stride not 1
    assert not tma_aligned(torch.zeros(2, 100, 4, 66, dtype=torch.bfloat16)[..., :64])  # 132 B rows
    broadcast = torch.zeros(2, 100, 1, 64, dtype=torch.bfloat16).expand(2, 100, 4, 64)
    assert not tma_aligned(broadcast)  # a zero stride


def test_backward_without_an_output_gradient_returns_no_gradients() -> None:
    # With materialize_grads off (no zero tensor for lse), autograd passes None for an output
    # that did not reach the loss; the backward then returns no gradient instead of failing.
    from dash_attn.interface import DashAttnFunction, DashAttnVarlenFunction

    assert DashAttnFunction.backward(None, None, None) == (None,) * 12
    assert DashAttnVarlenFunction.backward(None, None, None) == (None,) * 16


@pytest.mark.parametrize(
    "causal,window,expected",
    [
        (False, (2**31 - 1, 2**31 - 1), (False, (-1, -1))),
        (False, (2**64, -1), (False, (-1, -1))),
        (False, (2**30, 5), (False, (-1, 5))),
        (False, (2**30 - 1, 5), (False, (2**30 - 1, 5))),
        (True, (2**63 - 1, -1), (True, (-1, 0))),
    ],
)
def test_windows_past_any_sequence_are_unbounded(causal, window, expected) -> None:
    """A side of 2**30 or more reaches past any sequence (-1); passed on, 2**31 - 1 wrapped in
    the kernels' int32 row arithmetic and gave wrong outputs, and 2**64 overflowed in Triton."""
    from dash_attn.validation import normalize_window

    assert normalize_window(causal, window) == expected
