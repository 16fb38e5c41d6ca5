"""The analyses behind ``dash-attn schedule`` (``dash_attn.schedule.report``): pure Python."""

from __future__ import annotations

import json

import pytest
from schedule_helpers import make_spec

from dash_attn.backends.triton.tiles import SUPPORTED_HEADDIMS, backward_tiles
from dash_attn.plan import H200, Problem, analysis_device, make_backward_plan
from dash_attn.schedule import CAUSAL, FULL, applicable_schedules, make_schedule, simulate
from dash_attn.schedule import report as rep


def test_paper_grid_is_defined_once() -> None:
    assert rep.DEFAULT_WORKERS == H200.sm_count == 132
    assert (rep.PAPER_TOKENS, rep.PAPER_HIDDEN) == (16384, 2048)
    assert rep.PAPER_HEADDIMS == (64, 128)
    assert rep.PAPER_SEQLENS == (512, 1024, 2048, 4096, 8192, 16384)
    grid = rep.paper_grid()
    assert len(grid) == 24 and len(set(grid)) == 24
    assert rep.paper_batch_heads(64, 512) == (32, 32)
    assert rep.paper_batch_heads(128, 16384) == (1, 16)
    assert rep.paper_batch_heads(64, 32768) == (1, 32)  # at least one sequence
    with pytest.raises(ValueError, match="multiple of head dim"):
        rep.paper_batch_heads(96, 512, hidden=1000)


def test_kernel_tile_ratios_come_from_the_tile_table() -> None:
    ratios = {backward_tiles(d).block_n // backward_tiles(d).block_m for d in SUPPORTED_HEADDIMS}
    assert rep.KERNEL_TILE_RATIOS == tuple(sorted(ratios)) == (1, 2)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_analysis_spec_is_the_plans_spec(causal: bool) -> None:
    """The CLI and the bench model tile a shape exactly as the backward plan does."""
    problem = Problem(2, 1000, 1500, 8, 2, 128, CAUSAL if causal else FULL)
    spec, shape = rep.analysis_spec(problem, 16)
    plan = make_backward_plan(problem, device=analysis_device(16), backend="triton")
    assert spec == plan.spec
    assert (shape.block_m, shape.block_n) == (plan.tiles.block_m, plan.tiles.block_n)
    assert (shape.seqlen_q, shape.seqlen_k, shape.headdim) == (1000, 1500, 128)
    assert (
        rep.square_spec(128, 1024, 2, 8, causal, 16)
        == rep.analysis_spec(Problem(2, 1024, 1024, 8, 8, 128, CAUSAL if causal else FULL), 16)[0]
    )


def test_sweep_specs_cover_the_grid() -> None:
    specs = rep.sweep_specs(132)
    assert len(specs) == 24
    for spec, shape in specs:
        assert spec.batch * shape.seqlen_q == rep.PAPER_TOKENS
        assert spec.q_heads * shape.headdim == rep.PAPER_HIDDEN
        assert spec.workers == 132 and spec.kv_heads == spec.q_heads


def test_model_speedups() -> None:
    assert rep.model_speedups({"fa3": 12.0, "shift": 8.0, "descending": 12.0}) == {
        "fa3": 1.0,
        "shift": 1.5,
        "descending": 1.0,
    }
    assert rep.model_speedups({"fa3": 3.0, "x": 0.0})["x"] == float("inf")
    with pytest.raises(KeyError):
        rep.model_speedups({"shift": 1.0})


def test_analyse_matches_the_engine() -> None:
    spec = make_spec(q_tiles=4, kv_tiles=4, workers=4, causal=True)
    a = rep.analyse("symmetric_shift", spec, cost_c=2.0, cost_r=0.5)
    sim = simulate(make_schedule("symmetric_shift", spec), 2.0, 0.5)
    assert a.name == "symmetric_shift" and a.report.valid
    assert a.sim.makespan == sim.makespan
    assert rep.analyse("auto", spec).name == "descending"  # the model's fastest here


def test_record_names_the_mask_both_ways() -> None:
    for causal in (False, True):
        spec = make_spec(q_tiles=4, kv_tiles=4, workers=4, causal=causal)
        fields = rep.record(rep.analyse("fa3", spec), 1.0, 1.0)
        assert fields["mask"] == ("causal" if causal else "full")
        assert fields["causal"] is causal
        assert fields["q_tiles"] == 4 and fields["schedule"] == "fa3"
        json.dumps(fields)  # only JSON types


def test_spec_report_text_and_json() -> None:
    spec = make_spec(q_tiles=8, kv_tiles=8, q_heads=2, kv_heads=2, workers=8)
    result = rep.report_spec(spec, None, "auto", compare=True)
    assert [a.name for a in result.analyses] == applicable_schedules(spec)
    assert result.chosen.name == result.auto_name == "shift"
    data = rep.spec_json(result, compare=True, ascii_grid=True)
    speedups = {e["schedule"]: e["speedup_vs_fa3"] for e in data["compare"]}
    assert speedups["fa3"] == 1.0 and speedups["shift"] == pytest.approx(39 / 32)
    assert set(data["ascii"]) == set(speedups) and data["requested_schedule"] == "auto"
    text = rep.spec_text(result, compare=True, ascii_grid=False)
    assert "shift (auto)" in text and "1.219x" in text
    single = rep.spec_text(rep.report_spec(spec, None, "fa3", compare=False), compare=False,
                           ascii_grid=False)  # fmt: skip
    assert single.splitlines()[0].startswith("schedule    fa3, dynamic dispatch")
    with pytest.raises(ValueError, match="does not apply to the full mask"):
        rep.report_spec(spec, None, "symmetric_shift", compare=False)


def test_describe() -> None:
    problem = Problem(2, 1000, 1500, 8, 2, 64, CAUSAL)
    spec, shape = rep.analysis_spec(problem, 16)
    text = rep.describe(spec, shape)
    assert text.startswith(
        "seqlen 1000/1500, hdim 64, batch 2, 8 heads (2 kv, a chain per q head), causal;"
    )
    assert rep.describe(make_spec(q_tiles=4, kv_tiles=2, tile_ratio=2, workers=3), None) == (
        "4 Q x 2 KV tiles, tile ratio 2, batch 1, 1 head, full; 3 workers"
    )


def test_sweep_json_and_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rep, "PAPER_SEQLENS", (512,))
    monkeypatch.setattr(rep, "PAPER_HEADDIMS", (128,))
    sweep = rep.run_sweep(workers=32)
    data = rep.sweep_json(sweep)
    assert data["workers"] == 32 and len(data["configs"]) == 2
    for config in data["configs"]:
        assert config["mask"] == ("causal" if config["causal"] else "full")
        assert config["schedules"]["fa3"]["speedup_vs_fa3"] == 1.0
    text = rep.sweep_text(sweep)
    assert "on 32 workers" in text and "2 configurations in" in text
