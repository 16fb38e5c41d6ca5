"""Integer helpers of the Triton launchers."""

from __future__ import annotations

# An unbounded window side as the kernels get it: the window compares then need no branch
# (key <= row + shift + UNBOUNDED always holds). 2**30 leaves room for row + shift in int32.
UNBOUNDED = 1 << 30


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def kernel_window(causal: bool, window: tuple[int, int]) -> tuple[str, int, int]:
    """The mask as the kernels take it: (kind, window_left, window_right).

    ``window`` is flash-attn's ``window_size`` (left, right) in tokens, -1 for an unbounded side;
    ``causal`` bounds the right side at 0 (as flash-attn does). ``kind`` is "full", "causal"
    (right 0, left unbounded: the kernels' CAUSAL path) or "local" (anything else bounded: the
    WINDOW path); unbounded sides come back as ``UNBOUNDED``.

    >>> kernel_window(True, (-1, -1))
    ('causal', 1073741824, 0)
    >>> kernel_window(False, (4, 0))
    ('local', 4, 0)
    """
    if len(window) != 2:
        raise ValueError(f"window must be (left, right), got {window!r}")
    left, right = (int(side) for side in window)
    for name, side in (("window_left", left), ("window_right", right)):
        if side < -1:
            raise ValueError(f"{name} must be >= -1 (-1 = unbounded), got {side}")
    if causal:
        right = 0
    if left < 0 and right < 0:
        kind = "full"
    elif left < 0 and right == 0:
        kind = "causal"
    else:
        kind = "local"
    return (
        kind,
        UNBOUNDED if left < 0 else left,
        UNBOUNDED if right < 0 else right,
    )
