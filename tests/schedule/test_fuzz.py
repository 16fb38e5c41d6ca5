"""Property tests: random specs through every generator, random rank orders against oracles.

Shapes stay small (tens to a few thousand steps) so that thousands of schedules run in seconds;
the oracles are plain-Python re-derivations from the definitions in ``types.py``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from schedule_helpers import (
    dq_rank_lists,
    mask_pairs,
    reference_static_times,
    schedule_pairs,
)

from dash_attn.schedule import (
    Dispatch,
    Mask,
    Schedule,
    ScheduleSpec,
    applicable_schedules,
    make_schedule,
    schedule_from_json,
    schedule_to_json,
    simulate,
    validate,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def specs(draw: st.DrawFn) -> ScheduleSpec:
    """Any valid spec: GQA/MQA, batch, waves (N > P) and idle workers (N < P), odd N, tile_ratio
    up to 3, causal offsets of both signs."""
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.integers(1, 3))
    tile_ratio = draw(st.integers(1, 3))
    kv_tiles = draw(st.integers(1, 8))
    causal = draw(st.booleans())
    offset = 0
    if causal:
        offset = draw(st.integers(-3, 4))
        # The last KV tile must meet a Q tile: (N - 1) s - offset <= M - 1.
        least = max(1, (kv_tiles - 1) * tile_ratio - offset + 1)
        q_tiles = draw(st.integers(least, least + 5))
    else:
        q_tiles = draw(st.integers(1, 12))
    return ScheduleSpec(
        batch=draw(st.integers(1, 2)),
        q_heads=kv_heads * group,
        kv_heads=kv_heads,
        q_tiles=q_tiles,
        kv_tiles=kv_tiles,
        mask=Mask(causal=causal),
        tile_ratio=tile_ratio,
        workers=draw(st.integers(1, 12)),
        causal_offset=offset,
        invariant=False,  # the worker-dependent rules; invariance has its own fuzz
    )


costs = st.sampled_from([(1.0, 1.0), (2.0, 1.0), (1.0, 0.5), (3.0, 2.0), (1.0, 0.0)])


@settings(FUZZ, max_examples=1000)
@given(spec=specs(), cost=costs)
def test_every_generator_on_random_specs(spec: ScheduleSpec, cost: tuple[float, float]) -> None:
    c, r = cost
    for name in applicable_schedules(spec):
        schedule = make_schedule(name, spec)
        report = validate(schedule)
        assert report.valid
        assert schedule.num_steps == spec.num_tasks()
        pairs = schedule_pairs(schedule)
        assert len(pairs) == len(set(pairs)) and set(pairs) == mask_pairs(spec)
        for ranks in dq_rank_lists(schedule).values():
            assert ranks == list(range(len(ranks)))
        if name == "shift" and spec.kv_tiles <= spec.q_tiles:
            assert report.depth_monotone  # concurrent chains start on distinct Q tiles

        sim = simulate(schedule, c, r)
        assert sim.lower_bound <= sim.makespan + 1e-9
        assert 0.0 <= sim.bubble_fraction < 1.0
        assert abs(sim.critical_path - sim.makespan) <= 1e-9 * max(1.0, sim.makespan)
        if schedule.dispatch is Dispatch.STATIC:
            acyclic, makespan = reference_static_times(schedule, c, r)
            assert acyclic and abs(makespan - sim.makespan) <= 1e-9 * max(1.0, makespan)
            if report.depth_monotone:  # Lemma 1: no reduction ever waits
                longest = np.bincount(sim.worker, minlength=spec.workers).max()
                assert sim.makespan == longest * (c + r)

        back = schedule_from_json(schedule_to_json(schedule))
        assert back.spec == spec and np.array_equal(back.step_rank, schedule.step_rank)


def _shuffled_ranks(schedule: Schedule, rng: np.random.Generator) -> np.ndarray:
    """A random valid summation order: every dQ tile's ranks permuted independently."""
    dq = schedule.step_dq_tile()
    key = rng.permutation(schedule.num_steps)
    by = np.lexsort((key, dq))
    sorted_dq = dq[by]
    starts = np.flatnonzero(np.r_[True, sorted_dq[1:] != sorted_dq[:-1]])
    sizes = np.diff(np.r_[starts, len(by)])
    ranks = np.empty(schedule.num_steps, dtype=np.int64)
    ranks[by] = np.arange(len(by)) - np.repeat(starts, sizes)
    return ranks


def _dynamic_oracle(schedule: Schedule) -> bool:
    """Rank predecessors all in earlier tickets, in plain Python."""
    ticket = {chain: t for t, chain in enumerate(schedule.order.tolist())}
    holder: dict[tuple[int, int, int, int], int] = {}
    for chain in range(schedule.num_chains):
        b, _, _ = schedule.chain_coords(chain)
        for h, q, rank in schedule.chain_steps(chain):
            holder[(b, h, q, rank)] = chain
    for (b, h, q, rank), chain in holder.items():
        if rank and ticket[holder[(b, h, q, rank - 1)]] > ticket[chain]:
            return False
    return True


@FUZZ
@given(spec=specs(), seed=st.integers(0, 2**32 - 1), dynamic=st.booleans())
def test_random_orders_against_oracles(spec: ScheduleSpec, seed: int, dynamic: bool) -> None:
    """Random ranks and random dispatch tables: validate's verdict (fast path, worker run, ticket
    rule) must match a naive Kahn pass or the ticket rule in Python, and simulate must match the
    naive longest path whenever the schedule is valid."""
    rng = np.random.default_rng(seed)
    schedule = make_schedule("fa3", spec)
    ranks = _shuffled_ranks(schedule, rng)
    order = rng.permutation(spec.num_chains)
    if dynamic:
        worker_start = np.array([0, spec.num_chains])
        dispatch = Dispatch.DYNAMIC
    else:
        cuts = np.sort(rng.integers(0, spec.num_chains + 1, size=spec.workers - 1))
        worker_start = np.r_[0, cuts, spec.num_chains]
        dispatch = Dispatch.STATIC
    candidate = dataclasses.replace(
        schedule, dispatch=dispatch, step_rank=ranks, order=order, worker_start=worker_start
    )
    report = validate(candidate, raise_on_error=False)
    event(
        f"{dispatch.value}: {'valid' if report.valid else 'rejected'}"
        f"{', depth-monotone' if report.depth_monotone else ''}"
    )
    if dynamic:
        assert report.valid == _dynamic_oracle(candidate)
    else:
        acyclic, makespan = reference_static_times(candidate, 1.0, 0.5)
        assert report.valid == acyclic, report.errors
        if acyclic:
            assert simulate(candidate, 1.0, 0.5).makespan == makespan
        else:
            assert report.errors[0].startswith("static dispatch deadlocks")
    if report.valid and report.depth_monotone and not dynamic:
        lengths = np.diff(schedule.chain_start)[order]
        per_worker = [
            int(lengths[worker_start[w] : worker_start[w + 1]].sum()) for w in range(spec.workers)
        ]
        assert simulate(candidate).makespan == 2.0 * max(per_worker)


@FUZZ
@given(
    spec=specs(),
    name_index=st.integers(0, 2),
    field=st.sampled_from(["step_q_tile", "step_q_head", "step_rank"]),
    data=st.data(),
)
def test_any_single_corruption_is_rejected(
    spec: ScheduleSpec, name_index: int, field: str, data: st.DataObject
) -> None:
    """Moving one step to another Q tile or head, or giving it another rank, always breaks
    coverage or a rank permutation, and validate must say so."""
    schedule = make_schedule(applicable_schedules(spec)[name_index], spec)
    step = data.draw(st.integers(0, schedule.num_steps - 1), label="step")
    array = getattr(schedule, field).copy()
    bound = {"step_q_tile": spec.q_tiles, "step_q_head": spec.q_heads}.get(field, 2 * spec.kv_tiles)
    # Any other value in -1..bound: shift the old one by 1..span-1 around that range.
    span = bound + 2
    shift = data.draw(st.integers(1, span - 1), label="shift")
    array[step] = (int(array[step]) + 1 + shift) % span - 1
    broken = dataclasses.replace(schedule, **{field: array})
    report = validate(broken, raise_on_error=False)
    assert not report.valid and report.errors


def test_fuzz_shapes_cover_the_interesting_cases() -> None:
    """The strategy reaches waves, idle workers, GQA, odd N, s > 1 and both offset signs."""
    seen: dict[str, bool] = defaultdict(bool)

    @settings(max_examples=300, deadline=None, database=None)
    @given(spec=specs())
    def collect(spec: ScheduleSpec) -> None:
        seen["waves"] |= spec.kv_tiles > spec.workers
        seen["idle"] |= spec.kv_tiles * spec.kv_heads * spec.batch < spec.workers
        seen["gqa"] |= spec.q_heads > spec.kv_heads
        seen["odd"] |= spec.kv_tiles % 2 == 1 and spec.kv_tiles > 1
        seen["ratio"] |= spec.tile_ratio > 1
        seen["offset+"] |= spec.mask.causal and spec.causal_offset > 0
        seen["offset-"] |= spec.mask.causal and spec.causal_offset < 0

    collect()
    assert all(seen[key] for key in ("waves", "idle", "gqa", "odd", "ratio", "offset+", "offset-"))
