"""dK/dV sums in the kernel (``ScheduleSpec.dkv_sum_group``): the spec's checks, the validator's
and the simulator's new dependency (a chain's end waits for the previous rank's), and the
rank-major placement that keeps the ranks of a sum apart."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from schedule_helpers import make_spec

from dash_attn.schedule import (
    CAUSAL,
    FULL,
    Dispatch,
    Schedule,
    ScheduleSpec,
    applicable_schedules,
    dkv_predecessors,
    make_schedule,
    simulate,
    validate,
)

# A GQA split of 6 q heads over 2 kv heads: 6 chains per KV tile, two sums of 3.
SPLIT = dict(q_heads=6, kv_heads=6, dkv_sum_group=3)


def _split_spec(invariant: bool, causal: bool, batch: int = 2, workers: int = 20) -> ScheduleSpec:
    spec = ScheduleSpec.from_shape(
        batch=batch, seqlen_q=700, seqlen_k=900, q_heads=6, kv_heads=6, block_m=64,
        block_n=128, mask=CAUSAL if causal else FULL, workers=workers, invariant=invariant,
    )  # fmt: skip
    return dataclasses.replace(spec, dkv_sum_group=3)


def _last_step(schedule: Schedule, chain: int) -> int:
    return int(schedule.chain_start[chain + 1]) - 1


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(q_heads=6, kv_heads=2, dkv_sum_group=3), "needs one chain per q head"),
        (dict(q_heads=6, kv_heads=6, dkv_sum_group=4), "a multiple of it"),
        (dict(q_heads=6, kv_heads=6, dkv_sum_group=0), "dkv_sum_group must be >= 1"),
    ],
)
def test_spec_checks_the_sum_group(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_spec(q_tiles=2, kv_tiles=2, workers=2, **kwargs)


def test_predecessor_is_the_previous_ranks_last_step() -> None:
    spec = make_spec(q_tiles=3, kv_tiles=2, workers=4, **SPLIT)
    schedule = make_schedule("fa3", spec)
    pred = dkv_predecessors(schedule)
    for chain in range(spec.num_chains):
        _, head, tile = schedule.chain_coords(chain)
        last = _last_step(schedule, chain)
        if head % 3 == 0:
            assert pred[last] == -1
        else:
            assert pred[last] == _last_step(schedule, spec.chain_id(0, head - 1, tile))
    # Only last steps wait on a sum, one per chain of rank > 0.
    assert np.count_nonzero(pred >= 0) == spec.kv_tiles * 4
    plain = dataclasses.replace(spec, dkv_sum_group=1)
    assert not (dkv_predecessors(make_schedule("fa3", plain)) >= 0).any()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "worker-dependent"])
def test_every_schedule_stays_valid_with_sums(invariant: bool, causal: bool) -> None:
    spec = _split_spec(invariant, causal)
    for name in applicable_schedules(spec):
        schedule = make_schedule(name, spec)
        assert validate(schedule).valid, name
        # The sums move chains between workers and tickets, never a step's rank or Q tile.
        plain = make_schedule(name, dataclasses.replace(spec, dkv_sum_group=1))
        for field in ("chain_start", "step_q_head", "step_q_tile", "step_rank"):
            assert np.array_equal(getattr(schedule, field), getattr(plain, field)), (name, field)


def test_static_sum_in_reverse_on_one_worker_deadlocks() -> None:
    """One worker runs head 1's chain before head 0's: head 1's end waits for head 0's, which
    comes later on the same worker."""
    spec = make_spec(q_tiles=1, kv_tiles=1, workers=1, q_heads=2, kv_heads=2, dkv_sum_group=2)
    schedule = make_schedule("shift", spec)
    reversed_order = dataclasses.replace(schedule, order=schedule.order[::-1])
    report = validate(reversed_order, raise_on_error=False)
    assert not report.valid
    assert report.errors[0].startswith(
        "static dispatch deadlocks: dK/dV sum of (b=0, kv=0): the chain of head 1 (rank 1"
    )
    assert "later on the same worker" in report.errors[0]
    with pytest.raises(ValueError, match="dK/dV sum of"):
        validate(reversed_order)


def test_static_sum_cycle_across_workers_deadlocks() -> None:
    """Two workers, two KV tiles: worker 0 runs (h1, kv0) then (h0, kv1), worker 1 runs
    (h1, kv1) then (h0, kv0): each first chain waits for the other worker's second."""
    spec = make_spec(q_tiles=1, kv_tiles=2, workers=2, q_heads=2, kv_heads=2, dkv_sum_group=2)
    schedule = make_schedule("shift", spec)
    order = [spec.chain_id(0, 1, 0), spec.chain_id(0, 0, 1), spec.chain_id(0, 1, 1),
             spec.chain_id(0, 0, 0)]  # fmt: skip
    broken = dataclasses.replace(schedule, order=order, worker_start=[0, 2, 4])
    report = validate(broken, raise_on_error=False)
    assert not report.valid
    assert report.errors[0].startswith("static dispatch deadlocks: 2 worker(s) (0, 1)")


def test_dynamic_sum_needs_rank_order_in_tickets() -> None:
    spec = make_spec(q_tiles=2, kv_tiles=2, workers=2, q_heads=2, kv_heads=2, dkv_sum_group=2)
    schedule = make_schedule("fa3", spec)
    assert schedule.dispatch is Dispatch.DYNAMIC
    heads_reversed = [spec.chain_id(0, 1, 0), spec.chain_id(0, 1, 1), spec.chain_id(0, 0, 0),
                      spec.chain_id(0, 0, 1)]  # fmt: skip
    report = validate(dataclasses.replace(schedule, order=heads_reversed), raise_on_error=False)
    assert not report.valid
    assert report.errors[0].startswith("dK/dV sum of (b=0, kv=0): the chain of head 1 (rank 1")
    assert "which dynamic dispatch may not have started" in report.errors[0]


def test_simulated_sum_waits_for_the_previous_ranks_epilogue() -> None:
    """Two one-step chains of one sum on two workers: rank 1's reduction waits for the end of
    rank 0's (its r and its epilogue e), then takes its own r + e."""
    spec = make_spec(q_tiles=1, kv_tiles=1, workers=2, q_heads=2, kv_heads=2, dkv_sum_group=2)
    schedule = make_schedule("shift", spec)
    c, r, e = 1.0, 0.5, 2.0
    sim = simulate(schedule, c, r, cost_dkv_sum=e)
    assert sim.makespan == pytest.approx(c + 2 * (r + e))
    assert sim.critical_path == pytest.approx(sim.makespan)
    assert sim.lower_bound == pytest.approx(2 * (c + r + e) / 2)
    unordered = simulate(schedule, c, r, cost_dkv_sum=e, ordered=False)
    assert unordered.makespan == pytest.approx(c + r + e)
    # Without a sum the same tables cost no epilogue.
    plain = make_schedule("shift", dataclasses.replace(spec, dkv_sum_group=1))
    assert simulate(plain, c, r, cost_dkv_sum=e).makespan == pytest.approx(c + r)
    with pytest.raises(ValueError, match="cost_dkv_sum must be finite and >= 0"):
        simulate(schedule, c, r, cost_dkv_sum=-1.0)


def test_rank_major_placement_keeps_a_sums_ranks_apart() -> None:
    """Placement (invariant rounds) and tickets (dynamic) go rank-major: all rank-0 chains of
    every sequence and sum before any rank-1 chain, and so on."""
    # 2 sequences x 2 sums of rank 0, 4 pairs of KV tiles each (900 keys): 16 units, one
    # round on 16 workers.
    spec = _split_spec(True, True, workers=16)
    rank_of = lambda chain: (chain // spec.kv_tiles) % spec.kv_heads % 3  # noqa: E731
    for name in ("fa3", "descending"):
        ranks = [rank_of(c) for c in make_schedule(name, spec).order.tolist()]
        assert ranks == sorted(ranks), name
    schedule = make_schedule("symmetric_shift", spec)
    first_round = [schedule.worker_chains(w)[:2] for w in range(spec.workers)]
    assert {rank_of(c) for chains in first_round for c in chains} == {0}
    second_round = [schedule.worker_chains(w)[2:4] for w in range(spec.workers)]
    assert {rank_of(c) for chains in second_round for c in chains} == {1}
    keys = spec.dkv_placement(np.array([0, 1, 0, 0]), np.array([0, 0, 1, 3]))
    assert keys.tolist() == [0, 2, 4, 1]
