"""Fixtures of the hopper backend's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def cute_pre_post(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole backward on the CuTe host path (``bwd_launch.FullBackward``) whatever
    ``DASH_ATTN_CUTE_PRE_POST`` says, with no launch prepared before the test."""
    from dash_attn.backends.hopper import launch

    monkeypatch.setattr(launch, "CUTE_PRE_POST", True)
    monkeypatch.setattr(launch, "_launches", {})


@pytest.fixture
def counted_nondet():
    """Non-deterministic hopper backwards run their counted kernels
    (``tools.hopper.bwd_probe.counted_nondet``) for the test."""
    from tools.hopper.bwd_probe import counted_nondet

    with counted_nondet():
        yield
