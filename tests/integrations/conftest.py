"""Fixtures of the integration tests: tiny random-init transformers models built in the test
(no weights downloaded), and eager stand-ins for the kernels so the glue runs on any CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import dash_attn.interface as interface


def _transformers() -> Any:
    # Imported when a test needs it, not at collection: the import takes seconds.
    return pytest.importorskip("transformers", reason="the integration needs transformers")


def _keeps(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    """The contract's row rule (bottom-right aligned, d = seqlen_k - seqlen_q), stated here on its
    own: query m sees key n iff n <= m + d + right (right >= 0) and n >= m + d - left."""
    left, right = window
    if causal:
        right = 0
    m = torch.arange(seqlen_q).view(-1, 1) + (seqlen_k - seqlen_q)
    n = torch.arange(seqlen_k).view(1, -1)
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if right >= 0:
        keep &= n <= m + right
    if left >= 0:
        keep &= n >= m - left
    return keep


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None,
    causal: bool,
    window: tuple[int, int],
) -> torch.Tensor:
    """(seqlen, heads, headdim) for one sequence, in float32; rows that see no key give 0."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k.float()) * scale
    keep = _keeps(q.shape[0], k.shape[0], causal, window).to(q.device)
    scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key: NaN -> 0
    return torch.einsum("hmn,nhd->mhd", probs, v.float()).to(q.dtype)


class ReferenceKernels:
    """dash_attn_func / dash_attn_varlen_func stand-ins (the contract's signatures, eager math);
    ``calls`` records which one ran with which options."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        self.calls.append(("dense", kw))
        window = kw.get("window_size", (-1, -1))
        outs = [
            reference_attention(q[b], k[b], v[b], kw.get("softmax_scale"), kw["causal"], window)
            for b in range(q.shape[0])
        ]
        return torch.stack(outs)

    def varlen(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: int,
        max_k: int,
        **kw: Any,
    ) -> torch.Tensor:
        self.calls.append(("varlen", {**kw, "cu_q": cu_q.tolist(), "cu_k": cu_k.tolist()}))
        assert cu_q.dtype == cu_k.dtype == torch.int32
        window = kw.get("window_size", (-1, -1))
        outs = []
        for b in range(cu_q.numel() - 1):
            sq = slice(int(cu_q[b]), int(cu_q[b + 1]))
            sk = slice(int(cu_k[b]), int(cu_k[b + 1]))
            assert sq.stop - sq.start <= max_q and sk.stop - sk.start <= max_k
            outs.append(
                reference_attention(
                    q[sq], k[sk], v[sk], kw.get("softmax_scale"), kw["causal"], window
                )
            )
        return torch.cat(outs)


@pytest.fixture
def reference_kernels(monkeypatch: pytest.MonkeyPatch) -> ReferenceKernels:
    kernels = ReferenceKernels()
    monkeypatch.setattr(interface, "dash_attn_func", kernels.dense)
    monkeypatch.setattr(interface, "dash_attn_varlen_func", kernels.varlen, raising=False)
    return kernels


@pytest.fixture
def registered() -> str:
    _transformers()
    from dash_attn.integrations.transformers import NAME, register

    register()
    return NAME


def tiny_config(kind: str, **overrides: Any) -> Any:
    """Tiny random-init configs: head dim 64 (the smallest the kernels take), 2 layers."""
    transformers = _transformers()
    common: dict[str, Any] = {
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 128,
        "attention_dropout": 0.0,
    }
    common.update(overrides)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "qwen2":
        # One full and one sliding layer (the sliding one from layer index max_window_layers).
        common = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1, **common}
        return transformers.Qwen2Config(**common)
    if kind == "mistral":
        return transformers.MistralConfig(**{"sliding_window": 8, **common})
    raise ValueError(f"unknown config kind {kind!r}")


def build_model(kind: str, attn: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """The same random weights for every attention implementation (seeded init)."""
    torch.manual_seed(seed)
    config = tiny_config(kind, **overrides)
    return _transformers().AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def tokens(batch: int, seqlen: int, seed: int, vocab: int = 96) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seqlen), generator=torch.Generator().manual_seed(seed))


class Helpers:
    """What the test modules need from here, as one fixture (conftest is not importable)."""

    build_model: Callable[..., torch.nn.Module] = staticmethod(build_model)
    tiny_config: Callable[..., Any] = staticmethod(tiny_config)
    tokens: Callable[..., torch.Tensor] = staticmethod(tokens)
    reference_attention: Callable[..., torch.Tensor] = staticmethod(reference_attention)


@pytest.fixture
def hf() -> type[Helpers]:
    return Helpers
