"""Summaries of an Nsight Compute profile of attention kernels, from its CSV exports.

    ncu --import prof.ncu-rep --page raw --csv > raw.csv
    ncu --import prof.ncu-rep --page source --csv --print-source sass > source.csv
    python tools/hopper/ncu_summary.py --raw raw.csv.gz [--source source.csv.gz]

``--raw``: per kernel (attention kernels only: dash-attn's hopper backward and forward, FA4's
sm90 backward and forward), the time, clock (GHz), instructions, tensor-pipe activity (mean,
min and max over the SMs), issue activity and the warps stalled per issued instruction by main
reason.
``--raw --table LABELS``: the main metrics as a markdown table, one column per kernel.
``--raw --table LABELS --busiest N``: the N units nearest their peak, as a markdown table: every
metric of the form ``unit__counter.avg.pct_of_peak_sustained_{elapsed,active}`` (the throughput
breakdowns of a full set), ranked by their highest value over the kernels. A kernel limited by
a unit shows it near 100% here; one limited by latency has none near it.
``--raw --cut OUT``: the raw export cut to the columns those read, to commit.
``--source``: per kernel, warp-stall samples and executed instructions grouped by SASS opcode
(with each opcode's two main stall reasons and its shared-memory wavefronts against the
conflict-free count), grouped by execution count (a persistent kernel's step loop, chain
prologue/epilogue, ...), and the instructions with the most samples with their two main stall
reasons. Samples count every warp (producer, dQ writer and idle warps too), so compare kernels
of the same structure.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

# The attention kernels summarised (a class name in the mangled kernel name) and their labels.
SHORT_NAMES = {
    "HopperAttnBwd": "dash-attn hopper bwd",
    "HopperFwd": "dash-attn hopper fwd",
    "FlashAttentionBackwardSm90": "FA4 sm90 bwd",
    "FlashAttentionForwardSm90": "FA4 sm90 fwd",
}
KERNELS = re.compile("|".join(SHORT_NAMES))
RAW_METRICS = {
    "time_ms": "gpu__time_duration.sum",
    "sm_ghz": "smsp__cycles_elapsed.avg.per_second",
    "instructions": "smsp__inst_executed.sum",
    "tensor_active_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor_active_min_pct": "sm__pipe_tensor_cycles_active.min.pct_of_peak_sustained_active",
    "tensor_active_max_pct": "sm__pipe_tensor_cycles_active.max.pct_of_peak_sustained_active",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
}
# Warps stalled per issued instruction, by reason (the source page's samples do not name the
# "gmma" reason: a warp waiting to issue a warpgroup MMA).
STALLS = ("gmma", "barrier", "long_scoreboard", "mio_throttle", "short_scoreboard", "wait")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
# ncu picks the time unit per export (usecond for short kernels).
_TO_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
_TO_GB = {"byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0, "Tbyte": 1e3}


def _open(path: Path) -> Iterator[list[str]]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as handle:
        yield from csv.reader(handle)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def short_name(kernel: str) -> str:
    """The kernel's short label (SHORT_NAMES of the class named in its mangled name)."""
    found = KERNELS.search(kernel)
    return SHORT_NAMES[found.group(0)] if found else kernel[:40]


def raw_summary(path: Path) -> str:
    rows = list(_open(path))
    header, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    metrics = {**RAW_METRICS, **{f"stall_{k}": STALL_METRIC.format(k) for k in STALLS}}
    lines = []
    for row in data:
        name = row[col["Kernel Name"]]
        if not KERNELS.search(name):
            continue
        grid = row[col["Grid Size"]] if "Grid Size" in col else "?"
        lines.append(f"kernel {row[0]}: {short_name(name)}, grid {grid}")
        for label, metric in metrics.items():
            value = _number(row[col[metric]]) if metric in col else None
            if label == "time_ms" and value is not None:
                value *= _TO_MS.get(units[col[metric]], 1.0)
            lines.append(f"  {label:<24} {'-' if value is None else f'{value:.4g}'}")
    return "\n".join(lines)


# The markdown table of --table: (row label, metric, divisor, decimals). The shared-memory rows
# count wavefronts of the L1/shared data pipe's load-store path (LDS, STS, stmatrix and shuffles;
# not WGMMA's operand reads).
TABLE_ROWS = (
    ("kernel time (ms)", "gpu__time_duration.sum", None, 3),
    ("SM clock (GHz)", "smsp__cycles_elapsed.avg.per_second", 1.0, 2),
    ("tensor pipe active (%)", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
     1.0, 1),
    ("shared-memory data pipe busy (% of peak)",
     "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed", 1.0, 1),
    ("shared-memory wavefronts (M)", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", 1e6, 0),
    ("of them loads (M)", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", 1e6, 0),
    ("shared-memory load instructions (M)", "smsp__sass_inst_executed_op_shared_ld.sum", 1e6, 1),
    ("MUFU (XU) pipe (% of peak)", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
     1.0, 1),
    ("issue active (%)", "smsp__issue_active.avg.pct_of_peak_sustained_active", 1.0, 1),
    ("warps stalled per issue: fixed latency", STALL_METRIC.format("wait"), 1.0, 2),
    ("warps stalled per issue: barrier", STALL_METRIC.format("barrier"), 1.0, 2),
    ("warps stalled per issue: long scoreboard", STALL_METRIC.format("long_scoreboard"), 1.0, 2),
    ("L2 throughput (% of peak)", "lts__throughput.avg.pct_of_peak_sustained_elapsed", 1.0, 1),
)  # fmt: skip
# Rows of ``--table --memory``: where the bytes come from (the hd-256 backward's steps load 64 KiB
# of Q and dO per 48-key step, so whether the launch order keeps them in L2 shows here).
MEMORY_ROWS = (
    ("DRAM read (GB)", "dram__bytes_read.sum", None, 2),
    ("DRAM read throughput (% of peak)", "dram__bytes_read.sum.pct_of_peak_sustained_elapsed", 1.0,
     1),
    ("L2 hit rate (%)", "lts__t_sector_hit_rate.pct", 1.0, 1),
)  # fmt: skip


def metric_table(path: Path, labels: list[str], memory: bool = False) -> str:
    """A markdown table of TABLE_ROWS (and MEMORY_ROWS if ``memory``), one column per attention
    kernel of the raw export in launch order, headed by ``labels`` (one per kernel: a mismatch
    is an error)."""
    rows = list(_open(path))
    header, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    kernels = [row for row in data if KERNELS.search(row[col["Kernel Name"]])]
    if len(kernels) != len(labels):
        raise ValueError(f"{len(labels)} labels for {len(kernels)} attention kernels in {path}")
    lines = ["| metric | " + " | ".join(labels) + " |", "| :-- |" + " --: |" * len(labels)]
    for name, metric, divisor, decimals in TABLE_ROWS + (MEMORY_ROWS if memory else ()):
        if metric not in col:
            raise ValueError(f"{path} has no metric {metric} (export with --set full)")
        if divisor is None:  # a time or a byte count, in ncu's unit of the export
            unit = units[col[metric]]
            divisor = 1.0 / (_TO_GB if unit in _TO_GB else _TO_MS).get(unit, 1.0)
        cells = []
        for row in kernels:
            value = _number(row[col[metric]])
            cells.append("-" if value is None else f"{value / divisor:.{decimals}f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# Identity columns of a raw export that the summaries read or a reader needs to tell kernels
# apart.
_ID_COLUMNS = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context",
               "Stream", "Block Size", "Grid Size", "Device", "CC")  # fmt: skip


# A unit's throughput as a share of its peak: the metrics busiest_table ranks. ``gpu__`` ones
# (the most loaded of several units, under another name) are left out.
BUSY_METRIC = re.compile(r"^(?!gpu__)\w+__\w+\.avg\.pct_of_peak_sustained_(elapsed|active)$")


def summary_columns(header: Sequence[str] = ()) -> set[str]:
    """The raw-export columns that raw_summary, metric_table and busiest_table read (with the
    identity ones); those of busiest_table are the ones of ``header`` it would rank."""
    metrics = {*RAW_METRICS.values(), *(STALL_METRIC.format(k) for k in STALLS)}
    rows = TABLE_ROWS + MEMORY_ROWS
    busy = {name for name in header if BUSY_METRIC.match(name)}
    return {*_ID_COLUMNS, *metrics, *(metric for _, metric, _, _ in rows), *busy}


def busiest_table(path: Path, labels: list[str], top: int) -> str:
    """The ``top`` units nearest their peak (``BUSY_METRIC``) as a markdown table, one column per
    attention kernel headed by ``labels``, ranked by the highest value over the kernels. Metrics
    whose values are equal in every kernel (names of one counter, as the tensor pipe's and the
    shared pipe's cycles on sm_90) share a row that names them all."""
    rows = list(_open(path))
    header, data = rows[0], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    kernels = [row for row in data if KERNELS.search(row[col["Kernel Name"]])]
    if len(kernels) != len(labels):
        raise ValueError(f"{len(labels)} labels for {len(kernels)} attention kernels in {path}")
    ranked = []
    for name in header:
        if BUSY_METRIC.match(name):
            values = [_number(row[col[name]]) for row in kernels]
            if all(v is not None for v in values):
                ranked.append((max(values), name, values))  # type: ignore[type-var]
    if not ranked:
        raise ValueError(f"{path} has no unit throughput metrics (export with --set full)")
    ranked.sort(key=lambda item: (-item[0], item[1]))
    lines = ["| unit (% of peak) | " + " | ".join(labels) + " |",
             "| :-- |" + " --: |" * len(labels)]  # fmt: skip
    groups: dict[tuple[float, ...], list[str]] = {}
    for _, name, values in ranked:
        key = tuple(round(v, 1) for v in values)
        if key in groups or len(groups) < top:
            groups.setdefault(key, []).append(name.replace(".avg.pct_of_peak_sustained_", " "))
    for key, names in groups.items():
        lines.append(f"| {', '.join(names)} | " + " | ".join(f"{v:.1f}" for v in key) + " |")
    return "\n".join(lines)


def cut_raw(path: Path, out: Path) -> int:
    """Write the raw export ``path`` to ``out`` (gzipped if it ends in .gz) with only
    ``summary_columns()``, in their order there, its unit row kept: the summaries of the cut
    file equal the full export's at a few KB instead of tens (a full set has ~2,200 columns).
    Returns the number of columns kept."""
    rows = list(_open(path))
    wanted = summary_columns(rows[0])
    keep = [i for i, name in enumerate(rows[0]) if name in wanted]
    gzipped = out.suffix == ".gz"
    with gzip.open(out, "wt", newline="") if gzipped else open(out, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        for row in rows:
            writer.writerow([row[i] for i in keep])
    return len(keep)


def _source_blocks(path: Path) -> list[dict]:
    blocks: list[dict] = []
    current: dict | None = None
    for row in _open(path):
        if row and row[0] == "Kernel Name":
            current = {"name": row[1], "rows": []}
            blocks.append(current)
        elif row and row[0] == "Address" and current is not None:
            current["header"] = row
        elif row and current is not None:
            current["rows"].append(row)
    return [b for b in blocks if KERNELS.search(b["name"])]


def _by_execution_count(
    rows: list[list[str]], samples_col: int, executed_col: int, col: dict[str, int], total: int
) -> list[str]:
    """Warp-stall samples grouped by how often an instruction ran. In a persistent kernel the
    groups are its code paths: instructions run as often as its steps (times the warps that run
    them) form the step loop, those run once per chain its prologue and epilogue, and so on."""
    groups: dict[int, list] = collections.defaultdict(lambda: [0, 0, collections.Counter()])
    for row in rows:
        executed = int(row[executed_col] or 0)
        samples = int(row[samples_col] or 0)
        op = re.sub(r"^@!?U?P\w+\s+", "", row[col["Source"]].strip()).split(" ")[0].split(".")[0]
        group = groups[executed]
        group[0] += samples
        group[1] += 1
        group[2][op] += samples
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])[:8]
    return [
        f"  {executed:>10} {samples:>8} {100 * samples / total:>5.1f}% {count:>5}  "
        + ", ".join(f"{op} {n}" for op, n in ops.most_common(3) if n)
        for executed, (samples, count, ops) in ranked
    ]


def source_summary(path: Path, top: int = 20) -> str:
    out = []
    for index, block in enumerate(_source_blocks(path)):
        col = {name: i for i, name in enumerate(block["header"])}
        reasons = [k for k in block["header"] if k.startswith("stall_") and "Not Issued" not in k]
        samples_col = col["Warp Stall Sampling (All Samples)"]
        executed_col = col["Instructions Executed"]
        # Shared-memory wavefronts (actual, ideal): more than ideal means bank conflicts.
        wave_cols = [col.get(n) for n in ("L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal")]
        by_op: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
        op_reasons: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        by_reason: collections.Counter[str] = collections.Counter()
        for row in block["rows"]:
            source = row[col["Source"]].strip()
            op = re.sub(r"^@!?U?P\w+\s+", "", source).split(" ")[0].split(".")[0] or "?"
            by_op[op][0] += int(row[samples_col] or 0)
            by_op[op][1] += int(row[executed_col] or 0)
            for k, wave_col in enumerate(wave_cols):
                if wave_col is not None:
                    by_op[op][2 + k] += int(row[wave_col] or 0)
            for reason in reasons:
                count = int(row[col[reason]] or 0)
                by_reason[reason[6:]] += count
                op_reasons[op][reason[6:]] += count
        total = sum(v[0] for v in by_op.values()) or 1
        out.append(f"== kernel {index}: {short_name(block['name'])}, {total} warp-stall samples")
        named = sum(by_reason.values()) or 1
        out.append(
            "stall reasons: "
            + ", ".join(f"{k} {100 * v / named:.1f}%" for k, v in by_reason.most_common(8))
        )
        out.append(
            f"{'opcode':<12} {'samples':>9} {'share':>6} {'executed':>12}  "
            "two main stall reasons; shared wavefronts (ideal)"
        )
        ranked_ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
        for op, (samples, executed, waves, ideal) in ranked_ops:
            why = ", ".join(f"{k} {v}" for k, v in op_reasons[op].most_common(2) if v)
            if waves:
                why += f"; {waves} ({ideal})"
            out.append(
                f"{op:<12} {samples:>9} {100 * samples / total:>5.1f}% {executed:>12}  {why}"
            )
        out.append(
            "samples by execution count (code run once per step, per chain, per CTA, ...; "
            "count, samples, share, instructions, top opcodes):"
        )
        for line in _by_execution_count(block["rows"], samples_col, executed_col, col, total):
            out.append(line)
        out.append("top instructions (samples, share, two main named stall reasons):")
        ranked = sorted(block["rows"], key=lambda r: -int(r[samples_col] or 0))[:top]
        for row in ranked:
            samples = int(row[samples_col] or 0)
            main = sorted(((int(row[col[r]] or 0), r[6:]) for r in reasons), reverse=True)[:2]
            why = ", ".join(f"{name} {count}" for count, name in main if count)
            text = row[col["Source"]].strip()[:58]
            out.append(f"  {samples:>7} {100 * samples / total:>5.1f}%  {text:<58} {why}")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", type=Path, help="ncu --page raw --csv export (.csv or .csv.gz)")
    parser.add_argument("--source", type=Path, help="ncu --page source --csv export")
    parser.add_argument("--top", type=int, default=20, help="opcodes and instructions listed")
    parser.add_argument(
        "--table", metavar="LABELS",
        help="with --raw: a markdown table of the main metrics instead, one column per kernel, "
        "headed by these comma-separated labels (in launch order)",
    )  # fmt: skip
    parser.add_argument(
        "--memory", action="store_true",
        help="with --table: also the DRAM bytes read, their share of the peak and the L2 hit rate",
    )  # fmt: skip
    parser.add_argument(
        "--busiest", type=int, metavar="N",
        help="with --table: the N units nearest their peak instead of the main metrics",
    )  # fmt: skip
    parser.add_argument(
        "--cut", type=Path, metavar="OUT",
        help="with --raw: write it to OUT with only the columns these summaries read (a few KB "
        "to commit beside the summary instead of the whole export)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.raw is None and args.source is None:
        parser.error("give --raw and/or --source")
    if args.cut is not None:
        if args.raw is None:
            parser.error("--cut needs --raw")
        print(f"{cut_raw(args.raw, args.cut)} columns kept in {args.cut}")
        return 0
    if args.busiest is not None and args.table is None:
        parser.error("--busiest needs --table (the kernels' labels)")
    if args.table is not None:
        if args.raw is None:
            parser.error("--table needs --raw")
        labels = args.table.split(",")
        if args.busiest is not None:
            print(busiest_table(args.raw, labels, args.busiest))
        else:
            print(metric_table(args.raw, labels, memory=args.memory))
        return 0
    if args.raw is not None:
        print(raw_summary(args.raw))
        print()
    if args.source is not None:
        print(source_summary(args.source, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
