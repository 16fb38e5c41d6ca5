"""How much of a backward's Q, dO and dQ traffic an L2 of a given size would miss, by schedule.

Why: at head dim 256 the static (shift) tables read 3-7x more bytes from DRAM than
``descending`` (Nsight Compute, session 44, benchmarks/NOTES.md item 220), and the DAG model
(``schedule.simulate``) has no memory in it. This replays a plan's steps in the DAG model's
time order as tile accesses (per step: its Q + dO + LSE/delta rows read, its fp32 dQ partial
added in L2; per chain: its K and V read once) through a least-recently-used cache of
``--l2-mib`` and reports the bytes that miss. A model: one LRU for the whole L2 (the H200's is
two partitions with their own policy), DAG times (c = 1, r = 0.3) rather than measured ones. It
ranks orders and placements against each other; its absolute numbers are not Nsight's.

    python -m tools.l2_model --headdim 256 --seqlen 8192 --mask causal [--wave 16 32 64]
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from dash_attn.plan import CAUSAL, FULL, H200, Problem, make_backward_plan
from dash_attn.schedule import Schedule, simulate
from dash_attn.schedule.generators import legacy_shift, legacy_symmetric_shift
from dash_attn.schedule.invariant import LaneCap, invariant_schedule, units_per_group
from dash_attn.schedule.types import ScheduleSpec


# Bytes of one row, bf16 inputs: Q and dO (2 x 2 x d), LSE and delta (2 x 4); dQ in fp32.
def _row_bytes(headdim: int) -> tuple[int, int, int]:
    """(Q + dO + LSE + delta, dQ accumulator, K + V) bytes per row."""
    return 4 * headdim + 8, 4 * headdim, 4 * headdim


@dataclass(frozen=True)
class Traffic:
    """What one schedule's replay missed."""

    name: str
    makespan: float
    touched_gb: float
    missed_gb: float

    @property
    def hit_rate(self) -> float:
        return 1.0 - self.missed_gb / self.touched_gb if self.touched_gb else 1.0


def replay(
    schedule: Schedule,
    headdim: int,
    q_rows: int,
    kv_rows: int,
    l2_bytes: int,
    name: str | None = None,
) -> Traffic:
    """Replay ``schedule``'s steps (DAG times) through an LRU of ``l2_bytes``."""
    sim = simulate(schedule, 1.0, 0.3)
    spec = schedule.spec
    qdo_row, dq_row, kv_row = _row_bytes(headdim)
    chain_of_step = np.repeat(
        np.arange(schedule.num_chains), np.diff(np.asarray(schedule.chain_start, dtype=np.int64))
    )
    heads = np.asarray(schedule.step_q_head, dtype=np.int64)
    tiles = np.asarray(schedule.step_q_tile, dtype=np.int64)
    first = np.asarray(schedule.chain_start, dtype=np.int64)[:-1]
    per_batch = spec.kv_heads * spec.kv_tiles
    events: list[tuple[float, int, tuple, int]] = []
    for step in range(schedule.num_steps):
        chain = int(chain_of_step[step])
        key = (chain // per_batch, int(heads[step]), int(tiles[step]))
        t0 = float(sim.compute_start[step])
        if step == first[chain]:
            events.append((t0, 0, ("kv", chain), kv_row * kv_rows))
        events.append((t0, 1, ("qdo",) + key, qdo_row * q_rows))
        events.append((float(sim.reduce_start[step]), 2, ("dq",) + key, dq_row * q_rows))
    events.sort(key=lambda e: (e[0], e[1]))
    cache: OrderedDict[tuple, int] = OrderedDict()
    held = touched = missed = 0
    for _, _, key, size in events:
        touched += size
        if key in cache:
            cache.move_to_end(key)
            continue
        missed += size
        cache[key] = size
        held += size
        while held > l2_bytes:
            _, evicted = cache.popitem(last=False)
            held -= evicted
    return Traffic(name or schedule.name, sim.makespan, touched / 1e9, missed / 1e9)


def contenders(problem: Problem, waves: list[str]) -> list[tuple[str, Schedule]]:
    """The plan's own tables, descending, invariant=False, and the shift family at other
    WAVEs (the study's ``wave`` argument of ``invariant_schedule``)."""
    plan = make_backward_plan(problem, device=H200, backend="hopper")
    spec: ScheduleSpec = plan.spec
    out = [(f"{plan.schedule.name} (shipped)", plan.schedule)]
    down = make_backward_plan(problem, device=H200, backend="hopper", schedule="descending")
    out.append(("descending", down.schedule))
    loose = make_backward_plan(
        problem, device=H200, backend="hopper", invariant=False, schedule=plan.schedule.name
    )
    out.append((f"{plan.schedule.name} invariant=False", loose.schedule))
    legacy = legacy_symmetric_shift if problem.mask == CAUSAL else legacy_shift
    name = "symmetric_shift" if problem.mask == CAUSAL else "shift"
    for wave in waves:
        cap = lane_cap(wave, name)
        out.append((f"{name} lanes {wave}", invariant_schedule(name, spec, legacy, cap)))
    return out


def lane_cap(wave: str, name: str) -> int | LaneCap:
    """``"32"``: WAVE 32; ``"b64"``: at most 64 lanes, as few rounds as that allows, the units
    dealt evenly over them (a function of the sequence's KV tiles alone)."""
    if not wave.startswith("b"):
        return int(wave)
    most = int(wave[1:])

    def balanced(kv_tiles: int) -> int:
        units = units_per_group(name, kv_tiles)
        rounds = -(-units // most)
        return -(-units // rounds)

    return balanced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headdim", type=int, default=256)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--mask", choices=("full", "causal"), default="causal")
    parser.add_argument("--tokens", type=int, default=16384, help="batch x seqlen")
    parser.add_argument("--hidden", type=int, default=2048, help="heads x headdim")
    parser.add_argument("--l2-mib", type=float, default=50.0)
    parser.add_argument("--wave", nargs="*", default=["32", "64", "b64"])
    args = parser.parse_args(argv)
    heads = args.hidden // args.headdim
    problem = Problem(
        batch=max(1, args.tokens // args.seqlen),
        seqlen_q=args.seqlen,
        seqlen_k=args.seqlen,
        heads=heads,
        kv_heads=heads,
        headdim=args.headdim,
        mask=CAUSAL if args.mask == "causal" else FULL,
    )
    plan = make_backward_plan(problem, device=H200, backend="hopper")
    q_rows, kv_rows = plan.tiles.block_m, plan.tiles.block_n
    print(f"{problem}, tiles {q_rows} x {kv_rows}, L2 {args.l2_mib} MiB")
    print(f"{'tables':36s} {'makespan':>9s} {'touched GB':>10s} {'missed GB':>9s} {'hit %':>6s}")
    for name, schedule in contenders(problem, args.wave):
        t = replay(schedule, args.headdim, q_rows, kv_rows, int(args.l2_mib * 2**20), name)
        print(
            f"{name:36s} {t.makespan:9.0f} {t.touched_gb:10.3f} {t.missed_gb:9.3f} "
            f"{100 * t.hit_rate:6.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
