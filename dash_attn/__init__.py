"""dash-attn: bitwise-reproducible attention backward with DASH schedules.

``import dash_attn`` stays light: the kernels (torch, triton) load on first use of the API, so the
schedule engine and its CLI run on machines without either.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = [
    "check_determinism",
    "check_errors",
    "dash_attn_func",
    "dash_attn_varlen_func",
    "last_forward_backend",
    "last_launch_info",
    "scaled_dot_product_attention",
]


def __getattr__(name: str) -> Any:
    if name in ("dash_attn_func", "dash_attn_varlen_func"):
        from . import interface

        return getattr(interface, name)
    if name == "check_determinism":
        from .check import check_determinism

        return check_determinism
    if name == "scaled_dot_product_attention":
        from .sdpa import scaled_dot_product_attention

        return scaled_dot_product_attention
    if name == "check_errors":
        from .errors import check_errors

        return check_errors
    if name in ("last_launch_info", "last_forward_backend"):
        from . import dispatch

        return getattr(dispatch, name)
    raise AttributeError(f"module 'dash_attn' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public names load lazily; list them anyway (tab completion, ``dir(dash_attn)``).
    return sorted({*globals(), *__all__})
