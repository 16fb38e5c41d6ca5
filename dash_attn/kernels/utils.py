"""Small helpers shared by the kernel launchers."""

from __future__ import annotations

import functools
import os

import torch


def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=16)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``; under the interpreter a small fixed pool of workers."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_sm_count(index)
    # The interpreter runs programs one after another: any pool size works for dynamic dispatch;
    # a few workers keep the persistent loop honest.
    return 4
