"""The markdown table of a ``compare_host_paths.csv`` (no torch or GPU needed):
benchmarks/HISTORY.md's session-13 table is ``python3 tools/hopper/compare_host_paths.py --table
CSV``, which prints this."""

from __future__ import annotations

from dash_attn.bench.report import markdown_table as _table

HEADER = ("hdim", "mask", "seqlen", "default ms", "cute ms", "fa4_det ms", "cute / default",
          "default vs fa4_det", "cute vs fa4_det")  # fmt: skip


def markdown_table(rows: list[dict[str, str]]) -> str:
    """The CSV's rows: median times of the three rounds and speed ratios (above 1: the first
    named is faster)."""

    def ratio(text: str) -> str:
        return f"{float(text):.2f}x"

    body = [
        [row["head_dim"], row["mask"], row["seqlen"], f"{float(row['default_ms']):.3f}",
         f"{float(row['cute_ms']):.3f}", f"{float(row['fa4_ms']):.3f}",
         ratio(row["cute_vs_default"]), ratio(row["default_vs_fa4"]), ratio(row["cute_vs_fa4"])]
        for row in rows
    ]  # fmt: skip
    return _table(HEADER, body, left=2)
