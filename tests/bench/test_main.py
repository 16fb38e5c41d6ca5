"""The `dash-attn bench` command (`dash_attn.bench.main`): options, no-GPU path, whole CPU runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dash_attn.bench import configs, main, report, runinfo
from dash_attn.bench.timing import wall_clock_ms

from .helpers import META, dash_named_fakes, no_gpu, parse_bench_args


def test_documented_options_parse(tmp_path: Path) -> None:
    args = parse_bench_args(
        [
            "--configs", "128:causal:16384,64:f:2048",
            "--providers", "dash,fa4_det,sdpa_*",
            "--mode", "fwd_bwd", "--out-dir", str(tmp_path), "--warmup", "5", "--rep", "20",
            "--no-determinism", "--e2e", "--no-model", "--deadline-s", "500",
            "--commit", "abc", "--repeat-check", "0", "--rounds", "5", "--idle-ms", "100",
            "--settle-ms", "1000",
        ]
    )  # fmt: skip
    assert args.configs == [(128, True, 16384), (64, False, 2048)]
    assert args.providers == ["dash", "fa4_det", "sdpa_*"]
    assert (args.mode, args.out_dir, args.warmup, args.rep) == ("fwd_bwd", tmp_path, 5.0, 20.0)
    assert not args.determinism and args.e2e and not args.model
    assert (args.deadline_s, args.commit, args.repeat_check) == (500.0, "abc", 0)
    assert args.rounds == 5 and parse_bench_args([]).rounds == main.DEFAULT_ROUNDS
    assert args.idle_ms == 100.0 and parse_bench_args([]).idle_ms == main.DEFAULT_IDLE_MS
    assert args.settle_ms == 1000.0 and parse_bench_args([]).settle_ms == main.DEFAULT_SETTLE_MS
    cases = configs.resolve_cases(args)
    assert [(c.headdim, c.causal, c.seqlen, c.batch, c.heads) for c in cases] == [
        (128, True, 16384, 1, 16),
        (64, False, 2048, 8, 32),
    ]
    assert not configs.is_default_grid(args)


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
        parse_bench_args(argv)
    assert "error" in capsys.readouterr().err


def test_zero_rounds_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(parse_bench_args(["--rounds", "0"])) == 2
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err


def test_negative_idle_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(parse_bench_args(["--idle-ms", "-1"])) == 2
    assert "--idle-ms must be >= 0, got -1" in capsys.readouterr().err


def test_negative_settle_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.run(parse_bench_args(["--settle-ms", "-5"])) == 2
    assert "--settle-ms must be >= 0, got -5" in capsys.readouterr().err


def test_no_gpu_runs_the_model_sweep_on_the_requested_configs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    no_gpu(monkeypatch)
    args = parse_bench_args(
        ["--configs", "128:causal:1024,64:full:512", "--out-dir", str(tmp_path)]
    )
    assert main.run(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("GPU none") and "torch" in out[0] and "commit" in out[0]
    assert "No CUDA GPU" in out[1]
    assert any("symmetric_shift" in line and "1024" in line for line in out)
    assert not any(tmp_path.iterdir())  # nothing measured, nothing written


def test_no_gpu_default_grid_uses_the_schedule_sweep(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dash_attn.schedule import report as schedule_report

    no_gpu(monkeypatch)
    calls = []

    def fake_sweep(workers: int) -> str:
        calls.append(workers)
        return "the sweep"

    monkeypatch.setattr(schedule_report, "run_sweep", fake_sweep)
    monkeypatch.setattr(schedule_report, "sweep_text", lambda sweep: f"{sweep} ran")
    assert main.run(parse_bench_args([])) == 0
    assert calls == [132]  # the H200 of the paper
    assert capsys.readouterr().out.splitlines()[-1] == "the sweep ran"


def test_cli_bench_subcommand_without_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dash_attn import cli

    no_gpu(monkeypatch)
    assert cli.main(["bench", "--configs", "64:full:1024", "--providers", "dash"]) == 0
    assert capsys.readouterr().out.startswith("GPU none")


def test_whole_run_on_cpu_writes_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse_bench_args(
        [
            "--configs", "64:full:128,64:full:256", "--tokens", "256", "--hidden", "128",
            "--warmup", "0", "--rep", "1", "--determinism-seqlen", "128",
            "--determinism-repeats", "3", "--out-dir", str(tmp_path),
        ]
    )  # fmt: skip
    info = {**META, "python": "3", "sm_count": 4}
    status = main._run_gpu(
        args, configs.resolve_cases(args), info, tmp_path, runinfo.Deadline(None),
        device="cpu", timer=wall_clock_ms, provider_factory=dash_named_fakes,
    )  # fmt: skip
    assert status == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        "bench.csv", "bench.json", "determinism.csv", "model_vs_measured.csv", "bench_bwd.png",
    }  # fmt: skip
    rows = report.read_csv(tmp_path / "bench.csv")
    assert len(rows) == 2 * 6 and {r["commit"] for r in rows} == {"c0ffee"}
    assert all(len(r["ms_rounds"].split()) == main.DEFAULT_ROUNDS for r in rows)
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["header"]["gpu"] == "Test GPU"
    assert written["settings"]["rounds"] == main.DEFAULT_ROUNDS
    assert len(report.read_csv(tmp_path / "determinism.csv")) == 6
    model_rows = report.read_csv(tmp_path / "model_vs_measured.csv")
    assert {r["schedule"] for r in model_rows} == {"fa3", "descending", "shift"}
    out = capsys.readouterr().out
    assert "TFLOPS and ratios" in out and "Determinism:" in out and "DAG model" in out


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
        args = parse_bench_args([*argv, *extra])
        assert main._run_gpu(
            args, configs.resolve_cases(args), info, tmp_path, runinfo.Deadline(None),
            device="cpu", timer=wall_clock_ms, provider_factory=dash_named_fakes,
        ) == 0  # fmt: skip
        return report.read_csv(tmp_path / "bench.csv")

    first = go(["--seqlens", "128"])
    both = go(["--seqlens", "128,256", "--resume"])
    assert both[: len(first)] == first
    assert sorted({r["seqlen"] for r in both}) == [128, 256]
    assert "1 of 2 configs left" in capsys.readouterr().out
