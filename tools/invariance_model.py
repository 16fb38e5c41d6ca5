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

Pure CPU. ``python tools/invariance_model.py wave|band|groups [--out CSV] [--jobs 2]``
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

from dash_attn.schedule import Dispatch, Mask, ScheduleSpec, simulate
from dash_attn.schedule.generators import (
    GENERATORS,
    RANK_ARRIVAL,
    build_schedule,
    legacy_shift,
    legacy_symmetric_shift,
)
from dash_attn.schedule.invariant import invariant_schedule
from dash_attn.schedule.report import PAPER_SEQLENS, paper_batch_heads

WAVES = (8, 16, 32, 48, 64, 96)
WORKERS = (132, 114)
TILES = {64: (128, 128), 128: (64, 128)}  # head dim -> (block_m, block_n) of the backward
BAND_WINDOWS = (512, 1024, 2048, 4096, 8192)
BAND_SEQLENS = (2048, 4096, 8192, 16384, 32768)
BAND_TILES = ((64, 128), (128, 128))


def wave_rows(job: tuple[int, bool, int, int, float, tuple[int, int]]) -> list[dict[str, Any]]:
    headdim, causal, seqlen, workers, reduce_cost, (block_m, block_n) = job
    batch, heads = paper_batch_heads(headdim, seqlen)
    mask = Mask(causal=causal)
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
        invariant=False,
    )
    name = "symmetric_shift" if causal else "shift"
    legacy = legacy_symmetric_shift if causal else legacy_shift
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
    mask = Mask(causal=causal)
    spec = ScheduleSpec.from_shape(
        batch=1,
        seqlen_q=16384,
        seqlen_k=16384,
        q_heads=32,
        kv_heads=kv_heads,
        block_m=64,
        block_n=128,
        mask=mask,
        workers=workers,
        invariant=False,
    )
    name = "symmetric_shift" if causal else "shift"
    legacy = legacy_symmetric_shift if causal else legacy_shift
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", choices=["wave", "band", "groups"])
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


if __name__ == "__main__":
    main()
