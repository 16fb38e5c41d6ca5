"""How ``deterministic=`` combines with ``torch.use_deterministic_algorithms``.

The two settings, and what a dash-attn call does under each pair:

==========================  =========================  ==========================================
``deterministic=`` (ours)   torch's switch             backward
==========================  =========================  ==========================================
``True`` (default)          any                        fixed-order dQ accumulation: bitwise
                                                       reproducible. torch's switch changes nothing.
``False``                   off (torch's default)      dQ added in arrival order: faster, not
                                                       reproducible. No message.
``False``                   ``True``                   RuntimeError at the call, worded like the
                                                       error torch raises for its own
                                                       nondeterministic ops.
``False``                   ``True, warn_only=True``   UserWarning at the call, then the
                                                       nondeterministic backward runs (as torch
                                                       does for its own ops under ``warn_only``).
==========================  =========================  ==========================================

So ``deterministic=True`` never needs torch's switch, and torch's switch never silently turns an
explicit ``deterministic=False`` into ``True``: it refuses it (or warns), as it does for any other
nondeterministic op. The check runs when the call records a graph for the backward (grad mode on
and an input that requires grad): a forward-only call is deterministic whatever the flag, so it
is never refused. The check happens at the call rather than in the backward so that the traceback
points at the line that asked for ``deterministic=False``.
"""

from __future__ import annotations

import warnings

import torch

__all__ = ["alert_nondeterministic_backward", "nondeterministic_message"]


def nondeterministic_message(function: str, warn_only: bool = False) -> str:
    """The error (``warn_only=False``) or warning text for ``function`` (e.g.
    ``"dash_attn_func"``) called with ``deterministic=False`` under
    ``torch.use_deterministic_algorithms(True)``.

    Worded after torch's own messages for nondeterministic ops ("... does not have a
    deterministic implementation, but you set 'torch.use_deterministic_algorithms(True)'. ..."),
    so that people and tools that know those recognise it, followed by the ways out.
    """
    switch = "True, warn_only=True" if warn_only else "True"
    text = (
        f"{function}(..., deterministic=False) backward does not have a deterministic "
        f"implementation, but you set 'torch.use_deterministic_algorithms({switch})'. Pass "
        "deterministic=True (the default: fixed-order dQ accumulation, bitwise reproducible)"
    )
    if warn_only:
        return text + " to make this call reproducible."
    return text + (
        " to fix it, or use the 'warn_only=True' option of torch.use_deterministic_algorithms "
        "if a nondeterministic attention backward is acceptable for your application."
    )


def alert_nondeterministic_backward(
    deterministic: bool, needs_grad: bool, function: str = "dash_attn_func"
) -> None:
    """Raise or warn, as torch does for its nondeterministic ops, when a call that will run a
    nondeterministic backward meets ``torch.use_deterministic_algorithms(True)``.

    Args:
        deterministic: the call's ``deterministic`` argument.
        needs_grad: whether the call records a graph for the backward, i.e.
            ``torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))``; the forward
            is deterministic in every mode, so without a backward there is nothing to refuse.
        function: the public function's name, for the message.

    Raises:
        RuntimeError: ``deterministic=False`` with the switch on and ``warn_only=False``.

    Warns:
        UserWarning: ``deterministic=False`` with the switch on and ``warn_only=True``.
    """
    if deterministic or not needs_grad or not torch.are_deterministic_algorithms_enabled():
        return
    if torch.is_deterministic_algorithms_warn_only_enabled():
        # stacklevel 3: the warning points at the user's call of the public function.
        warnings.warn(nondeterministic_message(function, warn_only=True), UserWarning, stacklevel=3)
        return
    raise RuntimeError(nondeterministic_message(function))
