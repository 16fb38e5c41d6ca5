"""Benchmark the attention backward of dash-attn against FA4, FlexAttention and SDPA on this GPU.

``dash-attn bench`` (this module's ``add_bench_arguments`` and ``run``). Without options it runs
the paper's operator sweep (section 5.2): bf16, 16,384 tokens (batch = 16384 / seqlen), hidden
2048 (heads = 2048 / head dim), head dims 64 and 128, full and causal masks, seqlen 512 to 16k;
every provider of ``providers.py`` on each of the 24 configs, then the determinism table (max
|delta| of the gradients over repeated backward calls), then the DAG model against the
measurements. ``--e2e`` adds one transformer block of LLaMA3-8B, Qwen2.5-7B and a ViT-H-like
model.

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
import datetime as dt
import importlib.metadata
import io
import math
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .providers import (
    FAMILIES,
    Case,
    Provider,
    ProviderUnavailable,
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
from .timing import (
    MODES,
    Inputs,
    Timer,
    attention_flops,
    cleanup,
    do_bench_ms,
    gpu_alive,
    launched_schedule,
    measure,
    repeat_diffs,
    short_reason,
    tflops,
    warm_up_gpu,
)

# The paper's grid (section 5.2), the same as `dash-attn schedule`'s default sweep.
DEFAULT_TOKENS = 16384
DEFAULT_HIDDEN = 2048
DEFAULT_HEADDIMS = (64, 128)
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_MASKS = ("full", "causal")
QUICK_SEQLENS = (1024, 8192)
DEFAULT_WARMUP_MS = 25.0
# Seconds of matmuls before the run's first timing (see timing.warm_up_gpu).
GPU_WARMUP_S = 2.0
DEFAULT_REP_MS = 100.0
QUICK_WARMUP_MS = 10.0
QUICK_REP_MS = 40.0
DETERMINISM_SEQLEN = 4096
DETERMINISM_REPEATS = 10
DEFAULT_WORKERS = 132  # SMs of an H100/H200 SXM: the model sweep's machine without a GPU

# Seconds an optional stage needs at least (rough, from H200 runs of this harness); with
# --deadline-s a stage that does not fit is skipped rather than cut off by an outer time limit.
STAGE_RESERVE_S = {"report": 15.0, "determinism": 30.0, "e2e": 90.0, "model": 25.0}

_MASK_NAMES = {"full": False, "f": False, "causal": True, "c": True}


# ------------------------------------------------------------------------------------------------
# Arguments


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _mask_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in _MASK_NAMES]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"masks are 'full' and 'causal', got {text!r}")
    return ["causal" if _MASK_NAMES[v] else "full" for v in values]


def parse_configs(text: str) -> list[tuple[int, bool, int]]:
    """``"128:causal:16384,64:full:2048"`` -> ``[(128, True, 16384), (64, False, 2048)]``.

    Masks may be abbreviated ``c`` and ``f``.
    """
    configs = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        if len(parts) != 3 or parts[1] not in _MASK_NAMES:
            raise argparse.ArgumentTypeError(
                f"a config is HEADDIM:MASK:SEQLEN with MASK full or causal, got {item!r}"
            )
        try:
            headdim, seqlen = int(parts[0]), int(parts[2])
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"HEADDIM and SEQLEN must be integers in {item!r}"
            ) from None
        if headdim < 1 or seqlen < 1:
            raise argparse.ArgumentTypeError(f"HEADDIM and SEQLEN must be positive in {item!r}")
        configs.append((headdim, _MASK_NAMES[parts[1]], seqlen))
    if not configs:
        raise argparse.ArgumentTypeError("--configs is empty")
    return configs


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
    grid.add_argument("--hidden", type=int, default=DEFAULT_HIDDEN, help="heads * head dim")
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
# Configs


def resolve_cases(args: argparse.Namespace) -> list[Case]:
    """The sweep's cases, grouped by (head dim, mask), seqlen growing within a group.

    Grouping lets one compile per group serve all its seqlens. Groups run in the order of their
    weight in the paper (head dim 128 before 64, causal before full), so a run stopped by
    ``--deadline-s`` has measured the configs that matter most.
    """
    if args.configs:
        triples = list(args.configs)
    else:
        triples = [
            (d, m == "causal", s)
            for d in args.headdims
            for m in args.masks
            for s in (QUICK_SEQLENS if args.quick else args.seqlens)
        ]
    cases = []
    for headdim, causal, seqlen in triples:
        if args.hidden % headdim:
            raise ValueError(f"--hidden {args.hidden} is not a multiple of head dim {headdim}")
        heads = args.hidden // headdim
        batch = max(1, args.tokens // seqlen)
        cases.append(Case(batch, seqlen, heads, heads, headdim, causal, args.dtype))
    order = {c: i for i, c in enumerate(cases)}
    return sorted(
        dict.fromkeys(cases), key=lambda c: (-c.headdim, not c.causal, c.seqlen, order[c])
    )


def is_default_grid(args: argparse.Namespace) -> bool:
    return (
        not args.configs
        and not args.quick
        and tuple(args.headdims) == DEFAULT_HEADDIMS
        and tuple(args.seqlens) == DEFAULT_SEQLENS
        and tuple(sorted(args.masks)) == tuple(sorted(DEFAULT_MASKS))
        and args.tokens == DEFAULT_TOKENS
        and args.hidden == DEFAULT_HIDDEN
    )


# ------------------------------------------------------------------------------------------------
# Machine


def _git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}-dirty" if dirty and sha else (sha or "unknown")


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(commit: str | None = None) -> dict[str, Any]:
    """GPU, SM count, driver, CUDA, torch, triton, cuDNN, FA4, commit, date; ``cuda_available``.

    Works without torch or triton (their fields then say so), so the no-GPU path can print it.
    """
    info: dict[str, Any] = {
        "gpu": "none",
        "sm_count": None,
        "driver": None,
        "cuda": None,
        "torch": "not installed",
        "triton": "not installed",
        "cudnn": None,
        "flash_attn_4": _dist_version("flash-attn-4"),
        "python": platform.python_version(),
        "commit": commit or _git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cuda_available": False,
    }
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            driver=_driver_version(),
            cuda_available=True,
        )
        if torch.backends.cudnn.is_available():
            info["cudnn"] = torch.backends.cudnn.version()
    return info


def gpu_slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"h200"``: the default results folder of a GPU."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")
    return slug or "gpu"


# ------------------------------------------------------------------------------------------------
# Run-time helpers


class Deadline:
    """Seconds left of ``--deadline-s`` (infinite without one)."""

    def __init__(self, seconds: float | None) -> None:
        self.start = time.monotonic()
        self.end = None if seconds is None else self.start + seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def remaining(self) -> float:
        return math.inf if self.end is None else self.end - time.monotonic()

    def allows(self, stage: str) -> bool:
        return self.remaining() >= STAGE_RESERVE_S.get(stage, 0.0)


class _Tee(io.TextIOBase):
    """Writes to a stream and to the log file."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        # Code that writes to the file descriptor (subprocesses) bypasses the log, not the screen.
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"


class LogTo:
    """Copy stdout and stderr into ``path`` for the duration of a ``with`` block."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> LogTo:
        self.file = self.path.open("w", buffering=1)
        self.saved = sys.stdout, sys.stderr
        sys.stdout = _Tee(sys.stdout, self.file)
        sys.stderr = _Tee(sys.stderr, self.file)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            # The interpreter prints the traceback after we are gone: keep a copy in the log.
            traceback.print_exception(exc_type, exc, tb, file=self.file)
        sys.stdout, sys.stderr = self.saved
        self.file.close()


class Progress:
    """A tqdm bar on an interactive terminal; plain numbered lines otherwise.

    tqdm redraws with carriage returns, which turns a captured log into one unreadable line, so it
    is only used when stderr is a terminal (and when tqdm is installed).
    """

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.count = total, desc, 0
        self.bar: Any = None
        stream = sys.__stderr__
        if stream is not None and stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=desc, file=stream, leave=False)

    def done(self, message: str) -> None:
        self.count += 1
        line = f"[{self.count:>{len(str(self.total))}}/{self.total}] {message}"
        if self.bar is not None:
            self.bar.update(1)
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def note(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message, file=sys.stdout)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------------------------------------------
# Stages


@dataclass
class Skips:
    """Providers that did not run, with the reason; each unavailable provider is printed once."""

    items: list[dict[str, Any]]
    announced: set[str]

    def add(self, stage: str, provider: str, case: str, reason: str, note: Callable) -> None:
        self.items.append({"stage": stage, "provider": provider, "config": case, "reason": reason})
        key = f"{provider}: {reason}"
        if key not in self.announced:
            self.announced.add(key)
            note(f"  skip {provider} ({case}): {reason}")


ProviderFactory = Callable[[Case], list[Provider]]


def _case_fields(case: Case) -> dict[str, Any]:
    return {
        "dtype": case.dtype,
        "headdim": case.headdim,
        "seqlen": case.seqlen,
        "batch": case.batch,
        "heads": case.heads,
        "causal": case.causal,
    }


def _short(name: str) -> str:
    return name.removeprefix("dash_")


def _config_line(case: Case, rows: Sequence[dict[str, Any]], seconds: float) -> str:
    parts = [f"{case.label}  {seconds:5.1f} s"]
    for row in rows:
        parts.append(f"{_short(row['provider'])} {row['tflops']:.0f}")
    return "  ".join(parts) if rows else parts[0] + "  (no provider ran)"


def run_sweep(
    cases: Sequence[Case],
    make_providers: ProviderFactory,
    *,
    meta: dict[str, Any],
    mode: str,
    warmup: float,
    rep: float,
    repeats: int,
    seed: int,
    device: Any,
    timer: Timer,
    deadline: Deadline,
    skips: Skips,
    on_config: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Time every provider on every case; returns the rows of bench.csv.

    ``on_config`` is called with all rows so far after each case (the caller rewrites its files).
    """
    rows: list[dict[str, Any]] = []
    progress = Progress(len(cases), f"bench {mode}")
    try:
        for case in cases:
            if not deadline.allows("report"):
                progress.note(f"deadline reached: {len(cases) - progress.count} configs not run")
                break
            started = time.monotonic()
            inputs = Inputs(case, device, seed)
            flops = attention_flops(
                case.batch, case.seqlen, case.seqlen, case.heads, case.headdim, case.causal, mode
            )
            done: list[dict[str, Any]] = []
            for provider in make_providers(case):
                try:
                    m = measure(
                        provider, case, inputs, mode=mode, warmup=warmup, rep=rep,
                        repeats=repeats, timer=timer, device=device,
                    )  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - a failing provider never stops the sweep
                    skips.add("sweep", provider.name, case.label, short_reason(exc), progress.note)
                    cleanup(device)
                    if not isinstance(exc, ProviderUnavailable) and not gpu_alive(device):
                        progress.note("the CUDA context is broken: stopping the sweep")
                        return rows
                    continue
                done.append(
                    {
                        **meta,
                        "mode": mode,
                        **_case_fields(case),
                        "provider": provider.name,
                        "deterministic": provider.deterministic,
                        "schedule": m.schedule,
                        "ms": m.ms,
                        "tflops": tflops(flops, m.ms),
                        "bitwise_repeatable": m.bitwise_repeatable,
                        "kernel": m.kernel,
                    }
                )
            del inputs
            cleanup(device)
            rows.extend(done)
            progress.done(_config_line(case, done, time.monotonic() - started))
            if on_config is not None:
                on_config(rows)
    finally:
        progress.close()
    return rows


def run_determinism(
    cases: Sequence[Case],
    make_providers: ProviderFactory,
    *,
    meta: dict[str, Any],
    repeats: int,
    seed: int,
    device: Any,
    deadline: Deadline,
    skips: Skips,
) -> list[dict[str, Any]]:
    """The paper's Table 1: max |delta| of dq, dk, dv over ``repeats`` backward calls."""
    rows: list[dict[str, Any]] = []
    for case in cases:
        if not deadline.allows("report"):
            print("deadline reached: determinism table cut short")
            break
        inputs = Inputs(case, device, seed)
        for provider in make_providers(case):
            try:
                with provider.context():
                    fn = provider.make(case, device)
                    q, k, v, dout = inputs.get(provider.layout)
                    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                    diffs, equal = repeat_diffs(fn, leaves, dout, repeats)
                    schedule = launched_schedule(provider, "bwd")
            except Exception as exc:  # noqa: BLE001
                skips.add("determinism", provider.name, case.label, short_reason(exc), print)
                cleanup(device)
                if not isinstance(exc, ProviderUnavailable) and not gpu_alive(device):
                    print("the CUDA context is broken: stopping the determinism table")
                    return rows
                continue
            rows.append(
                {
                    **meta,
                    **_case_fields(case),
                    "provider": provider.name,
                    "deterministic": provider.deterministic,
                    "schedule": schedule,
                    "repeats": repeats,
                    "max_diff_dq": diffs[0],
                    "max_diff_dk": diffs[1],
                    "max_diff_dv": diffs[2],
                    "bitwise_repeatable": equal,
                }
            )
        del inputs
        cleanup(device)
        print(f"  determinism {case.label}: {len(rows)} rows so far", flush=True)
    return rows


def determinism_cases(args: argparse.Namespace, cases: Sequence[Case]) -> list[Case]:
    """One case per (head dim, mask) of the sweep, at ``--determinism-seqlen``."""
    seen: dict[tuple[int, bool], Case] = {}
    for case in cases:
        key = (case.headdim, case.causal)
        if key not in seen:
            seqlen = args.determinism_seqlen
            seen[key] = Case(
                max(1, args.tokens // seqlen), seqlen, case.heads, case.kv_heads,
                case.headdim, case.causal, case.dtype,
            )  # fmt: skip
    return list(seen.values())


# ------------------------------------------------------------------------------------------------
# Without a GPU


def run_without_gpu(args: argparse.Namespace, cases: Sequence[Case]) -> int:
    """Print what the DAG model predicts for the requested grid: nothing can be timed here.

    The default grid goes through ``dash-attn schedule``'s own sweep (``cli.run_sweep``); other
    grids through ``model.predicted_table`` (same model, only the requested configs).
    """
    print(
        "No CUDA GPU (torch.cuda.is_available() is False): nothing to time. Running the DASH "
        "schedule-model sweep instead (predicted speedups over fa3, cost C = R = 1)."
    )
    from dash_attn import cli

    sweep = getattr(cli, "run_sweep", None)
    workers = getattr(cli, "DEFAULT_WORKERS", DEFAULT_WORKERS)
    if sweep is not None and is_default_grid(args):
        return int(
            sweep(argparse.Namespace(workers=workers, cost_c=1.0, cost_r=1.0, json=False)) or 0
        )
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
    provider_factory: Callable[[Case, int], list[Provider]] = providers_for_case,
) -> int:
    """Every stage on the GPU; ``device``, ``timer`` and ``provider_factory`` are replaceable so
    that the whole orchestration runs in the CPU tests with test doubles."""
    if device is None:
        import torch

        device = torch.device("cuda", torch.cuda.current_device())
    workers = int(info["sm_count"])
    patterns = args.providers
    set_flex_dynamic(args.flex_dynamic)
    meta = {k: info[k] for k in ("gpu", "sm_count", "torch", "triton", "commit", "date")}
    argv = sys.argv[1:]
    print(
        f"out dir {out_dir}; mode {args.mode}, {args.dtype}, warmup {args.warmup:g} ms, rep "
        f"{args.rep:g} ms, {len(cases)} configs; python {info['python']}, pid {os.getpid()}"
    )
    if any(family_of(p.name) == "fa4" for p in select(_peer_probe(), patterns)):
        reason = fa4_status()
        if reason is not None:
            print(f"FA4 not available, fa4_* skipped: {reason}")

    def make_providers(case: Case) -> list[Provider]:
        return select(provider_factory(case, workers), patterns)

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
                    "gpu_warmup_s": GPU_WARMUP_S,
                    "repeat_check": args.repeat_check,
                    "tokens": args.tokens,
                    "hidden": args.hidden,
                    "timer": "triton.testing.do_bench, median, L2 flushed",
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
                det_cases, make_providers, meta=meta, repeats=args.determinism_repeats,
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
            model_rows = model.model_vs_measured(rows, deadline=deadline)
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
