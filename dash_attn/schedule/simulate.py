"""The paper's DAG timing model, simulated step by step.

Model (paper section 2). Every step of a chain is a compute edge of cost ``c`` (recompute P, the
dK/dV/dQ-partial matmuls) followed by a reduction edge of cost ``r`` (adding the dQ partial into
global memory). A worker runs its steps back to back, ``C, R, C, R, ...``: a step's compute starts
when the worker's previous reduction has ended. A reduction starts when its own compute has ended
*and* the reduction holding the previous rank of the same dQ tile has ended (the semaphore wait);
with dK/dV sums (``ScheduleSpec.dkv_sum_group``) the last step of a chain also waits for the last
reduction of the chain before it in its sum (the kernel's epilogue wait, modelled at no cost of
its own). Nothing else is modelled (no memory contention, no launch cost), so the makespan
isolates what a schedule and its summation orders cost: the serialisation bubbles.

Dispatch. Static: worker ``w`` runs the chains of its list in ``schedule.order``. Dynamic: a worker
that becomes free draws the next ticket (earliest-free worker first, ties to the lowest index), as
the hardware block scheduler does for a non-persistent grid. A dynamic schedule's rank (and
dK/dV) predecessors all hold smaller tickets (``validate`` proves it), so one pass in ticket
order knows every time it needs; a static schedule's waits may point to any worker, so workers
are advanced until blocked and resumed when the step they wait on has run.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from .types import Dispatch, Schedule
from .validate import dkv_predecessors, rank_predecessors, validate


@dataclass(frozen=True, eq=False)
class SimResult:
    """Timing of one schedule in the DAG model.

    Attributes:
        makespan: time at which the last reduction ends.
        critical_path: length of the longest path of the DAG (equal to ``makespan`` in this model,
            where every worker starts at 0 and never idles without a reason).
        critical_steps: ``[K]`` the steps of one longest path, in execution order. Consecutive
            steps are linked by the worker (the next compute waited for the previous
            reduction), by the dQ summation order (the reduction waited for the previous rank)
            or by a dK/dV sum (the chain's end waited for the previous chain of its sum).
        lower_bound: total work ``S (c + r)`` (plus ``e`` per chain of a dK/dV sum) over the
            workers: the makespan of a perfectly packed schedule without any wait.
        bubble_fraction: ``1 - busy / (workers * makespan)``: the share of worker time spent
            waiting or idle at the end (0 for a perfect schedule).
        worker: ``[S]`` the worker that ran each step.
        compute_start, compute_end, reduce_start, reduce_end: ``[S]`` times of each step's edges.
    """

    makespan: float
    critical_path: float
    critical_steps: np.ndarray
    lower_bound: float
    bubble_fraction: float
    worker: np.ndarray
    compute_start: np.ndarray
    compute_end: np.ndarray
    reduce_start: np.ndarray
    reduce_end: np.ndarray

    @property
    def wait_time(self) -> float:
        """Total time reductions spent waiting on the summation order."""
        return float(np.sum(self.reduce_start - self.compute_end))


def simulate(
    schedule: Schedule,
    cost_compute: float | np.ndarray = 1.0,
    cost_reduce: float = 1.0,
    *,
    ordered: bool = True,
    cost_dkv_sum: float = 0.0,
) -> SimResult:
    """Run ``schedule`` through the DAG model with compute cost ``c`` and reduction cost ``r``.

    Args:
        schedule: a schedule; it is validated first (a deadlocking schedule has no makespan).
        cost_compute: ``c``, the time of one tile task's compute edge (>= 0): one number for every
            step, or an ``[S]`` array with one cost per step (to model noisy or uneven steps).
        cost_reduce: ``r``, the time of one dQ reduction (>= 0).
        ordered: False drops the summation-order edges (dQ and dK/dV): the same tables executed
            the way the non-deterministic kernel runs them (each reduction right after its
            compute).
        cost_dkv_sum: ``e``, the time a chain of a dK/dV sum (``ScheduleSpec.dkv_sum_group``)
            takes to add its dK/dV after its last step, modelled as part of that step's
            reduction edge (``r + e``): the next chain of its worker and the next rank of its
            sum wait for it. 0 (the default) prices the waits alone.

    Returns:
        A ``SimResult``.

    Raises:
        ValueError: the schedule is invalid (see ``validate``) or a cost is negative or not finite.

    Example:
        >>> from dash_attn.schedule import CAUSAL, FULL, ScheduleSpec, make_schedule, simulate
        >>> spec = ScheduleSpec(batch=1, q_heads=1, kv_heads=1, q_tiles=4, kv_tiles=4,
        ...                     mask=FULL, workers=4)
        >>> simulate(make_schedule("fa3", spec)).makespan  # n (c + r) + (n - 1) r
        11.0
        >>> simulate(make_schedule("shift", spec)).makespan  # n (c + r): no bubble
        8.0
    """
    costs = _step_costs(cost_compute, schedule.num_steps)
    r = _cost("cost_reduce", cost_reduce)
    validate(schedule)
    pred = rank_predecessors(schedule)
    dkv_pred = dkv_predecessors(schedule)
    if not ordered:
        pred = np.full_like(pred, -1)
        dkv_pred = np.full_like(dkv_pred, -1)
    cost_list = costs.tolist()
    # dK/dV predecessors are few (one per chain of a sum): a dict keeps the common step cheap.
    has_dkv = np.flatnonzero(dkv_pred >= 0)
    preds = (pred.tolist(), dict(zip(has_dkv.tolist(), dkv_pred[has_dkv].tolist(), strict=True)))
    reduce_costs = np.full(schedule.num_steps, r)
    if schedule.spec.dkv_sum_group > 1:
        start = schedule.chain_start.astype(np.int64)
        reduce_costs[start[1:][start[1:] > start[:-1]] - 1] += _cost("cost_dkv_sum", cost_dkv_sum)
    rcost = reduce_costs.tolist()
    if schedule.dispatch is Dispatch.STATIC:
        times = _run_static(schedule, preds, cost_list, rcost)
    else:
        times = _run_dynamic(schedule, preds, cost_list, rcost)
    worker, compute_start, reduce_start, prev, via = times

    compute_start_a = np.asarray(compute_start, dtype=np.float64)
    reduce_start_a = np.asarray(reduce_start, dtype=np.float64)
    reduce_end = reduce_start_a + reduce_costs
    num_steps = schedule.num_steps
    workers = schedule.spec.workers
    makespan = float(reduce_end.max()) if num_steps else 0.0

    path: list[int] = []
    length = 0.0
    if num_steps:
        step = int(np.argmax(reduce_end))
        while step >= 0:
            path.append(step)
            if via[step]:
                length += rcost[step]
                step = preds[0][step] if via[step] == 1 else preds[1][step]
            else:
                length += cost_list[step] + rcost[step]
                step = prev[step]
        path.reverse()
    busy = float(costs.sum()) + float(reduce_costs.sum())
    return SimResult(
        makespan=makespan,
        critical_path=length,
        critical_steps=np.asarray(path, dtype=np.int64),
        lower_bound=busy / workers,
        bubble_fraction=1.0 - busy / (workers * makespan) if makespan > 0 else 0.0,
        worker=np.asarray(worker, dtype=np.int64),
        compute_start=compute_start_a,
        compute_end=compute_start_a + costs,
        reduce_start=reduce_start_a,
        reduce_end=reduce_end,
    )


def _cost(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value}")
    return value


def _step_costs(value: float | np.ndarray, num_steps: int) -> np.ndarray:
    """``cost_compute`` as an ``[S]`` float64 array (a scalar is broadcast)."""
    if isinstance(value, np.ndarray):
        costs = value.astype(np.float64, copy=False)
        if costs.shape != (num_steps,):
            raise ValueError(
                f"cost_compute must be a number or an array of shape ({num_steps},) (one cost "
                f"per step), got shape {costs.shape}"
            )
        if not np.all(np.isfinite(costs)) or np.any(costs < 0):
            raise ValueError("cost_compute must be finite and >= 0 for every step")
        return costs
    return np.full(num_steps, _cost("cost_compute", value))


_Times = tuple[list[int], list[float], list[float], list[int], bytearray]
# The rank predecessor of every step (-1 for none), and the dK/dV predecessor of the steps that
# have one.
_Preds = tuple[list[int], dict[int, int]]


def _wait_on(
    p: int, ready: float, step: int, kind: int, reduce_end: list[float], via: bytearray
) -> float:
    """``ready`` pushed to the end of predecessor ``p``'s reduction (recorded in ``via`` as
    ``kind``: 2, dK/dV); -1.0 when ``p`` has not run yet. The rank predecessor, which most
    steps have, is the same test written inline in the loops."""
    done = reduce_end[p]
    if done < 0:
        return -1.0
    if done > ready:
        via[step] = kind
        return done
    return ready


def _run_static(schedule: Schedule, preds: _Preds, cost: list[float], rcost: list[float]) -> _Times:
    """Advance each worker until a reduction waits on a step not yet run; resume it after.

    A step's times depend only on its two predecessors, so the order in which blocked workers are
    resumed changes nothing: the result is the DAG's unique earliest-start schedule.
    """
    spec = schedule.spec
    rank_pred, dkv_pred = preds
    num_steps = schedule.num_steps
    chain_start = schedule.chain_start.tolist()
    order = schedule.order.tolist()
    worker_start = schedule.worker_start.tolist()
    sequences: list[list[int]] = []
    worker = [0] * num_steps
    for w in range(spec.workers):
        steps: list[int] = []
        for chain in order[worker_start[w] : worker_start[w + 1]]:
            steps.extend(range(chain_start[chain], chain_start[chain + 1]))
        for step in steps:
            worker[step] = w
        sequences.append(steps)

    compute_start = [0.0] * num_steps
    reduce_start = [0.0] * num_steps
    reduce_end = [-1.0] * num_steps  # -1: not run yet (times are >= 0)
    prev = [-1] * num_steps
    via = bytearray(num_steps)
    # The workers blocked on each step (a step is the rank predecessor of one step and the
    # dK/dV predecessor of at most one more).
    waiters: dict[int, list[int]] = {}
    position = [0] * spec.workers
    free_at = [0.0] * spec.workers
    last = [-1] * spec.workers
    runnable = list(range(spec.workers - 1, -1, -1))
    while runnable:
        w = runnable.pop()
        steps = sequences[w]
        index, t, before = position[w], free_at[w], last[w]
        end = len(steps)
        while index < end:
            step = steps[index]
            ready = t + cost[step]
            p = rank_pred[step]
            if p >= 0:  # inline: most steps have a rank predecessor
                done = reduce_end[p]
                if done < 0:
                    waiters.setdefault(p, []).append(w)
                    break
                if done > ready:
                    ready = done
                    via[step] = 1
            if step in dkv_pred:
                p = dkv_pred[step]
                ready = _wait_on(p, ready, step, 2, reduce_end, via)
                if ready < 0:
                    waiters.setdefault(p, []).append(w)
                    break
            compute_start[step] = t
            reduce_start[step] = ready
            prev[step] = before
            t = ready + rcost[step]
            reduce_end[step] = t
            runnable.extend(waiters.pop(step, ()))
            before = step
            index += 1
        position[w], free_at[w], last[w] = index, t, before
    if any(position[w] < len(sequences[w]) for w in range(spec.workers)):
        # validate() proves acyclicity first, so this is an internal error.
        raise RuntimeError("static simulation stalled on a validated schedule")
    return worker, compute_start, reduce_start, prev, via


def _run_dynamic(
    schedule: Schedule, preds: _Preds, cost: list[float], rcost: list[float]
) -> _Times:
    """Deal chains in ticket order to the earliest-free worker and run each one to its end."""
    spec = schedule.spec
    rank_pred, dkv_pred = preds
    num_steps = schedule.num_steps
    chain_start = schedule.chain_start.tolist()
    worker = [0] * num_steps
    compute_start = [0.0] * num_steps
    reduce_start = [0.0] * num_steps
    reduce_end = [-1.0] * num_steps
    prev = [-1] * num_steps
    via = bytearray(num_steps)
    last = [-1] * spec.workers
    free = [(0.0, w) for w in range(spec.workers)]  # a heap: (time free, worker)
    for chain in schedule.order.tolist():
        t, w = heapq.heappop(free)
        before = last[w]
        for step in range(chain_start[chain], chain_start[chain + 1]):
            ready = t + cost[step]
            p = rank_pred[step]
            if p >= 0:  # inline: most steps have a rank predecessor
                done = reduce_end[p]
                if done < 0:
                    raise RuntimeError("dynamic simulation met a later ticket on a valid schedule")
                if done > ready:
                    ready = done
                    via[step] = 1
            if step in dkv_pred:
                ready = _wait_on(dkv_pred[step], ready, step, 2, reduce_end, via)
                if ready < 0:
                    raise RuntimeError("dynamic simulation met a later ticket on a valid schedule")
            worker[step] = w
            compute_start[step] = t
            reduce_start[step] = ready
            prev[step] = before
            t = ready + rcost[step]
            reduce_end[step] = t
            before = step
        last[w] = before
        heapq.heappush(free, (t, w))
    return worker, compute_start, reduce_start, prev, via
