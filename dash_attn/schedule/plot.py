"""Gantt charts of simulated schedules (``dash-attn schedule --plot``).

matplotlib is imported inside ``plot_gantt`` only, so importing the schedule engine stays cheap.
The figure is drawn through the object-oriented API on an Agg canvas (no pyplot): the global
backend of an interactive session that calls this is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..figures import save_png
from .simulate import SimResult
from .types import Schedule

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COMPUTE = ("#2f6db5", "#7fa8d8")  # alternating per KV chain on a worker, so chain switches show
REDUCE = "#e8891d"
WAIT = "#bdbdbd"

# Text labels inside bars only while they stay legible.
MAX_LABELLED_STEPS = 48
MAX_LABELLED_ROWS = 24
# Beyond this many steps per worker, white separators between bars would drown the colours.
MAX_OUTLINED_STEPS = 150
MAX_PANEL_ROWS_HEIGHT = 5.0  # inches of bars per panel, however many workers are drawn


def plot_gantt(
    panels: Sequence[tuple[Schedule, SimResult]],
    path: str | Path,
    *,
    title: str = "",
    max_workers: int = 32,
    dpi: int = 130,
) -> None:
    """Write a PNG Gantt chart: one panel per ``(schedule, simulation)``, workers on y, time on x.

    Each tile task is a compute bar (blue; the shade alternates when the worker moves to another KV
    chain) followed by its dQ reduction (orange). A grey hatched gap between them is time the
    reduction spent waiting for its turn in the dQ tile's summation order. The dashed line is the
    lower bound of the makespan. Only workers ``0 .. max_workers - 1`` are drawn; the title says
    so when that hides some.

    Args:
        panels: schedules of one spec (usually) with their ``simulate`` results.
        path: output file; the format follows its suffix (PNG expected).
        title: first title line, e.g. the shape; each panel gets its schedule and makespan.
        max_workers: most workers drawn per panel.
        dpi: resolution of the written image.

    Raises:
        ValueError: no panels, or ``max_workers < 1``.
    """
    if not panels:
        raise ValueError("plot_gantt needs at least one (schedule, simulation) panel")
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    workers = max(schedule.spec.workers for schedule, _ in panels)
    rows = min(workers, max_workers)
    horizon = max(float(sim.makespan) for _, sim in panels)
    panel_height = 0.6 + min(0.28 * rows, MAX_PANEL_ROWS_HEIGHT)
    fig = Figure(figsize=(12, 1.2 + panel_height * len(panels)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]

    for ax, (schedule, sim) in zip(axes, panels, strict=True):
        _draw_panel(ax, schedule, sim, rows)
        ax.set_xlim(0, horizon * 1.01)
        ax.set_title(
            f"{schedule.name} ({schedule.dispatch.value} dispatch): makespan "
            f"{_num(sim.makespan)}, lower bound {_num(sim.lower_bound)}, "
            f"bubble {100 * float(sim.bubble_fraction):.1f}%",
            fontsize=10,
            loc="left",
        )
    axes[-1].set_xlabel("time (model units: one compute step = C, one dQ reduction = R)")

    lines = [title] if title else []
    if rows < workers:
        lines.append(f"workers 0-{rows - 1} of {workers} shown (--plot-workers)")
    if lines:
        fig.suptitle("\n".join(lines), fontsize=11)
    handles = [
        Patch(facecolor=COMPUTE[0], label="compute (shade alternates per KV chain)"),
        Patch(facecolor=REDUCE, label="dQ reduction"),
        Patch(facecolor="white", edgecolor="#808080", hatch="////", label="waiting for dQ turn"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=9, frameon=False)
    save_png(fig, path, dpi=dpi)


def _draw_panel(ax: Axes, schedule: Schedule, sim: SimResult, rows: int) -> None:
    worker = np.asarray(sim.worker)
    c0, c1 = np.asarray(sim.compute_start, float), np.asarray(sim.compute_end, float)
    r0, r1 = np.asarray(sim.reduce_start, float), np.asarray(sim.reduce_end, float)
    chain = schedule.step_chain()
    per_worker = _steps_per_worker(worker, rows)
    label = rows <= MAX_LABELLED_ROWS and per_worker <= MAX_LABELLED_STEPS
    edge = 0.4 if per_worker <= MAX_OUTLINED_STEPS else 0.0
    multi_head = schedule.spec.q_heads > 1

    for w in range(rows):
        steps = np.flatnonzero(worker == w)
        if steps.size == 0:
            continue
        steps = steps[np.argsort(c0[steps], kind="stable")]
        # Shade flips whenever the worker's chain changes, so consecutive chains are told apart.
        flips = np.r_[0, np.cumsum(chain[steps][1:] != chain[steps][:-1])] % 2
        y = (w - 0.4, 0.8)
        for shade in (0, 1):
            sel = steps[flips == shade]
            if sel.size:
                ax.broken_barh(
                    list(zip(c0[sel], c1[sel] - c0[sel], strict=True)),
                    y,
                    facecolors=COMPUTE[shade],
                    edgecolor="white",
                    linewidth=edge,
                )
        waiting = steps[r0[steps] > c1[steps]]
        if waiting.size:
            ax.broken_barh(
                list(zip(c1[waiting], r0[waiting] - c1[waiting], strict=True)),
                y,
                facecolors=WAIT,
                edgecolor="#808080",
                hatch="////",
                linewidth=0.3 if edge else 0.0,
            )
        ax.broken_barh(
            list(zip(r0[steps], r1[steps] - r0[steps], strict=True)),
            y,
            facecolors=REDUCE,
            edgecolor="white",
            linewidth=edge,
        )
        if label:
            for s in steps.tolist():
                head = f"h{schedule.step_q_head[s]}" if multi_head else ""
                ax.text(
                    (c0[s] + c1[s]) / 2,
                    w,
                    f"{head}q{schedule.step_q_tile[s]}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white",
                )

    ax.axvline(float(sim.lower_bound), color="black", linestyle="--", linewidth=0.8)
    ax.set_ylim(rows - 0.5, -0.5)  # worker 0 on top
    ax.set_ylabel("worker")
    ticks = range(rows) if rows <= 16 else range(0, rows, max(1, rows // 16))
    ax.set_yticks(list(ticks))


def _steps_per_worker(worker: np.ndarray, rows: int) -> int:
    counts = np.bincount(worker[worker < rows], minlength=rows)
    return int(counts.max()) if counts.size else 0


def _num(value: float) -> str:
    value = float(value)
    return f"{value:.0f}" if value.is_integer() else f"{value:.2f}"
