"""The table (benchmarks/HISTORY.md) of whole hopper backwards (preprocess, main kernel, dQ
cast) timed at a fixed clock, a kernel variant against its candidate (no torch or GPU).

The timing call runs a probe under Nsight Compute (``--clock-control base``, one metric,
``gpu__time_duration.sum``, the three kernels of every backward) that times each config's
variant and candidate interleaved and logs one line ``<config> <variant>[_nd] <kernel>`` per
profiled kernel, ``kernel`` one of ``pre``, ``main``, ``cast`` (``launches.txt``, committed
gzipped); ``ncu --import ... --page raw --csv`` of the report is ``ab_raw.csv.gz`` beside it.
This pairs kernels with launches in order (checking each kernel's name), takes per variant the
median of each kernel and of the backwards' sums, and prints per config and mode both variants'
times and variant / candidate of the sums (> 1: the candidate is faster)::

    cd benchmarks/results/h200/session26-851077a
    python3 ../../../../tools/hopper/backward_ab_table.py call2-8b65582-wip
"""

from __future__ import annotations

import csv
import gzip
import statistics
import sys
from pathlib import Path

from dash_attn.bench.report import markdown_table as _table

# The logged kernel -> a part of its compiled name.
KERNELS = {"pre": "BwdPreprocess", "main": "HopperAttnBwd", "cast": "DqFragmentCast"}


def backward_times(folder: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """{(config, variant as logged): {kernel: times in us, "sum": per backward}}."""
    with gzip.open(folder / "ab_raw.csv.gz", "rt") as f:
        rows = list(csv.reader(f))
    column = rows[0].index("gpu__time_duration.sum")
    name_column = rows[0].index("Kernel Name")
    if rows[1][column] != "ms":
        raise ValueError(f"{folder}: times in {rows[1][column]!r}, expected ms")
    with gzip.open(folder / "launches.txt.gz", "rt") as f:  # compressed since session 51
        launches = [line.split() for line in f.read().splitlines()]
    if len(launches) != len(rows) - 2:
        raise ValueError(f"{folder}: {len(rows) - 2} kernels, {len(launches)} launches")
    times: dict[tuple[str, str], dict[str, list[float]]] = {}
    for row, (config, variant, kernel) in zip(rows[2:], launches, strict=True):
        if KERNELS[kernel] not in row[name_column]:
            raise ValueError(f"{folder}: {kernel} logged where {row[name_column][:60]} ran")
        entry = times.setdefault((config, variant), {name: [] for name in KERNELS})
        entry[kernel].append(float(row[column].replace(",", "")) * 1e3)
    for entry in times.values():
        parts = zip(*(entry[name] for name in KERNELS), strict=True)
        entry["sum"] = [sum(kernels) for kernels in parts]
    return times


def table_rows(times: dict[tuple[str, str], dict[str, list[float]]]) -> list[list[str]]:
    """Per (config, mode), det first, then by head dim, mask and length: the base variant (the
    shortest name) and the candidate, each kernel's median and the sum's, base / candidate."""

    def order(key: tuple[str, str]) -> tuple:
        head_dim, mask, seqlen = key[0].removeprefix("d").split(":")
        return key[1] != "det", int(head_dim), mask, int(seqlen)

    groups: dict[tuple[str, str], list[str]] = {}
    for config, variant in times:
        mode = "non-det" if variant.endswith("_nd") else "det"
        groups.setdefault((config, mode), []).append(variant)
    body = []
    for config, mode in sorted(groups, key=order):
        base, candidate = sorted(groups[config, mode], key=len)
        medians = {
            name: {part: statistics.median(values) for part, values in times[config, name].items()}
            for name in (base, candidate)
        }
        head_dim, mask, seqlen = config.removeprefix("d").split(":")
        cells = [head_dim, mask, seqlen, mode, base.removesuffix("_nd")]
        for name in (base, candidate):
            cells += [f"{medians[name][part]:.0f}" for part in KERNELS]
        cells.append(f"{medians[base]['sum'] / medians[candidate]['sum']:.3f}")
        body.append(cells)
    return body


def markdown_table(folder: Path) -> str:
    header = (
        "hdim", "mask", "seqlen", "mode", "kernel", "pre us", "main us", "cast us",
        "first store: pre us", "main us", "cast us", "speed-up",
    )  # fmt: skip
    return _table(header, table_rows(backward_times(folder)), left=5)


if __name__ == "__main__":
    print(markdown_table(Path(sys.argv[1])))
