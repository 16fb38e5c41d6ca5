"""tools/hopper/writer_model.py: the DAG model with a decoupled dQ writer (NOTES item 129)."""

from __future__ import annotations

import pytest

from dash_attn.schedule import CAUSAL, FULL, ScheduleSpec, make_schedule, simulate
from tools.hopper.writer_model import writer_makespan


def _spec(mask, tiles: int = 8, heads: int = 6, workers: int = 10) -> ScheduleSpec:
    return ScheduleSpec(
        batch=1, q_heads=heads, kv_heads=heads, q_tiles=tiles, kv_tiles=tiles, mask=mask,
        workers=workers,
    )  # fmt: skip


@pytest.mark.parametrize(
    "mask,name",
    [(FULL, "fa3"), (FULL, "descending"), (FULL, "shift"), (CAUSAL, "fa3"),
     (CAUSAL, "descending"), (CAUSAL, "symmetric_shift")],
)  # fmt: skip
@pytest.mark.parametrize("c,r", [(1.0, 1.0), (3.0, 0.5), (1.0, 0.0)])
def test_coupled_mode_is_the_papers_model(mask, name: str, c: float, r: float) -> None:
    """``coupled`` (the next compute after the last reduction) is ``simulate``'s run, for
    dynamic and static schedules."""
    schedule = make_schedule(name, _spec(mask))
    expected = simulate(schedule, cost_compute=c, cost_reduce=r).makespan
    assert writer_makespan(schedule, c, r, "coupled") == pytest.approx(expected)


def test_one_chain_per_worker_runs_ahead_of_the_writer() -> None:
    """A single chain of n steps, no rank waits: coupled n (c + r); with a writer and one
    buffer the computes overlap the reductions, n c + r when c >= r (the same in every mode:
    nothing waits for a ticket)."""
    spec = ScheduleSpec(
        batch=1, q_heads=1, kv_heads=1, q_tiles=5, kv_tiles=1, mask=FULL, workers=1
    )  # fmt: skip
    schedule = make_schedule("fa3", spec)
    assert writer_makespan(schedule, 2.0, 1.0, "coupled") == pytest.approx(15.0)
    for mode in ("early", "drain"):
        assert writer_makespan(schedule, 2.0, 1.0, mode) == pytest.approx(11.0)


def test_early_tickets_stall_the_causal_fa3_wavefront() -> None:
    """A causal fa3 head in KV order is a wavefront of rank waits. Taking the next ticket while
    the last partial still waits (``early``, the shipped hopper kernel) makes the next head's
    chains wait behind it; ``drain`` does not, and is never slower than ``coupled`` here."""
    # 16 x 16 tiles per head, 64 heads on 132 workers: the sweep's d64 causal 2k in miniature
    # (makespans 573, 1884 and 453 for c = 3, r = 1).
    schedule = make_schedule("fa3", _spec(CAUSAL, tiles=16, heads=64, workers=132))
    coupled, early, drain = (
        writer_makespan(schedule, 3.0, 1.0, mode) for mode in ("coupled", "early", "drain")
    )
    assert early > 3 * coupled
    assert drain < coupled


@pytest.mark.parametrize("mask,name", [(FULL, "shift"), (CAUSAL, "symmetric_shift")])
def test_uneven_steps_and_a_slow_read_make_a_second_buffer_pay(mask, name: str) -> None:
    """With equal steps a second staging buffer changes nothing on the static orders (session
    28's reading); with steps that vary (seeded) and a bulk copy that reads its buffer for most
    of the reduction, a late partial holds the only buffer and a second one is faster. A static
    run is monotone in its inputs, so more buffers are never slower."""
    schedule = make_schedule(name, _spec(mask, tiles=12, heads=24, workers=20))
    even = [writer_makespan(schedule, 2.5, 2.0, "early", b, read=1.6) for b in (1, 2)]
    assert even[0] == pytest.approx(even[1])
    one, two = (
        writer_makespan(schedule, 2.5, 2.0, "early", b, jitter=0.2, seed=3, read=1.6)
        for b in (1, 2)
    )
    assert two < one
    assert writer_makespan(schedule, 2.5, 2.0, "early", 1, jitter=0.2, seed=3, read=1.6) == one
    assert writer_makespan(schedule, 2.5, 2.0, "early", 1, jitter=0.2, seed=4, read=1.6) != one


def test_two_writers_lift_the_writers_bound() -> None:
    """A reduction longer than a step bounds one writer at r per step; two writers taking
    turns overlap the reductions (one chain alone: n c + r once 2 c >= r). With r <= c a second
    writer changes nothing. Buffers as in the kernel: one per writer."""
    spec = ScheduleSpec(
        batch=1, q_heads=1, kv_heads=1, q_tiles=6, kv_tiles=1, mask=FULL, workers=1
    )  # fmt: skip
    schedule = make_schedule("fa3", spec)
    assert writer_makespan(schedule, 1.0, 1.5, "early", 2) == pytest.approx(1.0 + 6 * 1.5)
    assert writer_makespan(schedule, 1.0, 1.5, "early", 2, writers=2) == pytest.approx(7.5)
    assert writer_makespan(schedule, 2.0, 1.0, "early", 2, writers=2) == pytest.approx(
        writer_makespan(schedule, 2.0, 1.0, "early", 2)
    )
    # On the shift order of many heads too (rank waits across workers).
    shift = make_schedule("shift", _spec(FULL, tiles=12, heads=24, workers=20))
    one, two = (writer_makespan(shift, 1.0, 1.6, "early", 2, writers=w) for w in (1, 2))
    assert two < 0.9 * one


def test_bad_arguments() -> None:
    schedule = make_schedule("fa3", _spec(FULL))
    with pytest.raises(ValueError, match="mode"):
        writer_makespan(schedule, 1.0, 1.0, "late")
    with pytest.raises(ValueError, match="buffers"):
        writer_makespan(schedule, 1.0, 1.0, "early", buffers=0)
    with pytest.raises(ValueError, match="jitter"):
        writer_makespan(schedule, 1.0, 1.0, "early", jitter=0.5)
    with pytest.raises(ValueError, match="read"):
        writer_makespan(schedule, 1.0, 1.0, "early", read=2.0)
    with pytest.raises(ValueError, match="writers"):
        writer_makespan(schedule, 1.0, 1.0, "coupled", writers=2)
    with pytest.raises(ValueError, match="writers"):
        writer_makespan(schedule, 1.0, 1.0, "early", writers=0)
