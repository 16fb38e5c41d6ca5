"""simulate(): the paper's closed forms, model invariants, and a naive reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from schedule_helpers import reference_static_times, spec_id

from dash_attn.schedule import (
    CAUSAL,
    FULL,
    Dispatch,
    Mask,
    Schedule,
    ScheduleSpec,
    SimResult,
    applicable_schedules,
    make_schedule,
    rank_predecessors,
    simulate,
    validate,
)
from dash_attn.schedule.generators import RANK_KV_ORDER, build_schedule

COSTS = [(1.0, 1.0), (2.0, 1.0), (1.0, 0.5), (3.0, 2.0)]


def _paper_spec(n: int, m: int, causal: bool) -> ScheduleSpec:
    """The model's shape: N KV tiles = N Q tiles = N workers, m heads, batch 1, s = 1."""
    return ScheduleSpec(
        invariant=False,
        batch=1,
        q_heads=m,
        kv_heads=m,
        q_tiles=n,
        kv_tiles=n,
        mask=Mask(causal=causal),
        workers=n,
    )


_CLOSED = [
    pytest.param(n, m, c, r, id=f"n{n}-m{m}-c{c:g}-r{r:g}")
    for n in (4, 8, 16)
    for m in (2, 4)
    for c, r in COSTS
]


@pytest.mark.parametrize(("n", "m", "c", "r"), _CLOSED)
def test_closed_forms_full(n: int, m: int, c: float, r: float) -> None:
    spec = _paper_spec(n, m, causal=False)
    # FA3: worker j's first reduction waits j r behind worker j - 1 and the lag never closes.
    assert simulate(make_schedule("fa3", spec), c, r).makespan == m * n * (c + r) + (n - 1) * r
    assert simulate(make_schedule("shift", spec), c, r).makespan == m * n * (c + r)


@pytest.mark.parametrize(("n", "m", "c", "r"), _CLOSED)
def test_closed_forms_causal(n: int, m: int, c: float, r: float) -> None:
    spec = _paper_spec(n, m, causal=True)
    packed = m * (n + 1) * (c + r) / 2
    descending = simulate(make_schedule("descending", spec), c, r).makespan
    assert descending == packed + (n - 1) * r
    assert simulate(make_schedule("symmetric_shift", spec), c, r).makespan == packed
    assert simulate(make_schedule("fa3", spec), c, r).makespan >= descending


@pytest.mark.parametrize(
    ("name", "makespan"), [("symmetric_shift", 10), ("fa3", 19), ("descending", 13)]
)
def test_paper_worked_example_c(name: str, makespan: float) -> None:
    """Paper 3.6 (c): causal, n = 4, 2 heads, c = r = 1."""
    assert simulate(make_schedule(name, _paper_spec(4, 2, causal=True))).makespan == makespan


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(spec, id=spec_id(spec))
        for n in (4, 8, 16)
        for m in (1, 2, 4)
        for spec in (_paper_spec(n, m, False), _paper_spec(n, m, True))
    ],
)
def test_depth_monotone_on_paper_shapes(spec: ScheduleSpec) -> None:
    name = "symmetric_shift" if spec.mask.causal else "shift"
    report = validate(make_schedule(name, spec))
    assert report.depth_monotone and report.non_monotone_edges == 0
    if not spec.mask.causal:
        fa3 = validate(make_schedule("fa3", spec))
        assert not fa3.depth_monotone
        assert fa3.non_monotone_edges == fa3.num_rank_edges  # every KV-order edge conflicts


_MIXED = [
    ScheduleSpec(
        invariant=False, batch=2, q_heads=4, kv_heads=2, q_tiles=7, kv_tiles=5, mask=FULL, workers=3
    ),
    ScheduleSpec(
        invariant=False,
        batch=1,
        q_heads=3,
        kv_heads=1,
        q_tiles=8,
        kv_tiles=4,
        mask=CAUSAL,
        tile_ratio=2,
        workers=5,
    ),
    ScheduleSpec(
        invariant=False,
        batch=2,
        q_heads=2,
        kv_heads=2,
        q_tiles=6,
        kv_tiles=6,
        mask=CAUSAL,
        workers=4,
        causal_offset=1,
    ),
    ScheduleSpec(
        invariant=False,
        batch=1,
        q_heads=2,
        kv_heads=2,
        q_tiles=5,
        kv_tiles=5,
        mask=CAUSAL,
        workers=8,
    ),
]
_MIXED_CASES = [
    pytest.param(name, spec, c, r, id=f"{name}-{spec_id(spec)}-c{c:g}-r{r:g}")
    for spec in _MIXED
    for name in applicable_schedules(spec)
    for c, r in [(1.0, 1.0), (2.0, 0.5), (1.0, 0.0)]
]


def _check_invariants(schedule: Schedule, sim: SimResult, c: float, r: float) -> None:
    spec = schedule.spec
    assert sim.lower_bound == pytest.approx(schedule.num_steps * (c + r) / spec.workers)
    assert sim.lower_bound <= sim.makespan + 1e-9
    assert 0.0 <= sim.bubble_fraction < 1.0
    assert sim.critical_path == pytest.approx(sim.makespan)
    assert np.allclose(sim.compute_end - sim.compute_start, c)
    assert np.allclose(sim.reduce_end - sim.reduce_start, r)
    assert np.all(sim.reduce_start >= sim.compute_end)
    assert np.all((sim.worker >= 0) & (sim.worker < spec.workers))
    # The summation order holds: rank k + 1 starts after rank k ended.
    pred = rank_predecessors(schedule)
    has = pred >= 0
    assert np.all(sim.reduce_start[has] >= sim.reduce_end[pred[has]])
    # Each worker is serial and runs whole chains back to back.
    for w in range(spec.workers):
        mine = np.flatnonzero(sim.worker == w)
        mine = mine[np.argsort(sim.compute_start[mine], kind="stable")]
        assert np.all(sim.compute_start[mine[1:]] == sim.reduce_end[mine[:-1]])
        if schedule.dispatch is Dispatch.STATIC:
            expected = [
                s
                for chain in schedule.worker_chains(w)
                for s in range(schedule.chain_start[chain], schedule.chain_start[chain + 1])
            ]
            assert mine.tolist() == expected
    # The critical path is a chain of worker or rank links from time 0 to the makespan.
    path = sim.critical_steps.tolist()
    assert sim.compute_start[path[0]] == 0.0
    assert sim.reduce_end[path[-1]] == sim.makespan
    for a, b in zip(path, path[1:], strict=False):
        by_worker = sim.worker[a] == sim.worker[b] and sim.compute_start[b] == sim.reduce_end[a]
        by_rank = pred[b] == a and sim.reduce_start[b] == sim.reduce_end[a]
        assert by_worker or by_rank


@pytest.mark.parametrize(("name", "spec", "c", "r"), _MIXED_CASES)
def test_simulation_invariants(name: str, spec: ScheduleSpec, c: float, r: float) -> None:
    schedule = make_schedule(name, spec)
    sim = simulate(schedule, c, r)
    _check_invariants(schedule, sim, c, r)
    if schedule.dispatch is Dispatch.STATIC:
        acyclic, makespan = reference_static_times(schedule, c, r)
        assert acyclic and makespan == pytest.approx(sim.makespan)
        if validate(schedule).depth_monotone:
            longest = max(np.bincount(sim.worker, minlength=spec.workers))
            assert sim.makespan == pytest.approx(longest * (c + r))


def test_static_staircase_matches_reference() -> None:
    """A static schedule that waits a lot (KV-order ranks) against the naive Kahn reference."""
    spec = ScheduleSpec(
        invariant=False, batch=1, q_heads=2, kv_heads=2, q_tiles=6, kv_tiles=6, mask=FULL, workers=4
    )
    units = [[chain] for chain in range(spec.num_chains)]
    schedule = build_schedule(
        "ascending_static", spec, "static", lambda c: range(6), units, RANK_KV_ORDER
    )
    for c, r in COSTS:
        sim = simulate(schedule, c, r)
        _check_invariants(schedule, sim, c, r)
        assert sim.makespan == reference_static_times(schedule, c, r)[1]
        assert sim.wait_time > 0


def test_dynamic_dispatch_fills_the_earliest_free_worker() -> None:
    """Descending causal, 1 head, 2 workers, c = r = 1: kv0 (4 steps) and kv1 (3 steps) start
    together; kv2 goes to worker 1, freed first, and kv3 to worker 0."""
    spec = ScheduleSpec(
        invariant=False,
        batch=1,
        q_heads=1,
        kv_heads=1,
        q_tiles=4,
        kv_tiles=4,
        mask=CAUSAL,
        workers=2,
    )
    schedule = make_schedule("descending", spec)
    sim = simulate(schedule)
    chain_of_step = schedule.step_chain()
    worker_of_chain = {int(ch): int(w) for ch, w in zip(chain_of_step, sim.worker, strict=True)}
    assert worker_of_chain == {0: 0, 1: 1, 2: 1, 3: 0}
    _check_invariants(schedule, sim, 1.0, 1.0)


def test_zero_costs() -> None:
    sim = simulate(make_schedule("shift", _paper_spec(4, 1, False)), 0.0, 0.0)
    assert sim.makespan == 0.0 and sim.bubble_fraction == 0.0


@pytest.mark.parametrize(
    ("c", "r", "error"),
    [
        (-1.0, 1.0, ValueError),
        (1.0, float("nan"), ValueError),
        (1.0, float("inf"), ValueError),
        ("1", 1.0, TypeError),
        (True, 1.0, TypeError),
    ],
)
def test_bad_costs(c: object, r: object, error: type) -> None:
    with pytest.raises(error, match="cost_"):
        simulate(make_schedule("shift", _paper_spec(4, 1, False)), c, r)  # type: ignore[arg-type]


def test_invalid_schedule_is_not_simulated() -> None:
    schedule = make_schedule("fa3", _paper_spec(4, 1, False))
    broken = dataclasses.replace(schedule, order=schedule.order[::-1])
    with pytest.raises(ValueError, match="invalid schedule"):
        simulate(broken)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_closed_forms_at_device_scale(causal: bool) -> None:
    """132 workers (an H200), 8 heads: ~70k-140k steps, still exact and quick."""
    spec = _paper_spec(132, 8, causal)
    name = "symmetric_shift" if causal else "shift"
    schedule = make_schedule(name, spec)
    report = validate(schedule)
    assert report.depth_monotone
    sim = simulate(schedule, 2.0, 1.0)
    expected = 8 * 133 * 3.0 / 2 if causal else 8 * 132 * 3.0
    assert sim.makespan == expected == sim.lower_bound
    assert sim.bubble_fraction == 0.0


# ------------------------------------------------------------------------------------------------
# Per-step costs and the unordered (non-deterministic) execution


@pytest.mark.parametrize("name", ["fa3", "shift"])
def test_per_step_costs_equal_to_the_scalar_give_the_same_timeline(name: str) -> None:
    schedule = make_schedule(name, _paper_spec(8, 2, False))
    scalar = simulate(schedule, 2.0, 0.5)
    array = simulate(schedule, np.full(schedule.num_steps, 2.0), 0.5)
    assert array.makespan == scalar.makespan
    np.testing.assert_array_equal(array.reduce_end, scalar.reduce_end)
    np.testing.assert_array_equal(array.compute_end, scalar.compute_end)


@pytest.mark.parametrize("name", ["fa3", "descending", "symmetric_shift"])
def test_per_step_costs_respect_both_dependencies(name: str) -> None:
    spec = _paper_spec(8, 2, True)
    schedule = make_schedule(name, spec)
    costs = np.random.default_rng(1).uniform(0.5, 1.5, schedule.num_steps)
    sim = simulate(schedule, costs, 0.25)
    np.testing.assert_allclose(sim.compute_end - sim.compute_start, costs)
    pred = rank_predecessors(schedule)
    has = pred >= 0
    assert np.all(sim.reduce_start >= sim.compute_end - 1e-12)
    assert np.all(sim.reduce_start[has] >= sim.reduce_end[pred[has]] - 1e-12)
    assert sim.lower_bound == pytest.approx((costs.sum() + 0.25 * schedule.num_steps) / 8)
    assert sim.critical_path == pytest.approx(sim.makespan)


@pytest.mark.parametrize("name", ["fa3", "descending", "shift"])
def test_unordered_execution_has_no_rank_wait(name: str) -> None:
    schedule = make_schedule(name, _paper_spec(8, 2, False))
    ordered = simulate(schedule, 1.0, 1.0)
    unordered = simulate(schedule, 1.0, 1.0, ordered=False)
    assert unordered.wait_time == 0.0
    assert unordered.makespan <= ordered.makespan
    if name == "shift":  # no bubble to remove: the paper's n (c + r)
        assert unordered.makespan == ordered.makespan
    if name == "fa3":  # the (n - 1) r of serialised reductions disappears
        assert unordered.makespan < ordered.makespan


def test_per_step_costs_are_checked() -> None:
    schedule = make_schedule("shift", _paper_spec(4, 1, False))
    with pytest.raises(ValueError, match=r"cost_compute must be a number or an array of shape"):
        simulate(schedule, np.ones(schedule.num_steps + 1))
    bad = np.ones(schedule.num_steps)
    bad[3] = -1.0
    with pytest.raises(ValueError, match="cost_compute must be finite and >= 0"):
        simulate(schedule, bad)
