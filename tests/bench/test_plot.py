"""The figures of ``dash_attn.bench.plot``."""

from __future__ import annotations

from pathlib import Path

import pytest

from dash_attn.bench import plot

from .helpers import synthetic_rows


def test_plot_file(tmp_path: Path) -> None:
    written = plot.plot_modes(synthetic_rows(), tmp_path, "synthetic")
    assert written == [tmp_path / "bench_bwd.png"]
    data = written[0].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert plot.plot_tflops([], tmp_path / "none.png") is None


def test_plot_command(bench_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plot.main(["--csv", str(bench_csv)]) == 0
    assert (bench_csv.parent / "bench_bwd.png").exists()
