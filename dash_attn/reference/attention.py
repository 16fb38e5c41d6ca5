"""Eager PyTorch attention: the numerical reference every kernel is checked against.

Two entry points, both in the flash-attn layout (``(batch, seqlen, nheads, headdim)``):

* ``attention_ref``: forward (out, lse) by the textbook formula, differentiable by autograd.
* ``attention_bwd_ref``: the backward by the explicit formulas the kernels implement
  (delta, P, dV, dP, dS, dQ, dK), so a kernel can be compared with the same algebra and so the
  algebra itself can be checked against autograd.

Causal masks are bottom-right aligned as in flash-attn: query row ``r`` sees key ``c`` iff
``c <= r + seqlen_k - seqlen_q``. For ``seqlen_q = 3, seqlen_k = 5``::

    1 1 1 0 0
    1 1 1 1 0
    1 1 1 1 1

and for ``seqlen_q = 5, seqlen_k = 2`` the first three rows see no key at all::

    0 0
    0 0
    0 0
    1 0
    1 1

Such rows get ``out = 0`` and ``lse = -inf`` (flash-attn's convention), and zero gradients.

Sliding windows (``window_size=(left, right)`` as flash-attn, in tokens, -1 unbounded) use the
same diagonal: row ``r`` sees key ``c`` iff ``r + d - left <= c <= r + d + right`` with
``d = seqlen_k - seqlen_q`` (``causal`` sets ``right = 0``). For ``seqlen_q = seqlen_k = 5``
and ``window_size=(1, 0)``::

    1 0 0 0 0
    1 1 0 0 0
    0 1 1 0 0
    0 0 1 1 0
    0 0 0 1 1

Packed sequences (``cu_seqlens_q``/``cu_seqlens_k``, flash-attn's varlen layout ``(total, nheads,
headdim)``) are computed one sequence at a time, each with its own bottom-right diagonal.
"""

from __future__ import annotations

import math

import torch

from ..schedule import Mask

__all__ = [
    "attention_bwd_ref",
    "attention_ref",
    "causal_mask",
    "compute_dtype",
    "visible_mask",
]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for inputs of ``dtype``: float64 stays float64, the rest use float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def causal_mask(
    seqlen_q: int, seqlen_k: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Boolean ``(seqlen_q, seqlen_k)`` mask, True where query row ``r`` may see key ``c``.

    Bottom-right aligned: ``c <= r + seqlen_k - seqlen_q``.
    """
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return cols <= rows + (seqlen_k - seqlen_q)


def visible_mask(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    device: torch.device | str | None = None,
) -> torch.Tensor | None:
    """Boolean ``(seqlen_q, seqlen_k)`` mask of the row rule (module docstring), or None when
    every row sees every key (the full mask: no mask needed).

    The rule is ``Mask.keeps`` of the schedule engine, the one statement of it that the
    tables, the validator and the references share. Raises ValueError for window sides < -1.
    """
    mask = Mask(causal=causal, window_left=window_size[0], window_right=window_size[1])
    if mask.kind == "full":
        return None
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return mask.keeps(rows, cols, seqlen_q, seqlen_k)


def _sequences(
    cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None
) -> list[tuple[int, int, int, int]]:
    """(q_start, q_end, k_start, k_end) of every packed sequence."""
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    if len(cq) != len(ck):
        raise ValueError(
            f"cu_seqlens_q ({len(cq)} entries) and cu_seqlens_k ({len(ck)}) differ in length"
        )
    return [(cq[b], cq[b + 1], ck[b], ck[b + 1]) for b in range(len(cq) - 1)]


def _default_scale(headdim: int, softmax_scale: float | None) -> float:
    return 1.0 / math.sqrt(headdim) if softmax_scale is None else float(softmax_scale)


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(b, s, kv_heads, d) -> (b, s, heads, d)``: query head h reads kv head h // group."""
    group = heads // x.shape[2]
    return x if group == 1 else x.repeat_interleave(group, dim=2)


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    upcast: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference attention forward, differentiable with autograd.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim)
        k: (batch_size, seqlen_k, nheads_k, headdim)
        v: (batch_size, seqlen_k, nheads_k, headdim)
        causal: bool. Bottom-right aligned causal mask (see the module docstring).
        softmax_scale: float. Scaling of QK^T before the softmax. Default 1 / sqrt(headdim).
        upcast: bool. If True, compute in float32 (float64 for float64 inputs) and round ``out``
            back to the input dtype: the "fp32 reference". If False, every operation runs in the
            input dtype: the "same-dtype PyTorch computation" of the flash-attn error rule.
        window_size: (left, right) sliding window in tokens, -1 unbounded (module docstring).
        cu_seqlens_q, cu_seqlens_k: int [batch + 1] sequence boundaries: then q is
            (total_q, nheads, headdim), k/v (total_k, nheads_k, headdim), out like q and lse
            (nheads, total_q), as flash-attn's varlen functions.
    Return:
        out: (batch_size, seqlen_q, nheads, headdim), dtype of q.
        lse: (batch_size, nheads, seqlen_q), float32 (float64 for float64 inputs). Natural-log
            logsumexp of the scaled scores of each row; ``-inf`` for rows that see no key.

    nheads must be a multiple of nheads_k (GQA/MQA): query head h uses kv head
    h // (nheads // nheads_k).

    Example:
        >>> q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
        >>> out, lse = attention_ref(q, k, v, causal=True)
        >>> out.shape, lse.shape
        (torch.Size([1, 8, 2, 16]), torch.Size([1, 2, 8]))
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        outs, lses = [], []
        for q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k):
            o, lse = attention_ref(
                q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal=causal,
                softmax_scale=softmax_scale, upcast=upcast, window_size=window_size,
            )  # fmt: skip
            outs.append(o[0])
            lses.append(lse[0])
        return torch.cat(outs), torch.cat(lses, dim=1)
    dtype_in = q.dtype
    work = compute_dtype(dtype_in) if upcast else dtype_in
    batch, seqlen_q, heads, headdim = q.shape
    seqlen_k = k.shape[1]
    scale = _default_scale(headdim, softmax_scale)
    visible = visible_mask(
        seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=q.device
    )

    qw = q.to(work)
    kw = _repeat_kv(k.to(work), heads)
    vw = _repeat_kv(v.to(work), heads)
    scores = torch.einsum("bqhd,bkhd->bhqk", qw, kw) * scale
    if visible is not None:
        row_sees_any = visible.any(dim=-1, keepdim=True)
        # A row that sees no key is filled with a finite constant rather than -inf: softmax and
        # logsumexp of an all -inf row are NaN, and their NaN gradients would leak into dq even
        # after the row is zeroed. The constant does not depend on the scores, so those rows get
        # zero gradient, then their outputs are overwritten below.
        fill = torch.where(row_sees_any, float("-inf"), 0.0).to(work)
        scores = torch.where(visible, scores, fill)
    probs = torch.softmax(scores, dim=-1)
    lse = torch.logsumexp(scores, dim=-1)
    if visible is not None:
        probs = probs.masked_fill(~row_sees_any, 0.0)
        lse = lse.masked_fill(~row_sees_any.squeeze(-1), float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", probs, vw)
    return out.to(dtype_in), lse.to(compute_dtype(dtype_in))


def attention_bwd_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float | None,
    window_size: tuple[int, int] = (-1, -1),
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference attention backward by the explicit formulas, in float32 (float64 for float64).

    With S = Q K^T (per head) and ``scale`` the softmax scale::

        delta = rowsum(dO * O)
        P     = exp(scale * S - lse)        (0 where masked)
        dV    = P^T dO
        dP    = dO V^T
        dS    = P * (dP - delta)
        dQ    = scale * dS K
        dK    = scale * dS^T Q

    dK and dV of a kv head are summed over the query heads of its GQA group.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim)
        k, v: (batch_size, seqlen_k, nheads_k, headdim)
        out: (batch_size, seqlen_q, nheads, headdim), the forward output.
        lse: (batch_size, nheads, seqlen_q), the forward logsumexp; ``-inf`` rows give zero grads.
        dout: (batch_size, seqlen_q, nheads, headdim), the gradient of ``out``.
        causal: bool. Bottom-right aligned causal mask.
        softmax_scale: float or None (1 / sqrt(headdim)).
        window_size, cu_seqlens_q, cu_seqlens_k: as :func:`attention_ref` (varlen: lse is
            (nheads, total_q) and the tensors are packed).
    Return:
        dq: like q; dk: like k; dv: like v (each in its input's dtype).
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        grads: list[tuple[torch.Tensor, ...]] = []
        for q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k):
            dq, dk, dv = attention_bwd_ref(
                q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], out[None, q0:q1],
                lse[None, :, q0:q1], dout[None, q0:q1], causal=causal,
                softmax_scale=softmax_scale, window_size=window_size,
            )  # fmt: skip
            grads.append((dq[0], dk[0], dv[0]))
        return tuple(torch.cat(parts) for parts in zip(*grads, strict=True))  # type: ignore[return-value]
    work = compute_dtype(q.dtype)
    batch, seqlen_q, heads, headdim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    scale = _default_scale(headdim, softmax_scale)

    qw, ow, dow = q.to(work), out.to(work), dout.to(work)
    kw = _repeat_kv(k.to(work), heads)
    vw = _repeat_kv(v.to(work), heads)
    lse_w = lse.to(work)
    # exp(s - (-inf)) would be +inf (and inf * 0 = NaN below); such rows are fully masked, so
    # any finite stand-in works.
    lse_w = torch.where(torch.isneginf(lse_w), 0.0, lse_w).unsqueeze(-1)

    delta = (dow * ow).sum(dim=-1).transpose(1, 2).unsqueeze(-1)  # (b, h, sq, 1)
    scores = torch.einsum("bqhd,bkhd->bhqk", qw, kw) * scale
    probs = torch.exp(scores - lse_w)
    visible = visible_mask(
        seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=q.device
    )
    if visible is not None:
        probs = probs.masked_fill(~visible, 0.0)
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, dow)
    dp = torch.einsum("bqhd,bkhd->bhqk", dow, vw)
    ds = probs * (dp - delta)
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, kw) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, qw) * scale
    # Repeated heads are laid out kv-head-major (h = kv_head * group + g): sum over g.
    dk = dk.reshape(batch, seqlen_k, kv_heads, group, headdim).sum(dim=3)
    dv = dv.reshape(batch, seqlen_k, kv_heads, group, headdim).sum(dim=3)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
