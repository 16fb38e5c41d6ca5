"""Host-side launch options of the backward that need no GPU to check."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dash_attn.kernels.bwd import tma_loadable
from dash_attn.runtime import DQ_REDUCE_MODES, QO_LOAD_MODES, dq_reduce_mode, qo_load_mode
from dash_attn.tiles import _BACKWARD_TILES as _DEFAULTS
from dash_attn.tiles import BackwardTiles, backward_tiles, parse_tiles


def test_dq_reduce_auto_is_atomics_without_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    # "auto" (the default) picks TMA on Hopper GPUs only; CPU tensors (the interpreter) use atomics.
    for value in (None, "", "auto"):
        if value is None:
            monkeypatch.delenv("DASH_ATTN_DQ_REDUCE", raising=False)
        else:
            monkeypatch.setenv("DASH_ATTN_DQ_REDUCE", value)
        assert dq_reduce_mode(torch.device("cpu")) == "atomic"
    monkeypatch.setenv("DASH_ATTN_DQ_REDUCE", "atomic")
    assert dq_reduce_mode(torch.device("cpu")) == "atomic"
    assert DQ_REDUCE_MODES == ("auto", "atomic", "tma")


def test_pipeline_depth_follows_the_dq_reduction() -> None:
    # Head dim 64 pipelines two stages with TMA but one with atomics (which spill at two); the
    # block sizes, and with them the schedule, do not depend on the reduction.
    tma, atomic = backward_tiles(64, "tma"), backward_tiles(64, "atomic")
    assert (tma.num_stages, atomic.num_stages) == (2, 1)
    assert (tma.block_m, tma.block_n) == (atomic.block_m, atomic.block_n)
    assert tma.atomic_num_stages is None  # resolved tiles carry one depth only
    # Head dim 128: three stages with TMA; two with atomics, where three would not fit in an
    # A100's shared memory. The step tables are read ahead either way.
    tma, atomic = backward_tiles(128, "tma"), backward_tiles(128, "atomic")
    assert (tma.num_stages, atomic.num_stages) == (3, 2)
    assert tma.tables_ahead and atomic.tables_ahead


def test_tile_override_applies_to_both_reductions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASH_ATTN_BWD_TILES", "64:64x128w4s3")
    for mode in ("tma", "atomic"):
        assert backward_tiles(64, mode) == BackwardTiles(64, 128, 4, 3)


def test_tile_override_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASH_ATTN_BWD_TILES", "64:64x128w4s3a, 256:64x64w8s1r,128:64x128w8s2ar")
    assert backward_tiles(64) == BackwardTiles(64, 128, 4, 3, tables_ahead=True)
    assert backward_tiles(256) == BackwardTiles(64, 64, 8, 1, release_after_qk=True)
    both = backward_tiles(128)
    assert (both.tables_ahead, both.release_after_qk, both.label) == (True, True, "64x128w8s2ar")
    assert backward_tiles(96) == replace(_DEFAULTS[96], atomic_num_stages=None)  # not overridden


@pytest.mark.parametrize(
    "value, message",
    [
        ("128:64x128w8", "not HEADDIM:BMxBNwWARPSsSTAGES"),
        ("64x128w8s2", "not HEADDIM:BMxBNwWARPSsSTAGES"),
        ("128:64x128w8s2x", "not HEADDIM:BMxBNwWARPSsSTAGES"),
        ("128:64x128w8s2ra", "not HEADDIM:BMxBNwWARPSsSTAGES"),
        ("128:128x64w8s2", "BN must be a multiple of BM"),
    ],
)
def test_bad_tile_override_names_the_variable(
    value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DASH_ATTN_BWD_TILES", value)
    with pytest.raises(ValueError, match=f"DASH_ATTN_BWD_TILES entry .*{message}"):
        backward_tiles(128)


def test_tiles_label_round_trips() -> None:
    for tiles in _DEFAULTS.values():
        assert parse_tiles(tiles.label) == replace(tiles, atomic_num_stages=None)


def test_unknown_dq_reduce_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASH_ATTN_DQ_REDUCE", "bulk")
    with pytest.raises(ValueError, match=r"DASH_ATTN_DQ_REDUCE must be one of .*'bulk'"):
        dq_reduce_mode(torch.device("cpu"))


def test_tma_dq_reduce_needs_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASH_ATTN_DQ_REDUCE", "tma")
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        dq_reduce_mode(torch.device("cpu"))


def test_qo_load_defaults_to_pointer_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in (None, "", "pointer"):
        if value is None:
            monkeypatch.delenv("DASH_ATTN_QO_LOAD", raising=False)
        else:
            monkeypatch.setenv("DASH_ATTN_QO_LOAD", value)
        assert qo_load_mode(torch.device("cpu")) == "pointer"
    assert QO_LOAD_MODES == ("pointer", "tma")


def test_unknown_qo_load_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASH_ATTN_QO_LOAD", "async")
    with pytest.raises(ValueError, match=r"DASH_ATTN_QO_LOAD must be one of .*'async'"):
        qo_load_mode(torch.device("cpu"))


def test_tma_loads_need_a_gpu_or_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    # Triton's interpreter emulates descriptor loads (the CPU tests run that path); a plain CPU
    # run has no Triton at all for them.
    monkeypatch.setenv("DASH_ATTN_QO_LOAD", "tma")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA GPU or Triton's interpreter"):
        qo_load_mode(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert qo_load_mode(torch.device("cpu")) == "tma"


def test_tma_loadable_checks_alignment() -> None:
    x = torch.zeros(2, 64, 4, 128, dtype=torch.bfloat16)
    assert tma_loadable(x)
    assert not tma_loadable(x[..., 1:])  # base not 16-byte aligned, odd outer strides
    assert not tma_loadable(x.transpose(1, 3))  # last dimension not contiguous
    packed = torch.zeros(2, 64, 3, 4, 128, dtype=torch.bfloat16)
    assert tma_loadable(packed[:, :, 0])  # q of a packed qkv tensor: aligned strides
    # A broadcast gradient (e.g. of out.sum(dim=1)) has zero strides: pointer loads handle it.
    assert not tma_loadable(torch.zeros(128, dtype=torch.bfloat16).expand(2, 64, 4, 128))
