"""The ``dash-attn`` command (also ``python -m dash_attn``).

``dash-attn schedule`` analyses backward schedules with the pure-Python engine in
``dash_attn.schedule`` (DAG cost model of the DASH paper: every tile task is a compute edge of cost
``c`` followed by a dQ reduction edge of cost ``r``); it never imports torch or triton, so it runs
on any machine. Without shape arguments it runs the paper's benchmark sweep and prints the model's
speedup of each schedule over the FA3 deterministic baseline; bare ``dash-attn`` does the same.

``dash-attn bench`` runs GPU benchmarks; its arguments come from ``dash_attn.bench.sweep``, which
is imported only when that subcommand is chosen.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import __version__
from .backends.triton.tiles import SUPPORTED_HEADDIMS, backward_tiles
from .bench.model import spec_for
from .schedule import Mask, Schedule, ScheduleSpec, applicable_schedules, schedule_names
from .schedule.generators import GENERATORS, auto_schedule_name
from .schedule.render import render_ascii
from .schedule.simulate import SimResult, simulate
from .schedule.validate import ValidationReport, validate

PROG = "dash-attn"
BASELINE = "fa3"
DEFAULT_WORKERS = 132  # SMs of an H100/H200/H800 SXM, the machines of the paper and of this repo
DEFAULT_PLOT_WORKERS = 32

# The paper's benchmark grid (section 5.2): 16k tokens in total, hidden size 2048, MHA.
SWEEP_TOKENS = 16384
SWEEP_HIDDEN = 2048
SWEEP_HEADDIMS = (64, 128)
SWEEP_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)

# Shapes this small get their ASCII grid printed unasked: it fits a terminal (render_ascii draws at
# most 16 workers) and says more than the numbers do.
TINY_WORKERS = 16
TINY_TASKS = 256

BENCH_MODULE = "dash_attn.bench.sweep"


class CliError(Exception):
    """A bad request that argparse cannot see (it needs the engine); exit status 2."""


@dataclass(frozen=True)
class Shape:
    """The sequence-level shape a ``ScheduleSpec`` was tiled from (shape-level arguments only)."""

    seqlen_q: int
    seqlen_k: int
    headdim: int
    block_m: int
    block_n: int


@dataclass(frozen=True)
class Analysis:
    """One schedule of one spec: its tables, the model's timing and the validator's verdict."""

    schedule: Schedule
    sim: SimResult
    report: ValidationReport

    @property
    def name(self) -> str:
        return self.schedule.name


def analyse(name: str, spec: ScheduleSpec, cost_c: float, cost_r: float) -> Analysis:
    """Build schedule ``name`` (``"auto"`` allowed) for ``spec``, validate and simulate it."""
    if name == "auto":
        name = auto_schedule_name(spec)
    # Call the generator directly, not the lru-cached make_schedule: a sweep builds each table
    # once, and caching them would pin a few hundred MB for nothing.
    schedule = GENERATORS[name](spec)
    report = validate(schedule, raise_on_error=False)
    if not report.valid:
        # A schedule that fails validation may deadlock; simulating it has no meaning.
        raise CliError(f"schedule {name!r} is invalid for this shape: {'; '.join(report.errors)}")
    sim = simulate(schedule, cost_compute=cost_c, cost_reduce=cost_r)
    return Analysis(schedule=schedule, sim=sim, report=report)


# ------------------------------------------------------------------------------------------------
# Argument parsing


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _cost(minimum_exclusive: bool) -> Callable[[str], float]:
    # C > 0 keeps every makespan positive, so speedups (ratios of makespans) are always defined.
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value < float("inf") or value < 0 or (minimum_exclusive and value == 0):
            bound = "> 0" if minimum_exclusive else ">= 0"
            raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``dash-attn`` parser (``bench`` arguments are added later, only when it is chosen)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Deterministic attention backward with DASH schedules. Without a subcommand, runs "
            "'dash-attn schedule' (the CPU schedule-analysis sweep)."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{schedule,bench}")

    sched = sub.add_parser(
        "schedule",
        help="analyse backward schedules with the DAG cost model (CPU, no torch)",
        description=(
            "Analyse backward schedules with the DASH DAG cost model: each tile task is a compute "
            "step of cost C followed by a dQ reduction of cost R, and reductions into one dQ tile "
            "happen in the schedule's fixed order. Give a shape either in tiles (--q-tiles, "
            "--kv-tiles, ...) or in tokens (--seqlen, --headdim; tiles from the kernel's tile "
            "table). Without a shape: the paper's sweep (16384 tokens, hidden 2048, head dims 64 "
            "and 128, seqlen 512..16384, full and causal) with each schedule's model speedup "
            "over fa3."
        ),
        allow_abbrev=False,
    )
    _add_schedule_arguments(sched)
    # run_schedule reports argument errors through the subparser, so its usage line is shown.
    sched.set_defaults(command_parser=sched)

    # No arguments of its own here: they belong to dash_attn.bench.sweep, whose import may pull in
    # torch. Everything after 'bench' is handed over untouched (see _run_bench).
    sub.add_parser(
        "bench",
        help="GPU benchmarks (needs torch, triton and a GPU)",
        add_help=False,
        allow_abbrev=False,
    )
    return parser


def _add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    names = ["auto", *schedule_names()]
    parser.add_argument(
        "--schedule",
        choices=names,
        default=None,
        metavar="NAME",
        help=f"one of {', '.join(names)} (default auto: shift for full, symmetric_shift for "
        "causal)",
    )
    pos = _positive_int

    tiles = parser.add_argument_group("shape in tiles")
    tiles.add_argument("--q-tiles", type=pos, metavar="M", help="Q tiles per (batch, head)")
    tiles.add_argument(
        "--kv-tiles",
        type=pos,
        metavar="N",
        help="KV tiles per (batch, kv head) (default: square attention, ceil(M / S))",
    )
    tiles.add_argument(
        "--tile-ratio",
        type=pos,
        metavar="S",
        help="BLOCK_N / BLOCK_M: Q tiles per KV tile along the diagonal (default 1)",
    )

    shape = parser.add_argument_group("shape in tokens (tiles from dash_attn.tiles)")
    shape.add_argument("--seqlen", type=pos, metavar="L", help="query sequence length")
    shape.add_argument("--seqlen-k", type=pos, metavar="LK", help="key length (default: L)")
    shape.add_argument(
        "--headdim",
        type=int,
        choices=SUPPORTED_HEADDIMS,
        metavar="D",
        help=f"head dimension, one of {', '.join(map(str, SUPPORTED_HEADDIMS))}",
    )

    common = parser.add_argument_group("heads, batch, mask, machine")
    common.add_argument("--heads", type=pos, metavar="H", help="query heads (default 1)")
    common.add_argument("--kv-heads", type=pos, metavar="HKV", help="kv heads (default: H)")
    common.add_argument("--batch", type=pos, metavar="B", help="batch size (default 1)")
    common.add_argument("--causal", action="store_true", help="causal mask (bottom-right aligned)")
    common.add_argument(
        "--workers",
        type=pos,
        default=DEFAULT_WORKERS,
        metavar="P",
        help=f"persistent workers (SMs) running the backward (default {DEFAULT_WORKERS})",
    )

    cost = parser.add_argument_group(
        "cost model",
        "Times are in units of C and R. The paper's closed forms use c = r; the defaults (1, 1) "
        "make times read as steps.",
    )
    cost.add_argument(
        "--cost-c",
        type=_cost(minimum_exclusive=True),
        default=1.0,
        metavar="C",
        help="compute cost of one tile task, > 0 (default 1)",
    )
    cost.add_argument(
        "--cost-r",
        type=_cost(minimum_exclusive=False),
        default=1.0,
        metavar="R",
        help="cost of adding one dQ partial into global memory, >= 0 (default 1)",
    )

    out = parser.add_argument_group("output (combinable)")
    out.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    out.add_argument(
        "--compare",
        action="store_true",
        help="every schedule applicable to the mask side by side, with the speedup over fa3",
    )
    out.add_argument("--ascii", action="store_true", help="print the worker x step grid")
    out.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="write a Gantt chart (one panel per schedule with --compare)",
    )
    out.add_argument(
        "--plot-workers",
        type=pos,
        default=DEFAULT_PLOT_WORKERS,
        metavar="N",
        help=f"workers drawn by --plot, from worker 0 (default {DEFAULT_PLOT_WORKERS})",
    )


# ------------------------------------------------------------------------------------------------
# The schedule command

_SHAPE_FLAGS = ("seqlen", "seqlen_k", "headdim")
_TILE_FLAGS = ("q_tiles", "kv_tiles", "tile_ratio")
_SINGLE_SHAPE_FLAGS = ("heads", "kv_heads", "batch", "causal", "schedule", "ascii", "plot")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _given(args: argparse.Namespace, dests: Sequence[str]) -> list[str]:
    return [_flag(d) for d in dests if getattr(args, d) not in (None, False)]


def resolve_spec(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[ScheduleSpec, Shape | None] | None:
    """The spec the arguments describe, or None when they ask for the default sweep."""
    shape_flags = _given(args, _SHAPE_FLAGS)
    tile_flags = _given(args, _TILE_FLAGS)
    if shape_flags and tile_flags:
        parser.error(
            f"{tile_flags[0]} describes a shape in tiles; it cannot be combined with "
            f"{shape_flags[0]} (a shape in tokens)"
        )
    if not shape_flags and not tile_flags:
        single = _given(args, _SINGLE_SHAPE_FLAGS)
        if single:
            parser.error(
                f"{single[0]} needs a shape: --seqlen/--headdim or --q-tiles/--kv-tiles "
                "(without a shape, the sweep covers both masks and compares every schedule)"
            )
        return None

    heads = args.heads or 1
    kv_heads = args.kv_heads or heads
    if heads % kv_heads:
        parser.error(f"argument --kv-heads: {kv_heads} does not divide --heads {heads}")
    batch = args.batch or 1
    try:
        if shape_flags:
            if args.seqlen is None or args.headdim is None:
                missing = "--seqlen" if args.seqlen is None else "--headdim"
                parser.error(f"{shape_flags[0]} needs {missing} too")
            tiles = backward_tiles(args.headdim)
            seqlen_k = args.seqlen_k or args.seqlen
            spec = ScheduleSpec.from_shape(
                batch=batch,
                seqlen_q=args.seqlen,
                seqlen_k=seqlen_k,
                q_heads=heads,
                kv_heads=kv_heads,
                block_m=tiles.block_m,
                block_n=tiles.block_n,
                mask=Mask(causal=args.causal),
                workers=args.workers,
            )
            shape = Shape(args.seqlen, seqlen_k, args.headdim, tiles.block_m, tiles.block_n)
            return spec, shape
        ratio = args.tile_ratio or 1
        if args.q_tiles is None and args.kv_tiles is None:
            parser.error("--tile-ratio needs --q-tiles or --kv-tiles")
        q_tiles = args.q_tiles or args.kv_tiles * ratio
        kv_tiles = args.kv_tiles or -(-q_tiles // ratio)
        spec = ScheduleSpec(
            batch=batch,
            q_heads=heads,
            kv_heads=kv_heads,
            q_tiles=q_tiles,
            kv_tiles=kv_tiles,
            mask=Mask(causal=args.causal),
            tile_ratio=ratio,
            workers=args.workers,
        )
        return spec, None
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise CliError(f"invalid shape: {exc}") from None


def describe(spec: ScheduleSpec, shape: Shape | None) -> str:
    """A one-line description of the problem, for titles and headers."""
    mask = spec.mask.name
    heads = f"{spec.q_heads} head{'s' if spec.q_heads > 1 else ''}" + (
        f" ({spec.kv_heads} kv)" if spec.kv_heads != spec.q_heads else ""
    )
    if shape is not None:
        seq = f"seqlen {shape.seqlen_q}" + (
            f"/{shape.seqlen_k}" if shape.seqlen_k != shape.seqlen_q else ""
        )
        head = f"{seq}, hdim {shape.headdim}, batch {spec.batch}, {heads}, {mask}"
        tiles = f"{shape.block_m}x{shape.block_n} tiles: {spec.q_tiles} Q x {spec.kv_tiles} KV"
        return f"{head}; {tiles}; {spec.workers} workers"
    ratio = f", tile ratio {spec.tile_ratio}" if spec.tile_ratio != 1 else ""
    return (
        f"{spec.q_tiles} Q x {spec.kv_tiles} KV tiles{ratio}, batch {spec.batch}, {heads}, "
        f"{mask}; {spec.workers} workers"
    )


def record(analysis: Analysis, cost_c: float, cost_r: float) -> dict[str, Any]:
    """The JSON fields of one analysed schedule (spec fields included)."""
    schedule, sim, report = analysis.schedule, analysis.sim, analysis.report
    spec = schedule.spec
    out: dict[str, Any] = {
        "schedule": schedule.name,
        "dispatch": schedule.dispatch.value,
        "makespan": float(sim.makespan),
        "critical_path": float(sim.critical_path),
        "lower_bound": float(sim.lower_bound),
        "bubble_fraction": float(sim.bubble_fraction),
        "workers": spec.workers,
        "chains": schedule.num_chains,
        "tasks": schedule.num_steps,
        "valid": bool(report.valid),
        "depth_monotone": bool(report.depth_monotone),
        "non_monotone_edges": int(report.non_monotone_edges),
        "num_rank_edges": int(report.num_rank_edges),
        "cost_c": cost_c,
        "cost_r": cost_r,
    }
    for key, value in asdict(spec).items():
        out.setdefault(key, value)
    return out


def _num(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """Plain text table: the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def compare_table(analyses: Sequence[Analysis], auto_name: str) -> str:
    """Side-by-side text table of schedules for one spec."""
    base = next((a for a in analyses if a.name == BASELINE), None)
    rows = []
    for a in analyses:
        speedup = f"{base.sim.makespan / a.sim.makespan:.3f}x" if base is not None else "-"
        rows.append(
            [
                a.name + (" (auto)" if a.name == auto_name else ""),
                a.schedule.dispatch.value,
                _num(a.sim.makespan),
                _num(a.sim.critical_path),
                _num(a.sim.lower_bound),
                f"{100 * a.sim.bubble_fraction:.1f}%",
                "yes" if a.report.depth_monotone else f"no ({a.report.non_monotone_edges})",
                speedup,
            ]
        )
    header = [
        "schedule",
        "dispatch",
        "makespan",
        "critical path",
        "lower bound",
        "bubble",
        "depth-monotone",
        f"vs {BASELINE}",
    ]
    return _table(header, rows, left=2)


def _summary(a: Analysis, auto_name: str, shape_text: str, cost_c: float, cost_r: float) -> str:
    sim, report = a.sim, a.report
    auto = " (auto)" if a.name == auto_name else ""
    monotone = (
        "yes"
        if report.depth_monotone
        else f"no ({report.non_monotone_edges} of {report.num_rank_edges} rank edges go back)"
    )
    return "\n".join(
        [
            f"schedule    {a.name}{auto}, {a.schedule.dispatch.value} dispatch",
            f"shape       {shape_text}",
            f"work        {a.schedule.num_chains} chains, {a.schedule.num_steps} tasks, "
            f"cost C = {_num(cost_c)}, R = {_num(cost_r)}",
            f"makespan    {_num(sim.makespan)} (lower bound {_num(sim.lower_bound)}, critical path "
            f"{_num(sim.critical_path)}, bubble {100 * sim.bubble_fraction:.1f}%)",
            f"valid       {'yes' if report.valid else 'no'}; depth-monotone {monotone}",
        ]
    )


def _is_tiny(spec: ScheduleSpec) -> bool:
    return spec.workers <= TINY_WORKERS and spec.num_tasks() <= TINY_TASKS


def _write_plot(
    analyses: Sequence[Analysis], path: Path, title: str, max_workers: int, stream: Any
) -> None:
    try:
        from .schedule.plot import plot_gantt
    except ImportError as exc:  # matplotlib is a dependency, but a broken install should say so
        raise CliError(f"--plot needs matplotlib ({exc})") from None
    try:
        plot_gantt(
            [(a.schedule, a.sim) for a in analyses],
            path,
            title=title,
            max_workers=max_workers,
        )
    except OSError as exc:
        raise CliError(
            f"argument --plot: cannot write {str(path)!r}: {exc.strerror or exc}"
        ) from None
    print(f"wrote {path}", file=stream)


def run_schedule(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``dash-attn schedule``: one shape, a comparison, or the default sweep."""
    resolved = resolve_spec(args, parser)
    if resolved is None:
        return run_sweep(args)
    spec, shape = resolved
    requested = args.schedule or "auto"
    auto_name = auto_schedule_name(spec)
    names = applicable_schedules(spec)
    name = auto_name if requested == "auto" else requested
    if name not in names:
        mask = spec.mask.name
        parser.error(
            f"argument --schedule: {name!r} does not apply to the {mask} mask; "
            f"choose from {', '.join(['auto', *names])}"
        )

    chosen = analyse(name, spec, args.cost_c, args.cost_r)
    analyses = [chosen]
    if args.compare:
        analyses = [
            chosen if n == name else analyse(n, spec, args.cost_c, args.cost_r) for n in names
        ]
    title_shape = describe(spec, shape)

    if args.json:
        out = record(chosen, args.cost_c, args.cost_r)
        out["requested_schedule"] = requested
        if shape is not None:
            out.update(asdict(shape))
        if args.compare:
            base = next(a for a in analyses if a.name == BASELINE)
            out["compare"] = [
                {
                    **record(a, args.cost_c, args.cost_r),
                    "speedup_vs_fa3": base.sim.makespan / a.sim.makespan,
                }
                for a in analyses
            ]
        if args.ascii:
            out["ascii"] = {a.name: render_ascii(a.schedule) for a in analyses}
        print(json.dumps(out, indent=2))
    else:
        if args.compare:
            print(f"{title_shape}; cost C = {_num(args.cost_c)}, R = {_num(args.cost_r)}")
            print(compare_table(analyses, auto_name))
        else:
            print(_summary(chosen, auto_name, title_shape, args.cost_c, args.cost_r))
        show_ascii = args.ascii or (not args.compare and args.plot is None and _is_tiny(spec))
        if show_ascii:
            for a in analyses:
                print()
                print(render_ascii(a.schedule))

    if args.plot is not None:
        # Keep stdout pure JSON when --json is on.
        _write_plot(
            analyses,
            args.plot,
            title_shape,
            args.plot_workers,
            sys.stderr if args.json else sys.stdout,
        )
    return 0


_SWEEP_JSON_FIELDS = (
    "dispatch",
    "makespan",
    "critical_path",
    "lower_bound",
    "bubble_fraction",
    "valid",
    "depth_monotone",
)


def sweep_specs(workers: int) -> list[tuple[ScheduleSpec, Shape]]:
    """The paper's benchmark grid (section 5.2), tiled with this repo's backward tiles."""
    configs = []
    for headdim in SWEEP_HEADDIMS:
        tiles = backward_tiles(headdim)
        heads = SWEEP_HIDDEN // headdim
        for seqlen in SWEEP_SEQLENS:
            for causal in (False, True):
                spec = spec_for(headdim, seqlen, SWEEP_TOKENS // seqlen, heads, causal, workers)
                configs.append((spec, Shape(seqlen, seqlen, headdim, tiles.block_m, tiles.block_n)))
    return configs


def run_sweep(args: argparse.Namespace) -> int:
    """The default job: model speedup over fa3 of every applicable schedule on the paper's grid."""
    started = time.perf_counter()
    try:
        configs = sweep_specs(args.workers)
    except (ValueError, NotImplementedError) as exc:  # e.g. a bad tile override in the environment
        raise CliError(str(exc)) from None
    results: list[tuple[ScheduleSpec, Shape, dict[str, Analysis]]] = []
    for spec, shape in configs:
        analyses = {
            n: analyse(n, spec, args.cost_c, args.cost_r) for n in applicable_schedules(spec)
        }
        results.append((spec, shape, analyses))
    elapsed = time.perf_counter() - started

    if args.json:
        configs = []
        for spec, shape, analyses in results:
            base = analyses[BASELINE].sim.makespan
            schedules = {}
            for name, a in analyses.items():
                fields = record(a, args.cost_c, args.cost_r)
                schedules[name] = {key: fields[key] for key in _SWEEP_JSON_FIELDS}
                schedules[name]["speedup_vs_fa3"] = base / a.sim.makespan
            configs.append({**asdict(spec), **asdict(shape), "schedules": schedules})
        out = {
            "sweep": f"{SWEEP_TOKENS} tokens, hidden {SWEEP_HIDDEN}, MHA (paper section 5.2)",
            "workers": args.workers,
            "cost_c": args.cost_c,
            "cost_r": args.cost_r,
            "seconds": round(elapsed, 3),
            "configs": configs,
        }
        print(json.dumps(out, indent=2))
        return 0

    others = [n for n in schedule_names() if n != BASELINE]
    rows = []
    for spec, shape, analyses in results:
        base = analyses[BASELINE].sim
        cells = []
        for name in others:
            a = analyses.get(name)
            if a is None:
                cells.append("-")
            else:
                mark = "" if a.report.depth_monotone else "*"
                cells.append(f"{base.makespan / a.sim.makespan:.3f}x{mark}")
        rows.append(
            [
                str(shape.headdim),
                str(shape.seqlen_q),
                str(spec.batch),
                str(spec.q_heads),
                spec.mask.name,
                f"{spec.q_tiles}x{spec.kv_tiles}",
                _num(base.makespan),
                *cells,
                f"{base.makespan / base.lower_bound:.3f}x",
            ]
        )
    header = ["hdim", "seqlen", "batch", "heads", "mask", "Q x KV tiles", f"{BASELINE} makespan"]
    header += [*others, "bound"]
    print(
        f"DASH cost model: predicted backward speedup over {BASELINE} (the deterministic FA3 "
        f"order) on {args.workers} workers, C = {_num(args.cost_c)}, R = {_num(args.cost_r)}."
    )
    print(
        f"Paper grid: {SWEEP_TOKENS} tokens, hidden {SWEEP_HIDDEN} (heads = {SWEEP_HIDDEN}/hdim), "
        "tiles from dash_attn.tiles."
    )
    print(_table(header, rows, left=5))
    print(
        f"\nbound: {BASELINE} makespan / lower bound, the most any schedule could gain. "
        "'-': not applicable to the mask.\n'*': not depth-monotone (some dQ reductions wait on a "
        f"deeper step of another worker).\n{len(rows)} configurations in {elapsed:.1f} s."
    )
    return 0


# ------------------------------------------------------------------------------------------------
# The bench command


def _run_bench(argv: Sequence[str]) -> int:
    """Hand ``argv`` to ``dash_attn.bench.sweep``: ``add_bench_arguments(parser)`` then ``run``."""
    try:
        module = importlib.import_module(BENCH_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name in (BENCH_MODULE, BENCH_MODULE.rpartition(".")[0]):
            print(
                f"{PROG} bench: not available yet: this installation has no {BENCH_MODULE} module",
                file=sys.stderr,
            )
        else:
            print(
                f"{PROG} bench: needs the package {exc.name!r}, which is not installed",
                file=sys.stderr,
            )
        return 2
    parser = argparse.ArgumentParser(
        prog=f"{PROG} bench",
        description=(module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else None,
        allow_abbrev=False,
    )
    add_arguments = getattr(module, "add_bench_arguments", None)
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args(list(argv))
    status = module.run(args)
    return 0 if status is None else int(status)


# ------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dash-attn`` and ``python -m dash_attn``; returns the exit status.

    Bad arguments exit with status 2 and a one-line message (argparse's, or ours for problems only
    the schedule engine can see, such as a causal offset that leaves a KV tile with no Q tile).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # No subcommand (`dash-attn`, `dash-attn --json`) means `dash-attn schedule ...`.
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["schedule", *argv]
    parser = build_parser()
    # parse_known_args so that everything after 'bench' reaches the bench parser untouched.
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "bench":
            return _run_bench(extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return run_schedule(args, args.command_parser)
    except CliError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `dash-attn | head` closed the pipe: no traceback. Point stdout at devnull so that the
        # interpreter's final flush does not raise again (recipe from the `signal` module docs).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
