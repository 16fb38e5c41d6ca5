"""dash-attn: deterministic attention backward with DASH schedules, in Triton.

``import dash_attn`` stays light: the kernels (torch, triton) load on first use of the API, so the
schedule engine and its CLI run on machines without either.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["check_errors", "dash_attn_func", "last_launch_info"]


def __getattr__(name: str) -> Any:
    if name == "dash_attn_func":
        from .interface import dash_attn_func

        return dash_attn_func
    if name in ("check_errors", "last_launch_info"):
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'dash_attn' has no attribute {name!r}")
