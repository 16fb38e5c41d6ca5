"""The public API on Triton's CPU interpreter: flash-attn's positional order, the varlen entry
point and its custom ops, window_size, and errors raised from inside the ops.

Kernel numerics and bitwise invariance are tested beside the kernels
(``tests/backends/triton/test_interpreter.py``); this file tests what the API layer adds. Run
with ``TRITON_INTERPRET=1 python -m pytest -m interpreter``.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "interpreter tests need TRITON_INTERPRET=1 set before dash_attn's kernels are imported",
        allow_module_level=True,
    )

import torch

import dash_attn
from dash_attn import dash_attn_func, dash_attn_varlen_func
from dash_attn.reference.attention import attention_ref
from dash_attn.testing import bitwise_equal

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

DTYPE = torch.float16


def _qkv(*shape_q: int, kv_heads: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    *lead, heads, headdim = shape_q
    q = torch.randn(*lead, heads, headdim, generator=gen).to(DTYPE)
    k = torch.randn(*lead, kv_heads, headdim, generator=gen).to(DTYPE)
    v = torch.randn(*lead, kv_heads, headdim, generator=gen).to(DTYPE)
    return q, k, v


def _grads(fn, q, k, v, dout) -> list[torch.Tensor]:
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


def test_flash_attn_positional_order():
    q, k, v = _qkv(1, 70, 4, 64, kv_heads=2)
    dout = torch.randn_like(q)
    by_keyword = _grads(
        lambda q, k, v: dash_attn_func(q, k, v, causal=True, schedule="descending"),
        q, k, v, dout,
    )  # fmt: skip
    # flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
    # alibi_slopes, deterministic): drop-in code passes them by position.
    positional = _grads(
        lambda q, k, v: dash_attn_func(
            q, k, v, 0.0, 64**-0.5, True, (-1, -1), 0.0, None, True, schedule="descending"
        ),
        q, k, v, dout,
    )  # fmt: skip
    assert all(bitwise_equal(a, b) for a, b in zip(by_keyword, positional, strict=True))
    with pytest.raises(NotImplementedError, match=r"dropout_p=0\.1"):
        dash_attn_func(q, k, v, 0.1)


def test_window_through_the_api_matches_the_reference():
    q, k, v = _qkv(2, 90, 4, 64, kv_heads=2, seed=1)
    out, lse = dash_attn_func(q, k, v, causal=True, window_size=(20, -1), return_lse=True)
    ref_out, ref_lse = attention_ref(
        q.float(), k.float(), v.float(), causal=True, window_size=(20, 0)
    )
    assert (out.float() - ref_out.float()).abs().max().item() < 2e-2
    assert (lse - ref_lse).abs().max().item() < 1e-2
    assert lse.shape == (2, 4, 90)
    assert dash_attn.last_forward_backend()[0] == "triton"


def test_varlen_api_shapes_lse_layout_and_plan():
    lens = [0, 37, 37, 127]  # an empty sequence in the middle
    cu = torch.tensor(lens, dtype=torch.int32)
    q, k, v = _qkv(127, 4, 64, kv_heads=2, seed=2)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, lse = dash_attn_varlen_func(
        q, k, v, cu, cu, 90, 90, causal=True, schedule="descending", return_lse=True
    )
    assert out.shape == q.shape and lse.shape == (4, 127) and lse.dtype == torch.float32
    out.sum().backward()
    plan = dash_attn.last_launch_info()
    assert plan.backend == "triton" and plan.problem.seqlens == ((37, 37), (0, 0), (90, 90))
    assert "varlen" in plan.describe()
    # The second sequence alone, through the padded-batch API: the same output rows.
    alone = dash_attn_func(
        q[37:].detach()[None], k[37:].detach()[None], v[37:].detach()[None], causal=True
    )
    assert bitwise_equal(out[37:].detach(), alone[0])


@pytest.mark.parametrize(
    "cu_k, match",
    [
        ([0, 37, 126], r"cu_seqlens_k\[-1\] must equal the number of tokens in k \(127\)"),
        ([0, 90, 127], r"max_seqlen_k \(40\) is smaller than the longest sequence"),
        ([0, 100, 90], r"cu_seqlens_k must be non-decreasing"),
    ],
)
def test_bad_cu_seqlens_values_raise_from_the_op(cu_k, match):
    q, k, v = _qkv(127, 4, 64, kv_heads=2, seed=3)
    cu_q = torch.tensor([0, 37, 127], dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        dash_attn_varlen_func(q, k, v, cu_q, torch.tensor(cu_k, dtype=torch.int32), 90, 40)


def test_opcheck_varlen_ops():
    q, k, v = _qkv(70, 4, 64, kv_heads=2, seed=4)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32)
    args = (q, k, v, cu, cu, 40, 40, True, 0.125, "auto", -1, -1)
    torch.library.opcheck(torch.ops.dash_attn.varlen_fwd.default, args)
    out, lse = torch.ops.dash_attn.varlen_fwd(*args)
    dout = torch.randn_like(q)
    torch.library.opcheck(
        torch.ops.dash_attn.varlen_bwd.default,
        (dout, q, k, v, out, lse, cu, cu, 40, 40, True, 0.125, True, "fa3", 0, "auto", -1, -1,
         True),
    )  # fmt: skip


def test_torch_compile_fullgraph_traces_both_entry_points():
    # Dynamo traces the API layer (validation, autograd.Function) without a graph break: no
    # Mask object is built there, and one cu_seqlens tensor may serve q and k.
    q, k, v = (x.requires_grad_() for x in _qkv(1, 40, 2, 64, kv_heads=2, seed=5))
    dense = torch.compile(
        lambda q, k, v: dash_attn_func(q, k, v, causal=True, window_size=(8, -1)),
        fullgraph=True, backend="eager",
    )  # fmt: skip
    out = dense(q, k, v)
    out.sum().backward()
    assert bitwise_equal(out.detach(), dash_attn_func(q, k, v, causal=True, window_size=(8, -1)))
    cu = torch.tensor([0, 15, 40], dtype=torch.int32)
    packed = torch.compile(
        lambda q, k, v: dash_attn_varlen_func(q, k, v, cu, cu, 25, 25, causal=True),
        fullgraph=True, backend="eager",
    )  # fmt: skip
    out = packed(q[0], k[0], v[0])
    out.sum().backward()
    assert out.shape == (40, 2, 64) and q.grad is not None


def test_ops_on_transposed_inputs_give_the_fake_strides():
    """Every output is contiguous whatever the inputs' strides, as the fake ops say: inductor
    checks the real strides against them (the SDPA layout's transposed views failed its
    backward before session 53)."""
    inputs = _qkv(1, 24, 2, 64, kv_heads=2, seed=6)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in inputs)
    assert not q.is_contiguous()
    torch.library.opcheck(torch.ops.dash_attn.fwd.default, (q, k, v, True, 0.125))
    out, lse = torch.ops.dash_attn.fwd(q, k, v, True, 0.125)
    assert out.is_contiguous()
    dout = torch.randn_like(q)
    args = (dout, q, k, v, out, lse, True, 0.125, True, "fa3", 0, "auto", -1, -1, True, None)
    torch.library.opcheck(torch.ops.dash_attn.bwd.default, args)
    assert all(g.is_contiguous() for g in torch.ops.dash_attn.bwd(*args))
    packed_q = q[0].transpose(0, 1).contiguous().transpose(0, 1)  # (tokens, heads, dim), head-major
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)
    fwd_args = (packed_q, k[0], v[0], cu, cu, 14, 14, True, 0.125, "auto", -1, -1)
    torch.library.opcheck(torch.ops.dash_attn.varlen_fwd.default, fwd_args)


def test_inductor_compiles_the_sdpa_layouts_backward():
    """``torch.compile`` with inductor, fullgraph, of the SDPA-layout wrapper (q, k, v
    transposed views of the kernels' layout), forward and backward, equal to eager."""
    import torch._dynamo

    torch._dynamo.reset()
    leaves = [x.transpose(1, 2).contiguous() for x in _qkv(1, 24, 2, 64, kv_heads=2, seed=7)]

    def attention(q, k, v):
        return dash_attn.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled = torch.compile(attention, fullgraph=True)
    grads = []
    for fn in (compiled, attention):
        q, k, v = (x.clone().requires_grad_() for x in leaves)
        out = fn(q, k, v)
        out.backward(torch.ones_like(out))
        grads.append([out.detach(), q.grad, k.grad, v.grad])
    assert all(bitwise_equal(a, b) for a, b in zip(*grads, strict=True))


def test_non_contiguous_cu_seqlens_are_refused():
    q, k, v = _qkv(40, 2, 64, kv_heads=2, seed=8)
    strided = torch.tensor([[0, 9], [15, 9], [40, 9]], dtype=torch.int32)[:, 0]
    assert strided.tolist() == [0, 15, 40] and not strided.is_contiguous()
    with pytest.raises(ValueError, match="cu_seqlens_q must be contiguous"):
        dash_attn_varlen_func(q, k, v, strided, strided.contiguous(), 25, 25)


def test_packs_whose_q_or_k_sequences_are_all_empty():
    """Every k sequence empty: every row sees no key (out 0, gradients 0); every q sequence
    empty: nothing to compute. Both raised a ValueError about an internal Problem before
    session 53."""
    q, k, v = _qkv(40, 2, 64, kv_heads=2, seed=9)
    cu = torch.tensor([0, 15, 40], dtype=torch.int32)
    none = torch.zeros(3, dtype=torch.int32)
    empty = [x[:0].clone().requires_grad_() for x in (q, k, v)]
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    out = dash_attn_varlen_func(full[0], empty[1], empty[2], cu, none, 25, 1)
    out.backward(torch.ones_like(out))
    assert out.shape == q.shape and not out.detach().any()
    assert not full[0].grad.any()
    out = dash_attn_varlen_func(empty[0], full[1], full[2], none, cu, 1, 25)
    out.backward(torch.ones_like(out))
    assert out.shape == (0, 2, 64)
    assert not full[1].grad.any() and not full[2].grad.any()
