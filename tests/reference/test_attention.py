"""CPU checks of the eager reference: forward vs SDPA, explicit backward vs autograd, edge rows."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from dash_attn.reference.attention import (
    attention_bwd_ref,
    attention_ref,
    causal_mask,
    visible_mask,
)
from dash_attn.testing import assert_close_to_ref, make_qkv, repeat_equal

F64 = {"atol": 1e-12, "rtol": 1e-12}

# (batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal)
SHAPES = [
    pytest.param(2, 13, 13, 2, 2, 16, False, id="b2-sq13-sk13-h2-kv2-d16-full"),
    pytest.param(2, 13, 13, 2, 2, 16, True, id="b2-sq13-sk13-h2-kv2-d16-causal"),
    pytest.param(1, 7, 19, 4, 2, 8, False, id="b1-sq7-sk19-h4-kv2-d8-full"),
    pytest.param(1, 7, 19, 4, 2, 8, True, id="b1-sq7-sk19-h4-kv2-d8-causal"),
    pytest.param(1, 19, 7, 3, 1, 8, False, id="b1-sq19-sk7-h3-kv1-d8-full"),
    pytest.param(1, 19, 7, 3, 1, 8, True, id="b1-sq19-sk7-h3-kv1-d8-causal"),
    pytest.param(2, 1, 9, 2, 1, 8, True, id="b2-sq1-sk9-h2-kv1-d8-causal"),
]


def _sdpa_layout(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal", SHAPES)
def test_forward_matches_sdpa(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal):
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.float64, "cpu", 0)
    scale = 0.3
    out, lse = attention_ref(q, k, v, causal=causal, softmax_scale=scale)
    if causal and seqlen_q == seqlen_k:
        # SDPA's is_causal is top-left aligned; for square attention it is the same mask.
        mask_kwargs = {"is_causal": True}
    elif causal:
        # Bottom-right alignment spelled independently of causal_mask(): keep c - r <= sk - sq.
        keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).tril(seqlen_k - seqlen_q)
        mask_kwargs = {"attn_mask": keep}
    else:
        mask_kwargs = {}
    expected = F.scaled_dot_product_attention(
        _sdpa_layout(q),
        _sdpa_layout(k),
        _sdpa_layout(v),
        scale=scale,
        enable_gqa=heads != kv_heads,
        **mask_kwargs,
    )
    # Rows that see no key are SDPA-version dependent (NaN or 0); the fully-masked test owns them.
    seen = slice(max(0, seqlen_q - seqlen_k), None) if causal else slice(None)
    torch.testing.assert_close(out[:, seen], _sdpa_layout(expected)[:, seen], **F64)

    group = heads // kv_heads
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(group, dim=2)) * scale
    if causal:
        scores = scores.masked_fill(~causal_mask(seqlen_q, seqlen_k), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), **F64)
    assert lse.shape == (batch, heads, seqlen_q) and lse.dtype == torch.float64


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal", SHAPES)
def test_explicit_backward_matches_autograd(
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, causal
):
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.float64, "cpu", 1)
    out, lse = attention_ref(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v), dout)
    got = attention_bwd_ref(q, k, v, out, lse, dout, causal=causal, softmax_scale=None)
    for name, g, e in zip(("dq", "dk", "dv"), got, expected, strict=True):
        assert g.shape == e.shape, name
        torch.testing.assert_close(g, e, **F64, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, causal",
    [
        pytest.param(3, 5, True, id="sq3-sk5-causal"),
        pytest.param(5, 2, True, id="sq5-sk2-causal-empty-rows"),
        pytest.param(4, 3, False, id="sq4-sk3-full"),
    ],
)
def test_gradcheck(seqlen_q, seqlen_k, causal):
    q, k, v = make_qkv(1, seqlen_q, seqlen_k, 2, 1, 4, torch.float64, "cpu", 2)
    # lse is -inf on empty rows, where finite differences are undefined; check out only there.
    with_lse = seqlen_q <= seqlen_k or not causal

    def fn(q, k, v):
        out, lse = attention_ref(q, k, v, causal=causal, softmax_scale=0.7)
        return (out, lse) if with_lse else out

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_fully_masked_rows_are_zero_and_grads_finite():
    # seqlen_q=6, seqlen_k=2 causal: rows 0..3 see no key (bottom-right alignment).
    q, k, v = make_qkv(2, 6, 2, 2, 1, 8, torch.float64, "cpu", 3)
    out, lse = attention_ref(q, k, v, causal=True)
    empty = slice(0, 4)
    assert torch.equal(out[:, empty], torch.zeros_like(out[:, empty]))
    assert torch.isneginf(lse[:, :, empty]).all()
    assert torch.isfinite(lse[:, :, 4:]).all()

    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    explicit = attention_bwd_ref(q, k, v, out, lse, dout, causal=True, softmax_scale=None)
    for name, g, e in zip(("dq", "dk", "dv"), explicit, grads, strict=True):
        assert torch.isfinite(g).all() and torch.isfinite(e).all(), name
        torch.testing.assert_close(g, e, **F64)
    assert torch.equal(grads[0][:, empty], torch.zeros_like(grads[0][:, empty]))


def test_causal_mask_is_bottom_right_aligned():
    wide = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    tall = torch.tensor([[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(3, 5), wide)
    assert torch.equal(causal_mask(5, 2), tall)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kv_heads", [1, 2], ids=["mqa", "gqa"])
def test_gqa_equals_repeated_kv_heads(kv_heads, causal):
    heads, group = 4, 4 // kv_heads
    q, k, v = make_qkv(2, 9, 11, heads, kv_heads, 8, torch.float64, "cpu", 4)
    k_rep = k.detach().repeat_interleave(group, dim=2).requires_grad_()
    v_rep = v.detach().repeat_interleave(group, dim=2).requires_grad_()
    out, lse = attention_ref(q, k, v, causal=causal)
    out_rep, lse_rep = attention_ref(q, k_rep, v_rep, causal=causal)
    torch.testing.assert_close(out, out_rep, **F64)
    torch.testing.assert_close(lse, lse_rep, **F64)

    dout = torch.randn_like(out)
    dk, dv = torch.autograd.grad(out, (k, v), dout)
    dk_rep, dv_rep = torch.autograd.grad(out_rep, (k_rep, v_rep), dout)
    # Query head h reads kv head h // group, so the repeated heads fold back kv-head-major.
    fold = lambda x: x.reshape(2, 11, kv_heads, group, 8).sum(dim=3)
    torch.testing.assert_close(dk, fold(dk_rep), **F64)
    torch.testing.assert_close(dv, fold(dv_rep), **F64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_upcast_flag(dtype):
    q, k, v = make_qkv(1, 24, 24, 2, 2, 16, dtype, "cpu", 5, requires_grad=False)
    exact, _ = attention_ref(q.double(), k.double(), v.double(), causal=True)
    up, lse_up = attention_ref(q, k, v, causal=True)
    same, lse_same = attention_ref(q, k, v, causal=True, upcast=False)
    assert up.dtype == same.dtype == dtype
    assert lse_up.dtype == lse_same.dtype == torch.float32
    # Rounding every intermediate to 16 bits must cost more than rounding only the output.
    err_up = (up.double() - exact).abs().max()
    err_same = (same.double() - exact).abs().max()
    assert err_up < err_same


def test_assert_close_to_ref_rule():
    ref = torch.zeros(4)
    same = torch.tensor([0.0, 0.1, 0.0, 0.0])
    assert_close_to_ref("out", torch.tensor([0.0, 0.0, 0.19, 0.0]), ref, same, atol=0.0)
    with pytest.raises(AssertionError, match=r"dq: max \|got - ref\| = 2\.500e-01"):
        assert_close_to_ref("dq", torch.tensor([0.25, 0.0, 0.0, 0.0]), ref, same, atol=0.0)
    lse = torch.tensor([float("-inf"), 1.0])
    assert_close_to_ref("lse", lse.clone(), lse, lse, atol=0.0)
    with pytest.raises(AssertionError, match="lse"):
        assert_close_to_ref("lse", torch.tensor([float("nan"), 1.0]), lse, lse, atol=1.0)


def test_make_qkv_and_repeat_equal():
    a = make_qkv(1, 5, 7, 4, 2, 8, torch.bfloat16, "cpu", seed=11)
    b = make_qkv(1, 5, 7, 4, 2, 8, torch.bfloat16, "cpu", seed=11)
    assert [t.shape for t in a] == [(1, 5, 4, 8), (1, 7, 2, 8), (1, 7, 2, 8)]
    assert all(t.requires_grad and t.dtype == torch.bfloat16 and t.is_leaf for t in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], make_qkv(1, 5, 7, 4, 2, 8, torch.bfloat16, "cpu", seed=12)[0])

    assert repeat_equal(lambda: (a[0] * 2, a[1]), 3) == (True, 0.0)
    calls = iter(range(10))
    equal, diff = repeat_equal(lambda: torch.full((2,), float(next(calls))), 3)
    assert not equal and diff == 2.0
    # Bitwise, not numerically: -0.0 and 0.0 compare equal with == but are different bits.
    signs = iter([0.0, -0.0])
    assert repeat_equal(lambda: torch.tensor([next(signs)]), 2) == (False, 0.0)


# --- sliding windows and packed sequences ---------------------------------------------------------


def test_visible_mask_examples() -> None:
    # The docstring's window (1, 0) on 5 x 5, a window wider on the right, and the corner cases.
    band = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(visible_mask(5, 5, window_size=(1, 0)), band)
    assert torch.equal(visible_mask(5, 5, causal=True, window_size=(1, 7)), band)  # causal: right 0
    # seqlen_k - seqlen_q = 2 shifts the diagonal right: row r's window is keys r+2-1 .. r+2+1.
    assert visible_mask(3, 5, window_size=(1, 1)).nonzero().tolist() == [
        [0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [1, 4], [2, 3], [2, 4],
    ]  # fmt: skip
    assert visible_mask(4, 4) is None  # full: no mask
    assert torch.equal(visible_mask(5, 2, causal=True), causal_mask(5, 2))
    with pytest.raises(ValueError, match="window"):
        visible_mask(4, 4, window_size=(-2, 0))


def _explicit_window_attention(q, k, v, left, right, scale):
    """One sequence, every row by itself: softmax over exactly the keys of the row rule."""
    seqlen_q, seqlen_k = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], seqlen_q), float("-inf"), dtype=q.dtype)
    for r in range(seqlen_q):
        diag = r + seqlen_k - seqlen_q
        keys = [c for c in range(seqlen_k) if (left < 0 or c >= diag - left) and c <= diag + right]
        if not keys:
            continue
        for h in range(q.shape[1]):
            s = k[keys, h // group] @ q[r, h] * scale
            out[r, h] = torch.softmax(s, 0) @ v[keys, h // group]
            lse[h, r] = torch.logsumexp(s, 0)
    return out, lse


@pytest.mark.parametrize("window", [(3, 0), (-1, 2), (2, 2), (0, 0)])
@pytest.mark.parametrize(
    "lengths", [(9, 9), (5, 11), (11, 5)], ids=["sq9sk9", "sq5sk11", "sq11sk5"]
)
def test_window_matches_row_by_row_softmax(window, lengths) -> None:
    seqlen_q, seqlen_k = lengths
    q, k, v = make_qkv(1, seqlen_q, seqlen_k, 4, 2, 8, torch.float64, "cpu", 3)
    out, lse = attention_ref(q, k, v, window_size=window, softmax_scale=0.5)
    right = window[1] if window[1] >= 0 else seqlen_k
    exp_out, exp_lse = _explicit_window_attention(q[0], k[0], v[0], window[0], right, 0.5)
    torch.testing.assert_close(out[0], exp_out, **F64)
    torch.testing.assert_close(lse[0], exp_lse, **F64)


VARLEN = [(5, 7), (0, 4), (9, 9), (3, 0), (12, 6)]


def _packed(seed: int, heads: int = 4, kv_heads: int = 2, headdim: int = 8):
    gen = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(sq for sq, _ in VARLEN), sum(sk for _, sk in VARLEN)
    q = torch.randn(total_q, heads, headdim, generator=gen, dtype=torch.float64)
    k = torch.randn(total_k, kv_heads, headdim, generator=gen, dtype=torch.float64)
    v = torch.randn(total_k, kv_heads, headdim, generator=gen, dtype=torch.float64)
    cu_q = torch.tensor([0, *itertools.accumulate(sq for sq, _ in VARLEN)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(sk for _, sk in VARLEN)], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize(
    "causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 1)), (True, (4, -1))]
)
def test_varlen_is_each_sequence_alone(causal, window) -> None:
    q, k, v, cu_q, cu_k = _packed(4)
    out, lse = attention_ref(
        q, k, v, causal=causal, window_size=window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k
    )
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    for b in range(len(VARLEN)):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        alone, lse_alone = attention_ref(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal, window_size=window
        )
        torch.testing.assert_close(out[q0:q1], alone[0], **F64)
        torch.testing.assert_close(lse[:, q0:q1], lse_alone[0], **F64)
    # The empty-key sequence (3, 0): no key, so out 0 and lse -inf.
    q0, q1 = int(cu_q[3]), int(cu_q[4])
    assert torch.count_nonzero(out[q0:q1]) == 0 and torch.isneginf(lse[:, q0:q1]).all()


@pytest.mark.parametrize(
    "causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 1)), (True, (4, -1))]
)
def test_varlen_window_explicit_backward_matches_autograd(causal, window) -> None:
    q, k, v, cu_q, cu_k = _packed(5)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    kwargs = dict(causal=causal, window_size=window, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out, lse = attention_ref(q, k, v, **kwargs)
    dout = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v), dout)
    got = attention_bwd_ref(
        q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), dout,
        softmax_scale=None, **kwargs,
    )  # fmt: skip
    for name, g, e in zip(("dq", "dk", "dv"), got, expected, strict=True):
        assert g.shape == e.shape, name
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, e, **F64, msg=lambda m, name=name: f"{name}: {m}")


def test_varlen_needs_both_boundaries() -> None:
    q, k, v, cu_q, _ = _packed(6)
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k"):
        attention_ref(q, k, v, cu_seqlens_q=cu_q)
