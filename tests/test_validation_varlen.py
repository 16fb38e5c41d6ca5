"""Bad inputs to ``dash_attn_varlen_func`` and the flash-attn extras each raise, naming the
argument; ``check_cu_seqlens_values`` catches every malformed ``cu_seqlens``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from dash_attn.validation import (
    check_cu_seqlens_values,
    check_flash_attn_extras,
    check_inputs,
    check_varlen_inputs,
    mask_of,
)

H, HK, D = 4, 2, 64
LENS = [0, 5, 5, 17]  # three sequences, the middle one empty


def _tensor(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(shape).to(dtype)


def _cu(values: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _good() -> dict[str, Any]:
    total = LENS[-1]
    return {
        "q": _tensor(total, H, D),
        "k": _tensor(total, HK, D),
        "v": _tensor(total, HK, D),
        "cu_seqlens_q": _cu(LENS),
        "cu_seqlens_k": _cu(LENS),
        "max_seqlen_q": 12,
        "max_seqlen_k": 12,
        "causal": True,
        "softmax_scale": None,
        "deterministic": True,
        "schedule": "auto",
        "sm_margin": 0,
        "return_lse": False,
    }


def _set(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def apply(kwargs: dict[str, Any]) -> None:
        kwargs.update(changes)

    return apply


BAD = [
    ("q-4d", _set(q=_tensor(1, 17, H, D)), ValueError, r"q must be 3-D \(total_tokens"),
    ("k-list", _set(k=[1.0]), TypeError, r"k must be a torch\.Tensor"),
    ("v-rows", _set(v=_tensor(16, HK, D)), ValueError, r"v\.shape\[:2\] must equal k\.shape"),
    ("k-headdim", _set(k=_tensor(17, HK, 128)), ValueError, r"k\.shape\[2\] \(headdim\)"),
    ("heads", _set(q=_tensor(17, 3, D)), ValueError, r"q's heads \(3\) must be a multiple"),
    ("cu-int64", _set(cu_seqlens_q=_cu(LENS, torch.int64)), TypeError, r"cu_seqlens_q\.dtype"),
    ("cu-list", _set(cu_seqlens_k=LENS), TypeError, r"cu_seqlens_k must be a torch\.Tensor"),
    ("cu-2d", _set(cu_seqlens_q=_cu(LENS).view(2, 2)), ValueError, r"cu_seqlens_q must be 1-D"),
    ("cu-short", _set(cu_seqlens_k=_cu([0])), ValueError, r"cu_seqlens_k must be 1-D with"),
    (
        "cu-device",
        _set(cu_seqlens_q=_cu(LENS).to("meta")),
        ValueError,
        r"cu_seqlens_q must be on q's device \(cpu\), got meta",
    ),
    (
        "cu-lengths-differ",
        _set(cu_seqlens_k=_cu([0, 17])),
        ValueError,
        r"cu_seqlens_q and cu_seqlens_k must have the same length",
    ),
    ("max-float", _set(max_seqlen_q=12.0), TypeError, r"max_seqlen_q must be an int"),
    ("max-zero", _set(max_seqlen_k=0), ValueError, r"max_seqlen_k must be >= 1, got 0"),
    ("window-int", _set(window_size=4), TypeError, r"window_size must be a pair of ints"),
    ("window-3", _set(window_size=(1, 2, 3)), TypeError, r"window_size must be a pair"),
    ("window-float", _set(window_size=(1.0, 0)), TypeError, r"window_size must be a pair of int"),
    ("window-neg", _set(window_size=(-2, 0)), ValueError, r"window_size entries must be >= -1"),
    ("invariant-int", _set(invariant=1), TypeError, r"invariant must be a bool"),
    ("gqa-split-int", _set(gqa_split=0), TypeError, r"gqa_split must be a bool"),
    (
        "shift-window",
        _set(schedule="shift", window_size=(8, 8), causal=False),
        ValueError,
        r"schedule='shift' with the local\(8,8\) mask",
    ),
]


@pytest.mark.parametrize("mutate, exc, match", [pytest.param(*c[1:], id=c[0]) for c in BAD])
def test_bad_varlen_input_raises(mutate, exc, match):
    kwargs = _good()
    mutate(kwargs)
    with pytest.raises(exc, match=match):
        check_varlen_inputs(**kwargs)


def test_good_varlen_inputs_give_the_shape():
    shape = check_varlen_inputs(**_good(), window_size=(7, -1))
    assert (shape.batch, shape.seqlen_q, shape.seqlen_k, shape.heads, shape.kv_heads) == (
        3, 17, 17, H, HK,
    )  # fmt: skip
    assert shape.mask == mask_of(True, (7, 0))


BAD_VALUES = [
    ("first-not-0", [1, 5, 17], [0, 5, 17], r"cu_seqlens_q\[0\] must be 0, got 1"),
    ("decreasing", [0, 9, 5, 17], [0, 5, 5, 17], r"cu_seqlens_q must be non-decreasing.*\[1\] = 9"),
    ("last-not-total", [0, 5, 16], [0, 5, 17], r"cu_seqlens_q\[-1\] must equal .* \(17\), got 16"),
    ("k-last", [0, 5, 17], [0, 5, 18], r"cu_seqlens_k\[-1\] must equal the number of tokens in k"),
    ("max-too-small", [0, 2, 17], [0, 5, 17], r"max_seqlen_q \(12\) is smaller than .* \(15\)"),
]


@pytest.mark.parametrize("cu_q, cu_k, match", [pytest.param(*c[1:], id=c[0]) for c in BAD_VALUES])
def test_bad_cu_seqlens_values(cu_q, cu_k, match):
    with pytest.raises(ValueError, match=match):
        check_cu_seqlens_values(cu_q, cu_k, 17, 17, 12, 12)


def test_cu_seqlens_values_give_the_lengths():
    assert check_cu_seqlens_values([0, 5, 5, 17], [0, 3, 9, 17], 17, 17, 12, 8) == (
        (5, 3), (0, 6), (12, 8),
    )  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dropout_p": 0.1}, r"dropout_p=0\.1"),
        ({"softcap": 30.0}, r"softcap=30\.0"),
        ({"alibi_slopes": torch.ones(4)}, r"alibi_slopes"),
        ({"return_attn_probs": True}, r"return_attn_probs=True.*return_lse"),
    ],
)
def test_flash_attn_extras_are_refused_by_name(kwargs, match):
    args = {"dropout_p": 0.0, "softcap": 0.0, "alibi_slopes": None, "return_attn_probs": False}
    args.update(kwargs)
    with pytest.raises(NotImplementedError, match=match):
        check_flash_attn_extras(**args)
    neutral = {"dropout_p": 0.0, "softcap": 0.0, "alibi_slopes": None, "return_attn_probs": False}
    check_flash_attn_extras(**neutral)  # the neutral values pass


def test_window_size_makes_the_mask():
    assert mask_of(False, (-1, -1)).kind == "full"
    assert mask_of(True, (-1, -1)).kind == "causal"
    assert mask_of(False, (-1, 0)).kind == "causal"  # flash-attn: a right side of 0 is causal
    local = mask_of(True, (255, 7))  # causal overrides the right side
    assert (local.kind, local.window) == ("local", (255, 0))
    dense = check_inputs(
        _tensor(1, 9, H, D), _tensor(1, 9, HK, D), _tensor(1, 9, HK, D), causal=False,
        softmax_scale=None, deterministic=True, schedule="descending", sm_margin=0,
        return_lse=False, window_size=(3, 2),
    )  # fmt: skip
    assert dense.mask.window == (3, 2)
