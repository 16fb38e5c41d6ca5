"""The torch side of ``plan.DeviceInfo``: what a plan needs to know about a tensor's device."""

from __future__ import annotations

import functools
import os

import torch

from .plan import INTERPRETER, DeviceInfo


def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=16)
def _cuda_device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        sm_count=props.multi_processor_count,
        capability=(props.major, props.minor),
        name=props.name,
    )


def device_info(device: torch.device) -> DeviceInfo:
    """``DeviceInfo`` of a CUDA device, or ``INTERPRETER`` for CPU tensors under the interpreter."""
    if device.type == "cuda" and not is_interpreter():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda_device_info(index)
    return INTERPRETER
