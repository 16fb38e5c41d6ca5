"""tools/hopper/step_trace.py on the CPU: its summary of a synthetic trace laid out as the
kernel writes it (``StepMixin._trace``), and its arguments. The traced kernel's compile is
checked in tests/backends/hopper/test_bwd_compile.py."""

from __future__ import annotations

import numpy as np
import pytest

from tools.hopper import step_trace
from tools.hopper.step_trace import TRACE_POINTS, WARPS


def _synthetic(ctas: int, steps: int, real_steps: int, lag: int) -> np.ndarray:
    """Int32 words of a run where every interval between points is 100 cycles (a step 1000),
    warpgroup 1 reaches the dS barrier ``lag`` cycles after warpgroup 0 and waits nothing
    there, each warpgroup's last warp 3 cycles after its first; each CTA ran ``real_steps``
    steps, then its terminator stamped its top."""
    words = np.zeros((ctas, 2, steps, len(TRACE_POINTS), WARPS), dtype=np.int64)
    start = 2**32 - 4950  # the 32-bit clock wraps within the trace (never at a top: 0 is unset)
    for cta in range(ctas):
        for step in range(real_steps + 1):
            slot = min(step, steps - 1)
            for wg in (0, 1):
                top = start + 100 * len(TRACE_POINTS) * step
                points = top + 100 * np.arange(len(TRACE_POINTS))
                if wg == 1:
                    # arrives later; the barrier releases both at once
                    points[TRACE_POINTS.index("ds_arrive")] += lag
                if step == real_steps:
                    points[1:] = 0  # the terminator stamps its top only
                    points[0] = top
                for warp in range(WARPS):
                    stamp = points + (3 if warp == WARPS - 1 else 0)
                    stamp[1:] = np.where(points[1:] == 0, 0, stamp[1:])
                    words[cta, wg, slot, :, warp] = stamp % 2**32
    return words.astype(np.uint32).view(np.int32).reshape(-1)


def test_summary_of_a_synthetic_trace() -> None:
    ctas, steps = 3, 16
    words = _synthetic(ctas, steps, real_steps=10, lag=40)
    assert words.size == step_trace.words_needed(ctas, steps)
    points = step_trace.warpgroup_points(words, ctas, steps)
    tops = words.reshape(ctas, 2, steps, len(TRACE_POINTS), WARPS)[:, 0, :, 0, 0]
    steps_run = (tops != 0).sum(axis=1)
    assert steps_run.tolist() == [11, 11, 11]  # ten steps and the terminator's top
    text = step_trace.summarise(points, steps_run)
    # Each warpgroup's point is its last warp's: the intervals stay 100 cycles.
    assert "| top -> s_done | 100 / 100 (10%) | 100 / 100 (10%) |" in text
    assert "| s_done -> dp_done | 100 / 100 (10%) | 100 / 100 (10%) |" in text
    assert "| ds_stored -> ds_arrive | 100 / 100 (10%) | 140 / 140 (14%) |" in text
    assert "| ds_arrive -> ds_pass | 100 / 100 (10%) | 60 / 60 (6%) |" in text
    assert "| dq_pass -> dq_stored | 100 / 100 (10%) | 100 / 100 (10%) |" in text
    assert "| end -> next top | 100 / 100 (10%) | 100 / 100 (10%) |" in text
    assert "| step (top -> next top) | 1000 / 1000 | 1000 / 1000 |" in text
    assert "wg1 arrives last in 100% of steps" in text
    assert "arrives 40 cycles after the other (median 40" in text
    # Each CTA's ten steps (slot 10 holds the terminator's top only).
    assert "30 steps of 3 CTAs" in text


def test_points_a_kernel_does_not_stamp_are_left_out() -> None:
    """The fine points (stamped at hd 64 only) are zero in an hd-128 trace: the summary's
    intervals then skip them, "s_done -> ds_arrive" holding what they would have split."""
    from dash_attn.backends.hopper.bwd_step import FINE_POINTS

    ctas, steps = 2, 8
    words = _synthetic(ctas, steps, real_steps=6, lag=0).reshape(
        ctas, 2, steps, len(TRACE_POINTS), WARPS
    )
    for name in FINE_POINTS:
        words[..., TRACE_POINTS.index(name), :] = 0
    words = words.reshape(-1)
    stamped = step_trace.stamped_points(words, ctas, steps)
    assert stamped == [name for name in TRACE_POINTS if name not in FINE_POINTS]
    points = step_trace.warpgroup_points(words, ctas, steps)
    tops = words.reshape(ctas, 2, steps, len(TRACE_POINTS), WARPS)[:, 0, :, 0, 0]
    text = step_trace.summarise(points, (tops != 0).sum(axis=1), stamped)
    assert "| s_done -> ds_arrive | 300 / 300 (30%) | 300 / 300 (30%) |" in text
    assert "dp_done" not in text and "ds_stored" not in text


def test_a_cta_that_ran_more_steps_than_traced_keeps_the_untouched_slots() -> None:
    ctas, steps = 2, 8
    words = _synthetic(ctas, steps, real_steps=20, lag=-25)
    points = step_trace.warpgroup_points(words, ctas, steps)
    tops = words.reshape(ctas, 2, steps, len(TRACE_POINTS), WARPS)[:, 0, :, 0, 0]
    text = step_trace.summarise(points, (tops != 0).sum(axis=1))
    assert "wg1 arrives last in 0% of steps" in text
    assert "14 steps of 2 CTAs" in text  # slots 0-6 each; slot 7 holds later steps


@pytest.mark.parametrize(
    "argv",
    [["4096:window"], ["0:full"], ["--modes", "both", "4096:full"], ["--steps", "1", "4096:full"]],
)
def test_bad_arguments_exit(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        step_trace.main(argv)


def test_intervals_and_clock_wrap() -> None:
    every = step_trace.intervals(list(TRACE_POINTS))
    assert every[0] == ("top", "s_done")
    assert every[-1] == ("end", "next top")
    assert step_trace.intervals(["top", "s_done", "end"]) == [
        ("top", "s_done"), ("s_done", "end"), ("end", "next top"),
    ]  # fmt: skip
    late, early = np.array([5], dtype=np.int64), np.array([2**32 - 3], dtype=np.int64)
    assert step_trace.clock_delta(early, late).tolist() == [8]
    assert step_trace.clock_delta(late, early).tolist() == [-8]


def test_unknown_variant_suffix_exits() -> None:
    """``--suffix`` names a variant of the shipped kernel; one that is not registered is a
    usage error before anything runs (the check reads ``bwd_launch.VARIANTS``: needs cutlass)."""
    pytest.importorskip("cutlass")
    with pytest.raises(SystemExit):
        step_trace.main(["--headdim", "128", "--suffix", "_nope", "4096:full"])
    # The registered ones pass the check (the run itself needs a GPU: not called here).
    from dash_attn.backends.hopper import bwd_launch, bwd_variant

    for det in (True, False):
        assert bwd_variant(64, False, 4096, det) + "_p18" in bwd_launch.VARIANTS
