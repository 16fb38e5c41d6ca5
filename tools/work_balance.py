"""How evenly the hopper backward's static schedules spread the sweep's work over the SMs.

A persistent worker runs whole chains (one KV tile over its queries: dK/dV stay in its
registers), so a launch takes at least as long as its busiest worker. For each config of the
benchmark sweep (16384 tokens, hidden 2048, head dims 64 and 128 unless ``--headdims`` names
others, 512..16k tokens, full and causal; the hopper tiles) this prints the busiest worker's
steps over the mean, for the schedule ``auto`` picks (dynamic ones: tickets in order, each to
the first free worker) and for greedy longest-first dispatch of single chains (what FA4's
deterministic backward does with its tiles: an LPT order over one CTA per KV tile).

The sweep's shapes all have a power-of-two number of equal units (chains, or symmetric pairs
of chains), which 132 workers cannot share evenly; single causal chains of different lengths
can be packed almost perfectly.

Pure CPU, from the repository root:
``PYTHONPATH=. python tools/work_balance.py [--workers 132] [--headdims 64,128] [--out CSV]``
(the heads of each head dim are ``targets_table.SWEEP_HEADS``: the README's sweeps)
"""

from __future__ import annotations

import argparse
import csv
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from dash_attn.plan import Problem
from dash_attn.schedule import Mask, Schedule, auto_schedule_name, make_schedule, simulate
from dash_attn.schedule.invariant import place_chains
from dash_attn.schedule.report import analysis_spec
from tools.targets_table import SWEEP_HEADS

TOKENS = 16384
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)


def busiest_over_mean(schedule: Schedule) -> float:
    """The busiest worker's steps over the mean: the DAG model's non-deterministic makespan
    with unit steps and free reductions (so nothing waits) over its lower bound. Dynamic
    schedules: tickets in order, each to the first free worker, as ``simulate`` runs them."""
    result = simulate(schedule, 1.0, 0.0, ordered=False)
    return result.makespan / result.lower_bound


def lpt_busiest_over_mean(chain_steps: np.ndarray, workers: int) -> float:
    """Busiest worker over the mean when chains go, longest first, to the least busy worker."""
    load = np.zeros(workers, dtype=np.int64)
    place_chains([sorted(chain_steps.tolist(), reverse=True)], workers, load)
    return float(load.max() / load.mean())


def rows(workers: int, headdims: tuple[int, ...] = (64, 128)) -> list[dict]:
    """One row per sweep config."""
    out = []
    for headdim in headdims:
        heads = SWEEP_HEADS[headdim]
        for causal in (False, True):
            for seqlen in SEQLENS:
                problem = Problem(
                    TOKENS // seqlen, seqlen, seqlen, heads, heads, headdim, Mask(causal=causal)
                )
                spec, shape = analysis_spec(problem, workers, backend="hopper")
                name = auto_schedule_name(spec)
                schedule = make_schedule(name, spec)
                chain_steps = np.diff(schedule.chain_start)
                chain_steps = chain_steps[chain_steps > 0]
                out.append({
                    "headdim": headdim, "mask": "causal" if causal else "full",
                    "seqlen": seqlen, "tiles": f"{shape.block_m}x{shape.block_n}",
                    "workers": workers, "schedule": name, "chains": len(chain_steps),
                    "busiest_over_mean": round(busiest_over_mean(schedule), 4),
                    "lpt_single_chains": round(lpt_busiest_over_mean(chain_steps, workers), 4),
                })  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=132)
    parser.add_argument(
        "--headdims", default="64,128", help="comma-separated head dims (of 64, 96, 128, 192, 256)"
    )
    parser.add_argument("--out", type=Path, help="CSV to write (default: print only)")
    args = parser.parse_args()
    headdims = tuple(int(h) for h in args.headdims.split(","))
    if unknown := [h for h in headdims if h not in SWEEP_HEADS]:
        parser.error(f"--headdims: no sweep at {unknown}; the sweeps have {list(SWEEP_HEADS)}")
    table = rows(args.workers, headdims)
    with args.out.open("w", newline="") if args.out else nullcontext(sys.stdout) as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
