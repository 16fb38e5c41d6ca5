"""Whole-training-step determinism checker: which module first makes two identical steps differ.

``check_determinism(model, batch_fn, loss_fn, steps=1)`` is the Python API; ``main(argv)`` the
``dash-attn check`` demo (``dash_attn.check.demo``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .compare import DeterminismReport, Difference
from .run import check_determinism

__all__ = ["DeterminismReport", "Difference", "check_determinism", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    # The demo imports transformers; only the command pays for that import.
    from .demo import main as demo_main

    return demo_main(argv)
