"""Shared test set-up: the source checkout's ``tools/`` are importable (``from tools import ...``),
the two machine-dependent markers skip where their machine is missing, and the disk cache of
compiled kernels is off unless a test turns it on."""

from __future__ import annotations

import os

import pytest

# Compiled hopper kernels stay in the test process: the suite must not write to (or load from)
# the user's disk cache (~/.cache/dash_attn/kernels). Tests of the cache set the variable
# themselves.
os.environ.setdefault("DASH_ATTN_KERNEL_CACHE", "0")

from dash_attn.device import is_interpreter


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    has_cuda = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and (not has_cuda or is_interpreter()):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU and compiled kernels"))
        if "interpreter" in item.keywords and not is_interpreter():
            item.add_marker(pytest.mark.skip(reason="needs TRITON_INTERPRET=1 before import"))
