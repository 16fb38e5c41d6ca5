"""What Triton's interpreter cannot run is refused with the reason, never run wrong or timed out.

Run with ``TRITON_INTERPRET=1 python -m pytest -m interpreter`` (CI's interpreter session), like
``test_interpreter.py``.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip(
        "interpreter tests need TRITON_INTERPRET=1 set before dash_attn's kernels are imported "
        "(run: TRITON_INTERPRET=1 python -m pytest -m interpreter)",
        allow_module_level=True,
    )

import torch

import dash_attn
from dash_attn import dash_attn_func
from dash_attn.plan import INTERPRETER_AUTO_SCHEDULE
from dash_attn.reference.attention import attention_ref
from dash_attn.testing import assert_close_to_ref, make_qkv

pytestmark = [
    pytest.mark.interpreter,
    # Triton 3.6's interpreter turns 1-element arrays into scalars (NumPy < 2.4 only warns).
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]


def test_bf16_is_refused_with_the_reason():
    # The interpreter's bf16 tl.dot is wrong (max error ~8e8 on this shape), with no warning.
    q, k, v = make_qkv(1, 70, 90, 2, 2, 64, torch.bfloat16, "cpu", 0, requires_grad=False)
    with pytest.raises(NotImplementedError, match=r"bfloat16 .*interpreter.*float16"):
        dash_attn_func(q, k, v, causal=True)
    # The custom ops refuse too (callers that skip dash_attn_func).
    with pytest.raises(NotImplementedError, match=r"bfloat16 .*interpreter"):
        torch.ops.dash_attn.fwd(q, k, v, True, 0.125)


def test_named_static_schedule_that_would_block_is_refused_before_any_launch():
    # Programs run one after another here: shift's program 0 waits for a later program's dQ
    # contribution. Refused by the plan (no timed-out wait blaming a concurrent kernel).
    q, k, v = make_qkv(1, 150, 150, 2, 2, 64, torch.float16, "cpu", 1, requires_grad=True)
    out = dash_attn_func(q, k, v, schedule="shift")
    with pytest.raises(NotImplementedError, match="one after another"):
        out.sum().backward()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_runs_a_dynamic_schedule_where_static_would_block(causal):
    seqlen_q, seqlen_k = (100, 257) if causal else (150, 150)
    q, k, v = make_qkv(
        1, seqlen_q, seqlen_k, 2, 1, 64, torch.float16, "cpu", 2, requires_grad=False
    )
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    grads = {}
    for upcast in (None, True, False):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        if upcast is None:
            out = dash_attn_func(*leaves, causal=causal)
        else:
            out = attention_ref(*leaves, causal=causal, upcast=upcast)[0]
        out.backward(dout)
        grads[upcast] = [x.grad for x in leaves]
    info = dash_attn.last_launch_info()
    assert (info.schedule_name, info.dispatch) == (INTERPRETER_AUTO_SCHEDULE, "dynamic")
    for name, got, ref, same in zip("qkv", *grads.values(), strict=True):
        assert_close_to_ref(f"d{name}", got, ref, same, atol=1e-3)
