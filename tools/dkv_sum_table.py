"""The README's table of the GQA split's in-kernel dK/dV sums from ``dkv_sum_probe.txt`` files (the
session-24 probe: one header line per shape with its repeat check and dk/dv errors, then one line
per provider with its median ms). Several files: a shape found in a later file replaces the
earlier row (the probe ran in two calls). No torch or GPU.

    python3 tools/dkv_sum_table.py \
        benchmarks/results/h200/session24-e3c9d1b/call2-e3c9d1b/dkv_sum_probe.txt \
        benchmarks/results/h200/session24-e3c9d1b/call3-e3c9d1b/dkv_sum_probe.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dash_attn.bench.report import markdown_table as _table

# "qwen2.5-7b b1 s8192 heads 28/4 causal: repeats_equal=True dk err sum 1.991e-02 partials
#  2.307e-02; dv err sum 3.142e-02 partials 4.268e-02; dq equal True" (the errors only where
# the probe computed a reference)
_SHAPE = re.compile(
    r"^(?P<label>.+?) b(?P<batch>\d+) s(?P<seqlen>\d+) heads (?P<heads>\d+)/(?P<kv>\d+) "
    r"(?P<mask>causal|full): repeats_equal=(?P<equal>True|False)(?P<rest>.*)$"
)
_ERRORS = re.compile(
    r"dk err sum (?P<dk>\S+) partials (?P<dk_p>\S+); dv err sum (?P<dv>\S+) partials "
    r"(?P<dv_p>\S+); dq equal (?P<dq_equal>True|False)"
)
# "   hopper_dkv_sum              2.319 ms  0.981x fa4_det  0.968x partials"
_TIME = re.compile(r"^\s+(?P<provider>\w+)\s+(?P<ms>[\d.]+) ms\s")
HEADER = (
    "shape", "batch", "seqlen", "heads", "mask", "sums ms", "partials ms", "fa4_det ms",
    "sums vs partials", "sums vs fa4_det", "max err dk / dv: sums", "partials", "repeats equal",
)  # fmt: skip


def parse(text: str) -> list[dict[str, object]]:
    """One row per shape: its fields, ``errors`` (or None) and ``ms`` (provider -> median ms)."""
    rows: list[dict[str, object]] = []
    for line in text.splitlines():
        if match := _SHAPE.match(line):
            errors = _ERRORS.search(match["rest"])
            rows.append({
                **match.groupdict(), "errors": errors.groupdict() if errors else None, "ms": {},
            })  # fmt: skip
        elif rows and (match := _TIME.match(line)):
            rows[-1]["ms"][match["provider"]] = float(match["ms"])  # type: ignore[index]
    return rows


def merge(runs: list[list[dict[str, object]]]) -> list[dict[str, object]]:
    """The rows of every run, each shape once: from the last run that has it, in first-seen
    order."""
    merged: dict[tuple, dict[str, object]] = {}
    for rows in runs:
        for row in rows:
            merged[tuple(row[k] for k in ("label", "batch", "seqlen", "heads", "kv", "mask"))] = row
    return list(merged.values())


def _length(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def markdown_table(rows: list[dict[str, object]]) -> str:
    """Median ms and speed ratios (above 1: the first named is faster)."""

    def ratio(a: float, b: float) -> str:
        return f"{b / a:.2f}x"

    body = []
    for row in rows:
        ms: dict[str, float] = row["ms"]  # type: ignore[assignment]
        summed = ms["hopper_dkv_sum"]
        errors = row["errors"]
        if isinstance(errors, dict):
            sums = f"{float(errors['dk']):.1e} / {float(errors['dv']):.1e}"
            partials = f"{float(errors['dk_p']):.1e} / {float(errors['dv_p']):.1e}"
        else:
            sums = partials = "-"
        # The probe's labels repeat the batch and the mask ("llama3-8b b4 full"): drop them.
        label = str(row["label"]).replace(f" b{row['batch']}", "").replace(" full", "")
        body.append([
            label, row["batch"], _length(int(str(row["seqlen"]))),
            f"{row['heads']}/{row['kv']}", row["mask"], f"{summed:.2f}",
            f"{ms['hopper_partials']:.2f}", f"{ms['fa4_det']:.2f}",
            ratio(summed, ms["hopper_partials"]), ratio(summed, ms["fa4_det"]), sums, partials,
            "yes" if row["equal"] == "True" else "NO",
        ])  # fmt: skip
    return _table(HEADER, body, left=5)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(markdown_table(merge([parse(Path(path).read_text()) for path in argv])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
