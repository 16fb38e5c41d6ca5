"""The GPU loops of ``dash_attn.bench.sweep``, run on the CPU with test doubles."""

from __future__ import annotations

from pathlib import Path

import pytest

from dash_attn.bench import report, runinfo, sweep
from dash_attn.bench.providers import Case
from dash_attn.bench.timing import attention_flops, wall_clock_ms

from .helpers import META, fakes


@pytest.mark.parametrize("mode", ["bwd", "fwd", "fwd_bwd"])
def test_sweep_loop_on_cpu(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [Case(2, 32, 2, 2, 16, True), Case(1, 64, 2, 2, 16, False)]
    skips = sweep.Skips([], set())
    saved = []
    rows = sweep.run_sweep(
        cases, fakes, meta=META, mode=mode, warmup=0.0, rep=1.0, repeats=3, seed=0,
        device="cpu", timer=wall_clock_ms, deadline=runinfo.Deadline(None), skips=skips,
        on_config=lambda r: saved.append(len(r)),
    )  # fmt: skip
    assert saved == [3, 6]
    assert [r["provider"] for r in rows[:3]] == ["eager_det", "eager_bhsd", "eager_noisy"]
    for r in rows:
        assert r["ms"] > 0 and r["mode"] == mode
        flops = attention_flops(
            r["batch"], r["seqlen"], r["seqlen"], r["heads"], r["headdim"], r["causal"], mode
        )
        assert r["tflops"] == pytest.approx(flops / (r["ms"] * 1e-3) / 1e12)
    repeatable = {r["provider"]: r["bitwise_repeatable"] for r in rows}
    assert repeatable["eager_det"] and repeatable["eager_bhsd"]
    assert repeatable["eager_noisy"] is False
    assert [s["provider"] for s in skips.items] == ["broken", "broken"]
    out = capsys.readouterr().out
    assert out.count("skip broken") == 1 and "RuntimeError: kernel exploded" in out
    assert "second line" not in out
    report.write_csv(tmp_path / "bench.csv", rows, report.CSV_FIELDS)
    assert len(report.read_csv(tmp_path / "bench.csv")) == 6


def test_determinism_stage_on_cpu() -> None:
    rows = sweep.run_determinism(
        [Case(2, 32, 2, 2, 16, True)], fakes, meta=META, repeats=4, seed=0, device="cpu",
        deadline=runinfo.Deadline(None), skips=sweep.Skips([], set()),
    )  # fmt: skip
    by_name = {r["provider"]: r for r in rows}
    assert set(by_name) == {"eager_det", "eager_bhsd", "eager_noisy"}
    det = by_name["eager_det"]
    assert det["bitwise_repeatable"] and det["max_diff_dq"] == 0.0 and det["repeats"] == 4
    noisy = by_name["eager_noisy"]
    assert not noisy["bitwise_repeatable"] and noisy["max_diff_dv"] > 0
    assert "eager_noisy" in report.determinism_table(rows)


def test_deadline_stops_the_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    rows = sweep.run_sweep(
        [Case(2, 32, 2, 2, 16, True)], fakes, meta=META, mode="bwd", warmup=0.0, rep=1.0,
        repeats=0, seed=0, device="cpu", timer=wall_clock_ms, deadline=runinfo.Deadline(0.0),
        skips=sweep.Skips([], set()),
    )  # fmt: skip
    assert rows == [] and "deadline reached" in capsys.readouterr().out
