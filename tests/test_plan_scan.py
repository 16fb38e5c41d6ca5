"""tools/plan_scan.py: seeded draws, the study switch restores the shipped placement, and a small
scan finds no invalid plan."""

from __future__ import annotations

import numpy as np

from dash_attn.schedule import invariant
from tools import plan_scan


def test_draws_are_seeded_and_scan_finds_no_invalid_plan() -> None:
    first = [plan_scan.draw_problem(np.random.default_rng(3)) for _ in range(2)]
    assert first[0] == first[1]
    checked, invalid = plan_scan.scan("hopper", count=25, seed=5)
    assert checked > 0 and invalid == []


def test_unmerged_rounds_is_a_study_switch_only() -> None:
    shipped = invariant.merged_rounds
    with plan_scan.unmerged_rounds():
        assert invariant.merged_rounds is not shipped
        assert invariant.merged_rounds([], 3, (), ()) == [(0, 0), (1, 1), (2, 2)]
    assert invariant.merged_rounds is shipped


def test_scan_of_every_schedule_plans_each_that_fits_the_mask() -> None:
    """``--schedules all``: a draw is planned once per schedule that fits its mask (five for
    a full mask with ``auto``, four for a causal one), with the invariant tables and the
    worker-dependent ones; none is invalid."""
    from dash_attn.schedule import schedule_names
    from dash_attn.schedule.generators import SCHEDULE_MASKS

    names = ("auto", *schedule_names())
    problem = plan_scan.draw_problem(np.random.default_rng(7))
    fitting = 1 + sum(problem.mask.kind in SCHEDULE_MASKS[n] for n in names[1:])
    checked, invalid = plan_scan.scan("hopper", count=1, seed=7, schedules=names)
    assert invalid == [] and checked == fitting
    checked, invalid = plan_scan.scan("triton", count=6, seed=8, schedules=names, invariant=False)
    assert invalid == [] and checked > 6


def test_local_draws_add_windows_and_keep_the_other_draws() -> None:
    """``--local``: a third of the draws become sliding windows (never full); the others are
    the draws without it, so earlier seeds' scans stay reproducible."""
    plain = [plan_scan.draw_problem(np.random.default_rng(s)) for s in range(60)]
    local = [plan_scan.draw_problem(np.random.default_rng(s), local=True) for s in range(60)]
    assert 5 < sum(p.mask.kind == "local" for p in local) < 40
    assert all(a.mask.kind == "local" or a == b for a, b in zip(local, plain, strict=True))
    checked, invalid = plan_scan.scan("triton", count=10, seed=11, schedules=("auto",), local=True)
    assert invalid == [] and checked > 0
