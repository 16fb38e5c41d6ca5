"""What the packed benchmark times: dash-attn (issue #12's API), FA4 and FlexAttention.

A provider's ``make(row, device)`` returns ``fn(q, k, v) -> out`` in the provider's own layout or
raises ``ProviderUnavailable`` saying why it cannot run (missing peer, an API keyword this commit
does not have yet); the harness turns that into a row with the reason. Nothing here imports torch,
flash_attn or cutlass at module level, so the module imports on any machine.

Layouts: ``thd`` (total tokens, heads, headdim: the varlen APIs), ``bshd`` (batch 1, the dense
APIs on the window row) and ``bhsd`` (FlexAttention).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .packed_rows import PackedRow
from .providers import ProviderUnavailable, _compiled_flex
from .timing import short_reason

THD, BSHD, BHSD = "thd", "bshd", "bhsd"
# Schedules assumed for the local mask when the schedule engine of this commit cannot say which
# apply (the two dynamic baselines serve any mask).
FALLBACK_SCHEDULES = ("fa3", "descending")

AttnFn = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class PackedProvider:
    """One implementation to time.

    Attributes:
        name: the CSV's ``provider``.
        family: ``dash``, ``fa4`` or ``flex``.
        deterministic: whether the implementation promises bitwise-repeatable gradients (the
            measured answer is the CSV's ``bits_repeatable``).
        make: ``(row, device) -> fn``; raises ``ProviderUnavailable`` when it cannot run.
        layout: ``thd``, ``bshd`` or ``bhsd``.
        schedule: the requested dash schedule; None for peers.
    """

    name: str
    family: str
    deterministic: bool
    make: Callable[[PackedRow, Any], AttnFn] = field(repr=False)
    layout: str = THD
    schedule: str | None = None


def row_layout(row: PackedRow) -> str:
    """The layout of the flash-attn style APIs on ``row``: varlen packs, dense has a batch."""
    return THD if row.varlen else BSHD


def first_output(out: Any) -> Any:
    """The attention output of an API that may also return the LSE (``(out, lse)``)."""
    return out[0] if isinstance(out, tuple) else out


def require_keywords(fn: Callable[..., Any], names: Sequence[str], what: str) -> None:
    """Raise ``ProviderUnavailable`` if ``fn`` lacks one of the keywords ``names``: the issue #12
    API may not be on the commit being measured, and a TypeError deep in a timing loop would say
    less."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [n for n in names if n not in params]
    if missing:
        raise ProviderUnavailable(f"{what} has no keyword {', '.join(missing)} on this commit")


# ------------------------------------------------------------------------------------------------
# dash-attn


def _dash_function(row: PackedRow) -> Callable[..., Any]:
    import dash_attn

    name = "dash_attn_varlen_func" if row.varlen else "dash_attn_func"
    fn = getattr(dash_attn, name, None)
    if fn is None:
        raise ProviderUnavailable(f"dash_attn.{name} does not exist on this commit")
    return fn


def _dash(schedule: str, deterministic: bool, invariant: bool | None) -> Callable[..., AttnFn]:
    def make(row: PackedRow, device: Any) -> AttnFn:
        import torch

        fn = _dash_function(row)
        kwargs: dict[str, Any] = {
            "causal": True,
            "deterministic": deterministic,
            "schedule": schedule,
            "backend": "triton",
        }
        if row.local:
            kwargs["window_size"] = row.window
        if invariant is not None:
            kwargs["invariant"] = invariant
        require_keywords(fn, list(kwargs), f"dash_attn.{fn.__name__}")
        if not row.varlen:
            return lambda q, k, v: first_output(fn(q, k, v, **kwargs))
        cu = torch.tensor(row.cu_seqlens, dtype=torch.int32, device=device)
        n = row.max_seqlen
        return lambda q, k, v: first_output(fn(q, k, v, cu, cu, n, n, **kwargs))

    return make


def dash_schedules(row: PackedRow) -> tuple[list[str], str | None]:
    """The schedules that apply to the row's mask (``applicable_schedules``), and a note when the
    engine could not say and ``FALLBACK_SCHEDULES`` is used instead."""
    try:
        from dash_attn.schedule import Mask, applicable_schedules

        if row.local:
            mask = Mask(causal=True, window_left=row.window_left, window_right=0)
        else:
            mask = Mask(causal=True)
        names = list(applicable_schedules(mask))
    except Exception as exc:  # noqa: BLE001 - the local Mask may not exist yet on this commit
        return list(FALLBACK_SCHEDULES), f"applicable_schedules failed ({short_reason(exc)})"
    if not names:
        return list(FALLBACK_SCHEDULES), f"applicable_schedules({mask.name}) returned none"
    return names, None


def dash_providers(row: PackedRow, schedules: list[str]) -> list[PackedProvider]:
    """det ``auto``, det per schedule, ``auto_workers`` (det ``auto`` with ``invariant=False``, the
    name ``dash-attn bench`` gives it), non-det ``auto``."""
    layout = row_layout(row)
    out = [PackedProvider("dash_auto", "dash", True, _dash("auto", True, None), layout, "auto")]
    for name in schedules:
        make = _dash(name, True, None)
        out.append(PackedProvider(f"dash_{name}", "dash", True, make, layout, name))
    make = _dash("auto", True, False)
    out.append(PackedProvider("dash_auto_workers", "dash", True, make, layout, "auto"))
    make = _dash("auto", False, None)
    out.append(PackedProvider("dash_nondet", "dash", False, make, layout, "auto"))
    return out


# ------------------------------------------------------------------------------------------------
# FlashAttention-4


def _fa4_module() -> Any:
    try:
        import flash_attn.cute as fa4
    except Exception as exc:  # noqa: BLE001 - any import failure means "peer not installed"
        raise ProviderUnavailable(f"flash_attn.cute does not import: {short_reason(exc)}") from exc
    return fa4


def _fa4(deterministic: bool) -> Callable[..., AttnFn]:
    def make(row: PackedRow, device: Any) -> AttnFn:
        import torch

        fa4 = _fa4_module()
        kwargs: dict[str, Any] = {"causal": True, "deterministic": deterministic}
        if row.local:
            kwargs["window_size"] = row.window
        if not row.varlen:
            return lambda q, k, v: first_output(fa4.flash_attn_func(q, k, v, **kwargs))
        cu = torch.tensor(row.cu_seqlens, dtype=torch.int32, device=device)
        # Keywords: the fourth positional parameter of FA4's varlen function is qv (MLA).
        kwargs.update(
            cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=row.max_seqlen,
            max_seqlen_k=row.max_seqlen,
        )  # fmt: skip
        return lambda q, k, v: first_output(fa4.flash_attn_varlen_func(q, k, v, **kwargs))

    return make


# ------------------------------------------------------------------------------------------------
# FlexAttention


def flex_mask_mod(row: PackedRow, device: Any) -> Callable[[Any, Any, Any, Any], Any]:
    """FlexAttention's ``mask_mod`` of ``row``: document mask, causal, and the window if any."""
    import torch

    doc = None
    if row.varlen and len(row.lengths) > 1:
        doc = torch.tensor(row.doc_ids(), dtype=torch.int32, device=device)
    window = row.window_left

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        # The packed sequence is one flex sequence: a document sees only itself (document ids);
        # causal and window act on packed positions, whose differences inside a document are
        # those of the per-document positions the varlen APIs use.
        keep = q_idx >= kv_idx
        if doc is not None:
            keep = keep & (doc[q_idx] == doc[kv_idx])
        if window >= 0:
            keep = keep & (q_idx - kv_idx <= window)
        return keep

    return mask_mod


def _flex(row: PackedRow, device: Any) -> AttnFn:
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except Exception as exc:  # noqa: BLE001
        raise ProviderUnavailable(f"flex_attention does not import: {short_reason(exc)}") from exc
    n = row.tokens
    block_mask = create_block_mask(flex_mask_mod(row, device), None, None, n, n, device=device)
    kwargs: dict[str, Any] = {"block_mask": block_mask}
    if row.heads != row.kv_heads:
        kwargs["enable_gqa"] = True
    compiled = _compiled_flex(False)  # one static shape per row
    return lambda q, k, v: compiled(q, k, v, **kwargs)


# ------------------------------------------------------------------------------------------------
# Registry


def providers_for_row(row: PackedRow) -> tuple[list[PackedProvider], str | None]:
    """Every provider of ``row`` in run order, and the note of ``dash_schedules`` (or None).

    FA4-det runs first: it is the baseline of every ratio, so a run cut by its deadline keeps it.
    FlexAttention runs last (its compile is the slowest). Flex promises no bitwise repeatability
    (``deterministic=False``); whether the bits repeated anyway is measured like everyone's.
    """
    schedules, note = dash_schedules(row)
    layout = row_layout(row)
    fa4_det = PackedProvider("fa4_det", "fa4", True, _fa4(True), layout)
    fa4_nondet = PackedProvider("fa4_nondet", "fa4", False, _fa4(False), layout)
    flex = PackedProvider("flex", "flex", False, _flex, BHSD)
    return [fa4_det, *dash_providers(row, schedules), fa4_nondet, flex], note
