"""Order invariance (the default): a sequence's bits do not depend on anything but the sequence.

Seeded numpy draws (no hypothesis): varlen packs with windows, causal and full masks, GQA and
worker counts, through every applicable generator, the validator and the invariance check.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from schedule_helpers import packed_spec, reference_static_times

from dash_attn.schedule import (
    CAUSAL,
    FULL,
    Mask,
    ScheduleSpec,
    applicable_schedules,
    auto_schedule_name,
    make_schedule,
    simulate,
    validate,
)
from dash_attn.schedule.generators import DESCENDING_MIN_AREA, DESCENDING_MIN_TASKS
from dash_attn.schedule.invariance import invariance_errors, sequence_order
from dash_attn.schedule.invariant import WAVE, lanes_per_group

BLOCKS = [(8, 8), (8, 16), (16, 16), (4, 12)]
MASKS = [FULL, CAUSAL, Mask(window_left=24, window_right=0), Mask(window_left=7, window_right=30)]


def _min_workers(spec: ScheduleSpec, name: str) -> int:
    return max([lanes_per_group(name, spec.seq_tiles(b)[1]) for b in range(spec.batch)] + [1])


def _draw_pack(rng: np.random.Generator) -> list[tuple[int, int]]:
    count = int(rng.integers(1, 5))
    pack = []
    for _ in range(count):
        seqlen_q = int(rng.integers(0, 90))
        seqlen_k = seqlen_q if rng.random() < 0.6 else int(rng.integers(0, 90))
        pack.append((seqlen_q, seqlen_k))
    if all(q == 0 for q, _ in pack):
        pack[0] = (5, pack[0][1] or 5)
    return pack


@pytest.mark.parametrize("seed", range(80))
def test_fuzz_packs_are_valid_and_invariant(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pack = _draw_pack(rng)
    mask = MASKS[int(rng.integers(len(MASKS)))]
    block = BLOCKS[int(rng.integers(len(BLOCKS)))]
    kv_heads = int(rng.integers(1, 3))
    heads = (kv_heads * int(rng.integers(1, 4)), kv_heads)
    probe = packed_spec(pack, mask=mask, block=block, heads=heads)
    for name in applicable_schedules(probe):
        least = _min_workers(probe, name)
        workers = least + int(rng.integers(0, 12))
        spec = dataclasses.replace(probe, workers=workers)
        schedule = make_schedule(name, spec)
        assert validate(schedule).valid
        assert schedule.num_steps == spec.num_tasks()
        simulate(schedule)  # runs to the end: no stall on a validated schedule

        # The pack reversed, on other workers, with one query head per kv head.
        other_workers = least + int(rng.integers(0, 12))
        reordered = packed_spec(
            pack[::-1], mask=mask, block=block, heads=(kv_heads, kv_heads), workers=other_workers
        )
        other = make_schedule(name, reordered)
        assert validate(other).valid
        for b, lengths in enumerate(pack):
            alone = make_schedule(
                name, packed_spec([lengths], mask=mask, block=block, heads=(1, 1), workers=least)
            )
            assert invariance_errors(schedule, b, alone, 0) == [], (name, pack, b)
            assert invariance_errors(other, len(pack) - 1 - b, alone, 0) == []
            # Every query head of the pack carries the same order as head 0 alone.
            for q_head in range(heads[0]):
                assert sequence_order(schedule, b, q_head) == sequence_order(alone, 0, 0)


@pytest.mark.parametrize("name", ["shift", "symmetric_shift"])
@pytest.mark.parametrize("workers", [132, 124, 114, 112, 100])
def test_worker_count_changes_no_bit(name: str, workers: int) -> None:
    """sm_margin 0 / 8 / 20 on an H200 and an H100 PCIe: the same order for every sequence."""
    mask = FULL if name == "shift" else CAUSAL
    pack = [(1000, 1000), (3000, 3000), (517, 517), (2048, 2048)]
    spec = packed_spec(pack, mask=mask, block=(64, 128), heads=(4, 2), workers=workers)
    base = packed_spec(pack, mask=mask, block=(64, 128), heads=(4, 2), workers=132)
    schedule, reference = make_schedule(name, spec), make_schedule(name, base)
    assert validate(schedule).valid
    for b in range(len(pack)):
        assert invariance_errors(schedule, b, reference, b) == []


def test_padded_batch_and_varlen_agree() -> None:
    dense = ScheduleSpec.from_shape(
        batch=3,
        seqlen_q=200,
        seqlen_k=200,
        q_heads=2,
        kv_heads=2,
        block_m=16,
        block_n=32,
        mask=CAUSAL,
        workers=40,
    )
    pack = [(77, 77), (200, 200)]
    packed = packed_spec(pack, mask=CAUSAL, block=(16, 32), heads=(2, 2), workers=9)
    for name in applicable_schedules(dense):
        a, b = make_schedule(name, dense), make_schedule(name, packed)
        assert invariance_errors(a, 2, b, 1) == []


def test_worker_dependent_rules_do_change_the_order() -> None:
    """The opt-out is what it says: invariant=False reorders dQ with the worker count."""
    spec = ScheduleSpec.from_shape(
        batch=1,
        seqlen_q=1024,
        seqlen_k=1024,
        q_heads=4,
        kv_heads=4,
        block_m=64,
        block_n=128,
        mask=FULL,
        workers=132,
        invariant=False,
    )
    small = dataclasses.replace(spec, workers=7)
    errors = invariance_errors(make_schedule("shift", spec), 0, make_schedule("shift", small), 0)
    assert errors


def test_group_wider_than_the_workers_is_a_clear_error() -> None:
    spec = packed_spec([(4096, 4096)], mask=FULL, block=(64, 128), heads=(1, 1), workers=8)
    with pytest.raises(ValueError, match="needs 16 co-resident workers .* has 8 .*sm_margin"):
        make_schedule("shift", spec)
    assert lanes_per_group("shift", 1000) == WAVE


def test_auto_is_a_function_of_the_mask_and_each_sequence() -> None:
    """Causal and window: the mask alone. Full: each sequence's tile tasks (``walks_down``), so
    a sequence gets the same order alone and in any pack, at any worker count."""
    for mask, name in [
        (FULL, "shift"),
        (CAUSAL, "symmetric_shift"),
        (Mask(window_left=64, window_right=0), "descending"),
    ]:
        for workers in (16, 132):
            spec = packed_spec([(300, 300)], mask=mask, block=(16, 32), workers=workers)
            assert auto_schedule_name(spec) == name
    # 112 x 112 tiles of 128 tokens: 12544 tasks and 14336^2 tokens^2, over both thresholds;
    # 2400 tokens: 19 x 19 tiles. The same tile counts at 16 tokens stay under the area floor.
    long, short = (14336, 14336), (2400, 2400)
    assert 112 * 112 >= DESCENDING_MIN_TASKS > 19 * 19
    assert 14336**2 >= DESCENDING_MIN_AREA > 1792**2
    for pack, name in [
        ([long], "descending"),
        ([long, long], "descending"),
        ([short, long], "shift_descending"),
        ([long, (0, 0), short], "shift_descending"),
    ]:
        spec = packed_spec(pack, mask=FULL, block=(128, 128), heads=(2, 1), workers=40)
        assert auto_schedule_name(spec) == name
    small_tiles = packed_spec([(1792, 1792)], mask=FULL, block=(16, 16), heads=(2, 1))
    assert auto_schedule_name(small_tiles) == "shift"


def test_mixed_full_pack_orders_each_sequence_as_its_named_schedule() -> None:
    """``shift_descending``: valid, and every sequence carries the tables ``auto`` gives it alone
    (``descending`` from DESCENDING_MIN_TASKS and DESCENDING_MIN_AREA on, ``shift`` below), at
    several worker counts;
    with invariant=False the shift lanes follow the worker count instead."""
    long, short, other = (14336, 14336), (2400, 2400), (5600, 5200)
    pack = [short, long, other, (0, 0), long]
    for workers in (16, 40, 132):
        spec = packed_spec(pack, mask=FULL, block=(128, 128), heads=(4, 2), workers=workers)
        schedule = make_schedule("auto", spec)
        assert schedule.name == "shift_descending"
        assert validate(schedule).valid
        for b, lengths in enumerate(pack):
            if lengths == (0, 0):
                continue
            alone = make_schedule(
                "auto", packed_spec([lengths], mask=FULL, block=(128, 128), heads=(2, 1))
            )
            assert alone.name == ("descending" if lengths == long else "shift")
            assert invariance_errors(schedule, b, alone, 0) == []
    few = packed_spec(pack, mask=FULL, block=(128, 128), heads=(4, 2), workers=3)
    with pytest.raises(ValueError, match="co-resident workers"):
        make_schedule("shift_descending", few)
    loose = make_schedule("shift_descending", dataclasses.replace(few, invariant=False))
    assert validate(loose).valid
    assert invariance_errors(loose, 1, make_schedule("descending", few), 1) == []


@pytest.mark.parametrize("seed", range(6))
def test_simulator_agrees_with_a_naive_pass_on_packs(seed: int) -> None:
    """The event simulator against a plain Kahn pass, on invariant static packs with gaps."""
    rng = np.random.default_rng(100 + seed)
    pack = _draw_pack(rng)
    for mask, name in ((FULL, "shift"), (CAUSAL, "symmetric_shift")):
        probe = packed_spec(pack, mask=mask, block=(8, 16), heads=(2, 1))
        spec = dataclasses.replace(probe, workers=_min_workers(probe, name) + int(seed % 3))
        schedule = make_schedule(name, spec)
        acyclic, makespan = reference_static_times(schedule, 2.0, 0.5)
        assert acyclic
        assert simulate(schedule, 2.0, 0.5).makespan == pytest.approx(makespan)


def test_simulator_runs_windows_and_empty_chains() -> None:
    spec = packed_spec(
        [(0, 40), (64, 64), (30, 90)], mask=Mask(window_left=16, window_right=0), block=(8, 16)
    )
    for name in applicable_schedules(spec):
        sim = simulate(make_schedule(name, spec), 1.0, 0.3)
        assert sim.makespan >= sim.lower_bound > 0
        assert len(sim.worker) == spec.num_tasks()


# Padded shapes whose order-invariant tables deadlocked before rounds were merged (session 44):
# (batch, seqlen_q, seqlen_k, q heads, kv heads, block_m, block_n), causal; the hopper backend's
# 64 x 48 (hd 256), 64 x 96 (hd 192) and 64 x 128 tiles, and Triton's.
DEADLOCKED_BEFORE = [
    (2, 281, 6165, 4, 2, 64, 48),
    (3, 207, 14868, 2, 1, 64, 128),
    (3, 215, 13379, 2, 2, 64, 128),
    (8, 2598, 3495, 8, 8, 64, 96),
    (1, 8192, 16331, 32, 8, 64, 128),
    (4, 9951, 9951, 4, 1, 64, 48),
    (3, 1024, 12836, 2, 2, 64, 128),
]


def _round_of_rank_is_monotone(spec: ScheduleSpec, name: str) -> bool:
    """In every sequence's canonical layout, consecutive ranks of a dQ tile come from the same
    or later (merged) rounds: no contribution waits on a round placed after its own."""
    from dash_attn.schedule.generators import legacy_shift, legacy_symmetric_shift
    from dash_attn.schedule.invariant import group_layout

    legacy = legacy_symmetric_shift if name == "symmetric_shift" else legacy_shift
    for b in range(spec.batch):
        layout = group_layout(name, spec, b, legacy)
        round_of = {j: k for k, units in enumerate(layout.rounds) for unit in units for j in unit}
        by_tile: dict[int, list[tuple[int, int]]] = {}
        for j, (tiles, ranks) in enumerate(zip(layout.q_order, layout.ranks, strict=True)):
            for tile, rank in zip(tiles.tolist(), ranks.tolist(), strict=True):
                by_tile.setdefault(tile, []).append((rank, round_of[j]))
        for contributions in by_tile.values():
            rounds = [k for _, k in sorted(contributions)]
            if rounds != sorted(rounds):
                return False
    return True


@pytest.mark.parametrize("shape", DEADLOCKED_BEFORE, ids=lambda s: "x".join(map(str, s)))
def test_long_causal_sequences_with_drifting_lanes_are_valid(shape: tuple[int, ...]) -> None:
    """A canonical layout's lanes are not in lockstep: a lane with short units reaches a dQ tile
    in its next round before a slower lane reaches it in the current one. Placed round by round
    with one worker holding both, such a pair waited on each other (these shapes deadlocked on
    132 workers); the rounds involved are now placed as one."""
    batch, seqlen_q, seqlen_k, heads, kv_heads, block_m, block_n = shape
    spec = ScheduleSpec.from_seqlens(
        seqlens=[(seqlen_q, seqlen_k)] * batch, q_heads=heads, kv_heads=kv_heads,
        block_m=block_m, block_n=block_n, mask=CAUSAL, workers=132,
    )  # fmt: skip
    schedule = make_schedule("symmetric_shift", spec)
    assert validate(schedule).valid
    assert _round_of_rank_is_monotone(spec, "symmetric_shift")
    # Merging moves chains between workers only: the order is that of the sequence alone.
    alone = make_schedule(
        "symmetric_shift",
        ScheduleSpec.from_seqlens(
            seqlens=[(seqlen_q, seqlen_k)], q_heads=1, kv_heads=1, block_m=block_m,
            block_n=block_n, mask=CAUSAL, workers=WAVE,
        ),
    )  # fmt: skip
    assert invariance_errors(schedule, batch - 1, alone, 0) == []


@pytest.mark.parametrize("seed", range(40))
def test_fuzz_long_sequences_are_valid(seed: int) -> None:
    """Seeded padded shapes as the backends plan them (both backends' tiles, head dims 64-256,
    GQA, Sq != Sk, up to 12k tokens: several rounds per group, partial last rounds), full and
    causal, on 132 and 114 workers: every deterministic table validates and no rank waits on a
    later round. (Session 44's scan of this kind found 6-9% of such shapes deadlocking.)"""
    from dash_attn.plan import DeviceInfo, Problem, make_backward_plan

    rng = np.random.default_rng(1000 + seed)
    seqlen_q = int(rng.integers(64, 12000))
    seqlen_k = seqlen_q if rng.random() < 0.5 else int(rng.integers(64, 12000))
    kv_heads = int(rng.choice([1, 2]))
    problem = Problem(
        batch=int(rng.integers(1, 3)), seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        heads=kv_heads * int(rng.choice([1, 2])), kv_heads=kv_heads,
        headdim=int(rng.choice([64, 96, 128, 192, 256])), mask=CAUSAL if seed % 2 else FULL,
    )  # fmt: skip
    device = DeviceInfo(sm_count=int(rng.choice([132, 114])), capability=(9, 0), name="H")
    for backend in ("hopper", "triton"):
        plan = make_backward_plan(problem, device=device, backend=backend)
        assert validate(plan.schedule).valid, (problem, backend)
        if plan.schedule.name in ("shift", "symmetric_shift"):
            assert _round_of_rank_is_monotone(plan.spec, plan.schedule.name)
