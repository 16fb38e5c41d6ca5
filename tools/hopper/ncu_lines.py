"""Stall samples per Python source line of CuTe-DSL kernels compiled with line info
(CUTE_DSL_LINEINFO=1), from two exports of one Nsight Compute report:

    ncu --import prof.ncu-rep --page source --print-source cuda,sass > lines.txt
    ncu --import prof.ncu-rep --page source --csv --print-source sass > sass.csv
    python tools/hopper/ncu_lines.py lines.txt.gz sass.csv.gz --labels "a,b,..." [--top 30]

The text export attributes each SASS instruction to the innermost source line (a helper's
line, not its caller's); the CSV export gives each instruction's samples by stall reason,
joined here by address. Per kernel (in report order): the lines with the most samples, each
with its samples, their two main stall reasons and the instructions it executed.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
from pathlib import Path

_SOURCE_ROW = re.compile(r"^(\d+)\s")
_SASS_ROW = re.compile(r"^\s+(0x[0-9a-f]+)\s")
# The text export's columns: the line number or address, the source text or instruction from
# character 19, the metrics from character 80.
_TEXT_AT, _METRICS_AT = 19, 80


def _open(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def parse_lines(path: Path) -> list[dict]:
    """Kernels in report order, each ``{"function", "lines", "addresses"}``: ``lines`` maps
    (file, line number) to the line's source text, samples, not-issued samples, instructions
    executed and (filled by :func:`add_stalls`) stall-reason samples; ``addresses`` maps each
    SASS instruction's address to its (file, line) and opcode."""
    kernels: list[dict] = []
    current_file = None
    source_key = None  # the (file, line) whose SASS rows follow
    pending = None  # (kind, key, text) of a row whose metrics are on a later physical line
    for raw in _open(path):
        line = raw.rstrip("\n")
        if line.startswith("File Path: "):
            # A kernel's sections come sorted by path: one not after the last starts the next.
            file_path = line[len("File Path: ") :].strip()
            if not kernels or current_file is None or file_path <= current_file:
                kernels.append({"function": "", "lines": {}, "addresses": {}})
            current_file = file_path
            continue
        if line.startswith("Function Name: "):
            # ... and so does another function name (two kernels' paths may both ascend).
            function = line[len("Function Name: ") :].strip()
            if kernels[-1]["function"] not in ("", function):
                kernels.append({"function": function, "lines": {}, "addresses": {}})
            kernels[-1]["function"] = function
            continue
        if not kernels or current_file is None or line.startswith("-"):
            continue
        m = _SOURCE_ROW.match(line)  # "<line number>  <source>": a source line's totals
        s = _SASS_ROW.match(line)  # "  <address> <instruction>": one of its instructions
        if m:
            text = line[_TEXT_AT:_METRICS_AT].strip()
            pending = ("line", (current_file, int(m.group(1))), text)
            source_key = pending[1]
        elif s:
            pending = ("sass", s.group(1), line[_TEXT_AT:_METRICS_AT].strip())
        elif pending is None:
            continue
        metrics = line[_METRICS_AT:].split()
        if len(metrics) < 4 or not metrics[0].isdigit():
            continue  # wrapped text; the metrics follow on the next physical line
        kind, key, text = pending
        pending = None
        samples, not_issued, _, executed = (int(x) for x in metrics[:4])
        if kind == "line":
            kernels[-1]["lines"][key] = {
                "source": text, "samples": samples, "not_issued": not_issued,
                "executed": executed, "stalls": collections.Counter(),
            }  # fmt: skip
        else:
            opcode = text.split()[0] if text else "?"
            if opcode.startswith("@"):
                opcode = text.split()[1]
            kernels[-1]["addresses"][key] = (source_key, opcode)
    return kernels


def add_stalls(kernels: list[dict], sass_csv: Path) -> None:
    """Add each instruction's samples by stall reason (the CSV's ``stall_*`` columns, which
    count every sample; the ``(Not Issued)`` ones are left out) to its source line."""
    index = -1
    header: list[str] = []
    for row in csv.reader(_open(sass_csv)):
        if row and row[0] == "Kernel Name":
            index += 1
            continue
        if row and row[0] == "Address":
            header = row
            continue
        if not header or index >= len(kernels) or not row:
            continue
        where = kernels[index]["addresses"].get(row[0])
        if where is None:
            continue
        stalls = kernels[index]["lines"][where[0]]["stalls"]
        for name, value in zip(header, row, strict=False):
            if name.startswith("stall_") and "Not Issued" not in name and value not in ("", "0"):
                stalls[name[6:]] += int(value)


def report(kernels: list[dict], labels: list[str], top: int) -> str:
    """Per kernel, its ``top`` lines by samples as a markdown table, then samples by file."""
    if len(labels) != len(kernels):
        raise ValueError(f"--labels names {len(labels)} kernels, the export has {len(kernels)}")
    out = []
    for label, kernel in zip(labels, kernels, strict=True):
        lines = kernel["lines"]
        total = sum(v["samples"] for v in lines.values())
        out.append(f"\n## {label}: {total} samples, {len(lines)} source lines\n")
        out.append("| samples | % | main stalls | executed | file:line | source |")
        out.append("| --: | --: | :-- | --: | :-- | :-- |")
        ranked = sorted(lines.items(), key=lambda kv: -kv[1]["samples"])[:top]
        for (file, number), v in ranked:
            main = ", ".join(f"{k} {n}" for k, n in v["stalls"].most_common(2))
            out.append(
                f"| {v['samples']} | {100 * v['samples'] / max(total, 1):.1f} | {main} | "
                f"{v['executed']} | {Path(file).name}:{number} | `{v['source'][:50]}` |"
            )
        by_file = collections.Counter()
        for (file, _), v in lines.items():
            by_file[Path(file).name] += v["samples"]
        out.append("\nby file: " + ", ".join(f"{f} {n}" for f, n in by_file.most_common()))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lines", type=Path, help="--print-source cuda,sass text export")
    parser.add_argument("sass", type=Path, help="--csv --print-source sass export")
    parser.add_argument("--labels", default="", help="comma-separated kernel labels")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args(argv)
    kernels = parse_lines(args.lines)
    add_stalls(kernels, args.sass)
    labels = args.labels.split(",") if args.labels else [f"kernel {i}" for i in range(len(kernels))]
    print(report(kernels, labels, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
