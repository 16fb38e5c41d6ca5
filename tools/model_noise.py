"""What the DAG model predicts for the cost of determinism when step times are not all equal.

The plain model (every step costs c) says the shift schedules never wait, yet on the H200 the
deterministic kernel loses ~12% to waiting at head dim 128 (benchmarks/NOTES.md, attempt 6). This
script asks the model whether unequal step times explain it: for each config it simulates the
schedule `auto` picks with per-step compute costs drawn around c, once with the summation order
(deterministic) and once without it (the non-deterministic kernel on the same tables), and
reports the ratio of the makespans (= predicted det / non-det throughput). Two kinds of noise:

* ``step``: every step's cost independently c * (1 + sigma * z), z ~ N(0, 1);
* ``worker``: one persistent factor per worker (an SM that is slower all the way through).

Pure CPU. ``python tools/model_noise.py [--out benchmarks/results/model/noise.csv]``
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from dash_attn.schedule import auto_schedule_name, make_schedule, simulate
from dash_attn.schedule.generators import step_depth_and_worker
from dash_attn.schedule.report import DEFAULT_WORKERS, paper_batch_heads, square_spec

CONFIGS = [(128, False, 4096), (128, True, 4096), (128, True, 16384), (64, True, 8192)]
SIGMAS = (0.05, 0.1, 0.2)


def noisy_costs(
    kind: str, sigma: float, worker: np.ndarray, workers: int, rng: np.random.Generator
) -> np.ndarray:
    if kind == "step":
        factor = 1.0 + sigma * rng.standard_normal(len(worker))
    elif kind == "worker":
        factor = (1.0 + sigma * rng.standard_normal(workers))[worker]
    else:
        raise ValueError(f"noise kind must be 'step' or 'worker', got {kind!r}")
    return np.maximum(factor, 0.05)  # c = 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reduce-cost", type=float, default=0.3, help="r / c (H200: ~0.3)")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--out", type=Path, default=None, help="CSV of every row")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    started = time.perf_counter()
    print(f"r/c = {args.reduce_cost}, {args.trials} trials, {args.workers} workers")
    print("hdim  mask    seqlen  schedule         noise   sigma  det/nondet (model)")
    for headdim, causal, seqlen in CONFIGS:
        batch, heads = paper_batch_heads(headdim, seqlen)
        spec = square_spec(headdim, seqlen, batch, heads, causal, args.workers)
        name = auto_schedule_name(spec)
        schedule = make_schedule(name, spec)
        _, worker = step_depth_and_worker(schedule)
        for kind in ("step", "worker"):
            for sigma in SIGMAS:
                ratios = []
                for _ in range(args.trials):
                    costs = noisy_costs(kind, sigma, worker, spec.workers, rng)
                    ordered = simulate(schedule, costs, args.reduce_cost).makespan
                    free = simulate(schedule, costs, args.reduce_cost, ordered=False).makespan
                    ratios.append(free / ordered)
                ratio = float(np.mean(ratios))
                mask = "causal" if causal else "full"
                print(
                    f"{headdim:<5} {mask:<7} {seqlen:>6}  {name:<16} {kind:<7} {sigma:>5.2f}"
                    f"  {ratio:.3f}",
                    flush=True,
                )
                rows.append(
                    dict(
                        headdim=headdim, causal=causal, seqlen=seqlen, schedule=name,
                        noise=kind, sigma=sigma, reduce_over_compute=args.reduce_cost,
                        trials=args.trials, det_over_nondet=ratio,
                    )
                )  # fmt: skip
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
