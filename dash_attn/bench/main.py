"""Benchmark the attention backward of dash-attn against FA4, FlexAttention and SDPA on this GPU.

``dash-attn bench`` (this module's ``add_bench_arguments`` and ``run``; the configs are
``configs.py``'s, the GPU loops ``sweep.py``'s, the run's header and log ``runinfo.py``'s).
Without options it runs the paper's operator sweep (section 5.2): bf16, 16,384 tokens (batch =
16384 / seqlen), hidden 2048 (heads = 2048 / head dim), head dims 64 and 128, full and causal
masks, seqlen 512 to 16k; every provider of ``providers.py`` on each of the 24 configs, then
the determinism table (max |delta| of the gradients over repeated backward calls), then the DAG
model against the measurements. ``--e2e`` adds one transformer block of LLaMA3-8B,
Qwen2.5-7B and a ViT-H-like model.

Timing: median of ``triton.testing.do_bench`` (L2 flushed before every call) of
``out.backward(dout, retain_graph=True)``, gradients cleared with ``grad_to_none``; one forward per
(config, provider), inputs shared by all providers of a config. FLOPs: see ``timing.py``.

Files in ``--out-dir`` (default ``benchmarks/results/<gpu>/``), rewritten after every config so
that a run cut short still leaves what it measured: ``bench.csv``, ``bench.json`` (machine header,
command line, rows, skipped providers with the reason), ``determinism.csv``, ``e2e.csv``,
``model_vs_measured.csv``, ``bench_<mode>.png``, and ``bench.log`` (everything printed).

A provider that is not installed or fails is skipped with its reason; the sweep goes on. On a
machine without a CUDA GPU the command prints the machine header and runs the schedule-model
sweep of ``dash-attn schedule`` instead.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..schedule import report as schedule_report
from .configs import (
    DEFAULT_HEADDIMS,
    DEFAULT_HIDDEN,
    DEFAULT_MASKS,
    DEFAULT_SEQLENS,
    DEFAULT_TOKENS,
    QUICK_SEQLENS,
    HiddenSizes,
    _int_list,
    _mask_list,
    determinism_cases,
    is_default_grid,
    parse_configs,
    parse_hidden,
    resolve_cases,
)
from .providers import (
    FAMILIES,
    Case,
    Provider,
    check_selection,
    fa4_status,
    family_of,
    provider_names,
    providers_for_case,
    select,
    set_flex_dynamic,
)
from .report import (
    CSV_FIELDS,
    DETERMINISM_FIELDS,
    config_key,
    determinism_table,
    header_line,
    ratio_table,
    read_csv,
    summary_table,
    write_csv,
    write_json,
)
from .runinfo import Deadline, LogTo, gpu_slug, machine_info
from .sweep import Skips, run_determinism, run_sweep
from .timing import (
    MIN_TIMED_CALLS,
    MODES,
    Timer,
    do_bench_ms,
    gpu_alive,
    short_reason,
    warm_up_gpu,
)

DEFAULT_WARMUP_MS = 25.0
# Seconds of matmuls before the run's first timing (see timing.warm_up_gpu).
GPU_WARMUP_S = 2.0
DEFAULT_REP_MS = 100.0
# Providers of one config timed in interleaved rounds, not one after the other: in a single
# sequence, host-bound configs read up to 1.4x apart on the same launch depending on the
# provider's place (H200, session 13; ``timing.ProviderTiming``). An even number, so that with
# every other round reversed each provider runs as often in a round's first half as in its
# second: in session 16's 3-round run a config's first provider read 2.6% faster in round 1
# than in round 2, where it came last (median over the 24 configs; 12% at d128 full 16k), FA4
# in fifth place 0.6% (``ms_rounds`` in session 16's call5-8e4efe2/sweep/bench.csv, in git
# history at 85ebde9).
DEFAULT_ROUNDS = 4
# GPU idleness before each provider's turn in a round (timing.idle_gpu): without it a provider
# timed after a power-hungry one ran at a lower clock (H200, session 18).
DEFAULT_IDLE_MS = 250.0
# With --settle-ms each provider is timed at the clock it sustains by itself: on the H200 the
# power cap settles within about a second of back-to-back calls (a 10 ms backward's first call
# ran at the boost clock and its median over 1.5 s at 1650-1750 MHz, session 18's
# clock/clock.txt). Off by default: the tables are boost-clock numbers unless a run says so.
DEFAULT_SETTLE_MS = 0.0
QUICK_WARMUP_MS = 10.0
QUICK_REP_MS = 40.0
DETERMINISM_SEQLEN = 4096
DETERMINISM_REPEATS = 10


def _provider_list(text: str) -> list[str]:
    patterns = [x.strip() for x in text.split(",") if x.strip()]
    try:
        check_selection(patterns)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--providers: ")) from None
    return patterns


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``dash-attn bench`` (the CLI calls this on its own sub-parser)."""
    grid = parser.add_argument_group(
        "configs",
        f"Default: the paper's grid, {DEFAULT_TOKENS} tokens in total (batch = tokens / seqlen), "
        f"hidden {DEFAULT_HIDDEN} (heads = hidden / head dim).",
    )
    grid.add_argument(
        "--configs",
        type=parse_configs,
        default=None,
        metavar="D:MASK:S,...",
        help="explicit configs, e.g. 128:causal:16384,64:full:2048 (overrides the three below)",
    )
    grid.add_argument(
        "--headdims", type=_int_list, default=list(DEFAULT_HEADDIMS), help="default 64,128"
    )
    grid.add_argument(
        "--seqlens",
        type=_int_list,
        default=list(DEFAULT_SEQLENS),
        help="default " + ",".join(map(str, DEFAULT_SEQLENS)),
    )
    grid.add_argument(
        "--masks", type=_mask_list, default=list(DEFAULT_MASKS), help="default full,causal"
    )
    grid.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help="batch * seqlen")
    grid.add_argument(
        "--hidden",
        type=parse_hidden,
        default=HiddenSizes(DEFAULT_HIDDEN),
        help=f"heads * head dim (default {DEFAULT_HIDDEN}); per head dim: e.g. 2048,96:3072",
    )
    grid.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")

    what = parser.add_argument_group("what to run")
    what.add_argument(
        "--providers",
        type=_provider_list,
        default=None,
        help=(
            "comma list of providers, families (" + ", ".join(FAMILIES) + ") or shell patterns "
            "(default all): " + ", ".join(provider_names())
        ),
    )
    what.add_argument("--mode", choices=MODES, default="bwd", help="what is timed (default bwd)")
    what.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the operator sweep (default on)",
    )
    what.add_argument(
        "--determinism",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=(
            f"the determinism table: max |delta| of dq, dk, dv over {DETERMINISM_REPEATS} "
            f"backward calls at seqlen {DETERMINISM_SEQLEN} (default on)"
        ),
    )
    what.add_argument(
        "--e2e",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="one transformer block of LLaMA3-8B, Qwen2.5-7B, ViT-H-like (default off)",
    )
    what.add_argument(
        "--model",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="DAG model vs measured speedups, model_vs_measured.csv (default on; CPU only)",
    )
    what.add_argument(
        "--plot", action=argparse.BooleanOptionalAction, default=True, help="write PNG figures"
    )
    what.add_argument(
        "--flex-dynamic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=(
            "compile FlexAttention with symbolic sizes, once per head dim and mask (default); "
            "--no-flex-dynamic compiles once per shape (slower to compile)"
        ),
    )
    what.add_argument(
        "--quick",
        action="store_true",
        help=(
            f"seqlens {','.join(map(str, QUICK_SEQLENS))}, warmup {QUICK_WARMUP_MS:g} ms, rep "
            f"{QUICK_REP_MS:g} ms, 3 determinism repeats, smallest e2e shapes"
        ),
    )

    timing = parser.add_argument_group("timing")
    timing.add_argument(
        "--warmup", type=float, default=None, help=f"ms (default {DEFAULT_WARMUP_MS:g})"
    )
    timing.add_argument("--rep", type=float, default=None, help=f"ms (default {DEFAULT_REP_MS:g})")
    timing.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        metavar="N",
        help=(
            "interleaved rounds per config: every provider is timed once per round (every "
            "other round in reverse order) with warmup / N and rep / N ms, and bench.csv has "
            f"the median (default {DEFAULT_ROUNDS})"
        ),
    )
    timing.add_argument(
        "--idle-ms",
        type=float,
        default=DEFAULT_IDLE_MS,
        metavar="MS",
        help=(
            "GPU idle time before each provider's turn in a round, so that none inherits the "
            f"clock the power draw of the one before left (default {DEFAULT_IDLE_MS:g}; 0: none)"
        ),
    )
    timing.add_argument(
        "--settle-ms",
        type=float,
        default=DEFAULT_SETTLE_MS,
        metavar="MS",
        help=(
            "back-to-back untimed calls of each provider before each of its turns, so that it "
            "is timed at the clock its own power draw sustains (training-like; e.g. 1000 with "
            f"--idle-ms 0; default {DEFAULT_SETTLE_MS:g}: boost-clock numbers)"
        ),
    )
    timing.add_argument(
        "--repeat-check",
        type=int,
        default=3,
        metavar="N",
        help="backward calls compared bitwise for bench.csv's bitwise_repeatable (0: skip)",
    )
    timing.add_argument("--determinism-seqlen", type=int, default=DETERMINISM_SEQLEN)
    timing.add_argument("--determinism-repeats", type=int, default=None)
    timing.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    timing.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="stop starting new work after this many seconds and still write every file",
    )

    out = parser.add_argument_group("output")
    out.add_argument(
        "--out-dir", type=Path, default=None, help="default benchmarks/results/<gpu-slug>/"
    )
    out.add_argument(
        "--resume",
        action="store_true",
        help=(
            "keep the rows of an existing OUT_DIR/bench.csv and measure only the configs it lacks "
            "(to finish a run stopped by --deadline-s)"
        ),
    )
    out.add_argument(
        "--commit", default=None, help="commit to record (default: git rev-parse, else unknown)"
    )


# ------------------------------------------------------------------------------------------------
# Without a GPU


def run_without_gpu(args: argparse.Namespace, cases: Sequence[Case]) -> int:
    """Print what the DAG model predicts for the requested grid: nothing can be timed here.

    The default grid is ``dash-attn schedule``'s own sweep (``schedule.report.run_sweep``); other
    grids go through ``model.predicted_table`` (same model, only the requested configs).
    """
    print(
        "No CUDA GPU (torch.cuda.is_available() is False): nothing to time. Running the DASH "
        "schedule-model sweep instead (predicted speedups over fa3, cost C = R = 1)."
    )
    workers = schedule_report.DEFAULT_WORKERS
    if is_default_grid(args):
        print(schedule_report.sweep_text(schedule_report.run_sweep(workers)))
        return 0
    from .model import predicted_table

    print(predicted_table(cases, workers))
    return 0


# ------------------------------------------------------------------------------------------------
# Entry point


def _apply_defaults(args: argparse.Namespace) -> None:
    if args.warmup is None:
        args.warmup = QUICK_WARMUP_MS if args.quick else DEFAULT_WARMUP_MS
    if args.rep is None:
        args.rep = QUICK_REP_MS if args.quick else DEFAULT_REP_MS
    if args.determinism_repeats is None:
        args.determinism_repeats = 3 if args.quick else DETERMINISM_REPEATS


def run(args: argparse.Namespace) -> int:
    """``dash-attn bench``: returns the exit status."""
    deadline = Deadline(args.deadline_s)
    _apply_defaults(args)
    try:
        if args.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
        if args.idle_ms < 0:
            raise ValueError(f"--idle-ms must be >= 0, got {args.idle_ms}")
        if args.settle_ms < 0:
            raise ValueError(f"--settle-ms must be >= 0, got {args.settle_ms}")
        cases = resolve_cases(args)
    except ValueError as exc:
        print(f"dash-attn bench: error: {exc}", file=sys.stderr)
        return 2
    info = machine_info(args.commit)
    if not info["cuda_available"]:
        print(header_line(info))
        return run_without_gpu(args, cases)
    out_dir = args.out_dir or Path("benchmarks") / "results" / gpu_slug(str(info["gpu"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    with LogTo(out_dir / "bench.log"):
        print(header_line(info), flush=True)
        return _run_gpu(args, cases, info, out_dir, deadline)


def _run_gpu(
    args: argparse.Namespace,
    cases: list[Case],
    info: dict[str, Any],
    out_dir: Path,
    deadline: Deadline,
    *,
    device: Any = None,
    timer: Timer = do_bench_ms,
    provider_factory: Callable[[Case, int], list[Provider]] | None = None,
) -> int:
    """Every stage on the GPU; ``device``, ``timer`` and ``provider_factory`` are replaceable so
    that the whole orchestration runs in the CPU tests with test doubles."""
    if device is None:
        import torch

        device = torch.device("cuda", torch.cuda.current_device())
    workers = int(info["sm_count"])
    # The sweep's providers are for its mode's step (the hopper forward covers head dims its
    # backward does not); the determinism table always compares backward calls.
    sweep_factory = provider_factory or functools.partial(providers_for_case, mode=args.mode)
    det_factory = provider_factory or providers_for_case
    patterns = args.providers
    set_flex_dynamic(args.flex_dynamic)
    meta = {k: info[k] for k in ("gpu", "sm_count", "torch", "triton", "commit", "date")}
    argv = sys.argv[1:]
    print(
        f"out dir {out_dir}; mode {args.mode}, {args.dtype}, warmup {args.warmup:g} ms, rep "
        f"{args.rep:g} ms in {args.rounds} interleaved rounds ({args.idle_ms:g} ms idle, then "
        f"{args.settle_ms:g} ms of its own calls before each provider's turn), {len(cases)} "
        f"configs; python "
        f"{info['python']}, pid {os.getpid()}"
    )
    if any(family_of(p.name) == "fa4" for p in select(_peer_probe(), patterns)):
        reason = fa4_status()
        if reason is not None:
            print(f"FA4 not available, fa4_* skipped: {reason}")

    def make_providers(case: Case) -> list[Provider]:
        return select(sweep_factory(case, workers), patterns)

    def make_det_providers(case: Case) -> list[Provider]:
        return select(det_factory(case, workers), patterns)

    skips = Skips([], set())
    rows: list[dict[str, Any]] = []
    written: dict[str, Path] = {}
    previous: list[dict[str, Any]] = []
    todo = list(cases)
    if args.resume and (out_dir / "bench.csv").exists():
        previous = read_csv(out_dir / "bench.csv")
        done = {config_key(r) for r in previous}
        todo = [c for c in cases if (args.mode, c.headdim, c.causal, c.seqlen) not in done]
        print(
            f"resume: {len(previous)} rows kept from {out_dir / 'bench.csv'}, "
            f"{len(todo)} of {len(cases)} configs left"
        )

    def save(current: list[dict[str, Any]]) -> None:
        write_csv(out_dir / "bench.csv", current, CSV_FIELDS)
        write_json(
            out_dir / "bench.json",
            {
                "header": info,
                "header_line": header_line(info),
                "argv": argv,
                "settings": {
                    "mode": args.mode,
                    "dtype": args.dtype,
                    "warmup_ms": args.warmup,
                    "rep_ms": args.rep,
                    "rounds": args.rounds,
                    "idle_ms": args.idle_ms,
                    "settle_ms": args.settle_ms,
                    "gpu_warmup_s": GPU_WARMUP_S,
                    "repeat_check": args.repeat_check,
                    "tokens": args.tokens,
                    # An int as before, the spec's text where head dims differ.
                    "hidden": str(args.hidden) if args.hidden.per_headdim else args.hidden.default,
                    "timer": (
                        "triton.testing.do_bench, median, L2 flushed, at least "
                        f"{MIN_TIMED_CALLS} timed calls per round"
                    ),
                },
                "rows": current,
                "skipped": skips.items,
            },
        )
        written["bench.csv"] = out_dir / "bench.csv"
        written["bench.json"] = out_dir / "bench.json"

    # Before whichever stage times first (the sweep, or the e2e blocks with --no-sweep).
    warmed = warm_up_gpu(device, GPU_WARMUP_S)
    if args.sweep:
        print(f"== operator sweep: {len(todo)} configs (after {warmed:.1f} s of GPU warm-up)")
        rows = previous + run_sweep(
            todo, make_providers, meta=meta, mode=args.mode, warmup=args.warmup, rep=args.rep,
            repeats=args.repeat_check, seed=args.seed, device=device, timer=timer,
            deadline=deadline, skips=skips, on_config=lambda new: save(previous + new),
            rounds=args.rounds, idle_s=args.idle_ms / 1000, settle_ms=args.settle_ms,
        )  # fmt: skip
        save(rows)
    else:
        rows = previous

    det_rows: list[dict[str, Any]] = []
    if args.determinism and gpu_alive(device):
        if deadline.allows("determinism"):
            det_cases = determinism_cases(args, cases)
            print(
                f"== determinism: {len(det_cases)} configs at seqlen {args.determinism_seqlen}, "
                f"{args.determinism_repeats} backward calls each"
            )
            det_rows = run_determinism(
                det_cases, make_det_providers, meta=meta, repeats=args.determinism_repeats,
                seed=args.seed, device=device, deadline=deadline, skips=skips,
            )  # fmt: skip
            write_csv(out_dir / "determinism.csv", det_rows, DETERMINISM_FIELDS)
            written["determinism.csv"] = out_dir / "determinism.csv"
        else:
            print("== determinism: skipped, not enough time left before --deadline-s")

    e2e_rows: list[dict[str, Any]] = []
    if args.e2e and gpu_alive(device):
        if deadline.allows("e2e"):
            from . import e2e

            print("== end-to-end transformer block (forward + backward)")
            e2e_rows = e2e.run_e2e(
                meta=meta, patterns=patterns, quick=args.quick, seed=args.seed, device=device,
                workers=workers, deadline=deadline, skips=skips,
            )  # fmt: skip
            write_csv(out_dir / "e2e.csv", e2e_rows, e2e.E2E_FIELDS)
            written["e2e.csv"] = out_dir / "e2e.csv"
        else:
            print("== e2e: skipped, not enough time left before --deadline-s")

    model_rows: list[dict[str, Any]] = []
    if args.model and rows:
        if deadline.allows("model"):
            from . import model

            print("== DAG model vs measurement (CPU)")
            model_rows = model.model_vs_measured(
                rows, deadline=deadline, backends=tuple(model.BACKEND_PREFIX)
            )
            write_csv(out_dir / "model_vs_measured.csv", model_rows, model.MODEL_FIELDS)
            written["model_vs_measured.csv"] = out_dir / "model_vs_measured.csv"
        else:
            print(
                "== model: skipped (deadline); later, on any machine: python -m "
                f"dash_attn.bench.model --csv {out_dir / 'bench.csv'}"
            )

    if args.plot and rows:
        from .plot import plot_modes

        title = f"{info['gpu']}, {args.dtype}, torch {info['torch']}, commit {info['commit']}"
        try:
            for path in plot_modes(rows, out_dir, title):
                written[path.name] = path
        except Exception as exc:  # noqa: BLE001 - a figure must not lose the numbers
            print(f"plot failed: {short_reason(exc)}")

    if args.sweep:
        save(rows)  # again: bench.json lists the skips of every stage
    _print_summary(rows, det_rows, e2e_rows, model_rows, skips)
    print("\nfiles: " + ", ".join(str(p) for p in written.values()))
    print(f"total {deadline.elapsed():.0f} s")
    return 0


def _peer_probe() -> list[Provider]:
    from .providers import peer_providers

    return peer_providers()


def _print_summary(
    rows: Sequence[dict[str, Any]],
    det_rows: Sequence[dict[str, Any]],
    e2e_rows: Sequence[dict[str, Any]],
    model_rows: Sequence[dict[str, Any]],
    skips: Skips,
) -> None:
    if skips.items:
        reasons: dict[tuple[str, str], int] = {}
        for item in skips.items:
            key = (item["provider"], item["reason"])
            reasons[key] = reasons.get(key, 0) + 1
        print("\nskipped (provider: reason x configs):")
        for (provider, reason), count in sorted(reasons.items()):
            print(f"  {provider}: {reason} x{count}")
    if rows:
        print("\nTFLOPS and ratios (best = fastest deterministic dash schedule):")
        print(ratio_table(rows))
        print()
        print(summary_table(rows))
    if det_rows:
        print("\nDeterminism:")
        print(determinism_table(det_rows))
    if e2e_rows:
        from .report import e2e_table

        print("\nEnd-to-end block, forward + backward:")
        print(e2e_table(e2e_rows))
    if model_rows:
        from .model import agreement_summary

        print("\nDAG model vs measurement:")
        print(agreement_summary(model_rows))
