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
def uncounted_nondet():
    """Non-deterministic hopper backwards run the kernels without turns shipped before session
    59 (``tools.hopper.bwd_probe.nondet_kernels``) for the test."""
    from tools.hopper.bwd_probe import nondet_kernels

    with nondet_kernels(counted=False):
        yield
