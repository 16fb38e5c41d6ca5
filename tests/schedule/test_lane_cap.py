"""The per-sequence lane cap of ``invariant_schedule`` (a study parameter): the default tables
stay bit for bit what they were, and a cap that is a function of the sequence keeps the order
invariant to the pack, the heads and the worker count."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from schedule_helpers import packed_spec

from dash_attn.schedule import (
    CAUSAL,
    FULL,
    Schedule,
    make_schedule,
    simulate,
    validate,
)
from dash_attn.schedule.generators import legacy_shift, legacy_symmetric_shift
from dash_attn.schedule.invariance import invariance_errors
from dash_attn.schedule.invariant import WAVE, invariant_schedule, lanes_per_group

LEGACY = {"shift": legacy_shift, "symmetric_shift": legacy_symmetric_shift}
MASK_OF = {"shift": FULL, "symmetric_shift": CAUSAL}


def _digest(schedule: Schedule) -> str:
    """Every table the kernels read, hashed: equal digests, equal bits and equal dispatch."""
    digest = hashlib.sha256()
    for table in (
        schedule.order,
        schedule.worker_start,
        schedule.chain_start,
        schedule.step_q_head,
        schedule.step_q_tile,
        schedule.step_rank,
    ):
        digest.update(np.ascontiguousarray(table, dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


# Digests of the default tables, recorded at 41dce32 before the lane-cap parameter existed.
GOLDEN = [
    ("shift", [(4096, 4096)], FULL, (64, 128), (4, 1), 132, "662cf2bbc60f3bf2"),
    ("symmetric_shift", [(4096, 4096)], CAUSAL, (64, 128), (4, 1), 114, "9b545f2fceec5634"),
    (
        "shift",
        [(1000, 1000), (3000, 3000), (517, 517)],
        FULL,
        (64, 128),
        (4, 2),
        114,
        "63319b898d60891e",
    ),
    (
        "symmetric_shift",
        [(1000, 1000), (3000, 3000), (517, 700)],
        CAUSAL,
        (64, 128),
        (4, 2),
        132,
        "d3de1ee8c41a93b8",
    ),
    ("symmetric_shift", [(300, 260), (90, 90)], CAUSAL, (16, 32), (2, 1), 40, "164d02c24c11476d"),
]


@pytest.mark.parametrize("case", GOLDEN, ids=lambda case: f"{case[0]}-{case[5]}w")
def test_default_tables_are_unchanged(case: tuple) -> None:
    name, seqlens, mask, block, heads, workers, golden = case
    spec = packed_spec(seqlens, mask=mask, block=block, heads=heads, workers=workers)
    assert _digest(make_schedule(name, spec)) == golden
    # The explicit constant and a cap that always answers WAVE build the same tables.
    assert _digest(invariant_schedule(name, spec, LEGACY[name], wave=WAVE)) == golden
    assert _digest(invariant_schedule(name, spec, LEGACY[name], wave=lambda _: WAVE)) == golden


def _cap(kv_tiles: int) -> int:
    """A small length-dependent cap: short sequences 4 lanes, from 8 KV tiles on 8."""
    return 4 if kv_tiles < 8 else 8


@pytest.mark.parametrize("name", ["shift", "symmetric_shift"])
def test_length_dependent_cap_is_valid_and_invariant(name: str) -> None:
    mask, block = MASK_OF[name], (16, 16)
    pack = [(40, 40), (260, 260), (97, 97), (160, 130)]
    most = max(lanes_per_group(name, -(-k // block[1]), _cap) for _, k in pack)
    assert most == 8  # the long sequences do get the larger cap
    alone = [
        invariant_schedule(
            name,
            packed_spec([s], mask=mask, block=block, heads=(1, 1), workers=most),
            LEGACY[name],
            _cap,
        )
        for s in pack
    ]
    for workers, order, heads in [
        (most, pack, (4, 2)),
        (23, pack[::-1], (3, 3)),
        (61, pack, (1, 1)),
    ]:
        spec = packed_spec(order, mask=mask, block=block, heads=heads, workers=workers)
        schedule = invariant_schedule(name, spec, LEGACY[name], _cap)
        assert validate(schedule).valid
        simulate(schedule)  # runs to the end: no stall
        for b, lengths in enumerate(order):
            assert invariance_errors(schedule, b, alone[pack.index(lengths)], 0) == []


def test_cap_changes_the_order_of_long_sequences_only() -> None:
    """The cap is live: a long sequence's order differs from the one under the constant cap 4,
    a short one's (below 8 KV tiles) does not."""
    spec = packed_spec([(40, 40), (260, 260)], mask=FULL, block=(16, 16), heads=(1, 1), workers=16)
    capped = invariant_schedule("shift", spec, legacy_shift, _cap)
    constant = invariant_schedule("shift", spec, legacy_shift, 4)
    assert invariance_errors(capped, 0, constant, 0) == []
    assert invariance_errors(capped, 1, constant, 1) != []


def test_cap_above_the_workers_or_below_one_is_an_error() -> None:
    spec = packed_spec([(260, 260)], mask=FULL, block=(16, 16), heads=(1, 1), workers=6)
    with pytest.raises(ValueError, match="needs 8 co-resident workers .* has 6"):
        invariant_schedule("shift", spec, legacy_shift, _cap)
    with pytest.raises(ValueError, match="at least 1"):
        invariant_schedule("shift", spec, legacy_shift, lambda _: 0)
