"""The ``dash-attn`` command (also ``python -m dash_attn``): argument parsing and dispatch only.

``dash-attn schedule`` analyses backward schedules on the CPU; the analysis and its tables live in
``dash_attn.schedule.report``, which imports neither torch nor triton, so the command runs on any
machine. Without shape arguments it runs the paper's sweep; bare ``dash-attn`` does the same.

``dash-attn bench`` runs GPU benchmarks; its arguments come from ``dash_attn.bench.main``, which is
imported only when that subcommand is chosen.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .backends.triton.tiles import SUPPORTED_HEADDIMS
from .plan import Problem
from .schedule import Mask, ScheduleSpec, schedule_names
from .schedule import report as rep

PROG = "dash-attn"
BENCH_MODULE = "dash_attn.bench.main"
DEFAULT_PLOT_WORKERS = 32
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
# Bounds of the size arguments: they cover every real GPU and model, and keep an analysis in
# seconds (the simulator runs ~10 us per tile task and schedule) and its tables in memory.
MAX_WORKERS = 1024
MAX_HEADS = 1024
MAX_BATCH = 65536
MAX_TILES = 65536
MAX_SEQLEN = 1 << 20
MAX_TASKS = 1 << 20  # tile tasks of one spec: twice the paper grid's largest


class CliError(Exception):
    """A bad request that argparse cannot see (it needs the engine); exit status 2."""


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low} <= value <= {high}, got {value}")
        return value

    return parse


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


def _length_list(text: str) -> list[int]:
    """``1000,3000,517``: sequence lengths of a pack (0 allowed)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not 1 <= len(values) <= MAX_BATCH or not all(0 <= v <= MAX_SEQLEN for v in values):
        raise argparse.ArgumentTypeError(
            f"expected 1..{MAX_BATCH} lengths, each 0..{MAX_SEQLEN}, got {text!r}"
        )
    return values


def _window(text: str) -> tuple[int, int]:
    """``L,R``: flash-attn's window_size (-1 = unbounded side)."""
    try:
        left, right = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected L,R (two integers), got {text!r}") from None
    if min(left, right) < -1 or max(left, right) > MAX_SEQLEN:
        raise argparse.ArgumentTypeError(f"expected -1 <= L, R <= {MAX_SEQLEN}, got {text!r}")
    return left, right


def _plot_path(text: str) -> Path:
    path = Path(text)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"expected a file ending in {', '.join(PLOT_SUFFIXES)}, got {text!r}"
        )
    return path


def build_parser() -> argparse.ArgumentParser:
    """The ``dash-attn`` parser (``bench`` arguments are added later, only when it is chosen)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Deterministic attention backward with DASH schedules. Without a subcommand, "
        "runs 'dash-attn schedule' (the CPU schedule-analysis sweep).",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="{schedule,bench,bench-packed,bench-graphs,check}"
    )
    sched = sub.add_parser(
        "schedule",
        help="analyse backward schedules with the DAG cost model (CPU, no torch)",
        description="Analyse backward schedules with the DASH DAG cost model: each tile task is a "
        "compute step of cost C followed by a dQ reduction of cost R, and reductions into one dQ "
        "tile happen in the schedule's fixed order. Give a shape either in tiles (--q-tiles, ...) "
        "or in tokens (--seqlen, --headdim; tiles from the backward plan). Without a shape: the "
        f"paper's sweep ({rep.PAPER_TOKENS} tokens, hidden {rep.PAPER_HIDDEN}, head dims "
        f"{' and '.join(map(str, rep.PAPER_HEADDIMS))}, seqlen {rep.PAPER_SEQLENS[0]}.."
        f"{rep.PAPER_SEQLENS[-1]}, full and causal) with each schedule's model speedup over fa3. "
        f"A spec may have at most {MAX_TASKS} tile tasks.",
        allow_abbrev=False,
    )
    _add_schedule_arguments(sched)
    sched.set_defaults(command_parser=sched)
    # No arguments of its own: they belong to dash_attn.bench.main, whose import may pull in torch.
    # Everything after 'bench' is handed over untouched (see _run_bench).
    sub.add_parser("bench", help="GPU benchmarks (needs torch, triton and a GPU)", add_help=False)
    sub.add_parser(
        "bench-packed",
        help="GPU benchmark of packed documents (varlen) and a sliding window against FA4 and Flex",
        add_help=False,
    )
    sub.add_parser(
        "bench-graphs",
        help="GPU benchmark of forward + backward run eagerly and replayed from a CUDA graph, "
        "against FA4",
        add_help=False,
    )
    sub.add_parser(
        "check",
        help="whole-training-step determinism checker demo: a tiny Llama with sdpa and with dash "
        "(needs a GPU and transformers)",
        add_help=False,
    )
    return parser


def _add_schedule_arguments(p: argparse.ArgumentParser) -> None:
    names = ["auto", *schedule_names()]
    help_auto = "(default auto: the model's fastest, see dash_attn.schedule.generators)"
    p.add_argument("--schedule", choices=names, metavar="NAME", help=f"one of {names} {help_auto}")

    def size(group: Any, flag: str, meta: str, high: int, text: str, default: Any = None) -> None:
        group.add_argument(
            flag,
            type=_int_in(1, high),
            default=default,
            metavar=meta,
            help=f"{text}, at most {high}",
        )

    tiles = p.add_argument_group("shape in tiles")
    size(tiles, "--q-tiles", "M", MAX_TILES, "Q tiles per (batch, head)")
    size(tiles, "--kv-tiles", "N", MAX_TILES, "KV tiles per (batch, kv head) (default ceil(M/S))")
    ratios = rep.KERNEL_TILE_RATIOS
    tiles.add_argument(
        "--tile-ratio",
        type=int,
        choices=ratios,
        metavar="S",
        help=f"BLOCK_N / BLOCK_M, one of {list(ratios)} (the ratios of the "
        "kernels' tiles; default 1)",
    )
    shape = p.add_argument_group("shape in tokens (tiles from the backward plan)")
    size(shape, "--seqlen", "L", MAX_SEQLEN, "query sequence length")
    size(shape, "--seqlen-k", "LK", MAX_SEQLEN, "key length (default: L)")
    shape.add_argument(
        "--seqlens",
        type=_length_list,
        metavar="L1,L2,...",
        help="packed sequences (varlen): each sequence's query length; replaces --seqlen/--batch",
    )
    shape.add_argument(
        "--seqlens-k",
        type=_length_list,
        metavar="K1,K2,...",
        help="each packed sequence's key length (default: the --seqlens)",
    )
    shape.add_argument(
        "--headdim",
        type=int,
        choices=SUPPORTED_HEADDIMS,
        metavar="D",
        help=f"head dimension, one of {list(SUPPORTED_HEADDIMS)}",
    )
    common = p.add_argument_group("heads, batch, mask, machine")
    size(common, "--heads", "H", MAX_HEADS, "query heads (default 1)")
    size(common, "--kv-heads", "HKV", MAX_HEADS, "kv heads (default: H)")
    size(common, "--batch", "B", MAX_BATCH, "batch size (default 1)")
    common.add_argument("--causal", action="store_true", help="causal mask (bottom-right aligned)")
    common.add_argument(
        "--window",
        type=_window,
        metavar="L,R",
        help="sliding window (flash-attn window_size, -1 = unbounded side, bottom-right "
        "aligned per sequence; write --window=-1,R when L is -1); needs a shape in tokens",
    )
    common.add_argument(
        "--invariant",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="order-invariant schedules (default): each sequence's dQ summation order depends "
        "only on its lengths, tiles and mask, never on workers, batch or heads; --no-invariant "
        "keeps the worker-dependent shift rules",
    )
    common.add_argument(
        "--gqa-split",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --kv-heads below --heads, one chain per q head as the backward runs it "
        "(default); --no-gqa-split analyses one chain per kv head (gqa_split=False). Shapes in "
        "tokens only",
    )
    workers = f"persistent workers (SMs) of the backward (default {rep.DEFAULT_WORKERS})"
    size(common, "--workers", "P", MAX_WORKERS, workers, rep.DEFAULT_WORKERS)
    cost = p.add_argument_group(
        "cost model",
        "Times are in units of C and R (default 1 each: "
        "times read as steps); the paper's closed forms use c = r.",
    )
    cost.add_argument(
        "--cost-c",
        type=_cost(minimum_exclusive=True),
        default=1.0,
        metavar="C",
        help="compute cost of one tile task, > 0",
    )
    cost.add_argument(
        "--cost-r",
        type=_cost(minimum_exclusive=False),
        default=1.0,
        metavar="R",
        help="cost of adding one dQ partial into global memory, >= 0",
    )
    out = p.add_argument_group("output (combinable)")
    out.add_argument(
        "--json",
        action="store_true",
        help="one JSON object instead of text "
        '(the mask as "mask": "full"|"causal" and "causal": true|false)',
    )
    out.add_argument(
        "--compare",
        action="store_true",
        help="every schedule that fits the mask, with its speedup over fa3",
    )
    out.add_argument("--ascii", action="store_true", help="print the worker x step grid")
    out.add_argument(
        "--plot",
        type=_plot_path,
        metavar="FILE.png",
        help=f"write a Gantt chart ({', '.join(PLOT_SUFFIXES)}; one panel per "
        "schedule with --compare)",
    )
    draw = f"workers drawn by --plot, from worker 0 (default {DEFAULT_PLOT_WORKERS})"
    size(out, "--plot-workers", "N", MAX_WORKERS, draw, DEFAULT_PLOT_WORKERS)


_SHAPE_FLAGS = ("seqlen", "seqlen_k", "seqlens", "seqlens_k", "headdim")
_TILE_FLAGS = ("q_tiles", "kv_tiles", "tile_ratio")
_SINGLE_SHAPE_FLAGS = (
    "heads",
    "kv_heads",
    "batch",
    "causal",
    "window",
    "invariant",
    "gqa_split",
    "schedule",
    "ascii",
    "plot",
)


def _given(args: argparse.Namespace, dests: Sequence[str]) -> list[str]:
    return ["--" + d.replace("_", "-") for d in dests if getattr(args, d) not in (None, False)]


def resolve_spec(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[ScheduleSpec, rep.Shape | None] | None:
    """The spec the arguments describe, or None when they ask for the default sweep."""
    shape_flags, tile_flags = _given(args, _SHAPE_FLAGS), _given(args, _TILE_FLAGS)
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
                "(without a shape, the sweep covers both masks and every schedule)"
            )
        return None
    heads = args.heads or 1
    kv_heads = args.kv_heads or heads
    if heads % kv_heads:
        parser.error(f"argument --kv-heads: {kv_heads} does not divide --heads {heads}")
    batch = args.batch or 1
    invariant = args.invariant is not False
    try:
        left, right = args.window if args.window is not None else (-1, -1)
        mask = Mask(causal=args.causal, window_left=left, window_right=right)
    except ValueError as exc:
        parser.error(f"argument --window: {exc}")
    try:
        if args.seqlens_k is not None and args.seqlens is None:
            parser.error("--seqlens-k needs --seqlens")
        if args.seqlens is not None:
            spec, shape = _varlen_spec(args, parser, heads, kv_heads, mask, invariant)
        elif shape_flags:
            if args.seqlen is None or args.headdim is None:
                missing = "--seqlen" if args.seqlen is None else "--headdim"
                parser.error(f"{shape_flags[0]} needs {missing} too")
            seqlen_k = args.seqlen_k or args.seqlen
            problem = Problem(batch, args.seqlen, seqlen_k, heads, kv_heads, args.headdim, mask)
            spec, shape = rep.analysis_spec(
                problem, args.workers, invariant, gqa_split=args.gqa_split
            )
        else:
            if args.q_tiles is None and args.kv_tiles is None:
                parser.error("--tile-ratio needs --q-tiles or --kv-tiles")
            ratio = args.tile_ratio or 1
            q_tiles = args.q_tiles or args.kv_tiles * ratio
            kv_tiles = args.kv_tiles or -(-q_tiles // ratio)
            spec = ScheduleSpec(
                batch=batch,
                q_heads=heads,
                kv_heads=kv_heads,
                q_tiles=q_tiles,
                kv_tiles=kv_tiles,
                mask=mask,
                tile_ratio=ratio,
                workers=args.workers,
                invariant=invariant,
            )
            shape = None
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise CliError(f"invalid shape: {exc}") from None
    tasks = spec.num_tasks()
    if tasks > MAX_TASKS:
        raise CliError(
            f"the shape has {tasks} tile tasks, more than the {MAX_TASKS} an analysis "
            "takes (fewer --batch, --heads or tiles)"
        )
    return spec, shape


def _varlen_spec(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    heads: int,
    kv_heads: int,
    mask: Mask,
    invariant: bool,
) -> tuple[ScheduleSpec, rep.Shape]:
    """The spec of ``--seqlens`` (and ``--seqlens-k``): packed sequences tiled as the backward."""
    for flag in ("seqlen", "seqlen_k", "batch"):
        if getattr(args, flag) is not None:
            name = "--" + flag.replace("_", "-")
            parser.error(f"argument --seqlens: not allowed with {name} (it gives every length)")
    if args.headdim is None:
        parser.error("--seqlens needs --headdim too")
    lengths_k = args.seqlens_k if args.seqlens_k is not None else args.seqlens
    if len(lengths_k) != len(args.seqlens):
        parser.error(
            f"argument --seqlens-k: {len(lengths_k)} lengths for {len(args.seqlens)} sequences"
        )
    seqlens = list(zip(args.seqlens, lengths_k, strict=True))
    return rep.varlen_analysis_spec(
        seqlens, heads, kv_heads, args.headdim, mask, args.workers, invariant, args.gqa_split
    )


def run_schedule(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``dash-attn schedule``: one shape, a comparison, or the default sweep."""
    resolved = resolve_spec(args, parser)
    if resolved is None:
        sweep = rep.run_sweep(args.workers, args.cost_c, args.cost_r)
        print(rep.to_json(rep.sweep_json(sweep)) if args.json else rep.sweep_text(sweep))
        return 0
    spec, shape = resolved
    try:
        result = rep.report_spec(
            spec,
            shape,
            args.schedule or "auto",
            compare=args.compare,
            cost_c=args.cost_c,
            cost_r=args.cost_r,
        )
    except rep.AnalysisError as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        parser.error(f"argument --schedule: {exc}")
    if args.json:
        print(rep.to_json(rep.spec_json(result, compare=args.compare, ascii_grid=args.ascii)))
    else:
        show = args.ascii or (not args.compare and args.plot is None and rep.is_tiny(spec))
        print(rep.spec_text(result, compare=args.compare, ascii_grid=show))
    if args.plot is not None:
        _write_plot(result, args.plot, args.plot_workers, sys.stderr if args.json else sys.stdout)
    return 0


def _write_plot(result: rep.SpecReport, path: Path, max_workers: int, stream: object) -> None:
    try:
        from .schedule.plot import plot_gantt
    except ImportError as exc:  # matplotlib is a dependency, but a broken install should say so
        raise CliError(f"--plot needs matplotlib ({exc})") from None
    pairs = [(a.schedule, a.sim) for a in result.analyses]
    try:
        plot_gantt(pairs, path, title=result.title, max_workers=max_workers)
    except OSError as exc:
        raise CliError(
            f"argument --plot: cannot write {str(path)!r}: {exc.strerror or exc}"
        ) from None
    print(f"wrote {path}", file=stream)  # type: ignore[call-overload]


def _run_bench(argv: Sequence[str]) -> int:
    """Hand ``argv`` to ``dash_attn.bench.main``: ``add_bench_arguments(parser)`` then ``run``."""
    try:
        module = importlib.import_module(BENCH_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name in (BENCH_MODULE, BENCH_MODULE.rpartition(".")[0]):
            why = f"not available: this installation has no {BENCH_MODULE} module"
        else:
            why = f"needs the package {exc.name!r}, which is not installed"
        print(f"{PROG} bench: {why}", file=sys.stderr)
        return 2
    doc = (module.__doc__ or "").strip().splitlines()
    parser = argparse.ArgumentParser(
        prog=f"{PROG} bench", description=doc[0] if doc else None, allow_abbrev=False
    )
    add_arguments = getattr(module, "add_bench_arguments", None)
    if add_arguments is not None:
        add_arguments(parser)
    status = module.run(parser.parse_args(list(argv)))
    return 0 if status is None else int(status)


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
        if args.command == "bench-packed":
            from .bench.packed import main as packed_main

            return packed_main(list(extra))
        if args.command == "bench-graphs":
            from .bench.graphs import main as graphs_main

            return graphs_main(list(extra))
        if args.command == "check":
            from .check import main as check_main

            return check_main(extra)
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
