"""What ``dash-attn bench`` times: dash-attn's schedules and the peers it is compared with.

A provider turns a ``Case`` (one attention shape) into a function ``fn(q, k, v) -> out`` in its own
native layout, so that every implementation is timed on the tensors it would get in a model and no
provider pays for a transpose the others do not. The harness builds the inputs; a provider only
says which layout it wants.

Providers (the columns of every table, in this order):

* ``dash_auto``, ``dash_<schedule>`` (one per schedule that applies to the mask), ``dash_nondet``:
  this package's Triton backend, deterministic with the ``"auto"`` schedule rule or a named
  schedule, and non-deterministic (dQ added in arrival order).
* ``dash_hopper_auto``, ``dash_hopper_<schedule>``, ``dash_hopper_nondet``: the same with the
  Hopper (CuTe-DSL) backend; unavailable where it does not cover the case.
* ``fa4_det``, ``fa4_nondet``: FlashAttention-4 (``flash_attn.cute``), when it imports.
* ``flex``: ``torch.compile(flex_attention)``; a causal ``BlockMask`` for causal, none for full.
  Deterministic by construction (its backward computes dQ in a separate pass, no atomics).
* ``sdpa_flash_det``: PyTorch SDPA, flash backend, under ``torch.use_deterministic_algorithms``.
* ``sdpa_flash``, ``sdpa_cudnn``: SDPA flash and cuDNN backends, non-deterministic.

Nothing here imports torch, triton or a peer at module level: the names must be listable (for
argument checking and the tables) on a machine that has none of them.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..schedule import schedule_names

FAMILIES = ("dash", "fa4", "flex", "sdpa")
BSHD = "bshd"  # (batch, seqlen, heads, headdim): flash-attn and dash-attn
BHSD = "bhsd"  # (batch, heads, seqlen, headdim): SDPA and FlexAttention

AttnFn = Callable[[Any, Any, Any], Any]


def provider_names() -> list[str]:
    """Every provider name in table order (dash schedules from the schedule registry)."""
    dash = [
        f"dash_{prefix}{name}"
        for prefix in ("", "hopper_")
        for name in ("auto", *schedule_names(), "auto_workers", "nondet")
    ]
    return [*dash, "fa4_det", "fa4_nondet", "flex", "sdpa_flash_det", "sdpa_flash", "sdpa_cudnn"]


def family_of(name: str) -> str:
    """``dash``, ``fa4``, ``flex`` or ``sdpa`` for a provider name (its prefix)."""
    return name.split("_", 1)[0]


class ProviderUnavailable(RuntimeError):
    """The provider cannot run here (peer not installed, backend missing); the sweep skips it."""


@dataclass(frozen=True)
class Case:
    """One attention shape. ``kv_heads < heads`` is grouped-query attention."""

    batch: int
    seqlen: int
    heads: int
    kv_heads: int
    headdim: int
    causal: bool
    dtype: str = "bf16"

    @property
    def mask(self) -> str:
        return "causal" if self.causal else "full"

    @property
    def label(self) -> str:
        kv = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        return (
            f"hdim {self.headdim} {self.mask:<6} seqlen {self.seqlen:>5} "
            f"(b{self.batch} h{self.heads}{kv})"
        )


@dataclass(frozen=True)
class Provider:
    """One implementation to time.

    Attributes:
        name: column name in the CSV and the tables.
        family: ``dash``, ``fa4``, ``flex``, ``sdpa`` (or anything for a test double).
        deterministic: whether the implementation promises bitwise-repeatable gradients.
        make: ``(case, device) -> fn``; raises ``ProviderUnavailable`` when it cannot run.
        layout: ``"bshd"`` or ``"bhsd"``: the layout of the q, k, v, dout it is given.
        schedule: the requested dash schedule (``"auto"`` or a name); None for peers.
        torch_deterministic: time it under ``torch.use_deterministic_algorithms(True)``.
    """

    name: str
    family: str
    deterministic: bool
    make: Callable[[Case, Any], AttnFn] = field(repr=False)
    layout: str = BSHD
    schedule: str | None = None
    torch_deterministic: bool = False

    def context(self) -> contextlib.AbstractContextManager[None]:
        """The global torch state this provider is timed (and checked) under."""
        return torch_deterministic() if self.torch_deterministic else contextlib.nullcontext()


@contextlib.contextmanager
def torch_deterministic() -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)``, restored on exit.

    ``fill_uninitialized_memory`` is turned off meanwhile: it makes every ``torch.empty`` write
    NaNs, so each backward would also pay for filling fresh dq/dk/dv, which the other providers
    do not; that fill is about safety, not about the determinism of the kernel being timed.
    """
    import torch
    import torch.utils.deterministic

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


# ------------------------------------------------------------------------------------------------
# dash-attn


def _directions(mode: str) -> tuple[str, ...]:
    """The directions a timed step of ``mode`` runs: every mode runs the forward, ``bwd`` and
    ``fwd_bwd`` the backward too."""
    return ("fwd",) if mode == "fwd" else ("fwd", "bwd")


def _dash(
    schedule: str, deterministic: bool, backend: str, invariant: bool = True, mode: str = "bwd"
) -> Callable[[Case, Any], AttnFn]:
    def make(case: Case, device: Any) -> AttnFn:
        from dash_attn import dash_attn_func

        if backend == "hopper":
            # The hopper forward covers more head dims than its backward (192 and 256): a
            # forward sweep times it there, a backward sweep skips with the reason.
            import torch

            from dash_attn.backends import hopper_unsupported
            from dash_attn.device import device_info
            from dash_attn.plan import CAUSAL, FULL, Problem

            mask = CAUSAL if case.causal else FULL
            problem = Problem(
                case.batch, case.seqlen, case.seqlen, case.heads, case.kv_heads, case.headdim, mask
            )
            info = device_info(torch.device(device))
            for direction in _directions(mode):
                gap = hopper_unsupported(problem, info, direction)
                if gap is not None:
                    raise ProviderUnavailable(f"hopper backend: {gap}")

        def fn(q: Any, k: Any, v: Any) -> Any:
            return dash_attn_func(
                q, k, v, causal=case.causal, deterministic=deterministic, schedule=schedule,
                backend=backend, invariant=invariant,
            )  # fmt: skip

        return fn

    return make


def dash_schedules(case: Case, workers: int) -> list[str]:
    """The schedules that apply to ``case`` on ``workers`` SMs (``applicable_schedules``)."""
    from dash_attn.schedule import CAUSAL, FULL, applicable_schedules

    return applicable_schedules(CAUSAL if case.causal else FULL)


def dash_providers(case: Case, workers: int, mode: str = "bwd") -> list[Provider]:
    """Per backend (Triton: ``dash_``, Hopper: ``dash_hopper_``): ``auto``, one deterministic
    provider per applicable schedule, ``auto_workers`` (``invariant=False``: the summation order
    may follow the worker count), and ``nondet``. ``mode`` (``bwd``, ``fwd``, ``fwd_bwd``): what
    will be timed, so that a hopper provider is unavailable only where a direction it runs is
    not covered."""
    out = []
    for backend, prefix in (("triton", "dash_"), ("hopper", "dash_hopper_")):
        make = _dash("auto", True, backend, mode=mode)
        out.append(Provider(f"{prefix}auto", "dash", True, make, schedule="auto"))
        for name in dash_schedules(case, workers):
            make = _dash(name, True, backend, mode=mode)
            out.append(Provider(f"{prefix}{name}", "dash", True, make, schedule=name))
        make = _dash("auto", True, backend, invariant=False, mode=mode)
        out.append(Provider(f"{prefix}auto_workers", "dash", True, make, schedule="auto"))
        make = _dash("auto", False, backend, mode=mode)
        out.append(Provider(f"{prefix}nondet", "dash", False, make, schedule="auto"))
    return out


# ------------------------------------------------------------------------------------------------
# FlashAttention-4


def _fa4_function() -> Callable[..., Any]:
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as exc:  # noqa: BLE001 - any import failure means "peer not installed"
        raise ProviderUnavailable(
            f"flash_attn.cute does not import: {type(exc).__name__}: {exc}"
        ) from exc
    return flash_attn_func


def _fa4(deterministic: bool) -> Callable[[Case, Any], AttnFn]:
    def make(case: Case, device: Any) -> AttnFn:
        fa4 = _fa4_function()

        def fn(q: Any, k: Any, v: Any) -> Any:
            out = fa4(q, k, v, causal=case.causal, deterministic=deterministic)
            # Some flash-attn-4 versions return (out, lse).
            return out[0] if isinstance(out, tuple) else out

        return fn

    return make


# ------------------------------------------------------------------------------------------------
# FlexAttention

_flex_state: dict[str, Any] = {"dynamic": True, "compiled": {}}


def _causal_mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    # Module level so that every call passes the same function and compiled graphs are reused.
    return q_idx >= kv_idx


def _compiled_flex(dynamic: bool) -> Callable[..., Any]:
    compiled = _flex_state["compiled"].get(dynamic)
    if compiled is None:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        # One graph per (head dim, mask) with symbolic sizes keeps the sweep to a few compiles;
        # the limits are raised in case the fallback compiles one graph per shape.
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(256, getattr(torch._dynamo.config, name)))
        # The timing loop re-runs backward with retain_graph=True, which AOTAutograd refuses for a
        # graph whose saved buffers it donated (seen on torch 2.11): keep them.
        if hasattr(torch._functorch.config, "donated_buffer"):
            torch._functorch.config.donated_buffer = False
        compiled = torch.compile(flex_attention, dynamic=dynamic)
        _flex_state["compiled"][dynamic] = compiled
    return compiled


def _flex(case: Case, device: Any) -> AttnFn:
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except Exception as exc:  # noqa: BLE001
        raise ProviderUnavailable(
            f"flex_attention does not import: {type(exc).__name__}: {exc}"
        ) from exc
    block_mask = None
    if case.causal:
        block_mask = create_block_mask(
            _causal_mask_mod, None, None, case.seqlen, case.seqlen, device=device
        )
    kwargs: dict[str, Any] = {"block_mask": block_mask}
    if case.heads != case.kv_heads:
        kwargs["enable_gqa"] = True

    def fn(q: Any, k: Any, v: Any) -> Any:
        if not _flex_state["dynamic"]:
            return _compiled_flex(False)(q, k, v, **kwargs)
        try:
            return _compiled_flex(True)(q, k, v, **kwargs)
        except Exception as exc:  # noqa: BLE001 - retry once with one compile per shape
            first = str(exc).splitlines()[0] if str(exc) else ""
            out = _compiled_flex(False)(q, k, v, **kwargs)  # raises if flex cannot run at all
            _flex_state["dynamic"] = False
            print(
                f"# flex: symbolic-size compile failed ({type(exc).__name__}: {first}); "
                "compiling once per shape from now on"
            )
            return out

    return fn


# ------------------------------------------------------------------------------------------------
# PyTorch SDPA


def _sdpa(backend_name: str) -> Callable[[Case, Any], AttnFn]:
    def make(case: Case, device: Any) -> AttnFn:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name, None)
        if backend is None:
            raise ProviderUnavailable(f"this torch has no SDPBackend.{backend_name}")
        kwargs: dict[str, Any] = {"is_causal": case.causal}
        if case.heads != case.kv_heads:
            kwargs["enable_gqa"] = True

        def fn(q: Any, k: Any, v: Any) -> Any:
            # Square attention only: SDPA's is_causal is top-left aligned, which is then the same
            # mask as the bottom-right one of flash-attn and dash-attn.
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)

        return fn

    return make


# ------------------------------------------------------------------------------------------------
# Registry


def peer_providers() -> list[Provider]:
    """The peers, in table order (availability is only found out when one is built)."""
    return [
        Provider("fa4_det", "fa4", True, _fa4(True)),
        Provider("fa4_nondet", "fa4", False, _fa4(False)),
        Provider("flex", "flex", True, _flex, layout=BHSD),
        Provider(
            "sdpa_flash_det",
            "sdpa",
            True,
            _sdpa("FLASH_ATTENTION"),
            layout=BHSD,
            torch_deterministic=True,
        ),  # fmt: skip
        Provider("sdpa_flash", "sdpa", False, _sdpa("FLASH_ATTENTION"), layout=BHSD),
        Provider("sdpa_cudnn", "sdpa", False, _sdpa("CUDNN_ATTENTION"), layout=BHSD),
    ]


def _unavailable(reason: str) -> Callable[[Case, Any], AttnFn]:
    def make(case: Case, device: Any) -> AttnFn:
        raise ProviderUnavailable(reason)

    return make


def providers_for_case(case: Case, workers: int, mode: str = "bwd") -> list[Provider]:
    """Every provider for ``case`` in table order (dash schedules depend on the mask), for
    timing steps of ``mode``.

    If dash-attn itself cannot even list its schedules here, its providers are still returned,
    each raising ``ProviderUnavailable`` with the reason, so the peers are measured anyway.
    """
    try:
        dash = dash_providers(case, workers, mode)
    except Exception as exc:  # noqa: BLE001 - report through the skip list, keep the peers
        reason = f"dash-attn unavailable: {type(exc).__name__}: {exc}"
        dash = [
            Provider("dash_auto", "dash", True, _unavailable(reason), schedule="auto"),
            Provider("dash_nondet", "dash", False, _unavailable(reason), schedule="auto"),
        ]
    return [*dash, *peer_providers()]


def set_flex_dynamic(dynamic: bool) -> None:
    """Compile FlexAttention once per (head dim, mask) with symbolic sizes (True, the default:
    a few compiles for the whole sweep), or once per shape (False: specialised kernels, minutes
    more of compilation)."""
    _flex_state["dynamic"] = dynamic


def check_selection(patterns: Sequence[str]) -> None:
    """Raise ValueError naming the first pattern that matches no provider."""
    names = provider_names()
    for pattern in patterns:
        if pattern in ("all", *FAMILIES):
            continue
        if not fnmatch.filter(names, pattern):
            raise ValueError(
                f"--providers: {pattern!r} matches no provider; choose among "
                f"{', '.join(['all', *FAMILIES, *names])} (shell patterns like 'dash_*' work)"
            )


def select(providers: Sequence[Provider], patterns: Sequence[str] | None) -> list[Provider]:
    """The providers matching any pattern: a family name, ``all``, a name or a shell pattern."""
    if not patterns:
        return list(providers)
    chosen = []
    for p in providers:
        for pattern in patterns:
            if pattern == "all" or pattern == p.family or fnmatch.fnmatchcase(p.name, pattern):
                chosen.append(p)
                break
    return chosen


def fa4_status() -> str | None:
    """None when FlashAttention-4 imports, else why not (printed once before the sweep)."""
    try:
        _fa4_function()
    except ProviderUnavailable as exc:
        return str(exc)
    return None
