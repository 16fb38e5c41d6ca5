"""Model studies behind two choices of issue #12: the WAVE of the order-invariant schedules and
the schedule ``auto`` gives a sliding-window (local) mask.

``wave``: the paper grid (16k tokens, hidden 2048, head dims 64 and 128, seqlen 512..16k, full and
causal) at 132 workers (H200/H100 SXM) and 114 (H100 PCIe). For each shape: the makespan of
today's worker-dependent shift schedule (``invariant=False``) and of the order-invariant one for
every candidate WAVE, in the DAG model (c = 1, r = --reduce-cost).

``band``: local masks ``(window, 0)`` (a causal sliding window) and ``(window, window)``, windows
512..8192, seqlens 2k..32k (16k tokens per batch, at least one sequence), tiles 64x128 and
128x128, 132 workers: fa3, descending, and ``band_shift`` (a candidate: each chain walks its band
cyclically shifted by its index within the wave, arrival ranks, static dispatch).

``groups``: few (sequence, kv head) groups, where the paper grid has many: one 16k sequence,
32 query heads, 1..8 kv heads (GQA, or tensor parallelism leaving few kv heads per GPU), head
dim 128, full and causal, 132 and 114 workers: legacy vs WAVE 16/32/64 vs descending. A group's
rounds cannot overlap (a shift round adds to every dQ tile until its last step), so a group runs
its rounds one after another on at most WAVE workers.

``lanes``: a length-dependent lane cap, ``V = min(units, cap(kv_tiles))`` with the cap a function
of the sequence's own KV tiles (so still invariant), against WAVE 16 and the worker-dependent
tables, on the paper grid (as ``wave``) and on few groups (one 16k or 32k sequence, 32 query
heads, 1..8 kv heads, head dim 128), full and causal, 132 and 114 workers. Every policy caps at
64 lanes, at most the 114 workers of an H100 PCIe, so none raises there; a launch with fewer
workers than a sequence's cap raises ValueError in the engine, as a WAVE above them would.

Pure CPU, from the repository root (so that this checkout's ``dash_attn`` is imported):
``PYTHONPATH=. python tools/invariance_model.py wave|band|groups|lanes --out CSV [--jobs 2]``
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import time
from collections.abc import Callable
from functools import partial
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

from dash_attn.schedule import Dispatch, Mask, Schedule, ScheduleSpec, simulate
from dash_attn.schedule.generators import (
    GENERATORS,
    RANK_ARRIVAL,
    build_schedule,
    legacy_shift,
    legacy_symmetric_shift,
)
from dash_attn.schedule.invariant import LaneCap, invariant_schedule, lanes_per_group
from dash_attn.schedule.report import PAPER_SEQLENS, paper_batch_heads

WAVES = (8, 16, 32, 48, 64, 96)
WORKERS = (132, 114)
TILES = {64: (128, 128), 128: (64, 128)}  # head dim -> (block_m, block_n) of the backward
BAND_WINDOWS = (512, 1024, 2048, 4096, 8192)
BAND_SEQLENS = (2048, 4096, 8192, 16384, 32768)
BAND_TILES = ((64, 128), (128, 128))


def shift_spec(
    causal: bool,
    batch: int,
    seqlen: int,
    q_heads: int,
    kv_heads: int,
    tiles: tuple[int, int],
    workers: int,
) -> tuple[ScheduleSpec, str, Callable[[ScheduleSpec], Schedule]]:
    """The worker-dependent spec of one square shape, the shift schedule its mask takes and
    that schedule's legacy (worker-dependent) generator: what every study compares against."""
    spec = ScheduleSpec.from_shape(
        batch=batch, seqlen_q=seqlen, seqlen_k=seqlen, q_heads=q_heads, kv_heads=kv_heads,
        block_m=tiles[0], block_n=tiles[1], mask=Mask(causal=causal), workers=workers,
        invariant=False,
    )  # fmt: skip
    if causal:
        return spec, "symmetric_shift", legacy_symmetric_shift
    return spec, "shift", legacy_shift


def wave_rows(job: tuple[int, bool, int, int, float, tuple[int, int]]) -> list[dict[str, Any]]:
    headdim, causal, seqlen, workers, reduce_cost, (block_m, block_n) = job
    batch, heads = paper_batch_heads(headdim, seqlen)
    spec, name, legacy = shift_spec(
        causal, batch, seqlen, heads, heads, (block_m, block_n), workers
    )
    mask = spec.mask
    base = dict(
        headdim=headdim,
        block_m=block_m,
        block_n=block_n,
        mask=mask.name,
        seqlen=seqlen,
        batch=batch,
        heads=heads,
        workers=workers,
        schedule=name,
        cost_r=reduce_cost,
    )
    runs: list[tuple[str, Any]] = [("legacy", lambda: legacy(spec))]
    invariant_spec = dataclasses.replace(spec, invariant=True)
    for wave in WAVES:
        runs.append(
            (str(wave), lambda w=wave: invariant_schedule(name, invariant_spec, legacy, wave=w))
        )
    runs.append(("descending", lambda: GENERATORS["descending"](spec)))
    rows = []
    legacy_makespan = None
    for label, build in runs:
        try:
            schedule = build()
        except ValueError as exc:  # a group wider than the workers
            rows.append({**base, "wave": label, "makespan": "", "note": str(exc)[:60]})
            continue
        sim = simulate(schedule, 1.0, reduce_cost)
        if label == "legacy":
            legacy_makespan = sim.makespan
        rows.append(
            {
                **base,
                "wave": label,
                "makespan": sim.makespan,
                "lower_bound": sim.lower_bound,
                "loss_vs_legacy": sim.makespan / legacy_makespan - 1 if legacy_makespan else "",
                "note": "",
            }
        )
    return rows


def group_rows(job: tuple[bool, int, int, float]) -> list[dict[str, Any]]:
    causal, kv_heads, workers, reduce_cost = job
    spec, name, legacy = shift_spec(causal, 1, 16384, 32, kv_heads, (64, 128), workers)
    mask = spec.mask
    base = dict(mask=mask.name, seqlen=16384, q_heads=32, kv_heads=kv_heads, workers=workers)
    invariant_spec = dataclasses.replace(spec, invariant=True)
    runs: list[tuple[str, Any]] = [("legacy", lambda: legacy(spec))]
    for wave in (16, 32, 64):
        runs.append(
            (f"wave{wave}", lambda w=wave: invariant_schedule(name, invariant_spec, legacy, wave=w))
        )
    runs.append(("descending", lambda: GENERATORS["descending"](spec)))
    rows, legacy_makespan = [], 0.0
    for label, build in runs:
        makespan = simulate(build(), 1.0, reduce_cost).makespan
        legacy_makespan = legacy_makespan or makespan
        rows.append(
            {**base, "schedule": label, "makespan": makespan,
             "loss_vs_legacy": makespan / legacy_makespan - 1}
        )  # fmt: skip
    return rows


def band_shift(spec: ScheduleSpec) -> Any:
    """Candidate band schedule: chain j walks its band starting at offset (j mod P) mod width."""

    def order(chain: int) -> np.ndarray:
        rest, kv_tile = divmod(chain, spec.kv_tiles)
        b = rest // spec.kv_heads
        lo, hi = spec.q_tile_range(b, kv_tile)
        width = hi - lo
        if width == 0:
            return np.zeros(0, dtype=np.int64)
        return lo + (chain % spec.workers + np.arange(width)) % width

    units = [[chain] for chain in spec.live_chains().tolist()]
    return build_schedule("band_shift", spec, Dispatch.STATIC, order, units, RANK_ARRIVAL)


def band_rows(job: tuple[int, int, tuple[int, int], int, str, float]) -> list[dict[str, Any]]:
    window, seqlen, tiles, workers, shape, reduce_cost = job
    block_m, block_n = tiles
    headdim = 64 if block_m == 128 else 128
    batch, heads = paper_batch_heads(headdim, seqlen)
    mask = Mask(window_left=window, window_right=0 if shape == "left" else window)
    spec = ScheduleSpec.from_shape(
        batch=batch,
        seqlen_q=seqlen,
        seqlen_k=seqlen,
        q_heads=heads,
        kv_heads=heads,
        block_m=block_m,
        block_n=block_n,
        mask=mask,
        workers=workers,
    )
    base = dict(
        mask=mask.name,
        window=window,
        seqlen=seqlen,
        block_m=block_m,
        block_n=block_n,
        batch=batch,
        heads=heads,
        workers=workers,
        tasks=spec.num_tasks(),
        cost_r=reduce_cost,
    )
    rows = []
    for name, build in (
        ("fa3", GENERATORS["fa3"]),
        ("descending", GENERATORS["descending"]),
        ("band_shift", band_shift),
    ):
        sim = simulate(build(spec), 1.0, reduce_cost)
        rows.append(
            {
                **base,
                "schedule": name,
                "makespan": sim.makespan,
                "lower_bound": sim.lower_bound,
                "efficiency": sim.lower_bound / sim.makespan,
            }
        )
    return rows


def constant_cap(lanes: int, kv_tiles: int) -> int:
    """Today's rule: the same cap for every length (``WAVE``)."""
    return lanes


def step_cap(lanes: int, from_tiles: int, kv_tiles: int) -> int:
    """16 lanes, ``lanes`` from ``from_tiles`` KV tiles on (8k tokens = 64 tiles of 128 keys)."""
    return lanes if kv_tiles >= from_tiles else 16


def clamp_cap(divisor: int, kv_tiles: int) -> int:
    """One lane per ``divisor`` KV tiles, between 16 and 64."""
    return min(max(kv_tiles // divisor, 16), 64)


# Policies of the ``lanes`` study (partials, so that the pool's workers can take them by name).
# Every cap is at most 64 <= 114 workers: no policy can ask an H100 PCIe for more lanes than SMs.
LANE_POLICIES: dict[str, LaneCap] = {
    "wave16": partial(constant_cap, 16),
    "wave32": partial(constant_cap, 32),
    "wave64": partial(constant_cap, 64),
    "32from64t": partial(step_cap, 32, 64),
    "32from128t": partial(step_cap, 32, 128),
    "64from128t": partial(step_cap, 64, 128),
    "64from256t": partial(step_cap, 64, 256),
    "clamp_t/2": partial(clamp_cap, 2),
    "clamp_t/4": partial(clamp_cap, 4),
    "clamp_t/8": partial(clamp_cap, 8),
}
FEW_GROUPS_SEQLENS = (16384, 32768)
FEW_GROUPS_KV_HEADS = (1, 2, 4, 8)


def lane_rows(
    job: tuple[str, int, bool, int, int, int, float, tuple[int, int]],
) -> list[dict[str, Any]]:
    """One row per shape: the makespan of the worker-dependent tables, and every policy's (and
    ``descending``'s) loss against it. The canonical layout depends on ``V`` alone, so each
    distinct ``V`` is simulated once and shared by the policies that give it."""
    study, headdim, causal, seqlen, kv_heads, workers, reduce_cost, tiles = job
    block_m, block_n = tiles
    if study == "grid":
        batch, q_heads = paper_batch_heads(headdim, seqlen)
        kv_heads = q_heads
    else:
        batch, q_heads = 1, 32
    spec, name, legacy = shift_spec(causal, batch, seqlen, q_heads, kv_heads, tiles, workers)
    mask = spec.mask
    invariant_spec = dataclasses.replace(spec, invariant=True)
    legacy_makespan = simulate(legacy(spec), 1.0, reduce_cost).makespan
    descending = simulate(GENERATORS["descending"](spec), 1.0, reduce_cost).makespan
    row: dict[str, Any] = dict(
        study=study,
        headdim=headdim,
        block_m=block_m,
        block_n=block_n,
        mask=mask.name,
        seqlen=seqlen,
        batch=batch,
        q_heads=q_heads,
        kv_heads=kv_heads,
        kv_tiles=spec.kv_tiles,
        workers=workers,
        legacy=round(legacy_makespan, 1),
        descending=round(descending / legacy_makespan - 1, 4),
    )
    by_lanes: dict[int, float | None] = {}
    for label, cap in LANE_POLICIES.items():
        lanes = lanes_per_group(name, spec.kv_tiles, cap)
        if lanes not in by_lanes:
            try:
                schedule = invariant_schedule(name, invariant_spec, legacy, wave=cap)
                by_lanes[lanes] = simulate(schedule, 1.0, reduce_cost).makespan
            except ValueError:  # V > workers: the engine refuses; no policy here reaches it
                by_lanes[lanes] = None
        makespan = by_lanes[lanes]
        row[f"V:{label}"] = lanes
        row[label] = "" if makespan is None else round(makespan / legacy_makespan - 1, 4)
    return [row]


def geomean_loss(losses: list[float]) -> float:
    """Geometric mean of the makespan ratios, minus one (as the WAVE docstring reports)."""
    return math.exp(sum(math.log1p(loss) for loss in losses) / len(losses)) - 1


def lane_summary(rows: list[dict[str, Any]]) -> str:
    """Per policy, study and worker count: loss vs legacy and vs WAVE 16 (geometric mean, max),
    and the largest ``V`` it asked for."""
    lines = [
        "| policy | study | workers | vs legacy: gmean | max | vs wave16: gmean | max | min "
        "| max V |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label in LANE_POLICIES:
        for study in ("grid", "few"):
            for workers in WORKERS:
                part = [r for r in rows if r["study"] == study and r["workers"] == workers]
                if not part or any(r[label] == "" for r in part):
                    continue
                losses = [float(r[label]) for r in part]
                vs16 = [(1 + float(r[label])) / (1 + float(r["wave16"])) - 1 for r in part]
                lines.append(
                    f"| {label} | {study} | {workers} | {geomean_loss(losses):+.1%} "
                    f"| {max(losses):+.1%} | {geomean_loss(vs16):+.1%} | {max(vs16):+.1%} "
                    f"| {min(vs16):+.1%} | {max(int(r[f'V:{label}']) for r in part)} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", choices=["wave", "band", "groups", "lanes"])
    parser.add_argument("--reduce-cost", type=float, default=0.3, help="r / c (H200: ~0.3)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="CSV of every row")
    parser.add_argument(
        "--hd64-tiles",
        default="128x128",
        help="wave study: BLOCK_MxBLOCK_N at head dim 64 (128x128 hopper and triton today)",
    )
    args = parser.parse_args()
    tiles = dict(TILES)
    block_m, _, block_n = args.hd64_tiles.partition("x")
    tiles[64] = (int(block_m), int(block_n))
    r = args.reduce_cost
    if args.study == "wave":
        jobs: list[Any] = [
            (headdim, causal, seqlen, workers, r, tiles[headdim])
            for workers in WORKERS
            for headdim in tiles
            for causal in (False, True)
            for seqlen in PAPER_SEQLENS
        ]
        work = wave_rows
    elif args.study == "groups":
        jobs = [(c, kv, w, r) for w in WORKERS for c in (False, True) for kv in (1, 2, 4, 8)]
        work = group_rows
    elif args.study == "lanes":
        # Longest jobs first (32k few-groups shapes), so the pool does not end on one of them.
        jobs = [
            ("few", 128, causal, seqlen, kv, w, r, tiles[128])
            for seqlen in FEW_GROUPS_SEQLENS[::-1]
            for w in WORKERS
            for causal in (False, True)
            for kv in FEW_GROUPS_KV_HEADS
        ] + [
            ("grid", headdim, causal, seqlen, 0, w, r, tiles[headdim])
            for w in WORKERS
            for headdim in tiles
            for causal in (False, True)
            for seqlen in PAPER_SEQLENS
        ]
        work = lane_rows
    else:
        jobs = [
            (window, seqlen, tiles, 132, shape, r)
            for shape in ("left", "both")
            for tiles in BAND_TILES
            for seqlen in BAND_SEQLENS
            for window in BAND_WINDOWS
            if window < seqlen
        ]
        work = band_rows
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with Pool(args.jobs) as pool:
        for done, result in enumerate(pool.imap_unordered(work, jobs), 1):
            rows.extend(result)
            print(f"{done}/{len(jobs)} jobs, {time.perf_counter() - started:.0f} s", flush=True)
    keys = list(dict.fromkeys(key for row in rows for key in row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda row: [str(row[k]) for k in keys[:8]]))
    print(f"wrote {args.out} ({len(rows)} rows)")
    if args.study == "lanes":
        print(lane_summary(rows))


if __name__ == "__main__":
    main()
