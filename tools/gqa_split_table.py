"""The README's GQA-split table from a ``gqa_split_probe.txt`` (the session-23 probe's output:
one header line per shape, then one line per provider with its median ms). No torch or GPU.

    python3 tools/gqa_split_table.py \
        benchmarks/results/h200/session23-87322f7/call1-87322f7/gqa_split_probe.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dash_attn.bench.report import markdown_table as _table

# "qwen2.5-7b b1 s8192 heads 28/4 causal: repeats_equal=True"
_SHAPE = re.compile(
    r"^(?P<label>.+?) b(?P<batch>\d+) s(?P<seqlen>\d+) heads (?P<heads>\d+)/(?P<kv>\d+) "
    r"(?P<mask>causal|full): repeats_equal=(?P<equal>True|False)$"
)
# "   hopper_split                2.329 ms  1.015x fa4_det"
_TIME = re.compile(r"^\s+(?P<provider>\w+)\s+(?P<ms>[\d.]+) ms\s")
HEADER = (
    "shape", "batch", "seqlen", "heads", "mask", "split ms", "no split ms", "fa4_det ms",
    "split vs no split", "split vs fa4_det", "split vs its non-det", "repeats equal",
)  # fmt: skip


def parse(text: str) -> list[dict[str, object]]:
    """One row per shape: its fields and ``ms`` (provider -> median ms)."""
    rows: list[dict[str, object]] = []
    for line in text.splitlines():
        if match := _SHAPE.match(line):
            rows.append({**match.groupdict(), "ms": {}})
        elif rows and (match := _TIME.match(line)):
            rows[-1]["ms"][match["provider"]] = float(match["ms"])  # type: ignore[index]
    return rows


def markdown_table(rows: list[dict[str, object]]) -> str:
    """Median ms and speed ratios (above 1: the first named is faster)."""

    def ratio(a: float, b: float) -> str:
        return f"{b / a:.2f}x"

    body = []
    for row in rows:
        ms: dict[str, float] = row["ms"]  # type: ignore[assignment]
        split = ms["hopper_split"]
        # The probe's labels repeat the batch and the mask ("llama3-8b b4 full"): drop them.
        label = str(row["label"]).replace(f" b{row['batch']}", "").replace(" full", "")
        body.append([
            label, row["batch"], f"{int(str(row['seqlen'])) // 1024}k",
            f"{row['heads']}/{row['kv']}", row["mask"], f"{split:.2f}",
            f"{ms['hopper_nosplit']:.2f}", f"{ms['fa4_det']:.2f}",
            ratio(split, ms["hopper_nosplit"]), ratio(split, ms["fa4_det"]),
            ratio(split, ms["hopper_split_nondet"]), "yes" if row["equal"] == "True" else "NO",
        ])  # fmt: skip
    return _table(HEADER, body, left=5)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(markdown_table(parse(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
