"""The DAG model against measurements (``dash_attn.bench.model``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dash_attn.backends import hopper
from dash_attn.bench import model, report
from dash_attn.schedule.report import square_spec

from .helpers import synthetic_rows


def test_model_vs_measured_columns_and_baseline(tmp_path: Path) -> None:
    rows = [r for r in synthetic_rows() if r["seqlen"] == 512 and r["headdim"] == 128]
    out = model.model_vs_measured(rows)
    assert {r["schedule"] for r in out if not r["causal"]} == {"fa3", "descending", "shift"}
    assert {r["schedule"] for r in out if r["causal"]} == {"fa3", "descending", "symmetric_shift"}
    for r in out:
        assert set(model.MODEL_FIELDS) <= set(r)
        assert r["c_us"] > 0 and r["r_us"] >= 0
        if r["schedule"] == "fa3":
            assert r["model_speedup_vs_fa3"] == r["measured_speedup_vs_fa3"] == 1.0
    causal = {r["schedule"]: r for r in out if r["causal"]}
    assert causal["symmetric_shift"]["measured_speedup_vs_fa3"] == pytest.approx(1.2)
    # The model, fed r from the fa3 overhead, also puts symmetric_shift ahead of fa3 (paper).
    assert causal["symmetric_shift"]["model_speedup_vs_fa3"] > 1.0
    assert "configs" in model.agreement_summary(out)
    csv_path = tmp_path / "bench.csv"
    report.write_csv(csv_path, rows, report.CSV_FIELDS)
    assert model.main(["--csv", str(csv_path)]) == 0
    assert (tmp_path / "model_vs_measured.csv").exists()


def test_estimate_costs_per_step() -> None:
    spec = square_spec(128, 1024, 16, 16, False, 132)
    c, r = model.estimate_costs(spec, nondet_ms=1.0, fa3_ms=1.5)
    steps = spec.num_tasks() / 132
    assert c == pytest.approx(1.0 / steps) and r == pytest.approx(0.5 / steps)
    assert model.estimate_costs(spec, 1.0, 0.9)[1] == 0.0


def test_model_per_backend_uses_each_backends_columns_and_tiles() -> None:
    """The hopper rows (``dash_hopper_*``) get their own c and r, on the hopper kernels' tiles."""
    rows = [r for r in synthetic_rows() if r["seqlen"] == 2048 and r["headdim"] == 64]
    hopper_rows = [
        {**r, "provider": r["provider"].replace("dash_", "dash_hopper_", 1), "ms": r["ms"] * 0.5}
        for r in rows
        if r["provider"].startswith("dash_")
    ]
    out = model.model_vs_measured(rows + hopper_rows, backends=("triton", "hopper"))
    by_backend = {b: [r for r in out if r["backend"] == b] for b in ("triton", "hopper")}
    assert len(by_backend["triton"]) == len(by_backend["hopper"]) == 6
    for tri, hop in zip(by_backend["triton"], by_backend["hopper"], strict=True):
        assert (tri["schedule"], tri["causal"]) == (hop["schedule"], hop["causal"])
        assert hop["measured_ms"] == pytest.approx(tri["measured_ms"] * 0.5)
        assert hop["measured_speedup_vs_fa3"] == pytest.approx(tri["measured_speedup_vs_fa3"])
    summary = model.agreement_summary(out)
    assert "hopper:" in summary and "triton:" in summary
    spec = square_spec(64, 2048, 8, 32, True, 132, backend="hopper")
    tiles = hopper.bwd_tiles(64, True)
    assert (spec.block_m, spec.q_tiles) == (tiles.block_m, 2048 // tiles.block_m)
    wide = square_spec(192, 2048, 8, 16, True, 132, backend="hopper")  # since session 40
    assert (wide.block_m, wide.block_n) == (64, 96)
    with pytest.raises(NotImplementedError, match="hopper backward has head dims"):
        square_spec(80, 2048, 8, 16, True, 132, backend="hopper")
    with pytest.raises(ValueError, match="backend must be"):
        square_spec(64, 2048, 8, 32, True, 132, backend="cuda")
    # Only the backends asked for (the default is the Triton one, as before).
    assert {r["backend"] for r in model.model_vs_measured(rows + hopper_rows)} == {"triton"}
