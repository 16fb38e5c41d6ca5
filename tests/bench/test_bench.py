"""CPU checks of the benchmark harness: FLOPs, files, tables, figures, the no-GPU path, the loop.

Nothing here needs a GPU: the measuring loop runs with test-double providers (eager attention on
the CPU) and a host-clock timer, so what is checked is the harness, not any kernel.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import pytest
import torch

from dash_attn.bench import model, plot, report, sweep
from dash_attn.bench.providers import (
    BHSD,
    Case,
    Provider,
    provider_names,
    select,
)
from dash_attn.bench.timing import attention_flops, tflops, wall_clock_ms
from dash_attn.schedule import CAUSAL

# ------------------------------------------------------------------------------------------------
# FLOPs


def test_forward_flops_is_four_bshd_products() -> None:
    assert attention_flops(2, 128, 256, 3, 64, False, "fwd") == 4 * 2 * 128 * 256 * 3 * 64


@pytest.mark.parametrize(
    "mode, factor", [("fwd", 1.0), ("bwd", 2.5), ("fwd_bwd", 3.5)], ids=["fwd", "bwd", "fwd_bwd"]
)
def test_mode_factors_and_causal_half(mode: str, factor: float) -> None:
    base = 4.0 * 4 * 4096 * 4096 * 16 * 128
    assert attention_flops(4, 4096, 4096, 16, 128, False, mode) == factor * base
    assert attention_flops(4, 4096, 4096, 16, 128, True, mode) == factor * base / 2


def test_paper_grid_backward_flops_do_not_depend_on_the_split() -> None:
    # 16k tokens, hidden 2048: b * s = 16384 and h * d = 2048, so bwd FLOPs grow only with s.
    values = [attention_flops(16384 // s, s, s, 2048 // 64, 64, False) for s in (512, 1024)]
    assert values[1] == 2 * values[0]


def test_tflops_units() -> None:
    assert tflops(2e12, 1000.0) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        tflops(1.0, 0.0)
    with pytest.raises(ValueError):
        attention_flops(1, 1, 1, 1, 1, False, "sideways")


# ------------------------------------------------------------------------------------------------
# Arguments


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    sweep.add_bench_arguments(parser)
    args = parser.parse_args(argv)
    sweep._apply_defaults(args)
    return args


def test_defaults_are_the_paper_grid() -> None:
    args = _parse([])
    cases = sweep.resolve_cases(args)
    assert len(cases) == 24 and sweep.is_default_grid(args)
    assert {(c.batch * c.seqlen, c.heads * c.headdim) for c in cases} == {(16384, 2048)}
    assert (args.mode, args.warmup, args.rep, args.dtype) == ("bwd", 25.0, 100.0, "bf16")
    assert args.determinism and args.model and not args.e2e
    # Grouped by (head dim, mask), seqlen growing: one compile per group; hdim 128 causal first.
    keys = [(-c.headdim, not c.causal, c.seqlen) for c in cases]
    assert keys == sorted(keys) and (cases[0].headdim, cases[0].causal) == (128, True)


def test_documented_options_parse(tmp_path: Path) -> None:
    args = _parse(
        [
            "--configs", "128:causal:16384,64:f:2048",
            "--providers", "dash,fa4_det,sdpa_*",
            "--mode", "fwd_bwd", "--out-dir", str(tmp_path), "--warmup", "5", "--rep", "20",
            "--no-determinism", "--e2e", "--no-model", "--deadline-s", "500",
            "--commit", "abc", "--repeat-check", "0",
        ]
    )  # fmt: skip
    assert args.configs == [(128, True, 16384), (64, False, 2048)]
    assert args.providers == ["dash", "fa4_det", "sdpa_*"]
    assert (args.mode, args.out_dir, args.warmup, args.rep) == ("fwd_bwd", tmp_path, 5.0, 20.0)
    assert not args.determinism and args.e2e and not args.model
    assert (args.deadline_s, args.commit, args.repeat_check) == (500.0, "abc", 0)
    cases = sweep.resolve_cases(args)
    assert [(c.headdim, c.causal, c.seqlen, c.batch, c.heads) for c in cases] == [
        (128, True, 16384, 1, 16),
        (64, False, 2048, 8, 32),
    ]
    assert not sweep.is_default_grid(args)


def test_grid_options_and_quick() -> None:
    args = _parse(["--headdims", "128", "--seqlens", "1024,4096", "--masks", "causal"])
    assert [(c.headdim, c.seqlen, c.causal) for c in sweep.resolve_cases(args)] == [
        (128, 1024, True),
        (128, 4096, True),
    ]
    quick = _parse(["--quick"])
    assert [c.seqlen for c in sweep.resolve_cases(quick)][:2] == list(sweep.QUICK_SEQLENS)
    assert (quick.warmup, quick.rep, quick.determinism_repeats) == (
        sweep.QUICK_WARMUP_MS,
        sweep.QUICK_REP_MS,
        3,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--providers", "fa5"],
        ["--configs", "128:diagonal:1024"],
        ["--configs", "x:full:1024"],
        ["--masks", "sliding"],
        ["--seqlens", "0"],
        ["--mode", "sideways"],
    ],
    ids=["provider", "mask", "headdim", "masks", "seqlen", "mode"],
)
def test_bad_options_exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(argv)
    assert "error" in capsys.readouterr().err


def test_provider_selection_by_family_name_and_pattern() -> None:
    def make(case: Case, device: object) -> None:
        return None

    names = provider_names()
    fakes = [Provider(n, n.split("_")[0], "nondet" not in n, make) for n in names]
    assert [p.name for p in select(fakes, ["fa4"])] == ["fa4_det", "fa4_nondet"]
    assert [p.name for p in select(fakes, ["flex", "dash_auto"])] == ["dash_auto", "flex"]
    assert {p.name for p in select(fakes, ["sdpa_flash*"])} == {"sdpa_flash_det", "sdpa_flash"}
    assert len(select(fakes, None)) == len(select(fakes, ["all"])) == len(names)


def test_gpu_slug() -> None:
    assert sweep.gpu_slug("NVIDIA H200") == "h200"
    assert sweep.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"


# ------------------------------------------------------------------------------------------------
# Synthetic results

SEQLENS = (512, 1024, 2048, 4096)
# A provider's synthetic TFLOPS is its factor times a seqlen curve, so every ratio is known.
FACTORS = {
    "dash_auto": 1.2,
    "dash_fa3": 1.0,
    "dash_descending": 1.1,
    "dash_shift": 1.2,
    "dash_symmetric_shift": 1.2,
    "dash_nondet": 1.25,
    "fa4_det": 0.96,
    "fa4_nondet": 1.28,
    "flex": 0.8,
    "sdpa_flash_det": 0.5,
}
META = {
    "gpu": "Test GPU",
    "sm_count": 132,
    "torch": "t",
    "triton": "tr",
    "commit": "c0ffee",
    "date": "2026-01-01",
}


def _synthetic_rows(mode: str = "bwd") -> list[dict]:
    rows = []
    for headdim in (64, 128):
        for causal in (False, True):
            for seqlen in SEQLENS:
                heads, batch = 2048 // headdim, 16384 // seqlen
                flops = attention_flops(batch, seqlen, seqlen, heads, headdim, causal, mode)
                curve = 100.0 + 20.0 * math.log2(seqlen / 256) + (10.0 if headdim == 128 else 0)
                for name, factor in FACTORS.items():
                    if name == ("dash_symmetric_shift" if not causal else "dash_shift"):
                        continue
                    value = factor * curve
                    auto = "symmetric_shift" if causal else "shift"
                    schedule = auto if name in ("dash_auto", "dash_nondet") else None
                    if name.startswith("dash_") and schedule is None:
                        schedule = name.removeprefix("dash_")
                    rows.append(
                        {
                            **META,
                            "mode": mode,
                            "dtype": "bf16",
                            "headdim": headdim,
                            "seqlen": seqlen,
                            "batch": batch,
                            "heads": heads,
                            "causal": causal,
                            "provider": name,
                            "deterministic": "nondet" not in name,
                            "schedule": schedule,
                            "ms": flops / (value * 1e12) * 1e3,
                            "tflops": value,
                            "bitwise_repeatable": "nondet" not in name,
                        }
                    )
    return rows


@pytest.fixture
def bench_csv(tmp_path: Path) -> Path:
    path = tmp_path / "bench.csv"
    report.write_csv(path, _synthetic_rows(), report.CSV_FIELDS)
    return path


def test_csv_round_trip_keeps_types(bench_csv: Path) -> None:
    rows = report.read_csv(bench_csv)
    original = _synthetic_rows()
    assert len(rows) == len(original)
    assert list(rows[0]) == list(report.CSV_FIELDS)
    for got, want in zip(rows, original, strict=True):
        for key in report.CSV_FIELDS:
            assert got[key] == want.get(key), key
    assert not bench_csv.with_name("bench.csv.tmp").exists()


def test_json_writer(tmp_path: Path) -> None:
    report.write_json(tmp_path / "bench.json", {"header": META, "rows": _synthetic_rows()[:2]})
    payload = json.loads((tmp_path / "bench.json").read_text())
    assert payload["header"]["gpu"] == "Test GPU" and len(payload["rows"]) == 2


def test_readme_command_names_the_subcommand_once(
    bench_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `python -m dash_attn bench ...` records argv with the subcommand first.
    report.write_json(
        bench_csv.with_name("bench.json"),
        {"header": META, "argv": ["bench", "--e2e", "--out-dir", "$OUT/h200", "--commit", "abc"]},
    )
    assert report.main(["--csv", str(bench_csv), "--readme-table"]) == 0
    assert "Command: `dash-attn bench --e2e --commit abc`" in capsys.readouterr().out


def test_readme_table_from_csv(bench_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report.write_json(
        bench_csv.with_name("bench.json"),
        {"header": META, "argv": ["--quick", "--out-dir", "/tmp/x", "--rep", "50"]},
    )
    assert report.main(["--csv", str(bench_csv), "--readme-table"]) == 0
    first = capsys.readouterr().out
    assert report.main(["--csv", str(bench_csv), "--readme-table"]) == 0
    assert capsys.readouterr().out == first  # deterministic
    lines = first.splitlines()
    assert lines[0].startswith("Machine: GPU Test GPU (132 SMs)")
    assert "Command: `dash-attn bench --quick --rep 50`" in first
    table = [line for line in lines if line.startswith(("| 64 |", "| 128 |"))]
    assert len(table) == 16  # 2 head dims x 2 masks x 4 seqlens
    header = next(line for line in lines if line.startswith("| hdim"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:3] == ["hdim", "mask", "seqlen"]  # one mode: no mode column
    assert columns[3:] == [n for n in provider_names() if n in FACTORS]
    # Bold marks the fastest deterministic provider (dash_auto/shift tie at 1.2x the curve).
    row = table[0].strip("|").split("|")
    cells = dict(zip(columns, (c.strip() for c in row), strict=True))
    assert cells["dash_auto"].startswith("**") and not cells["dash_nondet"].startswith("**")
    assert cells["seqlen"] == "512" and table[1].split("|")[3].strip() == "1k"
    # Geometric means: exact ratios of the synthetic factors.
    summary = [line for line in lines if line.startswith("| bwd full hdim 64")]
    values = {line.split("|")[2].strip(): line.split("|")[3].strip() for line in summary}
    assert values["dash auto / fa4_det"] == f"{1.2 / 0.96:.2f}x"
    assert values["dash auto / flex"] == f"{1.2 / 0.8:.2f}x"
    assert values["dash auto / dash fa3"] == "1.20x"
    assert values["dash auto / dash nondet"] == f"{1.2 / 1.25:.2f}x"
    assert values["fa4_det / fa4_nondet"] == f"{0.96 / 1.28:.2f}x"


def test_ratio_table_names_best_schedule(bench_csv: Path) -> None:
    text = report.ratio_table(report.read_csv(bench_csv))
    lines = text.splitlines()
    assert len(lines) == 2 + 16
    causal = next(line for line in lines if " causal " in line)
    assert "(symmetric_shift)" in causal and f"{1.2 / 0.96:.2f}x" in causal
    assert "1.20x" in causal  # auto / fa3


def test_missing_peer_gives_dash_instead_of_crash() -> None:
    rows = [r for r in _synthetic_rows() if r["provider"] not in ("flex", "fa4_det")]
    text = report.ratio_table(rows)
    assert "-" in text.splitlines()[2]
    assert "dash auto / flex" in report.summary_table(rows)


def test_plot_file(tmp_path: Path) -> None:
    written = plot.plot_modes(_synthetic_rows(), tmp_path, "synthetic")
    assert written == [tmp_path / "bench_bwd.png"]
    data = written[0].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert plot.plot_tflops([], tmp_path / "none.png") is None


def test_plot_command(bench_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plot.main(["--csv", str(bench_csv)]) == 0
    assert (bench_csv.parent / "bench_bwd.png").exists()


def test_determinism_and_e2e_tables() -> None:
    det = []
    for name, diff in (("dash_fa3", 0.0), ("dash_nondet", 3e-3)):
        det.append(
            {
                **META, "headdim": 128, "seqlen": 4096, "batch": 4, "heads": 16, "causal": True,
                "provider": name, "deterministic": diff == 0, "repeats": 10,
                "max_diff_dq": diff, "max_diff_dk": 0.0, "max_diff_dv": 0.0,
                "bitwise_repeatable": diff == 0,
            }
        )  # fmt: skip
    text = report.determinism_table(det)
    assert "causal d128 s4k" in text
    assert text.splitlines()[2].split() == ["dash_fa3", "0"]
    assert text.splitlines()[3].split() == ["dash_nondet", "3.0e-03"]
    e2e = [
        {"model": "llama3-8b", "seqlen": 8192, "batch": 1, "provider": p, "ms": ms}
        for p, ms in (("dash_auto", 10.0), ("dash_fa3", 12.0), ("fa4_det", 11.0))
    ]
    assert "1.20x" in report.e2e_table(e2e) and "1.10x" in report.e2e_table(e2e)


# ------------------------------------------------------------------------------------------------
# DAG model vs measurement


def test_model_vs_measured_columns_and_baseline(tmp_path: Path) -> None:
    rows = [r for r in _synthetic_rows() if r["seqlen"] == 512 and r["headdim"] == 128]
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
    spec = model.spec_for(128, 1024, 16, 16, False, 132)
    c, r = model.estimate_costs(spec, nondet_ms=1.0, fa3_ms=1.5)
    steps = spec.num_tasks() / 132
    assert c == pytest.approx(1.0 / steps) and r == pytest.approx(0.5 / steps)
    assert model.estimate_costs(spec, 1.0, 0.9)[1] == 0.0


# ------------------------------------------------------------------------------------------------
# Without a GPU


def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    real = sweep.machine_info

    def info(commit: str | None = None) -> dict:
        out = real(commit)
        out.update(gpu="none", sm_count=None, cuda_available=False)
        return out

    monkeypatch.setattr(sweep, "machine_info", info)


def test_no_gpu_runs_the_model_sweep_on_the_requested_configs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _no_gpu(monkeypatch)
    args = _parse(["--configs", "128:causal:1024,64:full:512", "--out-dir", str(tmp_path)])
    assert sweep.run(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("GPU none") and "torch" in out[0] and "commit" in out[0]
    assert "No CUDA GPU" in out[1]
    assert any("symmetric_shift" in line and "1024" in line for line in out)
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written


def test_no_gpu_default_grid_uses_the_cli_sweep(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dash_attn import cli

    _no_gpu(monkeypatch)
    calls = []

    def fake_sweep(ns: argparse.Namespace) -> int:
        calls.append(ns)
        print("cli sweep ran")
        return 0

    monkeypatch.setattr(cli, "run_sweep", fake_sweep)
    assert sweep.run(_parse([])) == 0
    assert len(calls) == 1 and calls[0].workers == cli.DEFAULT_WORKERS and not calls[0].json
    assert capsys.readouterr().out.splitlines()[-1] == "cli sweep ran"


def test_cli_bench_subcommand_without_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dash_attn import cli

    _no_gpu(monkeypatch)
    assert cli.main(["bench", "--configs", "64:full:1024", "--providers", "dash"]) == 0
    assert capsys.readouterr().out.startswith("GPU none")


# ------------------------------------------------------------------------------------------------
# The measuring loop on the CPU, with test doubles


class _Noisy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x * (1 + 1e-3 * torch.rand((), dtype=x.dtype))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * (1 + 1e-3 * torch.rand((), dtype=grad.dtype))


def _eager(layout: str, noisy: bool = False):
    def make(case: Case, device: object):
        def fn(q, k, v):
            if layout != BHSD:
                q, k, v = (x.transpose(1, 2) for x in (q, k, v))
            out = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=case.causal
            )
            if noisy:  # a non-deterministic "kernel": output and gradients vary by call
                out = _Noisy.apply(out)
            out = out.to(q.dtype)
            return out if layout == BHSD else out.transpose(1, 2)

        return fn

    return make


def _broken(case: Case, device: object) -> None:
    raise RuntimeError("kernel exploded\nsecond line")


def _fakes(case: Case) -> list[Provider]:
    return [
        Provider("eager_det", "test", True, _eager("bshd")),
        Provider("eager_bhsd", "test", True, _eager(BHSD), layout=BHSD),
        Provider("eager_noisy", "test", False, _eager("bshd", noisy=True)),
        Provider("broken", "test", True, _broken),
    ]


@pytest.mark.parametrize("mode", ["bwd", "fwd", "fwd_bwd"])
def test_sweep_loop_on_cpu(mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = [Case(2, 32, 2, 2, 16, True), Case(1, 64, 2, 2, 16, False)]
    skips = sweep.Skips([], set())
    saved = []
    rows = sweep.run_sweep(
        cases, _fakes, meta=META, mode=mode, warmup=0.0, rep=1.0, repeats=3, seed=0,
        device="cpu", timer=wall_clock_ms, deadline=sweep.Deadline(None), skips=skips,
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
        [Case(2, 32, 2, 2, 16, True)], _fakes, meta=META, repeats=4, seed=0, device="cpu",
        deadline=sweep.Deadline(None), skips=sweep.Skips([], set()),
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
        [Case(2, 32, 2, 2, 16, True)], _fakes, meta=META, mode="bwd", warmup=0.0, rep=1.0,
        repeats=0, seed=0, device="cpu", timer=wall_clock_ms, deadline=sweep.Deadline(0.0),
        skips=sweep.Skips([], set()),
    )  # fmt: skip
    assert rows == [] and "deadline reached" in capsys.readouterr().out


def test_log_copies_stdout(tmp_path: Path) -> None:
    with sweep.LogTo(tmp_path / "bench.log"):
        print("hello log")
    assert (tmp_path / "bench.log").read_text() == "hello log\n"


def test_e2e_block_on_cpu() -> None:
    from dash_attn.bench import e2e

    cfg = e2e.BlockConfig("tiny", 64, 4, 2, 16, 96, True, "swiglu", 10000.0)
    block = e2e.make_block(cfg, "cpu", seed=0)
    again = e2e.make_block(cfg, "cpu", seed=0)
    pairs = zip(block.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)

    def attn(q, k, v):  # GQA by repeating kv heads, (b, s, h, d)
        rep = q.shape[2] // k.shape[2]
        k, v = (x.repeat_interleave(rep, dim=2) for x in (k, v))
        out = torch.nn.functional.scaled_dot_product_attention(
            *(x.transpose(1, 2).float() for x in (q, k, v)), is_causal=True
        )
        return out.transpose(1, 2).to(q.dtype)

    block.attn = attn
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    y = block(x)
    y.float().sum().backward()
    assert y.shape == x.shape and x.grad is not None and block.wqkv.grad is not None
    assert [s[1] for s in e2e.quick_shapes()] == [8192, 8192, 4096]
    vit = e2e.MODELS["vit-h-like"]
    assert vit.heads * vit.headdim == vit.hidden and "80" in vit.note


def _dash_named_fakes(case: Case, workers: int) -> list[Provider]:
    """Eager attention under dash's provider names, so that every stage finds what it needs."""
    names = ["dash_auto", "dash_fa3", "dash_descending", "dash_shift", "dash_nondet"]
    fakes = [
        Provider(n, "dash", n != "dash_nondet", _eager("bshd"), schedule=n.removeprefix("dash_"))
        for n in names
    ]
    return [*fakes, Provider("flex", "flex", True, _eager(BHSD), layout=BHSD)]


def test_whole_run_on_cpu_writes_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parse(
        [
            "--configs", "64:full:128,64:full:256", "--tokens", "256", "--hidden", "128",
            "--warmup", "0", "--rep", "1", "--determinism-seqlen", "128",
            "--determinism-repeats", "3", "--out-dir", str(tmp_path),
        ]
    )  # fmt: skip
    info = {**META, "python": "3", "sm_count": 4}
    status = sweep._run_gpu(
        args, sweep.resolve_cases(args), info, tmp_path, sweep.Deadline(None),
        device="cpu", timer=wall_clock_ms, provider_factory=_dash_named_fakes,
    )  # fmt: skip
    assert status == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        "bench.csv", "bench.json", "determinism.csv", "model_vs_measured.csv", "bench_bwd.png",
    }  # fmt: skip
    rows = report.read_csv(tmp_path / "bench.csv")
    assert len(rows) == 2 * 6 and {r["commit"] for r in rows} == {"c0ffee"}
    assert json.loads((tmp_path / "bench.json").read_text())["header"]["gpu"] == "Test GPU"
    assert len(report.read_csv(tmp_path / "determinism.csv")) == 6
    model_rows = report.read_csv(tmp_path / "model_vs_measured.csv")
    assert {r["schedule"] for r in model_rows} == {"fa3", "descending", "shift"}
    out = capsys.readouterr().out
    assert "TFLOPS and ratios" in out and "Determinism:" in out and "DAG model" in out


def test_e2e_loop_on_cpu() -> None:
    from dash_attn.bench import e2e

    tiny = {"tiny": e2e.BlockConfig("tiny", 64, 4, 2, 16, 96, True, "swiglu", 10000.0)}

    def gqa_eager(case: Case, device: object):
        def fn(q, k, v):
            rep = q.shape[2] // k.shape[2]
            k, v = (x.repeat_interleave(rep, dim=2) for x in (k, v))
            return _eager("bshd")(case, device)(q, k, v)

        return fn

    def providers(case: Case, workers: int) -> list[Provider]:
        return [
            Provider("dash_auto", "test", True, gqa_eager),
            Provider("dash_fa3", "test", True, gqa_eager),
            Provider("fa4_det", "test", True, _broken),
        ]

    rows = e2e.run_e2e(
        meta=META, patterns=None, quick=False, seed=0, device="cpu", workers=4,
        shapes=[("tiny", 16, 2)], timer=wall_clock_ms, warmup=0.0, rep=1.0, models=tiny,
        make_providers=providers,
    )  # fmt: skip
    assert [r["provider"] for r in rows] == ["dash_auto", "dash_fa3"]
    assert rows[1]["speedup_vs_dash_fa3"] == 1.0 and rows[0]["tokens"] == 32
    assert "tiny" in report.e2e_table(rows)


def test_resume_measures_only_missing_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--tokens", "256", "--hidden", "128", "--headdims", "64", "--masks", "full",
        "--warmup", "0", "--rep", "1", "--no-determinism", "--no-model", "--no-plot",
        "--out-dir", str(tmp_path),
    ]  # fmt: skip
    info = {**META, "python": "3", "sm_count": 4}

    def go(extra: list[str]) -> list[dict]:
        args = _parse([*argv, *extra])
        assert sweep._run_gpu(
            args, sweep.resolve_cases(args), info, tmp_path, sweep.Deadline(None),
            device="cpu", timer=wall_clock_ms, provider_factory=_dash_named_fakes,
        ) == 0  # fmt: skip
        return report.read_csv(tmp_path / "bench.csv")

    first = go(["--seqlens", "128"])
    both = go(["--seqlens", "128,256", "--resume"])
    assert both[: len(first)] == first
    assert sorted({r["seqlen"] for r in both}) == [128, 256]
    assert "1 of 2 configs left" in capsys.readouterr().out


def test_real_peer_providers_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """SDPA flash runs on the CPU too: the deterministic-mode context, the (b, h, s, d) layout,
    a backend that is missing (cuDNN) and a peer that is not installed (FA4) go through the
    same code as on the GPU."""
    from dash_attn.bench.providers import peer_providers

    chosen = select(peer_providers(), ["sdpa_*", "fa4_det"])
    skips = sweep.Skips([], set())
    rows = sweep.run_sweep(
        [Case(2, 64, 2, 2, 64, True)], lambda case: chosen, meta=META, mode="bwd",
        warmup=0.0, rep=1.0, repeats=3, seed=0, device="cpu", timer=wall_clock_ms,
        deadline=sweep.Deadline(None), skips=skips,
    )  # fmt: skip
    assert [r["provider"] for r in rows] == ["sdpa_flash_det", "sdpa_flash"]
    assert all(r["bitwise_repeatable"] for r in rows)
    assert not torch.are_deterministic_algorithms_enabled()  # the context was undone
    assert {s["provider"] for s in skips.items} <= {"fa4_det", "sdpa_cudnn"}
    assert "fa4_det" in {s["provider"] for s in skips.items} or _fa4_installed()


def _fa4_installed() -> bool:
    from dash_attn.bench.providers import fa4_status

    return fa4_status() is None


def test_readme_results_are_generated_from_the_committed_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README's result tables are exactly what the report makes of benchmarks/results/."""
    repo = Path(__file__).resolve().parents[1]
    results, readme = repo / "benchmarks" / "results" / "h200", repo / "README.md"
    if not (results.is_dir() and readme.is_file()):
        pytest.skip("not a source checkout")
    args = ["--csv", str(results / "bench.csv"), "--readme-table"]
    args += ["--determinism", str(results / "determinism.csv"), "--e2e", str(results / "e2e.csv")]
    assert report.main(args) == 0
    generated = capsys.readouterr().out.strip()
    assert generated.splitlines()[0].startswith("Machine: GPU NVIDIA H200")
    assert generated in readme.read_text()


def test_launched_kernel_names_tiles_and_data_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each dash row of bench.csv records which kernel configuration produced it, so a number
    measured before and after a default changes stays attributable."""
    from dash_attn.runtime import LaunchInfo

    import dash_attn
    from dash_attn.backends.triton.tiles import BackwardTiles
    from dash_attn.bench import timing
    from dash_attn.schedule import ScheduleSpec

    spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=2, kv_tiles=2, mask=CAUSAL,
                        workers=2)  # fmt: skip
    info = LaunchInfo("symmetric_shift", "static", spec, BackwardTiles(64, 128, 8, 2), 2, True,
                      dq_reduce="tma", qo_load="pointer")  # fmt: skip
    monkeypatch.setattr(dash_attn, "last_launch_info", lambda: info)
    dash = Provider("dash_auto", "dash", True, lambda case, device: None, schedule="auto")
    assert timing.launched_kernel(dash, "bwd") == "64x128w8s2 dq:tma qo:pointer"
    assert timing.launched_kernel(dash, "fwd") is None  # the forward has one configuration
    flex = Provider("flex", "flex", True, lambda case, device: None)
    assert timing.launched_kernel(flex, "bwd") is None
    assert "kernel" in report.CSV_FIELDS


def test_gpu_warm_up_is_skipped_without_cuda() -> None:
    from dash_attn.bench import timing

    started = time.perf_counter()
    assert timing.warm_up_gpu("cpu", 5.0) == 0.0
    assert timing.warm_up_gpu(None, 5.0) == 0.0
    assert time.perf_counter() - started < 1.0
