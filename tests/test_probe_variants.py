"""Every candidate kernel variant of ``benchmarks/probe_protocol.py`` gives the shipped kernel's
gradients bit for bit, checked in Triton's interpreter, so that a device call only measures
variants already known to be correct (the GPU run checks it again).

Interpreter session only (``TRITON_INTERPRET=1 python -m pytest -m interpreter``)."""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 before the kernels are imported", allow_module_level=True)

import torch

import dash_attn.kernels.bwd as bwd_module
from dash_attn import dash_attn_func
from dash_attn.testing import bitwise_equal, make_qkv

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
if not BENCHMARKS.is_dir():
    pytest.skip("not a source checkout", allow_module_level=True)

pytestmark = [
    pytest.mark.interpreter,
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

sys.path.insert(0, str(BENCHMARKS))
try:
    import probe_protocol
finally:
    sys.path.remove(str(BENCHMARKS))

CANDIDATES = sorted(set(probe_protocol.VARIANTS) - probe_protocol.DIAGNOSTICS)
# GQA, seqlen_q != seqlen_k, neither a tile multiple; the dynamic fa3 order always completes
# in the interpreter (programs run one after another).
SHAPE = (1, 130, 200, 4, 2, 64)


def _gradients(causal: bool) -> list[torch.Tensor]:
    batch, seqlen_q, seqlen_k, heads, kv_heads, headdim = SHAPE
    q, k, v = make_qkv(
        batch, seqlen_q, seqlen_k, heads, kv_heads, headdim, torch.float16, "cpu", seed=3
    )
    dout = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(4))
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    dash_attn_func(q, k, v, causal=causal, schedule="fa3").backward(dout)
    return [q.grad, k.grad, v.grad]


@pytest.fixture(scope="module")
def shipped() -> dict[bool, list[torch.Tensor]]:
    return {causal: _gradients(causal) for causal in (False, True)}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name", CANDIDATES)
def test_candidate_variant_gives_the_shipped_bits(name: str, causal: bool, shipped) -> None:
    original = bwd_module.attn_bwd_kernel
    with tempfile.TemporaryDirectory(dir=probe_protocol.KERNEL_SOURCE.parent) as tmp:
        kernel = probe_protocol.load_variant(name, probe_protocol.VARIANTS[name], pathlib.Path(tmp))
        bwd_module.attn_bwd_kernel = kernel
        try:
            got = _gradients(causal)
        finally:
            bwd_module.attn_bwd_kernel = original
    for label, x, y in zip(("dq", "dk", "dv"), got, shipped[causal], strict=True):
        assert bitwise_equal(x, y), f"variant {name}: {label} differs from the shipped kernel"
