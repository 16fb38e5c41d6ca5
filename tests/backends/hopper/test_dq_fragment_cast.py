"""The cast of a fragment-order dQ accumulator (``hopper/dq_cast.py``) against a plain torch
decode: the same bits as ``(dq_acc * scale).to(dtype)`` on the row-major accumulator, rows past
seqlen_q dropped, on lengths that are not tile multiples."""

from __future__ import annotations

import functools
import os

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# The interpreter session (CI) or the GPU session: the kernel is the same either way.
pytestmark = pytest.mark.interpreter if INTERPRETED else pytest.mark.gpu

if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("needs a GPU or TRITON_INTERPRET=1 (CI's interpreter session)",
                allow_module_level=True)  # fmt: skip

from dash_attn.backends.hopper import dq_fragment  # noqa: E402
from dash_attn.backends.hopper.dq_cast import scale_cast_fragments  # noqa: E402

DEVICE = "cpu" if INTERPRETED else "cuda"


@functools.cache
def _offsets(block_m: int, head_dim: int) -> torch.Tensor:
    """(block_m, head_dim) int64: where each element of a tile lives (dq_fragment)."""
    return torch.tensor(
        [[dq_fragment.tile_offset(block_m, head_dim, r, c) for c in range(head_dim)]
         for r in range(block_m)]
    )  # fmt: skip


def encode(dq: torch.Tensor, block_m: int) -> torch.Tensor:
    """A row-major fp32 (b, s, h, d) accumulator in fragment order (b, h, q_tiles, bm * d),
    padded rows zero: what the kernel's bulk reduces leave behind."""
    batch, seqlen, heads, head_dim = dq.shape
    q_tiles = -(-seqlen // block_m)
    padded = dq.new_zeros(batch, q_tiles * block_m, heads, head_dim)
    padded[:, :seqlen] = dq
    tiles = padded.view(batch, q_tiles, block_m, heads, head_dim).permute(0, 3, 1, 2, 4)
    out = dq.new_zeros(batch, heads, q_tiles, block_m * head_dim)
    out[..., _offsets(block_m, head_dim).flatten().to(dq.device)] = tiles.reshape(
        batch, heads, q_tiles, block_m * head_dim
    )
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "shape,block_m",
    [
        ((2, 100, 3, 128), 64),
        ((2, 100, 3, 96), 64),
        ((1, 130, 2, 64), 128),
        ((1, 64, 1, 128), 64),
        ((2, 170, 2, 128), 80),
        ((1, 80, 1, 128), 80),
        ((1, 100, 2, 192), 64),
        ((1, 70, 1, 256), 64),
    ],
)
def test_fragment_cast_matches_row_major_cast(
    shape: tuple[int, ...], block_m: int, dtype: torch.dtype
) -> None:
    if INTERPRETED and dtype == torch.bfloat16:
        # The interpreter emulates the bf16 cast with its own rounding (see test_dq_cast).
        pytest.skip("bf16 casts are not the GPU's in Triton's interpreter")
    gen = torch.Generator().manual_seed(1)
    dq = (torch.randn(shape, generator=gen) * 300).to(DEVICE)
    scale = 0.125 if shape[-1] == 64 else 0.0883883476
    got = scale_cast_fragments(encode(dq, block_m), scale, dtype, shape[1], block_m)
    assert got.shape == dq.shape and got.dtype == dtype
    assert torch.equal(got, (dq * scale).to(dtype))


def test_fragment_cast_rejects_wrong_shapes() -> None:
    acc = torch.zeros(1, 2, 2, 64 * 128, device=DEVICE)
    with pytest.raises(ValueError, match="does not tile seqlen_q"):
        scale_cast_fragments(acc, 1.0, torch.float16, 300, 64)
    with pytest.raises(ValueError, match="block_m must be 64, 80 or 128"):
        scale_cast_fragments(acc, 1.0, torch.float16, 100, 96)
    with pytest.raises(ValueError, match="contiguous fp32"):
        scale_cast_fragments(acc.half(), 1.0, torch.float16, 100, 64)
    with pytest.raises(ValueError, match=r"a head dim of \(64, 96, 128, 192, 256\)"):
        wide = torch.zeros(1, 2, 2, 64 * 80, device=DEVICE)
        scale_cast_fragments(wide, 1.0, torch.float16, 100, 64)
