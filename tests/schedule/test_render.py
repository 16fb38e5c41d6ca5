"""render_ascii, dq_orders, JSON round trip, and the docstring examples of the engine."""

from __future__ import annotations

import doctest
import importlib
import json

import numpy as np
import pytest
from schedule_helpers import make_spec, spec_id

from dash_attn.schedule import (
    ScheduleSpec,
    applicable_schedules,
    dq_orders,
    make_schedule,
    render_ascii,
    schedule_from_json,
    schedule_to_json,
    simulate,
    validate,
)


def test_render_paper_example_a() -> None:
    text = render_ascii(make_schedule("shift", make_spec(q_tiles=4, kv_tiles=4, workers=4)))
    assert text.splitlines()[2:] == [
        "step  0    1    2    3",
        "w0    q0r0 q1r1 q2r2 q3r3   [kv0]",
        "w1    q1r0 q2r1 q3r2 q0r3   [kv1]",
        "w2    q2r0 q3r1 q0r2 q1r3   [kv2]",
        "w3    q3r0 q0r1 q1r2 q2r3   [kv3]",
    ]


def test_render_heads_and_chain_boundaries() -> None:
    spec = make_spec(q_heads=2, kv_heads=2, causal=True, q_tiles=4, kv_tiles=4, workers=4)
    lines = render_ascii(make_schedule("symmetric_shift", spec)).splitlines()
    assert lines[0].startswith("symmetric_shift: static dispatch, causal mask")
    assert lines[3] == "w0    h0q1r0 h0q2r1 h0q3r1 h0q0r0|h0q3r3   [g0kv0, g0kv3]"
    assert lines[4] == "w1    h0q2r0 h0q3r0 h0q1r1|h0q3r2 h0q2r2   [g0kv1, g0kv2]"


def test_render_truncates_large_schedules() -> None:
    spec = make_spec(batch=2, q_heads=4, kv_heads=2, q_tiles=64, kv_tiles=64, workers=132)
    text = render_ascii(make_schedule("fa3", spec), max_workers=5, max_steps=6)
    lines = text.splitlines()
    assert lines[-1] == "(truncated: showing workers 0..4 of 132 and steps 0..5 of 256)"
    assert "(dynamic:" in text
    rows = [line for line in lines if line.startswith("w")]
    assert len(rows) == 5 and all(" ..." in row for row in rows)
    assert rows[0].split()[1] == "b0h0q0r0"


def test_render_rejects_bad_limits() -> None:
    schedule = make_schedule("fa3", make_spec(q_tiles=2, kv_tiles=2, workers=2))
    with pytest.raises(ValueError, match="max_steps"):
        render_ascii(schedule, max_steps=0)


def test_dq_orders_gqa_and_batch() -> None:
    spec = make_spec(batch=2, q_heads=4, kv_heads=2, q_tiles=4, kv_tiles=4, workers=3, causal=True)
    schedule = make_schedule("descending", spec)
    for b in range(2):
        for h in range(4):
            assert dq_orders(schedule, b, h) == {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3]}
    with pytest.raises(ValueError, match="q_head"):
        dq_orders(schedule, 0, 4)
    with pytest.raises(ValueError, match="batch"):
        dq_orders(schedule, 2, 0)


def test_dq_orders_q_tile_without_contributions() -> None:
    spec = make_spec(q_tiles=6, kv_tiles=2, workers=2, causal=True, causal_offset=-2)
    orders = dq_orders(make_schedule("fa3", spec))
    assert orders[0] == orders[1] == [] and orders[2] == [0] and orders[5] == [0, 1]


_JSON_SPECS = [
    make_spec(q_tiles=4, kv_tiles=4, workers=4),
    make_spec(
        batch=2,
        q_heads=6,
        kv_heads=2,
        q_tiles=8,
        kv_tiles=4,
        tile_ratio=2,
        causal=True,
        workers=3,
        causal_offset=1,
    ),
]


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        pytest.param(name, spec, id=f"{name}-{spec_id(spec)}")
        for spec in _JSON_SPECS
        for name in applicable_schedules(spec)
    ],
)
def test_json_round_trip(name: str, spec: ScheduleSpec) -> None:
    schedule = make_schedule(name, spec)
    data = json.loads(json.dumps(schedule_to_json(schedule)))
    back = schedule_from_json(data)
    assert back.name == schedule.name and back.spec == spec and back.dispatch is schedule.dispatch
    for field in (
        "chain_start",
        "step_q_head",
        "step_q_tile",
        "step_rank",
        "order",
        "worker_start",
    ):
        assert np.array_equal(getattr(back, field), getattr(schedule, field))
        assert getattr(back, field).dtype == np.int32
    assert validate(back).valid
    assert simulate(back).makespan == simulate(schedule).makespan


def test_json_rejects_foreign_data() -> None:
    data = schedule_to_json(make_schedule("fa3", make_spec(q_tiles=2, kv_tiles=2, workers=2)))
    with pytest.raises(TypeError):
        schedule_from_json([data])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="format"):
        schedule_from_json({**data, "version": 99})
    with pytest.raises(ValueError, match="lacks"):
        schedule_from_json({k: v for k, v in data.items() if k != "order"})
    with pytest.raises(ValueError, match="unknown spec fields"):
        schedule_from_json({**data, "spec": {**data["spec"], "window": 3}})
    with pytest.raises(ValueError):
        schedule_from_json({**data, "dispatch": "sometimes"})


@pytest.mark.parametrize("module", ["generators", "render", "simulate", "types", "validate"])
def test_docstring_examples(module: str) -> None:
    # import_module: ``dash_attn.schedule.simulate`` as an attribute is the function.
    loaded = importlib.import_module(f"dash_attn.schedule.{module}")
    result = doctest.testmod(loaded, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
