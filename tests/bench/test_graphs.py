"""The CUDA-graph benchmark on the CPU: configs, the run with test doubles (a provider that cannot
run and one whose capture fails become rows with their reason), the README table's ratios."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from dash_attn.bench import graphs
from dash_attn.bench.providers import Case, Provider, ProviderUnavailable
from dash_attn.cli import main as cli_main
from dash_attn.testing import grad_step


def _attention(case: Case, device: Any):
    def fn(q, k, v):
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()).softmax(-1)
        return torch.einsum("bhqk,bkhd->bqhd", scores, v.float()).to(q.dtype)

    return fn


def _unavailable(case: Case, device: Any):
    raise ProviderUnavailable("not installed here")


def _providers(case: Case) -> list[Provider]:
    return [
        Provider("dash_hopper_auto", "dash", True, _attention, schedule="auto"),
        Provider("fa4_det", "fa4", True, _attention),
        Provider("fa4_nondet", "fa4", False, _unavailable),
        Provider("dash_hopper_nondet", "dash", False, _attention, schedule="auto"),
    ]


def _capture(fn, leaves, dout):
    if not leaves[0].requires_grad or leaves[0].grad is not None:
        raise AssertionError("the graph's leaves must be fresh")
    if leaves[0].shape[-1] == 128:
        raise RuntimeError("capture failed for this head dim")
    return grad_step(fn, leaves, dout), ()


class CountingTimer:
    """Calls the step once and returns 1 ms per call so far (a distinct value per timing)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn, warmup: float, rep: float) -> float:
        fn()
        self.calls += 1
        return float(self.calls)


def test_cases_are_the_sweeps_shapes() -> None:
    cases = graphs.graph_cases([512, 4096], [64, 128], ["causal"])
    assert [(c.headdim, c.seqlen, c.batch, c.heads) for c in cases] == [
        (64, 512, 32, 32), (64, 4096, 4, 32), (128, 512, 32, 16), (128, 4096, 4, 16),
    ]  # fmt: skip
    assert all(c.causal and c.kv_heads == c.heads for c in cases)
    for bad in (([0], [64], ["full"]), ([512], [48], ["full"]), ([512], [64], ["sliding"])):
        with pytest.raises(ValueError, match="--"):
            graphs.graph_cases(*bad)


def test_run_writes_every_row_with_times_or_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graphs, "DEFAULT_TOKENS", 64)  # tiny batches: batch = 64 / seqlen
    monkeypatch.setattr(graphs, "DEFAULT_HIDDEN", 256)
    parser = graphs.argparse.ArgumentParser()
    graphs.add_arguments(parser)
    args = parser.parse_args(
        ["--out-dir", str(tmp_path), "--seqlens", "16,32", "--headdims", "64,128",
         "--masks", "full", "--rounds", "2", "--commit", "abc1234"]
    )  # fmt: skip
    timer = CountingTimer()
    status = graphs.run(args, device="cpu", timer=timer, capture=_capture, providers_for=_providers)
    assert status == 0
    saved = json.loads((tmp_path / "graphs.json").read_text())
    assert saved["commit"] == "abc1234" and saved["settings"]["rounds"] == 2
    rows = saved["rows"]
    assert len(rows) == 2 * 2 * 4  # configs x providers
    for r in rows:
        if r["provider"] == "fa4_nondet":
            assert r["status"] == "skipped: not installed here" and "eager_ms" not in r
        elif r["headdim"] == 128:  # every capture fails there: eager timed, no graph
            assert r["status"] == "capture failed: RuntimeError: capture failed for this head dim"
            assert len(r["eager_rounds"]) == 2 and "graph_ms" not in r
        else:
            assert r["status"] == "ok"
            assert len(r["eager_rounds"]) == len(r["graph_rounds"]) == 2
            assert r["eager_ms"] == statistics.median(r["eager_rounds"])
            assert r["graph_tflops"] > 0
    # Timer calls: 3 providers x 2 configs x 2 rounds, with both modes at d64, eager at d128.
    assert timer.calls == 3 * 2 * 2 * (2 + 1)
    table = graphs.graphs_table(rows)
    assert table.count("\n") == 2 + 4 - 1
    assert all(line.endswith("| n/a | n/a | n/a |") for line in table.splitlines()[-2:])
    assert "n/a" not in "".join(table.splitlines()[2:4])


def test_table_ratios_are_fa4_time_over_ours() -> None:
    def row(provider: str, eager: float, graph: float | None) -> dict[str, Any]:
        r = {"headdim": 128, "causal": True, "seqlen": 512, "provider": provider}
        r["eager_ms"] = eager
        if graph is not None:
            r["graph_ms"] = graph
        return r

    rows = [row("dash_hopper_auto", 0.5, 0.4), row("fa4_det", 0.6, None), row("x", 9.0, 9.0)]
    line = graphs.graphs_table(rows).splitlines()[-1]
    assert line == "| 128 | causal | 512 | 0.500 | 0.600 | 1.20x | 0.400 | n/a | n/a |"


def test_cli_runs_the_graphs_benchmark(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def fake_run(args) -> int:
        seen["args"] = args
        return 0

    monkeypatch.setattr(graphs, "run", fake_run)
    assert cli_main(["bench-graphs", "--out-dir", str(tmp_path), "--seqlens", "512"]) == 0
    assert seen["args"].seqlens == [512] and seen["args"].rounds == graphs.DEFAULT_ROUNDS
    assert seen["args"].command_line == f"dash-attn bench-graphs --out-dir {tmp_path} --seqlens 512"
