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
the buffer is free again when its reduction starts (the bulk copy reads it at once).

Printed per measured config (``benchmarks/results/h200/bench.csv``, the hopper columns): the
measured ms of ``fa3`` and ``descending`` beside the three models' makespans, with ``c`` from
the non-deterministic time (as ``dash_attn.bench.model``) and ``r`` a fixed latency per
reduction (``--r-us``). Pure CPU, from the repository root::

    PYTHONPATH=. python tools/hopper/writer_model.py [--r-us 1,2] [--seqlens 1024,2048]
        [--orders fa3,descending,shift,symmetric_shift] [--buffers 2]
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections import deque
from pathlib import Path

from dash_attn.bench.model import estimate_costs
from dash_attn.bench.report import by_config, read_csv
from dash_attn.schedule import Dispatch, Schedule
from dash_attn.schedule.generators import GENERATORS
from dash_attn.schedule.report import square_spec
from dash_attn.schedule.validate import rank_predecessors, validate

MODES = ("coupled", "early", "drain")
# Staging buffers of the shipped hopper kernels (hd 128 causal has two: t128_wg2*).
BUFFERS = {(64, False): 1, (64, True): 1, (128, False): 1, (128, True): 2}
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200" / "bench.csv"


def writer_makespan(
    schedule: Schedule, c: float, r: float, mode: str, buffers: int = 1
) -> float:
    """The makespan of ``schedule`` with compute cost ``c`` and reduction cost ``r`` per step:
    dynamic schedules with workers free for the next ticket as ``mode`` says (module
    docstring); static ones (no tickets: ``early`` and ``drain`` are the same there) with the
    writer decoupled, or ``coupled``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if buffers < 1:
        raise ValueError(f"buffers must be >= 1, got {buffers}")
    validate(schedule)
    pred = rank_predecessors(schedule).tolist()
    if schedule.dispatch is Dispatch.STATIC:
        return _static_makespan(schedule, pred, c, r, mode == "coupled", buffers)
    starts = schedule.chain_start.tolist()
    workers = schedule.spec.workers
    reduce_end = [-1.0] * schedule.num_steps
    # Per worker: MMA warpgroups free, writer free, the reduce starts of the partials that
    # occupy the buffers (oldest first).
    mma = [0.0] * workers
    writer = [0.0] * workers
    held: list[deque[float]] = [deque([0.0] * buffers, maxlen=buffers) for _ in range(workers)]
    free = [(0.0, w) for w in range(workers)]  # a heap: (ticket time, worker)
    makespan = 0.0
    for chain in schedule.order.tolist():
        ticket, w = heapq.heappop(free)
        t_mma = max(mma[w], ticket)
        t_writer = writer[w]
        for step in range(starts[chain], starts[chain + 1]):
            done = reduce_end[pred[step]] if pred[step] >= 0 else 0.0
            if done < 0:
                raise RuntimeError("a rank predecessor holds a later ticket")
            if mode == "coupled":
                start = max(t_mma + c, t_writer, done)
                t_writer = t_mma = start + r
            else:
                handed = max(t_mma + c, held[w][0])  # the oldest buffer is the one freed first
                start = max(handed, t_writer, done)
                held[w].append(start)
                t_mma, t_writer = handed, start + r
            reduce_end[step] = start + r
            makespan = max(makespan, start + r)
        mma[w], writer[w] = t_mma, t_writer
        heapq.heappush(free, (t_mma if mode == "early" else t_writer, w))
    return makespan


def _static_makespan(
    schedule: Schedule, pred: list[int], c: float, r: float, coupled: bool, buffers: int
) -> float:
    """Static dispatch: each worker runs its chains in order and is advanced until a step's
    rank predecessor has not been reduced yet, then resumed once it has (as ``simulate``)."""
    starts = schedule.chain_start.tolist()
    order = schedule.order.tolist()
    worker_start = schedule.worker_start.tolist()
    workers = schedule.spec.workers
    sequences = [
        [s for chain in order[worker_start[w] : worker_start[w + 1]]
         for s in range(starts[chain], starts[chain + 1])]
        for w in range(workers)
    ]  # fmt: skip
    reduce_end = [-1.0] * schedule.num_steps
    position = [0] * workers
    mma = [0.0] * workers
    writer = [0.0] * workers
    held: list[deque[float]] = [deque([0.0] * buffers, maxlen=buffers) for _ in range(workers)]
    waiters: dict[int, list[int]] = {}
    runnable = list(range(workers - 1, -1, -1))
    while runnable:
        w = runnable.pop()
        steps = sequences[w]
        while position[w] < len(steps):
            step = steps[position[w]]
            done = reduce_end[pred[step]] if pred[step] >= 0 else 0.0
            if done < 0:
                waiters.setdefault(pred[step], []).append(w)
                break
            if coupled:
                start = max(mma[w] + c, writer[w], done)
                mma[w] = writer[w] = start + r
            else:
                handed = max(mma[w] + c, held[w][0])
                start = max(handed, writer[w], done)
                held[w].append(start)
                mma[w], writer[w] = handed, start + r
            reduce_end[step] = start + r
            runnable.extend(waiters.pop(step, ()))
            position[w] += 1
    if any(position[w] < len(sequences[w]) for w in range(workers)):
        raise RuntimeError("static run stalled on a validated schedule")
    return max(reduce_end, default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=RESULTS)
    parser.add_argument("--r-us", default="1,2", help="reduction latencies to model, in us")
    parser.add_argument("--seqlens", default="", help="only these seqlens (default: all)")
    parser.add_argument(
        "--orders", default="fa3,descending",
        help="schedules (static ones too: shift, symmetric_shift; early = drain there)",
    )  # fmt: skip
    parser.add_argument(
        "--buffers", type=int, default=0, help="staging buffers (default: the shipped kernel's)"
    )
    args = parser.parse_args(argv)
    r_values = [float(x) * 1e-3 for x in args.r_us.split(",") if x]
    seqlens = {int(x) for x in args.seqlens.split(",") if x}
    rows = read_csv(args.csv)
    print(f"measured: {args.csv}; c from each config's hopper non-det time; ms")
    header = f"{'hd':>3} {'mask':6} {'seqlen':>6} {'order':10} {'bufs':>4} {'measured':>9}"
    for r in r_values:
        header += "".join(f" {m + ' r' + format(r * 1e3, 'g'):>14}" for m in MODES)
    print(header)
    for (mode, headdim, causal, seqlen), providers in by_config(rows).items():
        nondet = providers.get("dash_hopper_nondet")
        if mode != "bwd" or nondet is None or (seqlens and seqlen not in seqlens):
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
                line += "".join(
                    f" {writer_makespan(schedule, c, r, m, buffers):>14.3f}" for m in MODES
                )
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
