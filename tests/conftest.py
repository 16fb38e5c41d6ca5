"""Shared test set-up: the source checkout's ``tools/`` are importable (``from tools import ...``),
and the two machine-dependent markers skip where their machine is missing."""

from __future__ import annotations

import os

import pytest


def _interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    for item in items:
        if "gpu" in item.keywords and (not has_cuda or _interpreter()):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU and compiled kernels"))
        if "interpreter" in item.keywords and not _interpreter():
            item.add_marker(pytest.mark.skip(reason="needs TRITON_INTERPRET=1 before import"))
