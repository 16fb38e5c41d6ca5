"""Fixtures of the bench tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from dash_attn.bench import report

from .helpers import synthetic_rows


@pytest.fixture
def bench_csv(tmp_path: Path) -> Path:
    path = tmp_path / "bench.csv"
    report.write_csv(path, synthetic_rows(), report.CSV_FIELDS)
    return path
