"""Host-side launch options of the backward that need no GPU to check."""

from __future__ import annotations

import pytest
import torch

from dash_attn.runtime import DQ_REDUCE_MODES, dq_reduce_mode


def test_dq_reduce_defaults_to_atomics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DASH_ATTN_DQ_REDUCE", raising=False)
    assert dq_reduce_mode(torch.device("cpu")) == "atomic"
    monkeypatch.setenv("DASH_ATTN_DQ_REDUCE", "")
    assert dq_reduce_mode(torch.device("cpu")) == "atomic"
    assert DQ_REDUCE_MODES == ("atomic", "tma")


def test_unknown_dq_reduce_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASH_ATTN_DQ_REDUCE", "bulk")
    with pytest.raises(ValueError, match=r"DASH_ATTN_DQ_REDUCE must be one of .*'bulk'"):
        dq_reduce_mode(torch.device("cpu"))


def test_tma_dq_reduce_needs_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASH_ATTN_DQ_REDUCE", "tma")
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        dq_reduce_mode(torch.device("cpu"))
