"""Pieces the backward A/B probes under benchmarks/results/h200/ share (sessions 45-47's lane,
stride, turn and prefetch probes): gradients of one backward call, their fp32 and same-dtype
references, the flash-attn rule's verdict on them as a line, and a hopper backward captured
once and replayed with other tables or another kernel variant.

    refs = grad_references(q, k, v, dout, causal=True)
    print(f"check B: {grad_verdict('B', grads(out, leaves, dout), *refs)}")

    base = capture(leaves, dout, causal=True, deterministic=True)
    kp = base.with_launch(variant_launch(base.plan, leaves[0], lambda name: name + "_kp"))
    time_contenders({"B": base.backward, "kp": kp.backward}, 20, "ab")
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from dash_attn.reference.attention import attention_ref
from dash_attn.testing import assert_close_to_ref

Grads = list[torch.Tensor]


def grads(out: torch.Tensor, leaves: Sequence[torch.Tensor], dout: torch.Tensor) -> Grads:
    """dq, dk, dv of ``out`` (graph kept, so a probe can call it again), cloned."""
    return [t.clone() for t in torch.autograd.grad(out, leaves, dout, retain_graph=True)]


def grad_references(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, *, causal: bool
) -> tuple[Grads, Grads]:
    """(fp32 gradients, gradients computed in the inputs' dtype), both as fp32 tensors: the two
    sides of the flash-attn rule."""
    sides = []
    for upcast in (True, False):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
        sides.append([g.float() for g in torch.autograd.grad(out, leaves, dout.to(out.dtype))])
    return sides[0], sides[1]


def grad_verdict(tag: str, got: Sequence[torch.Tensor], ref: Grads, same: Grads) -> str:
    """``rule ok`` or ``FAILS <the first 200 characters of why>`` for dq, dk and dv."""
    try:
        for name, g, r, s in zip(("dq", "dk", "dv"), got, ref, same, strict=True):
            assert_close_to_ref(f"{name} {tag}", g, r, s, atol=1e-3)
    except AssertionError as err:
        return f"FAILS {str(err)[:200]}"
    return "rule ok"


@dataclasses.dataclass(frozen=True)
class Captured:
    """One hopper backward as a probe replays it: the autograd graph of a ``dash_attn_func``
    call (``out``, its ``leaves`` q, k, v and ``dout``) and the launch the backend cached for it
    (``key`` into ``hopper.launch._launches``, the ``plan`` and its prepared ``launch``)."""

    out: torch.Tensor
    leaves: tuple[torch.Tensor, ...]
    dout: torch.Tensor
    key: Any
    plan: Any
    launch: Any

    def with_launch(self, launch: Any, plan: Any = None) -> Captured:
        """The same call run by another prepared launch (and its plan, if it has new tables)."""
        return dataclasses.replace(self, launch=launch, plan=self.plan if plan is None else plan)

    def backward(self) -> tuple[torch.Tensor, ...]:
        """dq, dk, dv by this launch: it is put in the backend's cache under the call's key
        alone, and the dispatcher is handed this plan, so the autograd backward finds the
        launch instead of preparing another. (The dispatcher makes its plan again at every
        backward; a probe that cleared ``make_backward_plan``'s cache after capturing, to make
        another plan of the same call, would otherwise get a new plan object, miss the cache
        and time a fresh preparation of the current plan each call: session 51, call 1.)"""
        from dash_attn import dispatch
        from dash_attn.backends.hopper import launch as hopper_launch

        hopper_launch._launches.clear()
        hopper_launch._launches[self.key] = (self.plan, self.launch)
        made = dispatch.make_backward_plan
        dispatch.make_backward_plan = lambda *args, **kwargs: self.plan  # type: ignore[assignment]
        try:
            return torch.autograd.grad(self.out, self.leaves, self.dout, retain_graph=True)
        finally:
            dispatch.make_backward_plan = made


def capture(leaves: Sequence[torch.Tensor], dout: torch.Tensor, **kwargs: Any) -> Captured:
    """Run ``dash_attn_func(*leaves, backend="hopper", **kwargs)`` and its backward once and
    capture the one launch the backend prepared (ValueError if it prepared another number)."""
    import dash_attn
    from dash_attn.backends.hopper import launch as hopper_launch

    hopper_launch._launches.clear()
    out = dash_attn.dash_attn_func(*leaves, backend="hopper", **kwargs)
    torch.autograd.grad(out, leaves, dout, retain_graph=True)
    if len(hopper_launch._launches) != 1:
        raise ValueError(f"expected one backward launch, got {len(hopper_launch._launches)}")
    ((key, (plan, prepared)),) = hopper_launch._launches.items()
    return Captured(out, tuple(leaves), dout, key, plan, prepared)


@contextlib.contextmanager
def kernel_variant(variant_of: Callable[[str], str]) -> Iterator[None]:
    """Within it the hopper backend runs the kernel variant ``variant_of(shipped variant)`` (a
    name in ``bwd_launch.VARIANTS``) instead of the shipped one; its choice is restored after."""
    from dash_attn.backends.hopper import launch as hopper_launch

    shipped = hopper_launch.bwd_variant
    hopper_launch.bwd_variant = lambda *args, **kwargs: variant_of(shipped(*args, **kwargs))
    try:
        yield
    finally:
        hopper_launch.bwd_variant = shipped


@contextlib.contextmanager
def nondet_kernels(counted: bool) -> Iterator[None]:
    """Within it every non-deterministic hopper backward runs its counted kernel
    (``counted``: ``hopper.counted_nondet_twin``, at every head dim and length) or the kernel
    without turns shipped before session 59 (``hopper.BWD_NONDET_UNCOUNTED``). Plans and
    prepared launches are made anew on entry and on exit, since a plan's ``cast_sms`` follows
    its kernel."""
    from dash_attn.backends import hopper
    from dash_attn.backends.hopper import launch as hopper_launch
    from dash_attn.plan import make_backward_plan

    shipped = hopper.BWD_NONDET_TWIN, hopper.NONDET_UNCOUNTED_HEADDIMS
    if counted:
        hopper.BWD_NONDET_TWIN = hopper.counted_nondet_twins()
        hopper.NONDET_UNCOUNTED_HEADDIMS = frozenset()
    else:
        hopper.BWD_NONDET_TWIN = dict(hopper.BWD_NONDET_UNCOUNTED)
    make_backward_plan.cache_clear()
    hopper_launch._launches.clear()
    try:
        yield
    finally:
        hopper.BWD_NONDET_TWIN, hopper.NONDET_UNCOUNTED_HEADDIMS = shipped
        make_backward_plan.cache_clear()
        hopper_launch._launches.clear()


@contextlib.contextmanager
def backward_tiles(head_dim: int, causal: bool, block_m: int, block_n: int) -> Iterator[None]:
    """Within it the hopper backward plans ``head_dim`` and the mask with ``block_m x block_n``
    tiles instead of the shipped ones (``hopper.bwd_tiles``): the schedule tables are built for
    them and the shipped kernel variant is compiled for them (its options, other tiles). A
    probe of another tile shape; other tiles give other bits. Plans and prepared launches are
    made anew on entry and on exit."""
    from dash_attn.backends import hopper
    from dash_attn.backends.hopper import launch as hopper_launch
    from dash_attn.plan import make_backward_plan

    key = (head_dim, "causal" if causal else "full")
    shipped = hopper._BWD_TILES[key]
    hopper._BWD_TILES[key] = dataclasses.replace(shipped, block_m=block_m, block_n=block_n)
    make_backward_plan.cache_clear()
    hopper_launch._launches.clear()
    try:
        yield
    finally:
        hopper._BWD_TILES[key] = shipped
        make_backward_plan.cache_clear()
        hopper_launch._launches.clear()


def variant_launch(plan: Any, q: torch.Tensor, variant_of: Callable[[str], str]) -> Any:
    """``plan`` prepared for the kernel variant ``variant_of(shipped variant)`` instead of the
    shipped one (``kernel_variant``)."""
    from dash_attn.backends.hopper import launch as hopper_launch

    with kernel_variant(variant_of):
        return hopper_launch._prepare(plan, q)
