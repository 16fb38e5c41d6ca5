"""The fused dQ scale-and-cast against torch's two-pass ``(acc * scale).to(dtype)``: the same
bits (fp32 product, round-to-nearest-even), on sizes that are not block multiples."""

from __future__ import annotations

import os

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# The interpreter session (CI) or the GPU session: the kernel is the same either way.
pytestmark = pytest.mark.interpreter if INTERPRETED else pytest.mark.gpu

if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("needs a GPU or TRITON_INTERPRET=1 (CI's interpreter session)",
                allow_module_level=True)  # fmt: skip

from dash_attn.backends.triton.dq_cast import scale_cast  # noqa: E402

DEVICE = "cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 8), (2, 37, 3, 64), (1, 4097, 1, 1)])
def test_scale_cast_matches_torch_bit_for_bit(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if INTERPRETED and dtype == torch.bfloat16:
        # The interpreter emulates the bf16 cast with its own rounding (dash-attn refuses bf16
        # there); the GPU's cvt.rn is round-to-nearest-even, checked by the GPU session.
        pytest.skip("bf16 casts are not the GPU's in Triton's interpreter")
    gen = torch.Generator().manual_seed(0)
    acc = (torch.randn(shape, generator=gen) * 300).to(DEVICE)
    # Values at rounding ties and beyond the fp16 range too.
    acc.view(-1)[0] = 1.0 + 2.0**-8
    acc.view(-1)[-1] = 1e6
    scale = 0.125 if shape[-1] == 64 else 0.0883883476
    got = scale_cast(acc, scale, dtype)
    assert got.dtype == dtype and got.shape == acc.shape
    assert torch.equal(got, (acc * scale).to(dtype))


def test_scale_cast_non_contiguous_and_bad_dtype() -> None:
    acc = torch.randn(4, 6, device=DEVICE).t()
    assert torch.equal(scale_cast(acc, 0.5, torch.float16), (acc * 0.5).to(torch.float16))
    with pytest.raises(ValueError, match="acc must be float32"):
        scale_cast(acc.half(), 0.5, torch.float16)
