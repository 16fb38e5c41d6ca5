"""Figures in the paper's form: TFLOPS vs sequence length, one panel per (mask, head dim).

    python -m dash_attn.bench.plot --csv benchmarks/results/h200/bench.csv.gz --out bench_bwd.png

Line styles carry the meaning, so that a figure with many providers stays readable: dash-attn
solid, peers dashed, non-deterministic variants dotted; markers tell the schedules apart.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..figures import save_png
from .providers import family_of
from .report import provider_order, read_csv

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p")
# By the provider's place in the table order, so a provider has one colour in every panel.
_COLORS = (*(f"C{i}" for i in range(10)), "black", "darkgoldenrod", "teal", "navy")


def _style(name: str, deterministic: bool, index: int) -> dict[str, Any]:
    linestyle = "-" if family_of(name) == "dash" else "--"
    if not deterministic:
        linestyle = ":"
    return {
        "linestyle": linestyle,
        "marker": _MARKERS[index % len(_MARKERS)],
        "color": _COLORS[index % len(_COLORS)],
        "linewidth": 2.2 if name == "dash_auto" else 1.4,
        "markersize": 5,
    }


def _seq_label(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen >= 1024 and seqlen % 1024 == 0 else str(seqlen)


def plot_tflops(
    rows: Sequence[Mapping[str, Any]], path: Path, title: str | None = None
) -> Path | None:
    """Write a PNG of TFLOPS vs seqlen (log2 x axis), one panel per (mask, head dim).

    Rows of one mode only (the caller splits modes). Returns ``path``, or None without rows.
    """
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    masks = sorted({bool(r["causal"]) for r in rows})
    headdims = sorted({int(r["headdim"]) for r in rows})
    names = provider_order({str(r["provider"]) for r in rows})
    deterministic = {str(r["provider"]): bool(r.get("deterministic")) for r in rows}
    fig, axes = plt.subplots(
        len(masks),
        len(headdims),
        figsize=(5.2 * len(headdims), 3.9 * len(masks)),
        squeeze=False,
        sharex=True,
    )
    handles: dict[str, Any] = {}
    for i, causal in enumerate(masks):
        for j, headdim in enumerate(headdims):
            ax = axes[i][j]
            panel = [
                r for r in rows if bool(r["causal"]) == causal and int(r["headdim"]) == headdim
            ]
            seqlens = sorted({int(r["seqlen"]) for r in panel})
            for index, name in enumerate(names):
                points = sorted(
                    (int(r["seqlen"]), float(r["tflops"]))
                    for r in panel
                    if r["provider"] == name and r.get("tflops") is not None
                )
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                (line,) = ax.plot(
                    xs, ys, label=name, **_style(name, deterministic.get(name, True), index)
                )
                handles.setdefault(name, line)
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens)
            ax.set_xticklabels([_seq_label(s) for s in seqlens])
            ax.minorticks_off()
            ax.set_title(f"{'causal' if causal else 'full'} mask, head dim {headdim}")
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
            if j == 0:
                ax.set_ylabel("TFLOPS")
            if i == len(masks) - 1:
                ax.set_xlabel("sequence length")
    ordered = [n for n in names if n in handles]
    fig.legend(
        [handles[n] for n in ordered],
        ordered,
        loc="lower center",
        ncol=min(6, len(ordered)),
        frameon=False,
        fontsize="small",
    )
    if title:
        fig.suptitle(title, fontsize="medium")
    rows_of_legend = -(-len(ordered) // 6)
    fig.tight_layout(rect=(0, 0.035 * rows_of_legend + 0.02, 1, 0.96 if title else 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(fig, path, dpi=130)
    plt.close(fig)
    return path


def plot_modes(rows: Sequence[Mapping[str, Any]], out_dir: Path, title: str | None) -> list[Path]:
    """One ``bench_<mode>.png`` per mode present in ``rows``."""
    written = []
    for mode in sorted({str(r["mode"]) for r in rows}):
        path = plot_tflops(
            [r for r in rows if r["mode"] == mode], Path(out_dir) / f"bench_{mode}.png", title
        )
        if path is not None:
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dash_attn.bench.plot",
        description="PNG figures from a bench.csv written by 'dash-attn bench'.",
        allow_abbrev=False,
    )
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where bench_<mode>.png go (default: beside)"
    )
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    rows = read_csv(args.csv)
    title = args.title
    if title is None and rows:
        title = f"{rows[0].get('gpu')}, {rows[0].get('dtype') or ''} (commit {rows[0]['commit']})"
    for path in plot_modes(rows, args.out_dir or args.csv.parent, title):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
