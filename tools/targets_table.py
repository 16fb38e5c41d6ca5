"""Where issue #10's speed targets stand, from the newest committed run of each sweep config.

The issue sets its targets on the benchmark sweep (16384 tokens in bf16, 512..16k per sequence,
full and causal; hidden 2048 at head dims 64 and 128, the "24 configs", and the same grid at
96, 192 and 256 with the heads of ``SWEEP_HEADS``):

- the hopper backend's deterministic backward (``dash_hopper_auto``) at >= 0.9x FA4's
  deterministic backward on every config, with the goal >= 1.0x, and >= 1.10x in the cells where
  FA4-det loses most to its own non-deterministic kernel (full mask up to 4k tokens, causal up to
  1k, at head dims 64 and 128);
- deterministic at >= 0.95x our own non-deterministic backward (``dash_hopper_nondet``);
- the hopper forward at >= 0.9x FA4's forward (``fa4_nondet``, or where a run timed only
  ``fa4_det``, that: FA4's det flag only changes its backward, so both run one forward kernel).

Every ``bench.csv`` (or ``bench.csv.gz``) under the results folder is read; rows off the sweep
grid are ignored. Each config takes the newest run (by the rows' ``date``) that timed both
providers of a comparison, so the table follows the kernels as new runs are committed, and each
row names its run's commit and round count. Ratios are of TFLOPS (the median round); the range
is over the interleaved rounds, a round's ratio taken from the two providers' times in it.

Pure CPU, from the repository root:
``python -m tools.targets_table [--results benchmarks/results/h200]``
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dash_attn.bench.report import markdown_table, read_csv

TOKENS = 16384
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# Query heads of the sweep at each head dim (hidden 2048 at 64 and 128, the 24 configs;
# 3072 at 96, and 3072 / 2048 at 192 / 256).
SWEEP_HEADS = {64: 32, 96: 32, 128: 16, 192: 16, 256: 8}
FLOOR, GOAL, DASH_CELL_GOAL, DET_OVER_NONDET, FWD_FLOOR = 0.9, 1.0, 1.10, 0.95, 0.9

DET, NONDET, FA4_DET, FA4_NONDET = "dash_hopper_auto", "dash_hopper_nondet", "fa4_det", "fa4_nondet"

Config = tuple[str, int, bool, int]  # (mode, headdim, causal, seqlen)


@dataclass(frozen=True)
class Comparison:
    """One provider over another at one config, from one run.

    >>> c = Comparison(1.05, 1.01, 1.08, 3, "4e9179e")
    >>> c.cell()
    '1.05x (1.01-1.08)'
    >>> Comparison(0.97, 0.97, 0.97, 1, "4e9179e").cell()
    '0.97x'
    """

    ratio: float
    low: float
    high: float
    rounds: int
    commit: str

    def cell(self) -> str:
        if self.rounds < 2:
            return f"{self.ratio:.2f}x"
        return f"{self.ratio:.2f}x ({self.low:.2f}-{self.high:.2f})"


def dash_cell(headdim: int, causal: bool, seqlen: int) -> bool:
    """The cells where the issue asks >= 1.10x FA4-det: FA4-det loses most to its own non-det
    there (full mask up to 4k tokens, causal up to 1k), on the 24 configs (head dims 64, 128).

    >>> [dash_cell(64, False, 4096), dash_cell(64, True, 2048), dash_cell(96, False, 1024)]
    [True, False, False]
    """
    return headdim in (64, 128) and seqlen <= (1024 if causal else 4096)


def on_sweep_grid(row: Mapping[str, object]) -> bool:
    headdim, seqlen = int(row["headdim"]), int(row["seqlen"])  # type: ignore[call-overload]
    return (
        row.get("dtype") == "bf16"
        and seqlen in SEQLENS
        and int(row["batch"]) * seqlen == TOKENS  # type: ignore[call-overload]
        and SWEEP_HEADS.get(headdim) == int(row["heads"])  # type: ignore[call-overload]
    )


def _round_times(row: Mapping[str, object]) -> list[float]:
    text = str(row.get("ms_rounds") or "")
    return [float(t) for t in text.split()] if text else [float(row["ms"])]  # type: ignore[arg-type]


def compare(num: Mapping[str, object], den: Mapping[str, object]) -> Comparison:
    """``num`` over ``den`` (TFLOPS), with the range of the per-round ratios (time of ``den`` over
    time of ``num`` in the same round); rounds missing in either count as none.

    >>> a = {"tflops": 110.0, "ms": 1.0, "ms_rounds": "1.0 0.9 1.1", "commit": "abc"}
    >>> b = {"tflops": 100.0, "ms": 1.1, "ms_rounds": "1.1 1.0 1.1", "commit": "abc"}
    >>> compare(a, b).cell()
    '1.10x (1.00-1.11)'
    """
    ratio = float(num["tflops"]) / float(den["tflops"])  # type: ignore[arg-type]
    mine, theirs = _round_times(num), _round_times(den)
    same_rounds = len(mine) == len(theirs)
    per_round = [t / m for m, t in zip(mine, theirs, strict=True)] if same_rounds else [ratio]
    return Comparison(
        ratio, min(per_round), max(per_round), len(per_round), str(num.get("commit", ""))
    )


def newest_runs(results: Path) -> list[tuple[str, list[dict]]]:
    """``(name, rows on the sweep grid)`` of every run under ``results``, newest first (by its
    rows' latest ``date``; ISO dates sort as text)."""
    runs = []
    for path in sorted(results.rglob("bench.csv*")):
        if path.name not in ("bench.csv", "bench.csv.gz"):
            continue
        rows = [row for row in read_csv(path) if on_sweep_grid(row)]
        if rows:
            name = str(path.relative_to(results)).removesuffix(".gz").removesuffix("/bench.csv")
            runs.append((max(str(row["date"]) for row in rows), name, rows))
    runs.sort(key=lambda run: run[0], reverse=True)
    return [(name, rows) for _, name, rows in runs]


def latest(
    runs: Sequence[tuple[str, list[dict]]], mode: str, num: str, den: str | Sequence[str]
) -> dict[Config, tuple[Comparison, str]]:
    """Per config of ``mode``: ``num`` over ``den`` from the newest run that timed both.

    ``den`` may name several providers that time the same kernel, in order of preference: a run
    counts if it timed ``num`` and any of them, and the first it timed is taken."""
    dens = (den,) if isinstance(den, str) else tuple(den)
    found: dict[Config, tuple[Comparison, str]] = {}
    for name, rows in runs:
        by_config: dict[Config, dict[str, dict]] = {}
        for row in rows:
            if row["mode"] == mode:
                key = (mode, int(row["headdim"]), bool(row["causal"]), int(row["seqlen"]))
                by_config.setdefault(key, {})[str(row["provider"])] = row
        for key, providers in by_config.items():
            timed = [d for d in dens if d in providers]
            if key not in found and num in providers and timed:
                found[key] = (compare(providers[num], providers[timed[0]]), name)
    return dict(sorted(found.items()))


def _seq(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen >= 1024 else str(seqlen)


def _met(value: float, target: float) -> str:
    return "yes" if round(value, 2) >= target else "**no**"


def _run(name: str, comparison: Comparison) -> str:
    """A table's run column: the run's folder, commit and round count."""
    return f"{name} ({comparison.commit}, {comparison.rounds} rounds)"


def backward_table(runs: Sequence[tuple[str, list[dict]]]) -> tuple[str, list[str]]:
    """The backward's table (one row per config) and its count lines."""
    vs_fa4 = latest(runs, "bwd", DET, FA4_DET)
    vs_nondet = latest(runs, "bwd", DET, NONDET)
    header = ["hdim", "mask", "seqlen", "det / FA4-det", "goal", "met", "det / non-det", "run"]
    body, counts = [], {"floor": 0, "goal": 0, "cells": 0, "cells_met": 0, "nondet": 0}
    for (_, headdim, causal, seqlen), (comparison, name) in vs_fa4.items():
        cell = dash_cell(headdim, causal, seqlen)
        target = DASH_CELL_GOAL if cell else GOAL
        value = round(comparison.ratio, 2)
        counts["floor"] += value >= FLOOR
        counts["goal"] += value >= GOAL
        counts["cells"] += cell
        counts["cells_met"] += cell and value >= DASH_CELL_GOAL
        own = vs_nondet.get(("bwd", headdim, causal, seqlen))
        own_text = "-"
        run_text = _run(name, comparison)
        if own is not None:
            own_comparison, own_name = own
            counts["nondet"] += round(own_comparison.ratio, 2) >= DET_OVER_NONDET
            own_text = f"{own_comparison.cell()} {_met(own_comparison.ratio, DET_OVER_NONDET)}"
            if own_name != name:
                # A newer run timed det and non-det without FA4: the row names both runs.
                run_text += f"; det / non-det: {_run(own_name, own_comparison)}"
        body.append([
            str(headdim), "causal" if causal else "full", _seq(seqlen), comparison.cell(),
            f">= {target:.2f}x", _met(comparison.ratio, target), own_text, run_text,
        ])  # fmt: skip
    total = len(vs_fa4)
    lines = [
        f"- det / FA4-det >= {FLOOR}x (the floor): {counts['floor']} of {total} configs; "
        f">= {GOAL:.1f}x (the goal): {counts['goal']} of {total}.",
        f"- >= {DASH_CELL_GOAL:.2f}x in the cells where FA4-det loses most (full <= 4k, causal "
        f"<= 1k at head dims 64 and 128): {counts['cells_met']} of {counts['cells']}.",
        f"- det / our non-det >= {DET_OVER_NONDET}x: {counts['nondet']} of {len(vs_nondet)}.",
    ]
    return markdown_table(header, body, left=3), lines


def forward_table(runs: Sequence[tuple[str, list[dict]]]) -> tuple[str, list[str]]:
    """The forward's table and its count line."""
    vs_fa4 = latest(runs, "fwd", DET, (FA4_NONDET, FA4_DET))
    header = ["hdim", "mask", "seqlen", "hopper / FA4", f">= {FWD_FLOOR}x", "run"]
    body, met = [], 0
    for (_, headdim, causal, seqlen), (comparison, name) in vs_fa4.items():
        met += round(comparison.ratio, 2) >= FWD_FLOOR
        body.append([
            str(headdim), "causal" if causal else "full", _seq(seqlen), comparison.cell(),
            _met(comparison.ratio, FWD_FLOOR),
            _run(name, comparison),
        ])  # fmt: skip
    lines = [
        f"- forward / FA4's >= {FWD_FLOOR}x: {met} of {len(vs_fa4)} configs; >= {GOAL:.1f}x: "
        f"{sum(round(c.ratio, 2) >= GOAL for c, _ in vs_fa4.values())} of {len(vs_fa4)}."
    ]
    return markdown_table(header, body, left=3), lines


def _geomean_cell(ratios: Sequence[float]) -> str:
    """``"geomean (min-max)"`` of ``ratios``, or ``"-"`` if there are none.

    >>> _geomean_cell([1.0, 1.21])
    '1.10x (1.00-1.21)'
    >>> _geomean_cell([])
    '-'
    """
    if not ratios:
        return "-"
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return f"{mean:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def by_headdim_table(runs: Sequence[tuple[str, list[dict]]]) -> str:
    """Per head dim and mask, over its seqlens: the geometric mean (and range) of det / FA4-det,
    of what determinism costs us (det / our non-det) and what it costs FA4 (FA4-det / FA4's
    non-det), each config from the newest run that timed that pair."""
    pairs = (
        latest(runs, "bwd", DET, FA4_DET),
        latest(runs, "bwd", DET, NONDET),
        latest(runs, "bwd", FA4_DET, FA4_NONDET),
    )
    groups = sorted({(hd, causal) for found in pairs for (_, hd, causal, _) in found})
    header = ["hdim", "mask", "det / FA4-det", "det / non-det", "FA4-det / FA4 non-det"]
    body = []
    for headdim, causal in groups:
        cells = []
        for found in pairs:
            ratios = [
                c.ratio for (_, hd, cs, _), (c, _) in found.items() if (hd, cs) == (headdim, causal)
            ]
            cells.append(_geomean_cell(ratios))
        body.append([str(headdim), "causal" if causal else "full", *cells])
    return markdown_table(header, body, left=2)


def report(results: Path) -> str:
    """The markdown the README's "Issue #10's targets" section holds."""
    runs = newest_runs(results)
    backward, backward_counts = backward_table(runs)
    forward, forward_counts = forward_table(runs)
    by_headdim = by_headdim_table(runs)
    return "\n".join(
        ["Backward:", "", backward, "", *backward_counts, "",
         "Backward by head dim and mask (geometric mean over the seqlens, range in brackets;"
         " a ratio below 1.0x in the last two columns is what determinism costs):", "",
         by_headdim, "", "Forward:", "", forward, "", *forward_counts]
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, default=Path("benchmarks/results/h200"),
        help="folder searched for bench.csv and bench.csv.gz (default %(default)s)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"--results: no folder {args.results}")
    print(report(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
