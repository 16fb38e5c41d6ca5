"""``check_determinism`` on a transformers model (CPU): the hooks work with transformers'
modules, a clean model comes out clean, and a nondeterministic attention function (a function,
not a module, as sdpa's fused kernels are) is named through the attention module that calls it."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from dash_attn.check import check_determinism

NOISY = "noisy_sdpa_for_tests"


class _NoisyBackward(torch.autograd.Function):
    """Identity; the backward scales the gradient by fresh noise (an unseeded generator)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(7), "little"))
        return grad * (1 + 1e-3 * torch.rand(grad.shape, generator=gen))


@pytest.fixture
def noisy_attention() -> str:
    transformers = pytest.importorskip("transformers")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def noisy(module: torch.nn.Module, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return sdpa_attention_forward(module, _NoisyBackward.apply(query), *args, **kwargs)

    transformers.AttentionInterface.register(NOISY, noisy)
    AttentionMaskInterface.register(NOISY, sdpa_mask)
    return NOISY


def _check(model: torch.nn.Module, **kwargs: Any) -> Any:
    def batch_fn(step: int) -> torch.Tensor:
        return torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(step))

    def loss_fn(m: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return m(input_ids=ids, labels=ids).loss

    return check_determinism(model, batch_fn, loss_fn, **kwargs)


def test_clean_transformers_model(hf) -> None:
    model = hf.build_model("llama", "sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    report = _check(model, steps=2, optimizer=optimizer)
    assert report.deterministic, str(report)
    # Every decoder module and every parameter was seen (forward outputs and gradients).
    params = len(list(model.parameters()))
    assert report.compared > 4 * params


def test_nondeterministic_attention_function_is_named(hf, noisy_attention: str) -> None:
    model = hf.build_model("llama", noisy_attention)
    report = _check(model)
    first = report.first
    assert first is not None, "the noisy backward must make the runs differ"
    assert first.phase == "backward"
    # The last layer's backward runs first; the noisy gradient reaches q_proj's output through
    # functional code (rotary embedding, the attention function) of the attention module.
    assert (first.name, first.kind) == ("model.layers.1.self_attn.q_proj", "grad_output")
    assert first.suspect.startswith("model.layers.1.self_attn: its own backward code")
    assert all(d.phase != "forward" for d in report.differences if d.step == 0)
