"""``attn_implementation="dash"`` in transformers, on the CPU: the glue (layouts, masks, padding,
packing, sliding windows, refusals) with eager stand-ins for the kernels in float32, so the
models must match ``sdpa`` to float32 accuracy. The kernels themselves run in
``test_transformers_interpreter.py`` (Triton's interpreter) and ``tests/test_gpu_integrations.py``.
"""

from __future__ import annotations

import pytest
import torch

from dash_attn.integrations.transformers import dash_attention_forward, register, window_size

ATOL = 2e-5  # float32 models; the stand-in kernels compute like sdpa's math path


def _logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs: object) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits


def test_register_adds_attention_and_mask_functions(registered: str) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    assert AttentionInterface._global_mapping[registered] is dash_attention_forward
    assert AttentionMaskInterface._global_mapping[registered] is flash_attention_mask
    register()  # idempotent
    assert AttentionInterface._global_mapping[registered] is dash_attention_forward
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        register("")


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_logits_and_grads_match_sdpa(registered: str, reference_kernels, hf, kind: str) -> None:
    ids = hf.tokens(2, 24, seed=1)  # 24 > sliding_window 8: the window matters
    dash = hf.build_model(kind, registered)
    sdpa = hf.build_model(kind, "sdpa")
    out_dash = dash(input_ids=ids, labels=ids)
    out_sdpa = sdpa(input_ids=ids, labels=ids)
    torch.testing.assert_close(out_dash.logits, out_sdpa.logits, atol=ATOL, rtol=ATOL)
    out_dash.loss.backward()
    out_sdpa.loss.backward()
    for (name, a), b in zip(dash.named_parameters(), sdpa.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=ATOL, rtol=1e-4, msg=name)
    # The dense kernel ran for every layer; sliding layers asked for the flash-attn window.
    kinds = [name for name, _ in reference_kernels.calls]
    assert kinds == ["dense"] * 2
    windows = [kw.get("window_size") for _, kw in reference_kernels.calls]
    expected = {"llama": [None, None], "qwen2": [None, (7, 0)], "mistral": [(7, 0), (7, 0)]}
    assert windows == expected[kind]
    assert all(kw["causal"] is True for _, kw in reference_kernels.calls)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_padded_batch_matches_unpadded_sequences(
    registered: str, reference_kernels, hf, side: str, kind: str
) -> None:
    model = hf.build_model(kind, registered)
    lengths = [20, 13]
    seqs = [hf.tokens(1, n, seed=10 + i) for i, n in enumerate(lengths)]
    width = max(lengths)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for b, s in enumerate(seqs):
        cols = slice(0, s.shape[1]) if side == "right" else slice(width - s.shape[1], width)
        ids[b, cols], mask[b, cols] = s[0], 1
    padded = _logits(model, ids, attention_mask=mask)
    assert {name for name, _ in reference_kernels.calls} == {"varlen"}
    assert reference_kernels.calls[0][1]["cu_q"] == [0, 20, 33]
    for b, s in enumerate(seqs):
        alone = _logits(model, s)
        cols = slice(0, s.shape[1]) if side == "right" else slice(width - s.shape[1], width)
        torch.testing.assert_close(padded[b, cols], alone[0], atol=ATOL, rtol=ATOL)


def test_packed_sequences_from_position_ids(registered: str, reference_kernels, hf) -> None:
    model = hf.build_model("llama", registered)
    a, b = hf.tokens(1, 11, seed=3), hf.tokens(1, 7, seed=4)
    ids = torch.cat([a, b], dim=1)
    position_ids = torch.cat([torch.arange(11), torch.arange(7)]).view(1, -1)
    packed = _logits(model, ids, position_ids=position_ids)
    assert reference_kernels.calls[0][0] == "varlen"
    assert reference_kernels.calls[0][1]["cu_q"] == [0, 11, 18]
    torch.testing.assert_close(packed[0, :11], _logits(model, a)[0], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(packed[0, 11:], _logits(model, b)[0], atol=ATOL, rtol=ATOL)


def test_packed_sequences_from_cu_seq_lens(registered: str, reference_kernels, hf) -> None:
    model = hf.build_model("llama", registered)
    a, b = hf.tokens(1, 9, seed=5), hf.tokens(1, 6, seed=6)
    cu = torch.tensor([0, 9, 15], dtype=torch.int32)
    packed = _logits(
        model,
        torch.cat([a, b], dim=1),
        position_ids=torch.cat([torch.arange(9), torch.arange(6)]).view(1, -1),
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=9,
        max_length_k=9,
    )
    assert reference_kernels.calls[0][1]["cu_k"] == [0, 9, 15]
    torch.testing.assert_close(packed[0, 9:], _logits(model, b)[0], atol=ATOL, rtol=ATOL)


def test_generation_with_cache_matches_sdpa(registered: str, reference_kernels, hf) -> None:
    # Decoding: one query against a longer key (bottom-right causal), with and without padding.
    ids = hf.tokens(2, 10, seed=7)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as for generation
    outs = []
    for attn in (registered, "sdpa"):
        model = hf.build_model("llama", attn)
        gen = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0
        )
        outs.append(gen)
    assert torch.equal(outs[0], outs[1])


def _qkv(batch: int = 1, seqlen: int = 6) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(batch, 2, seqlen, 64, generator=gen) for _ in range(3))


class _Module(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"softcap": 30.0}, "softcap=30.0"),
        ({"dropout": 0.1}, "attention dropout=0.1"),
        ({"s_aux": torch.zeros(2)}, "s_aux"),
        ({"output_attentions": True}, "output_attentions=True"),
    ],
)
def test_unsupported_features_are_refused(reference_kernels, kwargs: dict, match: str) -> None:
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match=match):
        dash_attention_forward(_Module(), q, k, v, None, **kwargs)
    assert reference_kernels.calls == []


def test_dropout_in_training_refused_through_the_model(registered: str, reference_kernels, hf):
    model = hf.build_model("llama", registered, attention_dropout=0.1)
    ids = hf.tokens(1, 8, seed=0)
    model.train()
    with pytest.raises(NotImplementedError, match="attention dropout=0.1 in training"):
        model(input_ids=ids)
    model.eval()  # no dropout in eval: served
    assert model(input_ids=ids).logits.shape == (1, 8, 96)


def test_4d_padding_mask_goes_through_varlen(reference_kernels) -> None:
    q, k, v = _qkv(batch=2, seqlen=6)
    valid = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    mask4 = (causal[None] & valid[:, None, :])[:, None]  # (2, 1, 6, 6), sdpa-style
    out, _ = dash_attention_forward(_Module(), q, k, v, mask4)
    out2, _ = dash_attention_forward(_Module(), q, k, v, valid.long())
    assert [name for name, _ in reference_kernels.calls] == ["varlen", "varlen"]
    torch.testing.assert_close(out, out2)
    # The additive form of the same mask is read the same way.
    additive = torch.zeros(mask4.shape).masked_fill(~mask4, torch.finfo(torch.float32).min)
    out3, _ = dash_attention_forward(_Module(), q, k, v, additive)
    torch.testing.assert_close(out, out3)


def test_4d_padding_mask_with_fewer_queries_than_keys(reference_kernels) -> None:
    # Decoding-like: 2 new queries against 6 keys (bottom-right causal), left padding in row 1.
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 2, 64, generator=gen)
    k, v = (torch.randn(2, 2, 6, 64, generator=gen) for _ in range(2))
    valid = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    causal = torch.arange(6).view(1, -1) <= torch.arange(4, 6).view(-1, 1)  # (2, 6)
    mask4 = (causal[None] & valid[:, None, :])[:, None]
    out, _ = dash_attention_forward(_Module(), q, k, v, mask4)
    out2, _ = dash_attention_forward(_Module(), q, k, v, valid.long())
    torch.testing.assert_close(out, out2)
    assert reference_kernels.calls[0][1]["cu_k"] == [0, 6, 9]
    assert reference_kernels.calls[0][1]["cu_q"] == [0, 2, 4]


def test_4d_mask_that_is_not_padding_is_refused(reference_kernels) -> None:
    q, k, v = _qkv(seqlen=6)
    mask4 = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    mask4[0, 0, 5, 2] = False  # a hole no padding/causal/window rule makes
    with pytest.raises(NotImplementedError, match="not a padding mask"):
        dash_attention_forward(_Module(), q, k, v, mask4)
    per_head = torch.ones(1, 2, 6, 6, dtype=torch.bool).tril()
    per_head[0, 1, 3, 0] = False
    with pytest.raises(NotImplementedError, match="differs between heads"):
        dash_attention_forward(_Module(), q, k, v, per_head)
    assert reference_kernels.calls == []


def test_mask_longer_than_keys_is_refused(reference_kernels) -> None:
    q, k, v = _qkv(seqlen=6)
    with pytest.raises(NotImplementedError, match="covers 8 keys but key has 6"):
        dash_attention_forward(_Module(), q, k, v, torch.ones(1, 8, dtype=torch.long))


def test_autocast_runs_in_the_autocast_dtype(reference_kernels) -> None:
    q, k, v = _qkv()
    seen = []

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
        seen.append(q.dtype)
        return reference_kernels.dense(q, k, v, **kw)

    import dash_attn.interface as interface

    original = interface.dash_attn_func
    interface.dash_attn_func = spy
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = dash_attention_forward(_Module(), q, k, v, None)
    finally:
        interface.dash_attn_func = original
    assert seen == [torch.bfloat16]
    assert out.dtype == torch.float32 and out.shape == (1, 6, 2, 64)


@pytest.mark.parametrize(
    ("sliding_window", "causal", "key_length", "expected"),
    [
        (None, True, 100, (-1, -1)),
        (8, True, 100, (7, 0)),
        (8, False, 100, (7, 7)),
        (8, True, 8, (-1, -1)),  # the window covers every key: no window, as transformers' FA
        (1, True, 4, (0, 0)),
    ],
)
def test_window_size_follows_transformers_flash_convention(
    sliding_window: int | None, causal: bool, key_length: int, expected: tuple[int, int]
) -> None:
    assert window_size(sliding_window, causal, key_length) == expected


def test_window_size_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="sliding_window must be a positive int"):
        window_size(0, True, 10)
