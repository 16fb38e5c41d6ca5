"""Hugging Face transformers: ``attn_implementation="dash"``.

One line makes every transformers model that goes through ``AttentionInterface`` (Llama, Qwen2,
Mistral, ... : the models that support ``"sdpa"`` and ``"flash_attention_2"``) train with
dash-attn's bitwise-reproducible backward::

    import dash_attn.integrations.transformers as dash_hf
    dash_hf.register()  # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="dash", dtype=torch.bfloat16)

``register`` adds two entries under the same name: the attention function (``AttentionInterface``)
and the mask function (``AttentionMaskInterface``, the one flash-attention uses: a 2-D padding
mask, or None when nothing is padded), so that padded batches reach the attention as a padding
mask, which goes through ``dash_attn_varlen_func`` (unpad, attend, pad back; padded query rows
give zeros, as with flash-attention).

What the attention function serves, and what it refuses (an error naming the argument, never a
silently different attention):

* causal or full attention, GQA/MQA, ``scaling``;
* ``sliding_window`` (Mistral, Qwen2 sliding layers, ...): ``window_size=(sliding_window - 1, 0)``
  for causal layers, ``(sliding_window - 1, sliding_window - 1)`` otherwise, applied when the keys
  are longer than the window, exactly as transformers' flash-attention path does;
* padding: the 2-D mask of ``register``'s mask function; a 4-D mask when it is exactly a padding
  mask combined with the layer's causal/window rule (checked; anything else is refused);
* packed sequences (``cu_seq_lens_q/k`` and ``max_length_q/k`` kwargs, or ``position_ids`` that
  restart within a batch of one), as the flash-attention path;
* refused: ``softcap`` (Gemma 2), attention ``dropout`` > 0 in training, attention sinks
  (``s_aux``), ``output_attentions=True``, keys longer than the 2-D mask (static caches) and
  fp32 activations outside autocast (dash-attn's kernels take fp16/bf16; under autocast the
  inputs are cast to the autocast dtype and the output back).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import interface

__all__ = ["NAME", "dash_attention_forward", "register", "window_size"]

NAME = "dash"


def register(name: str = NAME) -> None:
    """Register dash-attn under ``name`` in transformers' attention and mask interfaces.

    After this, ``from_pretrained(..., attn_implementation=name)``, ``from_config(...,
    attn_implementation=name)`` and ``model.set_attn_implementation(name)`` use dash-attn.
    Idempotent. Raises ImportError (with the pip requirement) without transformers.
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as exc:
        raise ImportError(
            "dash_attn.integrations.transformers needs transformers>=5 "
            f"(pip install 'transformers>=5'): {exc}"
        ) from exc
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    AttentionInterface.register(name, dash_attention_forward)
    # The flash-attention mask function: None without padding, else the 2-D padding mask.
    AttentionMaskInterface.register(name, flash_attention_mask)


def window_size(sliding_window: int | None, is_causal: bool, key_length: int) -> tuple[int, int]:
    """flash-attn ``window_size`` for transformers' ``sliding_window`` (tokens in the window,
    the current one included), as transformers' flash-attention path converts it: the window
    applies only when the keys are longer than it; a causal layer's right side is 0."""
    if sliding_window is None or key_length <= sliding_window:
        return (-1, -1)
    if (
        isinstance(sliding_window, bool)
        or not isinstance(sliding_window, int)
        or sliding_window < 1
    ):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    return (sliding_window - 1, 0 if is_causal else sliding_window - 1)


def _refuse_unsupported(
    dropout: float, softcap: float | None, s_aux: Any, kwargs: dict[str, Any]
) -> None:
    if softcap is not None and softcap != 0:
        raise NotImplementedError(
            f"softcap={softcap} (logit soft-capping, e.g. Gemma 2) is not supported by "
            "attn_implementation='dash'; use 'eager' or 'flex_attention' for this model"
        )
    if dropout and dropout > 0:
        raise NotImplementedError(
            f"attention dropout={dropout} in training is not supported by "
            "attn_implementation='dash': set config.attention_dropout = 0.0 (transformers "
            "passes no dropout in eval mode, which is served)"
        )
    if s_aux is not None:
        raise NotImplementedError(
            "s_aux (attention sinks) is not supported by attn_implementation='dash'"
        )
    if kwargs.get("output_attentions", False):
        raise NotImplementedError(
            "output_attentions=True is not supported by attn_implementation='dash' (the "
            "attention probabilities are never materialised); use 'eager'"
        )


def _autocast(query: torch.Tensor) -> torch.dtype | None:
    """The dtype to run in when autocast is on for the query's device and it is float32."""
    device = query.device.type
    if query.dtype == torch.float32 and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _packed_from_position_ids(position_ids: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """cu_seqlens and max length when a batch of one holds several sequences whose position ids
    restart at their minimum (transformers' packed / padding-free format), else None."""
    if position_ids is None or position_ids.shape[0] != 1 or position_ids.shape[-1] == 1:
        return None
    flat = position_ids.reshape(-1)
    starts = (flat == flat.min()).nonzero().view(-1).to(torch.int32)
    if starts.numel() <= 1:
        return None
    total = torch.tensor([flat.numel()], dtype=torch.int32, device=flat.device)
    cu = torch.cat([starts, total])
    return cu, int(cu.diff().max().item())


def _padding_from_4d(
    mask: torch.Tensor, is_causal: bool, window: tuple[int, int], seqlen_q: int
) -> torch.Tensor:
    """The 2-D key padding mask a 4-D mask is made of, checked to be exactly that: every valid
    query row keeps the keys the layer's rule (causal/window, bottom-right, on the valid tokens
    only) keeps among the valid keys, and nothing else. Refuses any other mask."""
    if mask.ndim != 4 or mask.shape[2] != seqlen_q:
        raise NotImplementedError(
            f"attention_mask of shape {tuple(mask.shape)} is not supported by "
            "attn_implementation='dash': pass a 2-D padding mask (batch, seqlen)"
        )
    keep = mask if mask.dtype == torch.bool else mask == 0  # additive: 0 keeps, -inf/min drops
    if not bool((keep == keep[:, :1]).all()):
        raise NotImplementedError(
            "attention_mask: a 4-D mask that differs between heads is not supported by "
            "attn_implementation='dash'"
        )
    keep = keep[:, 0]  # (batch, seqlen_q, seqlen_k)
    key_valid = keep.any(dim=1)
    seqlen_k = keep.shape[-1]
    # Self-attention with padding: the query tokens are the last seqlen_q keys.
    query_valid = key_valid[:, seqlen_k - seqlen_q :]
    # Positions among the valid tokens (what the varlen path sees), and the rule on them: a
    # valid query's position among the valid keys is m + d (queries are the last tokens), so
    # pos_k - pos_q is the contract's n - (m + d).
    pos_k = key_valid.long().cumsum(-1) - 1
    pos_q = pos_k[:, seqlen_k - seqlen_q :]
    rel = pos_k[:, None, :] - pos_q[:, :, None]
    left, right = window
    if is_causal:
        right = 0
    expected = key_valid[:, None, :].expand_as(keep).clone()
    if right >= 0:
        expected &= rel <= right
    if left >= 0:
        expected &= rel >= -left
    rows = query_valid[:, :, None].expand_as(keep)
    if not bool((keep[rows] == expected[rows]).all()):
        raise NotImplementedError(
            "attention_mask: this 4-D mask is not a padding mask combined with the layer's "
            f"{'causal' if is_causal else 'full'} rule and window {window}; "
            "attn_implementation='dash' serves padding (through dash_attn_varlen_func), causal "
            "and sliding-window masks only"
        )
    return key_valid


def _varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    **kwargs: Any,
) -> torch.Tensor:
    fn = getattr(interface, "dash_attn_varlen_func", None)
    if fn is None:
        raise NotImplementedError(
            "padded or packed batches need dash_attn_varlen_func, which this dash-attn version "
            "does not have yet: pass batches without padding (attention_mask all ones)"
        )
    return fn(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


def _attend_padded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_valid: torch.Tensor, **kwargs: Any
) -> torch.Tensor:
    """Unpad by the (batch, seqlen_k) mask, attend with varlen, pad back (zeros in padding)."""
    batch, seqlen_q, heads, headdim = q.shape
    seqlen_k = k.shape[1]
    query_valid = key_valid[:, seqlen_k - seqlen_q :]  # queries are the last seqlen_q tokens
    idx_k = key_valid.reshape(-1).nonzero().view(-1)
    idx_q = query_valid.reshape(-1).nonzero().view(-1)
    len_k = key_valid.sum(-1, dtype=torch.int32)
    len_q = query_valid.sum(-1, dtype=torch.int32)
    # Indexing with unique indices: the backward adds each gradient once into zeros, so its
    # bits do not depend on the order of the adds.
    out = _varlen(
        q.reshape(batch * seqlen_q, heads, headdim)[idx_q],
        k.reshape(batch * seqlen_k, *k.shape[2:])[idx_k],
        v.reshape(batch * seqlen_k, *v.shape[2:])[idx_k],
        _cu_seqlens(len_q),
        _cu_seqlens(len_k),
        int(len_q.max().item()),
        int(len_k.max().item()),
        **kwargs,
    )
    padded = out.new_zeros(batch * seqlen_q, heads, out.shape[-1])
    return padded.index_put((idx_q,), out).view(batch, seqlen_q, heads, -1)


def dash_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``(batch, heads, seqlen, headdim)`` in,
    ``((batch, seqlen_q, heads, headdim), None)`` out. See the module docstring."""
    _refuse_unsupported(dropout, softcap, s_aux, kwargs)
    is_causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    run_dtype = _autocast(query)
    out_dtype = query.dtype
    # dash-attn's layout is (batch, seqlen, heads, headdim): transposed views, no copy.
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    if run_dtype is not None:
        q, k, v = (x.to(run_dtype) for x in (q, k, v))
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    window = window_size(sliding_window, is_causal, seqlen_k)
    options: dict[str, Any] = {"softmax_scale": scaling, "causal": is_causal}
    if window != (-1, -1):
        options["window_size"] = window

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if attention_mask is not None and attention_mask.ndim == 2:
        if attention_mask.shape[-1] != seqlen_k:
            raise NotImplementedError(
                f"attention_mask covers {attention_mask.shape[-1]} keys but key has {seqlen_k} "
                "(a static cache?): not supported by attn_implementation='dash'"
            )
        out = _attend_padded(q, k, v, attention_mask.bool(), **options)
    elif attention_mask is not None:
        key_valid = _padding_from_4d(attention_mask, is_causal, window, seqlen_q)
        out = _attend_padded(q, k, v, key_valid, **options)
    elif all(x is not None for x in (cu_q, cu_k, max_q, max_k)):
        if q.shape[0] != 1:
            raise ValueError(f"cu_seq_lens_q/k need a batch of one packed row, got {q.shape[0]}")
        out = _varlen(
            q[0], k[0], v[0], cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k),
            **options,
        )[None]  # fmt: skip
    elif (packed := _packed_from_position_ids(kwargs.get("position_ids"))) is not None:
        cu, longest = packed
        out = _varlen(q[0], k[0], v[0], cu, cu, longest, longest, **options)[None]
    else:
        out = interface.dash_attn_func(q, k, v, **options)
    if run_dtype is not None:
        out = out.to(out_dtype)
    return out, None
