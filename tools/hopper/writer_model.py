"""When the next dynamic ticket is taken: the DAG model with the hopper backward's dQ writer.

The paper's model (``dash_attn.schedule.simulate``) runs a worker's steps as ``C, R, C, R``: the
next compute starts when the last reduction has ended, as in the Triton kernel, whose MMA warps
wait for their own dQ turns. The hopper kernel hands each step's dQ partial to a dQ writer warp
through ``buffers`` shared-memory staging buffers, so its MMA warpgroups run ahead of the writer
until every buffer holds a partial that waits for its turn. That changes when a worker is free
for the next ticket of a dynamic schedule (``fa3``, ``descending``):

``coupled``  the paper's model: after the chain's last reduction (must equal ``simulate``'s
             makespan; the test checks it).
``early``    the shipped hopper kernel: once the MMA warpgroups have handed over the chain's
             last partial, while the writer may still wait for its turn. The next chain's first
             partial then waits for a staging buffer behind it.
``drain``    ``drain_ticket`` (the ``*_dr`` variants): after the chain's last reduction, with the
             writer's run-ahead inside the chain kept.

Per step of a worker: the compute starts when the MMA warpgroups are free (for a chain's first
step, not before its ticket); the partial is handed over at ``max(compute end, a buffer free)``
and the MMA warpgroups are free again then; the reduction starts at ``max(hand-over, the
writer's previous reduction ended, the rank predecessor's reduction ended)`` and lasts ``r``;
the buffer is free again ``read`` after its reduction starts (the bulk copy's read of it; 0:
at once). With ``writers`` dQ writers (the kernel's ``dq_writers``) step k of a worker goes to
writer k mod ``writers``, and "the writer's previous reduction" is that writer's: two writers
overlap one reduction's latency with the next one's.

Steps need not take the same time: with ``jitter`` each step's compute is ``c (1 + jitter z)``,
z a standard normal clipped to +-3 (seeded, the same draws for every mode and buffer count), so
that a late partial can hold a staging buffer while its worker's next step is ready (why a
second buffer can pay off where the mean times say it cannot; NOTES item 135).

Printed per measured config (``benchmarks/results/h200/bench.csv.gz``, the hopper columns): the
measured ms of ``fa3`` and ``descending`` beside the three models' makespans, with ``c`` from
the non-deterministic time (as ``dash_attn.bench.model``) and ``r`` a fixed latency per
reduction (``--r-us``). Pure CPU, from the repository root::

    PYTHONPATH=. python tools/hopper/writer_model.py [--r-us 1,2] [--seqlens 1024,2048]
        [--headdims 64] [--orders fa3,descending,shift,symmetric_shift] [--buffers 2]
        [--jitter 0.1] [--read-us 1] [--writers 2]
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections import deque
from pathlib import Path

import numpy as np

from dash_attn.bench.model import estimate_costs
from dash_attn.bench.report import by_config, read_csv
from dash_attn.schedule import Dispatch, Schedule
from dash_attn.schedule.generators import GENERATORS
from dash_attn.schedule.report import square_spec
from dash_attn.schedule.validate import rank_predecessors, validate

MODES = ("coupled", "early", "drain")
# Staging buffers of the hopper kernels of session 28's run (the default --csv): hd 128 causal
# has two (t128_wg2*), and so has hd 64 since session 29 (_dq2), and hd 128 full from 8k keys.
BUFFERS = {(64, False): 1, (64, True): 1, (128, False): 1, (128, True): 2}
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "h200" / "bench.csv.gz"


class _Worker:
    """One worker's clocks: its MMA warpgroups, its dQ writers (step k goes to writer
    k mod ``writers``: the kernel's ``dq_writers``), and when each staging buffer is free again
    (oldest first: ``read`` after its partial's reduce starts)."""

    def __init__(self, coupled: bool, buffers: int, read: float = 0.0, writers: int = 1) -> None:
        self.coupled = coupled
        self.read = read
        self.mma = 0.0
        self.writers = [0.0] * writers
        self.steps = 0
        self.held = deque([0.0] * buffers, maxlen=buffers)

    @property
    def writer(self) -> float:
        """When every writer is done with the steps handed to it so far."""
        return max(self.writers)

    def step(self, c: float, r: float, done: float) -> float:
        """Run one step whose rank predecessor's reduction ended at ``done``; its reduce end."""
        if self.coupled:  # the next compute after this reduction (the paper's model)
            start = max(self.mma + c, self.writer, done)
            self.mma = start + r
            self.writers = [start + r] * len(self.writers)
        else:  # hand over when a buffer is free; each writer reduces its steps in order
            w = self.steps % len(self.writers)
            handed = max(self.mma + c, self.held[0])
            start = max(handed, self.writers[w], done)
            self.held.append(start + self.read)
            self.mma, self.writers[w] = handed, start + r
        self.steps += 1
        return start + r


def writer_makespan(
    schedule: Schedule,
    c: float,
    r: float,
    mode: str,
    buffers: int = 1,
    jitter: float = 0.0,
    seed: int = 0,
    read: float = 0.0,
    writers: int = 1,
) -> float:
    """The makespan of ``schedule`` with compute cost ``c`` (times ``1 + jitter z`` per step,
    module docstring) and reduction cost ``r`` per step: dynamic schedules with workers free
    for the next ticket as ``mode`` says (module docstring); static ones (no tickets: ``early``
    and ``drain`` are the same there) with the writer decoupled, or ``coupled``. ``writers``:
    dQ writers per worker taking turns by step (``dq_writers``; not with ``coupled``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if buffers < 1:
        raise ValueError(f"buffers must be >= 1, got {buffers}")
    if not 0.0 <= jitter < 1.0 / 3.0:
        raise ValueError(f"jitter must be in [0, 1/3) (steps of positive length), got {jitter}")
    if not 0.0 <= read <= r:
        raise ValueError(f"read must be in [0, r] (part of the reduction), got {read}")
    if writers < 1 or (writers > 1 and mode == "coupled"):
        raise ValueError(f"writers must be >= 1, and 1 in coupled mode, got {writers}")
    validate(schedule)
    z = np.random.default_rng(seed).standard_normal(schedule.num_steps).clip(-3.0, 3.0)
    costs = (c * (1.0 + jitter * z)).tolist()
    pred = rank_predecessors(schedule).tolist()
    starts = schedule.chain_start.tolist()
    order = schedule.order.tolist()
    workers = [
        _Worker(mode == "coupled", buffers, read, writers) for _ in range(schedule.spec.workers)
    ]
    reduce_end = [-1.0] * schedule.num_steps
    if schedule.dispatch is Dispatch.STATIC:
        _run_static(schedule, pred, starts, order, workers, reduce_end, costs, r)
        return max(reduce_end, default=0.0)
    free = [(0.0, w) for w in range(len(workers))]  # a heap: (ticket time, worker)
    for chain in order:
        ticket, w = heapq.heappop(free)
        worker = workers[w]
        worker.mma = max(worker.mma, ticket)
        for step in range(starts[chain], starts[chain + 1]):
            done = reduce_end[pred[step]] if pred[step] >= 0 else 0.0
            if done < 0:
                raise RuntimeError("a rank predecessor holds a later ticket")
            reduce_end[step] = worker.step(costs[step], r, done)
        heapq.heappush(free, (worker.mma if mode == "early" else worker.writer, w))
    return max(reduce_end, default=0.0)


def _run_static(
    schedule: Schedule,
    pred: list[int],
    starts: list[int],
    order: list[int],
    workers: list[_Worker],
    reduce_end: list[float],
    costs: list[float],
    r: float,
) -> None:
    """Static dispatch: each worker runs its chains in order and is advanced until a step's
    rank predecessor has not been reduced yet, then resumed once it has (as ``simulate``)."""
    worker_start = schedule.worker_start.tolist()
    sequences = [
        [s for chain in order[worker_start[w] : worker_start[w + 1]]
         for s in range(starts[chain], starts[chain + 1])]
        for w in range(len(workers))
    ]  # fmt: skip
    position = [0] * len(workers)
    waiters: dict[int, list[int]] = {}
    runnable = list(range(len(workers) - 1, -1, -1))
    while runnable:
        w = runnable.pop()
        steps = sequences[w]
        while position[w] < len(steps):
            step = steps[position[w]]
            done = reduce_end[pred[step]] if pred[step] >= 0 else 0.0
            if done < 0:
                waiters.setdefault(pred[step], []).append(w)
                break
            reduce_end[step] = workers[w].step(costs[step], r, done)
            runnable.extend(waiters.pop(step, ()))
            position[w] += 1
    if any(position[w] < len(sequences[w]) for w in range(len(workers))):
        raise RuntimeError("static run stalled on a validated schedule")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=RESULTS)
    parser.add_argument("--r-us", default="1,2", help="reduction latencies to model, in us")
    parser.add_argument("--seqlens", default="", help="only these seqlens (default: all)")
    parser.add_argument("--headdims", default="", help="only these head dims (default: all)")
    parser.add_argument(
        "--orders", default="fa3,descending",
        help="schedules (static ones too: shift, symmetric_shift; early = drain there)",
    )  # fmt: skip
    parser.add_argument(
        "--buffers", type=int, default=0, help="staging buffers (default: the shipped kernel's)"
    )
    parser.add_argument(
        "--jitter", type=float, default=0.0, help="relative spread of the step times (sigma)"
    )
    parser.add_argument(
        "--read-us", type=float, default=0.0,
        help="how long the bulk copy reads a staging buffer (its part of r), in us",
    )  # fmt: skip
    parser.add_argument(
        "--writers", type=int, default=1,
        help="dQ writers per worker, taking turns by step (dq_writers; early and drain modes)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    r_values = [float(x) * 1e-3 for x in args.r_us.split(",") if x]
    read = args.read_us * 1e-3
    seqlens = {int(x) for x in args.seqlens.split(",") if x}
    headdims = {int(x) for x in args.headdims.split(",") if x}
    rows = read_csv(args.csv)
    shown = args.csv.resolve()
    if shown.is_relative_to(REPO):
        shown = shown.relative_to(REPO)
    print(f"measured: {shown}; c from each config's hopper non-det time; ms")
    print(
        f"step time jitter (sigma / mean): {args.jitter:g}; buffer read: {args.read_us:g} us; "
        f"dQ writers: {args.writers} (coupled: 1)"
    )
    header = f"{'hd':>3} {'mask':6} {'seqlen':>6} {'order':10} {'bufs':>4} {'measured':>9}"
    for r in r_values:
        header += "".join(f" {m + ' r' + format(r * 1e3, 'g'):>14}" for m in MODES)
    print(header)
    for (mode, headdim, causal, seqlen), providers in by_config(rows).items():
        nondet = providers.get("dash_hopper_nondet")
        if mode != "bwd" or nondet is None or (seqlens and seqlen not in seqlens):
            continue
        if headdims and headdim not in headdims:
            continue
        spec = square_spec(
            headdim, seqlen, int(nondet["batch"]), int(nondet["heads"]), causal,
            int(nondet["sm_count"]), "hopper",
        )  # fmt: skip
        c, _ = estimate_costs(spec, float(nondet["ms"]), float(nondet["ms"]))
        buffers = args.buffers or BUFFERS[headdim, causal]
        for order in args.orders.split(","):
            measured = providers.get(f"dash_hopper_{order}")
            if measured is None:
                continue
            schedule = GENERATORS[order](spec)
            line = f"{headdim:>3} {'causal' if causal else 'full':6} {seqlen:>6} {order:10} "
            line += f"{buffers:>4} {float(measured['ms']):>9.3f}"
            for r in r_values:
                for m in MODES:
                    w = 1 if m == "coupled" else args.writers
                    ms = writer_makespan(schedule, c, r, m, buffers, args.jitter, 0, read, w)
                    line += f" {ms:>14.3f}"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
