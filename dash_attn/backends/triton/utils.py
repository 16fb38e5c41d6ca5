"""Integer helpers of the Triton launchers."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()
