"""Plans for Triton's interpreter: programs run one after another there, so a deterministic
static schedule whose worker waits for a later worker could never finish. The plan sees that from
the tables alone (no torch): ``auto`` takes a dynamic schedule, a named one is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dash_attn.plan import (
    CAUSAL,
    FULL,
    H200,
    INTERPRETER,
    INTERPRETER_AUTO_SCHEDULE,
    Problem,
    first_blocked_program,
    make_backward_plan,
)
from dash_attn.schedule import Dispatch

# (schedule, problem) whose static worker lists, run back to back, block / do not block. The same
# shapes as the interpreter tests that run them.
BLOCKS = [
    ("shift", Problem(1, 150, 150, 2, 2, 64, FULL, "float16")),
    ("symmetric_shift", Problem(1, 100, 257, 2, 1, 64, CAUSAL, "float16")),
]
COMPLETES = [
    ("shift", Problem(2, 40, 150, 4, 2, 64, FULL, "float16")),
    ("symmetric_shift", Problem(2, 150, 150, 4, 2, 64, CAUSAL, "float16")),
]


@pytest.mark.parametrize("schedule, problem", BLOCKS)
def test_named_static_schedule_that_would_block_is_refused(schedule, problem) -> None:
    plan = make_backward_plan(problem, device=INTERPRETER, schedule=schedule, deterministic=False)
    assert first_blocked_program(plan.schedule) == 0
    with pytest.raises(NotImplementedError, match="one after another") as info:
        make_backward_plan(problem, device=INTERPRETER, schedule=schedule)
    assert repr(schedule) in str(info.value) and "'descending'" in str(info.value)


@pytest.mark.parametrize("schedule, problem", BLOCKS)
def test_auto_takes_a_dynamic_schedule_where_static_would_block(schedule, problem) -> None:
    # On the GPU the static schedule runs as asked (same tiles: the Triton backend).
    static = make_backward_plan(problem, device=H200, backend="triton", schedule=schedule)
    assert (static.schedule_name, static.dispatch) == (schedule, Dispatch.STATIC)
    plan = make_backward_plan(problem, device=INTERPRETER)
    assert plan.schedule_name == INTERPRETER_AUTO_SCHEDULE
    assert plan.dispatch is Dispatch.DYNAMIC
    assert first_blocked_program(plan.schedule) is None


@pytest.mark.parametrize("schedule, problem", COMPLETES)
def test_static_schedule_that_completes_in_program_order_is_kept(schedule, problem) -> None:
    for name in (schedule, "auto"):
        plan = make_backward_plan(problem, device=INTERPRETER, schedule=name)
        assert (plan.schedule_name, plan.dispatch) == (schedule, Dispatch.STATIC)
        assert first_blocked_program(plan.schedule) is None


def test_first_blocked_program_replays_the_worker_lists() -> None:
    # Move program 0's chains to the end (program 0 becomes the last worker): the programs that
    # now run first wait for rank-0 contributions that only the last one adds.
    problem = Problem(2, 40, 150, 4, 2, 64, FULL, "float16")
    sched = make_backward_plan(problem, device=INTERPRETER, schedule="shift").schedule
    assert first_blocked_program(sched) is None
    order = sched.order.tolist()
    first_end = int(sched.worker_start[1])
    moved = order[first_end:] + order[:first_end]
    starts = [0, *(int(s) - first_end for s in sched.worker_start[2:]), len(order)]
    rotated = dataclasses.replace(
        sched, order=np.array(moved, dtype=np.int32), worker_start=np.array(starts, dtype=np.int32)
    )
    assert first_blocked_program(rotated) is not None
