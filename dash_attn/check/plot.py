"""Figure of where the two runs differ: max |Δ| of every recorded value in execution order."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..figures import save_png
from .compare import Difference
from .record import Event

__all__ = ["plot_differences"]

PHASE_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}


def plot_differences(
    events: Sequence[Event], differences: Sequence[Difference], path: Path, title: str = ""
) -> Path:
    """Write a scatter of max |Δ| (log scale) against the execution-order index of each value;
    equal values are drawn as small grey ticks at the bottom, so the figure shows where in the
    step the differences start and how they spread. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none assumed
    import matplotlib.pyplot as plt

    differing = {d.index: d for d in differences}
    finite = [d.max_abs_diff for d in differences if 0 < d.max_abs_diff < float("inf")]
    floor = min(finite) / 10 if finite else 1e-8
    top = max(finite) * 10 if finite else 1.0
    fig, ax = plt.subplots(figsize=(11, 4.5))
    equal_x = [i for i in range(len(events)) if i not in differing]
    ax.scatter(equal_x, [floor] * len(equal_x), marker="|", color="0.75", s=30, label="equal")
    for phase, color in PHASE_COLORS.items():
        rows = [d for d in differences if d.phase == phase]
        if rows:
            ys = [d.max_abs_diff if d.max_abs_diff < float("inf") else top for d in rows]
            ax.scatter([d.index for d in rows], ys, color=color, s=14, label=f"differs ({phase})")
    # Phase boundaries of each step: where the forward ends and the backward starts.
    for i in range(1, len(events)):
        prev, cur = events[i - 1].key, events[i].key
        if (prev.step, prev.phase) != (cur.step, cur.phase):
            ax.axvline(i - 0.5, color="0.5", linestyle="--", linewidth=0.8)
    if differences:
        first = differences[0]
        y = first.max_abs_diff if first.max_abs_diff < float("inf") else top
        ax.annotate(
            f"first: {first.name}\n{first.kind}",
            (first.index, y),
            xytext=(10, 10),
            textcoords="offset points",
            fontsize=8,
            arrowprops={"arrowstyle": "->", "color": "black"},
        )
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, top * 2)
    ax.set_xlabel("recorded value, in execution order (dashed: phase boundaries)")
    ax.set_ylabel("max |run 1 - run 2|")
    ax.set_title(title or "where the two runs differ")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    save_png(fig, path, dpi=120)
    plt.close(fig)
    return path
