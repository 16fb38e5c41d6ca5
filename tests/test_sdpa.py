"""``dash_attn.scaled_dot_product_attention``: torch's SDPA signature over ``dash_attn_func``.

On the plain CPU the kernel is replaced by the eager reference (same layout and arguments), so the
layout glue, argument mapping and refusals are tested everywhere; the interpreter tests run the
real kernels against torch's own SDPA.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import dash_attn.sdpa as sdpa_module
from dash_attn.reference.attention import attention_ref
from dash_attn.sdpa import scaled_dot_product_attention

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


def _bhsd(batch: int, heads: int, seqlen: int, headdim: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, heads, seqlen, headdim, generator=gen)


@pytest.fixture
def reference_kernel(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replace dash_attn_func by the eager reference in dash-attn's (B, S, H, D) layout; record
    the calls."""
    calls: list[dict] = []

    def fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: object) -> torch.Tensor:
        calls.append({"shapes": (q.shape, k.shape, v.shape), **kwargs})
        assert set(kwargs) == {"softmax_scale", "causal"}
        out, _ = attention_ref(
            q, k, v, causal=kwargs["causal"], softmax_scale=kwargs["softmax_scale"]
        )
        return out

    monkeypatch.setattr(sdpa_module, "dash_attn_func", fake)
    return calls


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_matches_torch_sdpa_through_the_layout_glue(
    reference_kernel: list[dict], is_causal: bool, heads: int, kv_heads: int, scale: float | None
) -> None:
    q = _bhsd(2, heads, 12, 16, 0)
    k, v = _bhsd(2, kv_heads, 12, 16, 1), _bhsd(2, kv_heads, 12, 16, 2)
    gqa = heads != kv_heads
    ours = scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=gqa)
    theirs = F.scaled_dot_product_attention(
        q, k, v, is_causal=is_causal, scale=scale, enable_gqa=gqa
    )
    assert ours.shape == theirs.shape == (2, heads, 12, 16)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    (call,) = reference_kernel
    # The kernel saw (B, S, H, D) and the arguments mapped by name.
    assert call["shapes"] == ((2, 12, heads, 16), (2, 12, kv_heads, 16), (2, 12, kv_heads, 16))
    assert call["causal"] is is_causal and call["softmax_scale"] == scale


def test_different_seqlens_without_causal_are_served(reference_kernel: list[dict]) -> None:
    q, k, v = _bhsd(1, 2, 5, 16, 0), _bhsd(1, 2, 9, 16, 1), _bhsd(1, 2, 9, 16, 2)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v)
    )


def test_gradients_flow_back_in_sdpa_layout(reference_kernel: list[dict]) -> None:
    q, k, v = (_bhsd(1, 2, 8, 16, s).requires_grad_() for s in range(3))
    scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum().backward()
    for a, t in zip(ours, (q, k, v), strict=True):
        torch.testing.assert_close(a, t.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"attn_mask": torch.ones(8, 8, dtype=torch.bool)}, NotImplementedError, "attn_mask"),
        ({"attn_mask": torch.zeros(1, 1, 8, 8)}, NotImplementedError, "dash_attn_varlen_func"),
        ({"dropout_p": 0.1}, NotImplementedError, "dropout_p=0.1"),
        ({"dropout_p": "0"}, TypeError, "dropout_p must be a float"),
        ({"is_causal": 1}, TypeError, "is_causal must be a bool"),
        ({"enable_gqa": None}, TypeError, "enable_gqa must be a bool"),
        ({"scale": float("nan")}, TypeError, "scale must be a finite float"),
        ({"scale": 0.0}, ValueError, r"scale must be > 0, got 0\.0"),
    ],
)
def test_refusals_name_the_argument(
    reference_kernel: list[dict], kwargs: dict, error: type[Exception], match: str
) -> None:
    q, k, v = (_bhsd(1, 2, 8, 16, s) for s in range(3))
    with pytest.raises(error, match=match):
        scaled_dot_product_attention(q, k, v, **kwargs)
    assert reference_kernel == []  # refused before any kernel ran


def test_causal_with_different_lengths_is_refused(reference_kernel: list[dict]) -> None:
    q, k, v = _bhsd(1, 2, 4, 16, 0), _bhsd(1, 2, 9, 16, 1), _bhsd(1, 2, 9, 16, 2)
    with pytest.raises(NotImplementedError, match="top-left.*bottom-right"):
        scaled_dot_product_attention(q, k, v, is_causal=True)


def test_gqa_needs_enable_gqa_as_in_torch(reference_kernel: list[dict]) -> None:
    q, k, v = _bhsd(1, 4, 8, 16, 0), _bhsd(1, 2, 8, 16, 1), _bhsd(1, 2, 8, 16, 2)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError, match="enable_gqa=True"):
        scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("bad", ["query", "key", "value"])
def test_layout_is_checked(reference_kernel: list[dict], bad: str) -> None:
    args = {name: _bhsd(1, 2, 8, 16, i) for i, name in enumerate(("query", "key", "value"))}
    args[bad] = args[bad][0]
    with pytest.raises(ValueError, match=f"{bad} must be 4-D \\(batch, heads, seqlen, headdim\\)"):
        scaled_dot_product_attention(**args)


@pytest.mark.interpreter
@pytest.mark.skipif(not INTERPRETER, reason="needs TRITON_INTERPRET=1 before import")
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
def test_kernels_match_torch_sdpa_in_the_interpreter(is_causal: bool) -> None:
    # float16 only in the interpreter; GQA 4:2, a length that is no tile multiple.
    q = _bhsd(1, 4, 40, 64, 0).half().requires_grad_()
    k = _bhsd(1, 2, 40, 64, 1).half().requires_grad_()
    v = _bhsd(1, 2, 40, 64, 2).half().requires_grad_()
    out = scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    ref = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=is_causal, enable_gqa=True
    )
    assert out.shape == (1, 4, 40, 64) and out.dtype == torch.float16
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)
    grad = _bhsd(1, 4, 40, 64, 3).half()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), grad.float())
    for ours, theirs in ((dq, rq), (dk, rk), (dv, rv)):
        torch.testing.assert_close(ours.float(), theirs.float(), atol=1e-2, rtol=1e-2)


def test_a_value_of_other_heads_is_refused_in_this_layouts_terms(reference_kernel: list[dict]):
    q, k = (_bhsd(1, 4, 8, 16, s) for s in range(2))
    v = _bhsd(1, 2, 8, 16, 2)
    with pytest.raises(ValueError, match=r"value must have key's heads and seqlen"):
        scaled_dot_product_attention(q, k, v)
    assert reference_kernel == []
