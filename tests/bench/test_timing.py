"""FLOPs, timers and the launch record of ``dash_attn.bench.timing``."""

from __future__ import annotations

import time

import pytest

from dash_attn.bench import report, timing
from dash_attn.bench.providers import Provider
from dash_attn.bench.timing import attention_flops, tflops
from dash_attn.schedule import CAUSAL


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


def test_launched_kernel_names_tiles_and_data_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each dash row of bench.csv records which kernel configuration produced it, so a number
    measured before and after a default changes stays attributable."""
    import dash_attn
    from dash_attn.bench import timing
    from dash_attn.plan import H200, Problem, make_backward_plan

    problem = Problem(batch=1, seqlen_q=256, seqlen_k=256, heads=2, kv_heads=2, headdim=128,
                      mask=CAUSAL)  # fmt: skip
    plan = make_backward_plan(problem, device=H200, backend="triton", schedule="descending")
    monkeypatch.setattr(dash_attn, "last_launch_info", lambda: plan)
    dash = Provider("dash_auto", "dash", True, lambda case, device: None, schedule="auto")
    assert timing.launched_kernel(dash, "bwd") == f"triton {plan.tiles.label} dq:tma"
    assert plan.tiles.label.startswith("64x128")
    assert timing.launched_schedule(dash, "bwd") == "descending"  # the plan's, not "auto"
    assert timing.launched_kernel(dash, "fwd") is None  # the forward has one configuration
    flex = Provider("flex", "flex", True, lambda case, device: None)
    assert timing.launched_kernel(flex, "bwd") is None
    assert timing.launched_schedule(flex, "bwd") is None
    assert "kernel" in report.CSV_FIELDS


def test_gpu_warm_up_is_skipped_without_cuda() -> None:
    from dash_attn.bench import timing

    started = time.perf_counter()
    assert timing.warm_up_gpu("cpu", 5.0) == 0.0
    assert timing.warm_up_gpu(None, 5.0) == 0.0
    assert time.perf_counter() - started < 1.0


class _FakeDoBench:
    """``triton.testing.do_bench`` with ``return_mode="all"``: ``rep / call_ms`` calls (at least
    one), each taking ``call_ms``; records the rep of every pass."""

    def __init__(self, call_ms: float) -> None:
        self.call_ms = call_ms
        self.reps: list[float] = []

    def __call__(self, fn, warmup, rep, grad_to_none=None, quantiles=None, return_mode="mean"):
        assert return_mode == "all"
        self.reps.append(rep)
        return [self.call_ms] * max(1, int(rep / self.call_ms))


@pytest.mark.parametrize(
    ("call_ms", "rep", "passes", "calls"),
    [
        (10.0, 25.0, 2, 5),  # two calls in the first pass, three more in a second
        (30.0, 25.0, 2, 5),  # one call, then four
        (1.0, 25.0, 1, 25),  # enough calls: no second pass
    ],
)
def test_do_bench_tops_up_to_min_calls(
    monkeypatch: pytest.MonkeyPatch, call_ms: float, rep: float, passes: int, calls: int
) -> None:
    triton_testing = pytest.importorskip("triton.testing")
    fake = _FakeDoBench(call_ms)
    monkeypatch.setattr(triton_testing, "do_bench", fake)
    assert timing.do_bench_ms(lambda: None, 1.0, rep) == call_ms
    assert len(fake.reps) == passes
    assert sum(max(1, int(r / call_ms)) for r in fake.reps) == calls
    assert calls >= timing.MIN_TIMED_CALLS


def test_do_bench_median_over_both_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    triton_testing = pytest.importorskip("triton.testing")
    passes = iter([[10.0, 30.0], [11.0, 12.0, 50.0]])
    monkeypatch.setattr(triton_testing, "do_bench", lambda *a, **k: next(passes))
    assert timing.do_bench_ms(lambda: None, 1.0, 25.0) == 12.0


def test_wall_clock_runs_min_calls() -> None:
    calls = []
    timing.wall_clock_ms(lambda: calls.append(1), 0.0, 0.0, min_calls=4)
    assert len(calls) == 1 + 4  # one warm-up call, then the timed ones


def test_idle_gpu_is_a_no_op_without_cuda() -> None:
    start = time.perf_counter()
    timing.idle_gpu("cpu", 5.0)
    assert time.perf_counter() - start < 1.0
