"""Files and tables of the packed benchmark: ratios to FA4-det, packed.csv / .json, the bar plot.

Imports neither torch nor matplotlib at module level (the plot loads matplotlib when it draws).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..figures import save_png
from ..schedule.report import text_table
from .report import write_csv, write_json

BASELINE = "fa4_det"
PACKED_MODES = ("fwd", "bwd")
CSV_FIELDS = (
    "row", "mode", "provider", "family", "deterministic", "status", "reason", "ms", "tflops",
    "ratio_vs_fa4_det", "bits_repeatable", "max_out_diff", "schedule", "kernel", "tokens", "docs",
    "heads", "kv_heads", "headdim", "window_left", "pairs",
)  # fmt: skip


def add_ratios(rows: Sequence[dict[str, Any]], baseline: str = BASELINE) -> None:
    """``ratio_vs_fa4_det = baseline ms / ms`` per (row, mode), in place; None without a measured
    baseline. Same FLOPs in a (row, mode), so it is also the TFLOPS ratio."""
    base = {
        (r["row"], r["mode"]): r["ms"]
        for r in rows
        if r["provider"] == baseline and r.get("status") == "ok" and r.get("ms")
    }
    for r in rows:
        ref = base.get((r["row"], r["mode"]))
        ok = r.get("status") == "ok" and r.get("ms")
        r["ratio_vs_fa4_det"] = ref / r["ms"] if ref and ok else None


def summary_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per provider, one column per (row, mode): ``TFLOPS ratio-to-fa4_det``, with
    ``bits!`` where repeated calls gave other bits; then why the missing cells are missing."""
    columns = list(dict.fromkeys((r["row"], r["mode"]) for r in rows))
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    cell = {(r["provider"], r["row"], r["mode"]): r for r in rows}
    body = []
    for name in providers:
        line = [name]
        for row, mode in columns:
            r = cell.get((name, row, mode))
            if r is None:
                line.append("")
            elif r.get("status") != "ok":
                line.append(str(r.get("status")))
            else:
                ratio = r.get("ratio_vs_fa4_det")
                text = f"{r['tflops']:.0f} " + (f"{ratio:.2f}x" if ratio is not None else "-")
                line.append(text + (" bits!" if r.get("bits_repeatable") is False else ""))
        first = next(r for r in rows if r["provider"] == name)
        body.append([*line[:1], "det" if first["deterministic"] else "non-det", *line[1:]])
    header = ["provider", "promise", *(f"{row} {mode}" for row, mode in columns)]
    reasons: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        if r.get("status") != "ok":
            key = (r["provider"], str(r["status"]), str(r.get("reason") or ""))
            reasons.setdefault(key, []).append(f"{r['row']} {r['mode']}")
    notes = [f"  {p} ({', '.join(where)}): {status}: {why}" for (p, status, why), where
             in reasons.items()]  # fmt: skip
    text = text_table(header, body, left=2)
    legend = "cells: TFLOPS on the kept pairs, speed vs fa4_det (same run); bits!: not repeatable"
    return "\n".join([text, legend, *(["not measured:", *notes] if notes else [])])


def plot_packed(
    rows: Sequence[Mapping[str, Any]], path: Path, title: str | None = None
) -> Path | None:
    """Bars of TFLOPS per provider, grouped by row, one panel per mode; hatched: no determinism
    promise. Returns ``path``, or None when nothing was measured."""
    done = [r for r in rows if r.get("status") == "ok"]
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["provider"] for r in rows))
    row_names = list(dict.fromkeys(r["row"] for r in rows))
    det = {r["provider"]: bool(r["deterministic"]) for r in rows}
    fig, axes = plt.subplots(1, len(PACKED_MODES), figsize=(7 * len(PACKED_MODES), 5.2))
    width = 0.8 / len(names)
    for ax, mode in zip(axes, PACKED_MODES, strict=True):
        value = {(r["row"], r["provider"]): r["tflops"] for r in done if r["mode"] == mode}
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(row_names))]
            ys = [value.get((row, name), 0.0) for row in row_names]
            label = name if det[name] else f"{name} (non-det)"
            ax.bar(xs, ys, width, label=label, color=f"C{i % 10}",
                   hatch=None if det[name] else "//", edgecolor="black", linewidth=0.4)  # fmt: skip
        ax.set_xticks(range(len(row_names)), row_names)
        ax.set_ylabel("TFLOPS (pairs the mask keeps)")
        ax.set_title(mode)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    save_png(fig, path, dpi=130)
    plt.close(fig)
    return path


def write_outputs(out_dir: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """packed.csv and packed.json (atomically: rewritten after every provider)."""
    add_ratios(rows)
    write_csv(out_dir / "packed.csv", rows, CSV_FIELDS)
    write_json(out_dir / "packed.json", {**meta, "rows": rows})
