"""The attention mask as a value: full, causal, or a sliding window (flash-attn semantics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Mask:
    """Which keys each query row attends to, in flash-attn's row semantics.

    Attributes:
        causal: the right side of the window is 0 (``window_right`` is set to 0).
        window_left, window_right: token counts, -1 for an unbounded side. With
            ``d = seqlen_k - seqlen_q`` (bottom-right alignment, per sequence), query row ``m``
            sees key ``n`` iff ``(window_right < 0 or n <= m + d + window_right)`` and
            ``(window_left < 0 or n >= m + d - window_left)``.

    Normalisation (so that equal masks compare equal and hash alike): ``causal=True`` sets
    ``window_right = 0`` (flash-attn does the same), and a window ``(x, 0)`` without ``causal``
    becomes ``causal=True``. The schedule engine, the validator, the reference executor and both
    backends read the mask from here (``keeps`` is the one statement of the row rule).

    >>> Mask.parse("causal")
    Mask(causal=True, window_left=-1, window_right=0)
    >>> Mask(window_left=4096, window_right=0).name
    'local(4096,0)'
    """

    causal: bool = False
    window_left: int = -1
    window_right: int = -1

    def __post_init__(self) -> None:
        if not isinstance(self.causal, bool):
            raise TypeError(f"Mask.causal must be a bool, got {type(self.causal).__name__}")
        for name in ("window_left", "window_right"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"Mask.{name} must be an int, got {type(value).__name__}")
            if value < -1:
                raise ValueError(f"Mask.{name} must be -1 (unbounded) or >= 0, got {value}")
            object.__setattr__(self, name, int(value))
        if self.causal:
            object.__setattr__(self, "window_right", 0)
        elif self.window_right == 0:
            object.__setattr__(self, "causal", True)

    @property
    def window(self) -> tuple[int, int]:
        """``(window_left, window_right)`` after normalisation (-1: unbounded)."""
        return self.window_left, self.window_right

    @property
    def kind(self) -> str:
        """``"full"`` (no bound), ``"causal"`` (right 0, left unbounded) or ``"local"``."""
        if self.window_left < 0 and self.window_right < 0:
            return "full"
        if self.window_left < 0 and self.window_right == 0:
            return "causal"
        return "local"

    @property
    def name(self) -> str:
        """``"full"``, ``"causal"`` or ``"local(L,R)"``: the spelling of the CLI, CSV and JSON."""
        kind = self.kind
        return f"local({self.window_left},{self.window_right})" if kind == "local" else kind

    @classmethod
    def parse(cls, name: str) -> Mask:
        """The mask spelled ``name``: ``"full"``, ``"causal"`` or ``"local(L,R)"``."""
        if not isinstance(name, str):
            raise TypeError(f"mask name must be a str, got {type(name).__name__}")
        if name in MASK_NAMES:
            return cls(causal=name == "causal")
        text = name.replace(" ", "")
        if text.startswith("local(") and text.endswith(")"):
            parts = text[len("local(") : -1].split(",")
            try:
                left, right = (int(part) for part in parts)
            except ValueError:
                pass  # wrong count or not integers: the error below names the spellings
            else:
                return cls(window_left=left, window_right=right)
        raise ValueError(f"mask must be 'full', 'causal' or 'local(L,R)', got {name!r}")

    def keeps(self, m: Any, n: Any, seqlen_q: Any, seqlen_k: Any) -> Any:
        """Whether query row ``m`` sees key ``n`` (rows and keys outside the sequence: never).

        Written with operators only, so that ints, numpy arrays and torch tensors broadcast
        alike; every reference (executor, attention, validator) uses this one rule.
        """
        d = seqlen_k - seqlen_q
        keep = (m >= 0) & (m < seqlen_q) & (n >= 0) & (n < seqlen_k)
        if self.window_right >= 0:
            keep = keep & (n <= m + d + self.window_right)
        if self.window_left >= 0:
            keep = keep & (n >= m + d - self.window_left)
        return keep


MASK_NAMES = ("full", "causal")
MASK_KINDS = ("full", "causal", "local")
FULL = Mask(causal=False)
CAUSAL = Mask(causal=True)
