"""tools/hopper/interleaved.py: the interleaved timing rounds of the A/B probes (no GPU: a
stand-in timer)."""

from __future__ import annotations

import itertools

import pytest

from tools.hopper import interleaved


def test_round_orders_visit_every_permutation() -> None:
    keys = ["A", "B", "F"]
    orders = interleaved.round_orders(keys, 6)
    assert sorted(orders) == sorted(itertools.permutations(keys))
    # Consecutive rounds start with different contenders often enough to spread the first slot.
    assert {order[0] for order in orders} == set(keys)
    assert interleaved.round_orders(["A", "B"], 4) == [("A", "B"), ("B", "A")] * 2


def test_run_rounds_times_each_contender_once_per_round() -> None:
    calls: list[str] = []

    def timer(fn):
        calls.append(fn())
        return {"A": 2.0, "B": 1.0}[calls[-1]]

    times = interleaved.run_rounds({"A": lambda: "A", "B": lambda: "B"}, 5, timer=timer)
    assert times == {"A": [2.0] * 5, "B": [1.0] * 5}
    assert calls == ["A", "B", "B", "A", "A", "B", "B", "A", "A", "B"]
    assert interleaved.ratios(times, "A", "B") == [2.0] * 5
    line = interleaved.ratio_line(times, "A", "B")
    assert line == "   A/B (>1: B faster) 2.0000 [2.0000, 2.0000]"
    assert interleaved.medians_line(times) == "A 2.000 ms  B 1.000 ms"


def test_per_round_ratios_cancel_slow_drift() -> None:
    """A clock that slows 0.05% per call (4% over the run): the per-round ratios stay within
    the drift of one call of the true 1.02."""
    clock = itertools.count()
    base = {"A": 1.02, "B": 1.0}

    def timer(fn):
        return base[fn()] * (1 + 0.0005 * next(clock))

    times = interleaved.run_rounds({"A": lambda: "A", "B": lambda: "B"}, 40, timer=timer)
    ratios = interleaved.ratios(times, "A", "B")
    median = sorted(ratios)[len(ratios) // 2]
    assert abs(median - 1.02) < 0.001


def test_quantile_by_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert interleaved.quantile(values, 0.0) == 1.0
    assert interleaved.quantile(values, 0.5) == 3.0
    assert interleaved.quantile(values, 1.0) == 5.0


def test_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        interleaved.run_rounds({"A": lambda: None}, 0, timer=lambda fn: 0.0)


def test_repeat_runs_the_call_that_many_times() -> None:
    calls = []
    interleaved.repeat(lambda: calls.append(1), 5)()
    assert len(calls) == 5
    with pytest.raises(ValueError, match="calls must be >= 1"):
        interleaved.repeat(lambda: None, 0)
