"""validate(): valid schedules pass; hand-broken ones fail with a message naming the cell."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from schedule_helpers import make_spec, reference_static_times, spec_id

from dash_attn.schedule import (
    Schedule,
    ScheduleSpec,
    ValidationReport,
    applicable_schedules,
    make_schedule,
    validate,
)
from dash_attn.schedule.generators import RANK_KV_ORDER, build_schedule

SHIFT_4 = make_spec(q_tiles=4, kv_tiles=4, workers=4)


def _with(schedule: Schedule, **arrays: object) -> Schedule:
    """A copy of ``schedule`` with some tables replaced (the dataclass re-freezes them)."""
    return dataclasses.replace(schedule, **arrays)


def _edit(schedule: Schedule, name: str, step: int, value: int) -> Schedule:
    array = getattr(schedule, name).copy()
    array[step] = value
    return _with(schedule, **{name: array})


def _step(schedule: Schedule, chain: int, q_tile: int, q_head: int | None = None) -> int:
    lo, hi = int(schedule.chain_start[chain]), int(schedule.chain_start[chain + 1])
    for step in range(lo, hi):
        if schedule.step_q_tile[step] == q_tile and q_head in (None, schedule.step_q_head[step]):
            return step
    raise LookupError((chain, q_tile))


def _rejects(schedule: Schedule, message: str) -> ValidationReport:
    """Raises with ``message`` first, and the non-raising report agrees."""
    with pytest.raises(ValueError, match="^invalid schedule: " + re.escape(message)):
        validate(schedule)
    report = validate(schedule, raise_on_error=False)
    assert not report.valid and report.errors[0].startswith(message)
    assert not report.depth_monotone
    return report


# ------------------------------------------------------------------ valid schedules


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(spec, id=spec_id(spec))
        for spec in [
            SHIFT_4,
            make_spec(q_tiles=4, kv_tiles=4, workers=4, causal=True, q_heads=2, kv_heads=2),
            make_spec(q_tiles=9, kv_tiles=5, workers=3, batch=2, q_heads=4, kv_heads=2),
            make_spec(
                q_tiles=8,
                kv_tiles=4,
                workers=5,
                causal=True,
                tile_ratio=2,
                q_heads=3,
                kv_heads=1,
                causal_offset=1,
            ),
        ]
    ],
)
def test_generated_schedules_are_valid(spec: ScheduleSpec) -> None:
    for name in applicable_schedules(spec):
        report = validate(make_schedule(name, spec))
        assert report == validate(make_schedule(name, spec), raise_on_error=False)
        assert report.valid and report.errors == []
        assert report.num_rank_edges > 0


def test_report_fields_on_paper_shape() -> None:
    report = validate(make_schedule("shift", SHIFT_4))
    assert report == ValidationReport(
        valid=True, errors=[], depth_monotone=True, non_monotone_edges=0, num_rank_edges=12
    )
    fa3 = validate(make_schedule("fa3", SHIFT_4))
    # FA3 adds dQ_i in KV order while every KV tile is at depth i: every edge is a conflict.
    assert fa3.valid and not fa3.depth_monotone and fa3.non_monotone_edges == 12


def test_static_non_monotone_schedule_is_valid() -> None:
    """Static dispatch with KV-order ranks waits (a staircase) but cannot deadlock."""
    spec = make_spec(q_tiles=6, kv_tiles=6, workers=3, q_heads=2, kv_heads=2)
    units = [[chain] for chain in range(spec.num_chains)]
    schedule = build_schedule(
        "ascending_static", spec, "static", lambda c: range(6), units, RANK_KV_ORDER
    )
    report = validate(schedule)
    assert report.valid and not report.depth_monotone
    assert reference_static_times(schedule, 1.0, 1.0)[0]


def test_not_a_schedule() -> None:
    with pytest.raises(TypeError, match="must be a Schedule"):
        validate("shift")  # type: ignore[arg-type]


# ------------------------------------------------------------------ coverage


def test_duplicated_pair() -> None:
    schedule = make_schedule("shift", SHIFT_4)
    broken = _edit(schedule, "step_q_tile", _step(schedule, 0, 1), 0)  # kv0 does q0 twice
    report = _rejects(broken, "pair (b=0, h=0, q=0, kv=0) appears 2 times (steps [0, 1])")
    assert "pair (b=0, h=0, q=1, kv=0) missing" in report.errors


def test_missing_pair() -> None:
    schedule = make_schedule("shift", SHIFT_4)
    drop = _step(schedule, 1, 2)  # kv1's visit of q2
    keep = np.arange(schedule.num_steps) != drop
    chain_start = schedule.chain_start.copy()
    chain_start[2:] -= 1
    broken = _with(
        schedule,
        chain_start=chain_start,
        step_q_head=schedule.step_q_head[keep],
        step_q_tile=schedule.step_q_tile[keep],
        step_rank=schedule.step_rank[keep],
    )
    _rejects(broken, "pair (b=0, h=0, q=2, kv=1) missing")


def test_pair_outside_causal_mask() -> None:
    spec = make_spec(q_tiles=4, kv_tiles=4, workers=2, causal=True)
    schedule = make_schedule("descending", spec)
    step = _step(schedule, 2, 2)  # kv2's diagonal tile, moved below the diagonal
    _rejects(
        _edit(schedule, "step_q_tile", step, 1),
        f"pair (b=0, h=0, q=1, kv=2) at step {step} is outside the causal mask "
        "(KV tile 2 of sequence 0 meets Q tiles 2..3)",
    )


def test_q_tile_out_of_range() -> None:
    schedule = make_schedule("fa3", SHIFT_4)
    _rejects(
        _edit(schedule, "step_q_tile", 5, 4),
        "step 5 (chain b=0, kv_head=0, kv=1): q_tile 4 out of range 0..3",
    )


def test_q_head_outside_gqa_group() -> None:
    spec = make_spec(q_tiles=2, kv_tiles=2, workers=2, q_heads=4, kv_heads=2)
    schedule = make_schedule("shift", spec)
    _rejects(
        _edit(schedule, "step_q_head", 0, 2),  # chain 0 belongs to KV head 0: q heads 0 and 1
        "step 0 (chain b=0, kv_head=0, kv=0): q_head 2 is not in KV head 0's group (q heads 0..1)",
    )


# ------------------------------------------------------------------ ranks


def test_rank_gap() -> None:
    schedule = make_schedule("shift", SHIFT_4)
    step = _step(schedule, 2, 3)  # rank 1 of dQ3 (order kv3, kv2, kv1, kv0)
    _rejects(
        _edit(schedule, "step_rank", step, 4),
        "dQ tile (b=0, h=0, q=3): ranks [0, 2, 3, 4] are not 0..3",
    )


def test_duplicate_rank() -> None:
    schedule = make_schedule(
        "fa3", make_spec(q_tiles=4, kv_tiles=4, workers=4, q_heads=2, kv_heads=2, batch=2)
    )
    chain = schedule.spec.chain_id(1, 1, 3)
    _rejects(
        _edit(schedule, "step_rank", _step(schedule, chain, 2), 1),
        "dQ tile (b=1, h=1, q=2): ranks [0, 1, 1, 2] are not 0..3",
    )


def test_negative_rank() -> None:
    schedule = make_schedule("fa3", SHIFT_4)
    _rejects(_edit(schedule, "step_rank", 0, -1), "dQ tile (b=0, h=0, q=0): ranks [-1, 1, 2, 3]")


# ------------------------------------------------------------------ dispatch tables


def test_order_lists_a_chain_twice() -> None:
    schedule = make_schedule("shift", SHIFT_4)
    report = _rejects(_with(schedule, order=[0, 1, 1, 3]), "order lists chain 1 2 times")
    assert "order misses chain 2" in report.errors


def test_order_entry_out_of_range() -> None:
    schedule = make_schedule("fa3", SHIFT_4)
    _rejects(_with(schedule, order=[0, 1, 2, 7]), "order[3] = 7 is not a chain index (0..3)")


def test_order_wrong_length() -> None:
    schedule = make_schedule("fa3", SHIFT_4)
    expected = "order has 3 entries, expected one per live chain (4"
    _rejects(_with(schedule, order=[0, 1, 2]), expected)


def test_static_worker_start_not_a_partition() -> None:
    schedule = make_schedule("shift", SHIFT_4)
    _rejects(
        _with(schedule, worker_start=[0, 1, 2, 4]),
        "worker_start has 4 entries, expected workers + 1 = 5",
    )
    _rejects(_with(schedule, worker_start=[0, 2, 1, 3, 4]), "worker_start decreases at worker 1")
    _rejects(
        _with(schedule, worker_start=[0, 1, 2, 3, 3]),
        "worker_start must run from 0 to len(order) = 4",
    )


def test_dynamic_worker_start() -> None:
    schedule = make_schedule("fa3", SHIFT_4)
    _rejects(
        _with(schedule, worker_start=[0, 1, 2, 3, 4]),
        "worker_start must be [0, 4] for dynamic dispatch",
    )


def test_chain_start_wrong_length() -> None:
    schedule = make_schedule("fa3", SHIFT_4)
    _rejects(
        _with(schedule, chain_start=schedule.chain_start[:-1]),
        "chain_start has 4 entries, expected num_chains + 1 = 5",
    )


# ------------------------------------------------------------------ deadlocks


def test_static_rank_cycle_deadlocks() -> None:
    """Swap the two ranks of each dQ tile of a 2 x 2 shift: each worker's first step now waits
    on the other worker's second step."""
    schedule = make_schedule("shift", make_spec(q_tiles=2, kv_tiles=2, workers=2))
    assert schedule.step_rank.tolist() == [0, 1, 0, 1]
    broken = _with(schedule, step_rank=1 - schedule.step_rank)
    report = _rejects(
        broken,
        "static dispatch deadlocks: 2 worker(s) (0, 1) can never finish; "
        "first: dQ tile (b=0, h=0, q=0): rank 1 (worker 0, depth 0) waits on rank 0 "
        "(worker 1, depth 1)",
    )
    assert reference_static_times(broken, 1.0, 1.0) == (False, None)
    assert report.num_rank_edges == 2 and report.non_monotone_edges == 2


def test_static_deadlock_on_one_worker() -> None:
    """One worker runs kv0 then kv1; dQ0 summed kv1 first: kv0's step waits on its own future."""
    schedule = make_schedule("shift", make_spec(q_tiles=2, kv_tiles=2, workers=1))
    chain0_q0 = _step(schedule, 0, 0)
    chain1_q0 = _step(schedule, 1, 0)
    ranks = schedule.step_rank.copy()
    ranks[chain0_q0], ranks[chain1_q0] = ranks[chain1_q0], ranks[chain0_q0]
    _rejects(_with(schedule, step_rank=ranks), "static dispatch deadlocks: dQ tile (b=0, h=0, q=0)")
    assert (
        "later on the same worker"
        in validate(_with(schedule, step_rank=ranks), raise_on_error=False).errors[0]
    )


def test_static_deadlock_through_long_cycle() -> None:
    """Ascending chains with KV-order ranks, dealt to workers in reverse: every worker starts on a
    chain whose rank predecessors are all at the start of the next worker's list."""
    spec = make_spec(q_tiles=4, kv_tiles=6, workers=3, q_heads=2, kv_heads=2)
    units = [[chain] for chain in reversed(range(spec.num_chains))]
    schedule = build_schedule("reversed", spec, "static", lambda c: range(4), units, RANK_KV_ORDER)
    assert reference_static_times(schedule, 1.0, 1.0) == (False, None)
    _rejects(schedule, "static dispatch deadlocks: 3 worker(s) (0, 1, 2) can never finish")


def test_dynamic_rank_predecessor_with_larger_ticket() -> None:
    """FA3's KV-order sums are only safe when tickets go out in KV order; reversed, kv3's first
    reduction waits on kv2, which a full device might never start."""
    schedule = make_schedule("fa3", SHIFT_4)
    broken = _with(schedule, order=schedule.order[::-1])
    _rejects(
        broken,
        "dQ tile (b=0, h=0, q=0): rank 1 (step 4, chain 1, ticket 2) waits on rank 0 (step 0, "
        "chain 0, ticket 3), which dynamic dispatch may not have started",
    )


def test_dynamic_symmetric_order_is_fine() -> None:
    """The same tables with a ticket order that still respects KV order stay valid."""
    spec = make_spec(q_tiles=3, kv_tiles=3, workers=2, q_heads=2, kv_heads=2)
    schedule = make_schedule("descending", spec)
    interleaved = [0, 3, 1, 4, 2, 5]  # heads interleaved, each head's KV tiles ascending
    assert validate(_with(schedule, order=interleaved)).valid


def test_error_message_counts_further_problems() -> None:
    schedule = make_schedule("fa3", SHIFT_4)
    broken = _with(schedule, step_rank=np.zeros(schedule.num_steps, dtype=np.int32))
    with pytest.raises(ValueError, match=r"and 3 more problems\)$"):
        validate(broken)
    assert len(validate(broken, raise_on_error=False).errors) == 4
