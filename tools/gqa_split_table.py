"""The GQA tables of benchmarks/HISTORY.md from the probes' outputs: one header line per
shape (with its repeat
check, and in session 24's probe its dk/dv errors), then one line per provider with its median
ms. No torch or GPU.

Session 23's split (``gqa_split_probe.txt``), and session 24's in-kernel dK/dV sums
(``dkv_sum_probe.txt``, several files: a shape found in a later file replaces the earlier row,
the probe ran in two calls)::

    python3 tools/gqa_split_table.py \
        benchmarks/results/h200/session23-87322f7/call1-87322f7/gqa_split_probe.txt
    python3 tools/gqa_split_table.py --dkv-sum \
        benchmarks/results/h200/session24-e3c9d1b/call2-e3c9d1b/dkv_sum_probe.txt \
        benchmarks/results/h200/session24-e3c9d1b/call3-e3c9d1b/dkv_sum_probe.txt
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dash_attn.bench.report import markdown_table as _table

# "qwen2.5-7b b1 s8192 heads 28/4 causal: repeats_equal=True", in session 24 followed by
# " dk err sum 1.991e-02 partials 2.307e-02; dv err sum 3.142e-02 partials 4.268e-02; dq equal
# True" where the probe computed a reference
_SHAPE = re.compile(
    r"^(?P<label>.+?) b(?P<batch>\d+) s(?P<seqlen>\d+) heads (?P<heads>\d+)/(?P<kv>\d+) "
    r"(?P<mask>causal|full): repeats_equal=(?P<equal>True|False)(?P<rest>.*)$"
)
_ERRORS = re.compile(
    r"dk err sum (?P<dk>\S+) partials (?P<dk_p>\S+); dv err sum (?P<dv>\S+) partials "
    r"(?P<dv_p>\S+); dq equal (?P<dq_equal>True|False)"
)
# "   hopper_split                2.329 ms  1.015x fa4_det"
_TIME = re.compile(r"^\s+(?P<provider>\w+)\s+(?P<ms>[\d.]+) ms\s")
HEADER = (
    "shape", "batch", "seqlen", "heads", "mask", "split ms", "no split ms", "fa4_det ms",
    "split vs no split", "split vs fa4_det", "split vs its non-det", "repeats equal",
)  # fmt: skip
DKV_SUM_HEADER = (
    "shape", "batch", "seqlen", "heads", "mask", "sums ms", "partials ms", "fa4_det ms",
    "sums vs partials", "sums vs fa4_det", "max err dk / dv: sums", "partials", "repeats equal",
)  # fmt: skip


def parse(text: str) -> list[dict[str, object]]:
    """One row per shape: its fields, ``errors`` (a dict, or None) and ``ms`` (provider -> median
    ms)."""
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


def _ratio(a: float, b: float) -> str:
    """How much faster ``a`` ms is than ``b`` ms."""
    return f"{b / a:.2f}x"


def _shape_cells(row: dict[str, object]) -> list[object]:
    # The probes' labels repeat the batch and the mask ("llama3-8b b4 full"): drop them.
    label = str(row["label"]).replace(f" b{row['batch']}", "").replace(" full", "")
    tokens = int(str(row["seqlen"]))
    length = f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
    return [label, row["batch"], length, f"{row['heads']}/{row['kv']}", row["mask"]]


def _equal(row: dict[str, object]) -> str:
    return "yes" if row["equal"] == "True" else "NO"


def markdown_table(rows: list[dict[str, object]]) -> str:
    """Session 23: median ms and speed ratios (above 1: the first named is faster)."""
    body = []
    for row in rows:
        ms: dict[str, float] = row["ms"]  # type: ignore[assignment]
        split = ms["hopper_split"]
        body.append([
            *_shape_cells(row), f"{split:.2f}", f"{ms['hopper_nosplit']:.2f}",
            f"{ms['fa4_det']:.2f}", _ratio(split, ms["hopper_nosplit"]),
            _ratio(split, ms["fa4_det"]), _ratio(split, ms["hopper_split_nondet"]), _equal(row),
        ])  # fmt: skip
    return _table(HEADER, body, left=5)


def dkv_sum_markdown_table(rows: list[dict[str, object]]) -> str:
    """Session 24: the in-kernel sums beside the partials and FA4-det, and the max errors."""
    body = []
    for row in rows:
        ms: dict[str, float] = row["ms"]  # type: ignore[assignment]
        summed = ms["hopper_dkv_sum"]
        errors = row["errors"]
        sums = partials = "-"
        if isinstance(errors, dict):
            sums = f"{float(errors['dk']):.1e} / {float(errors['dv']):.1e}"
            partials = f"{float(errors['dk_p']):.1e} / {float(errors['dv_p']):.1e}"
        body.append([
            *_shape_cells(row), f"{summed:.2f}", f"{ms['hopper_partials']:.2f}",
            f"{ms['fa4_det']:.2f}", _ratio(summed, ms["hopper_partials"]),
            _ratio(summed, ms["fa4_det"]), sums, partials, _equal(row),
        ])  # fmt: skip
    return _table(DKV_SUM_HEADER, body, left=5)


def main(argv: list[str]) -> int:
    dkv_sum = argv[:1] == ["--dkv-sum"]
    paths = argv[1:] if dkv_sum else argv
    if not paths or (not dkv_sum and len(paths) != 1):
        print(__doc__, file=sys.stderr)
        return 2
    if dkv_sum:
        print(dkv_sum_markdown_table(merge([parse(Path(p).read_text()) for p in paths])))
    else:
        print(markdown_table(parse(Path(paths[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
