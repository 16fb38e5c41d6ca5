"""The run header and log (``dash_attn.bench.runinfo``)."""

from __future__ import annotations

from pathlib import Path

from dash_attn.bench import runinfo


def test_gpu_slug() -> None:
    assert runinfo.gpu_slug("NVIDIA H200") == "h200"
    assert runinfo.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"


def test_log_copies_stdout(tmp_path: Path) -> None:
    with runinfo.LogTo(tmp_path / "bench.log"):
        print("hello log")
    assert (tmp_path / "bench.log").read_text() == "hello log\n"
