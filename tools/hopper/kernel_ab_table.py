"""The table (benchmarks/HISTORY.md) of hopper backward variants timed at a fixed clock (no
torch or GPU).

A timing call runs a probe under Nsight Compute (``--clock-control base``, one metric,
``gpu__time_duration.sum``) that launches each config's variants interleaved, and logs one line
``<config> <variant>[_nd]`` per profiled kernel; ``ncu --import ... --page raw --csv`` of the
report is ``ab_raw.csv.gz`` beside that log (``launches.txt``, committed gzipped; a second
pair, ``nostore_raw.csv.gz`` and ``nostore_launches.txt.gz``, may hold a probe without the dK/dV
stores). This pairs kernels with launches in order, takes each variant's median and prints,
per config and mode, the shipped kernel's time and shipped / variant for each kind of variant
(> 1: the variant is faster). A kind found in several calls shows each call's ratio, in the
order the folders are given::

    cd benchmarks/results/h200/session25-814acab
    python3 ../../../../tools/hopper/kernel_ab_table.py call1-814acab-wip call2-814acab-wip \
        call3-814acab-wip
"""

from __future__ import annotations

import csv
import gzip
import statistics
import sys
from pathlib import Path

from dash_attn.bench.report import markdown_table as _table

# Variant name suffix (after the shipped kernel's name) -> column. At hd 64 the session-25
# candidates carry dkv_row_ptr ("r"), which the shipped kernel of then did not.
KINDS = {
    "r": "row stores",
    "_ev": "early dV",
    "r_ev": "early dV",
    "_sm": "dK/dV via smem",
    "r_sm": "dK/dV via smem",
    "_sm2": "via smem, unroll 2",
    "r_sm2": "via smem, unroll 2",
    "_nostore": "no dK/dV stores",
}
COLUMNS = tuple(dict.fromkeys(KINDS.values()))
# (The launch logs are compressed since session 52.)
_PAIRS = (
    ("ab_raw.csv.gz", "launches.txt.gz"),
    ("nostore_raw.csv.gz", "nostore_launches.txt.gz"),
)


def kernel_times(folder: Path) -> dict[tuple[str, str], list[float]]:
    """{(config, variant name as logged): kernel times in ms} of one call's timing files."""
    times: dict[tuple[str, str], list[float]] = {}
    for raw, order in _PAIRS:
        if not (folder / raw).exists():
            continue
        with gzip.open(folder / raw, "rt") as f:
            rows = list(csv.reader(f))
        column = rows[0].index("gpu__time_duration.sum")
        if rows[1][column] != "ms":
            raise ValueError(f"{folder / raw}: times in {rows[1][column]!r}, expected ms")
        with gzip.open(folder / order, "rt") as f:
            launches = f.read().split("\n")
        launches = [line.split() for line in launches if line.strip()]
        if len(launches) != len(rows) - 2:
            raise ValueError(f"{folder}: {len(rows) - 2} kernels, {len(launches)} launches")
        for row, (config, variant) in zip(rows[2:], launches, strict=True):
            times.setdefault((config, variant), []).append(float(row[column].replace(",", "")))
    return times


def ratios(times: dict[tuple[str, str], list[float]]) -> dict[tuple[str, str], dict[str, object]]:
    """{(config, "det" | "non-det"): {"shipped": name, "ms": median, kind: shipped / kind}}."""
    medians = {key: statistics.median(values) for key, values in times.items()}
    out: dict[tuple[str, str], dict[str, object]] = {}
    for mode, tail in (("det", ""), ("non-det", "_nd")):
        names = {
            (config, variant.removesuffix(tail))
            for config, variant in medians
            if variant.endswith("_nd") == bool(tail)
        }
        for config in dict.fromkeys(c for c, _ in sorted(names)):
            variants = [v for c, v in names if c == config]
            shipped = min(variants, key=len)  # every candidate is shipped + suffix
            base = medians[config, shipped + tail]
            entry: dict[str, object] = {"shipped": shipped, "ms": base}
            for variant in variants:
                suffix = variant[len(shipped) :]
                if suffix:
                    entry[KINDS[suffix]] = base / medians[config, variant + tail]
            out[config, mode] = entry
    return out


def merge(runs: list[dict[tuple[str, str], dict[str, object]]]) -> list[list[str]]:
    """Table rows: every (config, mode) of the runs (det first, then by head dim, mask and
    length), the shipped kernel's time from the first run that has it, each kind's ratios from
    every run."""

    def order(key: tuple[str, str]) -> tuple:
        head_dim, mask, seqlen = key[0].removeprefix("d").split(":")
        return key[1] != "det", int(head_dim), mask, int(seqlen)

    keys = sorted(dict.fromkeys(key for run in runs for key in run), key=order)
    body = []
    for config, mode in keys:
        found = [run[config, mode] for run in runs if (config, mode) in run]
        head_dim, mask, seqlen = config.removeprefix("d").split(":")
        cells = [head_dim, mask, seqlen, mode, str(found[0]["shipped"]), f"{found[0]['ms']:.3f}"]
        for kind in COLUMNS:
            values = [f"{entry[kind]:.3f}" for entry in found if kind in entry]
            cells.append(" / ".join(values) or "-")
        body.append(cells)
    return body


def markdown_table(folders: list[Path]) -> str:
    header = ("hdim", "mask", "seqlen", "mode", "shipped then", "ms", *COLUMNS)
    return _table(header, merge([ratios(kernel_times(folder)) for folder in folders]), left=5)


if __name__ == "__main__":
    print(markdown_table([Path(arg) for arg in sys.argv[1:]]))
