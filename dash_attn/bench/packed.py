"""Packed documents and sliding window: dash-attn against FA4 and FlexAttention (issue #12).

    python -m dash_attn.bench.packed --out DIR [--quick] [--rows varlen,window] [--providers ...]
        [--deadline-s S] [--append]

Rows and FLOPs: ``packed_rows``; providers: ``packed_providers``; files, tables and the plot:
``packed_report``. For every row, provider and mode (``fwd``, ``bwd``) it writes one line of
``DIR/packed.csv``: median ms, TFLOPS on the pairs the mask keeps, the speed ratio to ``fa4_det``
measured in the same run (``fa4_det ms / ms``, > 1 = faster), whether three calls gave the same
bits, the largest |out - reference| (the first provider that ran, ``fa4_det`` unless it failed: a
provider with another mask than the others shows here), and a status with the reason when it did
not run. ``DIR/packed.json`` holds the same rows with the machine, versions, command and document
lengths; ``DIR/packed.png`` the bars; ``DIR/packed.log`` what was printed. A provider that cannot
run is a row with its reason; nothing stops the run but a broken CUDA context or
``--deadline-s``. When all rows do not fit in one GPU call, measure them in several with
``--append``: each row is still measured whole, with its baseline, by one run.

A CLI subcommand can reuse ``add_bench_arguments(parser)`` and ``run(args)``, as ``dash-attn
bench`` does with ``dash_attn.bench.main``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .main import DEFAULT_REP_MS, DEFAULT_WARMUP_MS, QUICK_REP_MS, QUICK_WARMUP_MS
from .packed_providers import BHSD, BSHD, THD, PackedProvider, providers_for_row
from .packed_report import BASELINE, PACKED_MODES, plot_packed, summary_table, write_outputs
from .packed_rows import ROW_NAMES, TOTAL_TOKENS, WINDOW_LEFT, PackedRow, make_rows
from .providers import ProviderUnavailable, select
from .report import header_line
from .runinfo import Deadline, LogTo, _dist_version, machine_info
from .timing import (
    Timer,
    bench_step,
    cleanup,
    gpu_alive,
    launched_kernel,
    launched_schedule,
    repeat_diffs,
    short_reason,
    tflops,
    wall_clock_ms,
)

PROG = "python -m dash_attn.bench.packed"
REPEATS = 3
GPU_WARMUP_S = 2.0
ProvidersFor = Callable[[PackedRow], tuple[list[PackedProvider], str | None]]


# ------------------------------------------------------------------------------------------------
# Inputs


class PackedInputs:
    """q, k, v, dout of one row, drawn once (``thd``) and shared by every provider."""

    def __init__(self, row: PackedRow, device: Any, seed: int) -> None:
        import torch

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[row.dtype]
        gen = torch.Generator(device=device).manual_seed(seed)

        def draw(heads: int) -> Any:
            shape = (row.tokens, heads, row.headdim)
            return torch.randn(shape, generator=gen, device=device, dtype=dtype)

        self.thd = (draw(row.heads), draw(row.kv_heads), draw(row.kv_heads), draw(row.heads))
        self.cache: dict[str, tuple[Any, ...]] = {THD: self.thd}

    def get(self, layout: str) -> tuple[Any, ...]:
        if layout not in self.cache:
            if layout == BSHD:
                self.cache[layout] = tuple(x.unsqueeze(0) for x in self.thd)
            elif layout == BHSD:
                self.cache[layout] = tuple(x.transpose(0, 1).unsqueeze(0).contiguous()
                                           for x in self.thd)  # fmt: skip
            else:
                raise ValueError(f"unknown layout {layout!r}")
        return self.cache[layout]


def to_thd(out: Any, layout: str) -> Any:
    """A provider's output back in ``thd`` (to compare it with the reference)."""
    if layout == BSHD:
        return out.squeeze(0)
    if layout == BHSD:
        return out.squeeze(0).transpose(0, 1)
    return out


# ------------------------------------------------------------------------------------------------
# One provider on one row


def row_fields(row: PackedRow) -> dict[str, Any]:
    return {
        "row": row.name,
        "tokens": row.tokens,
        "docs": len(row.lengths),
        "heads": row.heads,
        "kv_heads": row.kv_heads,
        "headdim": row.headdim,
        "window_left": row.window_left,
        "pairs": row.pairs,
    }


def base_rows(row: PackedRow, provider: PackedProvider, status: str, reason: str | None) -> list:
    """One row per mode, not measured (yet): ``status`` and ``reason`` say why."""
    return [
        {
            **row_fields(row),
            "mode": mode,
            "provider": provider.name,
            "family": provider.family,
            "deterministic": provider.deterministic,
            "schedule": provider.schedule,
            "status": status,
            "reason": reason,
        }
        for mode in PACKED_MODES
    ]


def launched(provider: PackedProvider, mode: str) -> dict[str, str | None]:
    """The schedule a dash backward really ran (``auto`` resolved) and its kernel configuration,
    from ``last_launch_info`` (``timing``'s readers); the requested schedule if it cannot say."""
    try:
        return {
            "schedule": launched_schedule(provider, mode),  # type: ignore[arg-type]
            "kernel": launched_kernel(provider, mode),  # type: ignore[arg-type]
        }
    except Exception:  # noqa: BLE001 - a record of what ran is worth no failed measurement
        return {"schedule": provider.schedule, "kernel": None}


class Reference:
    """The forward output of the first provider that ran on a row, in ``thd``."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.out: Any = None

    def diff(self, name: str, out: Any) -> float | None:
        if self.out is None:
            self.name, self.out = name, out.detach().float()
            return 0.0
        return float((out.detach().float() - self.out).abs().max())


def _out_diff(
    fn: Callable[..., Any], leaves: Sequence[Any], provider: PackedProvider, reference: Reference
) -> float | None:
    import torch

    with torch.no_grad():
        out = fn(*leaves)
    return reference.diff(provider.name, to_thd(out, provider.layout))


def measure_provider(
    provider: PackedProvider,
    row: PackedRow,
    inputs: PackedInputs,
    reference: Reference,
    *,
    timer: Timer,
    warmup: float,
    rep: float,
    repeats: int,
    device: Any,
) -> tuple[list[dict[str, Any]], bool]:
    """Time ``provider`` on ``row`` in each mode; check its bits over ``repeats`` calls.

    Returns the rows and whether the CUDA context still works. A failure of ``make``
    (unavailable) or of one mode (error) is recorded in the rows, never raised.
    """
    rows = base_rows(row, provider, "ok", None)
    try:
        fn = provider.make(row, device)
    except ProviderUnavailable as exc:
        return base_rows(row, provider, "unavailable", str(exc)), True
    except Exception as exc:  # noqa: BLE001 - e.g. a compile error: report it, go on
        return base_rows(row, provider, "error", short_reason(exc)), gpu_alive(device)
    q, k, v, dout = inputs.get(provider.layout)
    for out_row in rows:
        mode = out_row["mode"]
        grad = mode == "bwd"
        leaves = [x.detach().requires_grad_(grad) for x in (q, k, v)]
        try:
            if mode == "fwd":
                out_row["max_out_diff"] = _out_diff(fn, leaves, provider, reference)
            step = bench_step(fn, leaves, dout, mode)
            ms = timer(step, warmup, rep, leaves if grad else None)
            out_row.update(launched(provider, mode))
            del step  # frees the timed graph before the check builds its own
            if repeats >= 2:
                out_row["bits_repeatable"] = repeat_diffs(fn, leaves, dout, repeats, mode)[1]
        except Exception as exc:  # noqa: BLE001 - one failing mode never stops the run
            out_row.update(status="error", reason=short_reason(exc))
            cleanup(device)
            if not gpu_alive(device):
                for later in rows[rows.index(out_row) + 1 :]:
                    later.update(status="not run", reason="CUDA context broken")
                return rows, False
            continue
        out_row.update(ms=ms, tflops=tflops(row.flops(mode), ms))
    return rows, True


# ------------------------------------------------------------------------------------------------
# The run


def run_packed(
    rows_spec: Sequence[PackedRow],
    providers_for: ProvidersFor,
    *,
    out_dir: Path,
    meta: dict[str, Any],
    timer: Timer,
    device: Any,
    deadline: Deadline,
    warmup: float,
    rep: float,
    repeats: int = REPEATS,
    seed: int = 0,
    patterns: Sequence[str] | None = None,
    previous: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Every provider on every row; returns the CSV rows (files rewritten after each provider),
    after the ``previous`` rows (``--append``: other rows measured by an earlier run).

    Once ``deadline`` has passed, or a provider broke the CUDA context, no provider is started:
    the rest get ``status="not run"`` with the reason.
    """
    rows: list[dict[str, Any]] = list(previous)
    meta = {
        **meta,
        "rows_spec": list(meta.get("rows_spec", [])),
        "schedule_notes": dict(meta.get("schedule_notes", {})),
        "references": dict(meta.get("references", {})),
    }
    stop: str | None = None
    for row in rows_spec:
        providers, note = providers_for(row)
        providers = select(providers, patterns)  # type: ignore[arg-type]
        if not providers:
            print(f"# {row.name}: no provider matches --providers {','.join(patterns or [])}")
        meta["rows_spec"].append({**row_fields(row), "label": row.label, "lengths": row.lengths,
                                  "cu_seqlens": row.cu_seqlens})  # fmt: skip
        if note:
            meta["schedule_notes"][row.name] = note
            named = [p.schedule for p in providers if p.family == "dash"]
            print(f"# {row.name}: {note}; dash schedules {named}")
        print(f"== {row.label}; lengths {list(row.lengths)}", flush=True)
        inputs = PackedInputs(row, device, seed) if stop is None else None
        reference = Reference()
        for provider in providers:
            if stop is None and deadline.remaining() <= 0:
                stop = f"--deadline-s reached after {deadline.elapsed():.0f} s"
            if stop is not None:
                rows.extend(base_rows(row, provider, "not run", stop))
                continue
            done, alive = measure_provider(
                provider, row, inputs, reference, timer=timer, warmup=warmup, rep=rep,
                repeats=repeats, device=device,
            )  # fmt: skip
            if not alive:  # an illegal address poisons every later call: record, stop measuring
                stop = f"CUDA context broken by {provider.name}"
            rows.extend(done)
            cleanup(device)
            print(_progress_line(done, deadline), flush=True)
            write_outputs(out_dir, rows, meta)
        meta["references"][row.name] = reference.name
        del inputs, reference
        cleanup(device)
    write_outputs(out_dir, rows, meta)
    return rows


def _yes_no(value: Any) -> str:
    return "" if value is None else ("yes" if value else "NO")


def _progress_line(done: Sequence[Mapping[str, Any]], deadline: Deadline) -> str:
    parts = [f"  [{deadline.elapsed():5.0f} s] {done[0]['provider']}:"]
    for r in done:
        if r["status"] == "ok":
            parts.append(f"{r['mode']} {r['ms']:.3f} ms {r['tflops']:.0f} TFLOPS "
                         f"bits {_yes_no(r.get('bits_repeatable'))}")  # fmt: skip
        else:
            parts.append(f"{r['mode']} {r['status']} ({r.get('reason')})")
    return "  ".join(parts)


# ------------------------------------------------------------------------------------------------
# Command line


def _comma_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the packed benchmark (also for a CLI subcommand: see ``run``)."""
    parser.add_argument("--out", type=Path, required=True, help="folder of the result files")
    parser.add_argument("--rows", default=",".join(ROW_NAMES), help=f"among {','.join(ROW_NAMES)}")
    parser.add_argument(
        "--providers", type=_comma_list, default=None,
        help="comma list of names, families (dash, fa4, flex) or shell patterns like 'dash_*' "
        "(default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help=f"warmup {QUICK_WARMUP_MS:g} ms, rep {QUICK_REP_MS:g} ms (default "
        f"{DEFAULT_WARMUP_MS:g} / {DEFAULT_REP_MS:g})",
    )  # fmt: skip
    parser.add_argument("--warmup", type=float, default=None, help="ms")
    parser.add_argument("--rep", type=float, default=None, help="ms")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="calls compared bitwise")
    parser.add_argument("--seed", type=int, default=0, help="document lengths and inputs")
    parser.add_argument("--tokens", type=int, default=TOTAL_TOKENS, help="tokens per row")
    parser.add_argument("--window", type=int, default=WINDOW_LEFT, help="keys back (window row)")
    parser.add_argument(
        "--append", action="store_true",
        help="keep the other rows of an existing DIR/packed.json (one row per GPU call when the "
        "whole run does not fit in one); the rows measured now replace their old lines",
    )  # fmt: skip
    parser.add_argument(
        "--deadline-s", type=float, default=None,
        help="start no provider after this many seconds (files are still written)",
    )  # fmt: skip
    parser.add_argument(
        "--commit", default=None,
        help="the commit measured (a copied checkout's git HEAD may be stale; default: git's)",
    )  # fmt: skip


def run_info(commit: str | None = None) -> dict[str, Any]:
    """``machine_info`` plus the versions this benchmark's peers bring (CuTe-DSL, FA4)."""
    info = machine_info(commit)
    info["cutlass_dsl"] = _dist_version("nvidia-cutlass-dsl")
    return info


def run_record(meta: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """Which run measured which rows (``packed.json``'s ``runs``)."""
    return {**{k: meta[k] for k in ("command", "header_line", "settings")}, "rows": list(names)}


def earlier_rows(
    path: Path, meta: dict[str, Any], names: Sequence[str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``--append``: the rows of ``path`` (an earlier ``packed.json``) for rows other than
    ``names``, and ``meta`` carrying over their lengths, notes, references and run records.

    Ratios stay within one run: they are taken per (row, mode), and one run measures a row whole.
    """
    now = run_record(meta, names)
    if not path.exists():
        return {**meta, "runs": [now]}, []
    old = json.loads(path.read_text())
    keep = [r for r in old.get("rows", []) if r["row"] not in names]
    kept = {r["row"] for r in keep}
    runs = [{**r, "rows": [n for n in r["rows"] if n in kept]} for r in old.get("runs", [])]
    merged = {
        **meta,
        "rows_spec": [x for x in old.get("rows_spec", []) if x["row"] in kept],
        "schedule_notes": {k: v for k, v in old.get("schedule_notes", {}).items() if k in kept},
        "references": {k: v for k, v in old.get("references", {}).items() if k in kept},
        "runs": [*(r for r in runs if r["rows"]), now],
    }
    return merged, keep


def run(
    args: argparse.Namespace,
    *,
    device: Any = None,
    timer: Timer | None = None,
    providers_for: ProvidersFor = providers_for_row,
    size: Mapping[str, int] | None = None,
) -> int:
    """The benchmark for parsed ``args`` (``add_bench_arguments``); returns the exit status.

    ``device``, ``timer``, ``providers_for`` and ``size`` (``make_rows`` keywords) are
    replaceable so that the CPU tests run it whole with test doubles.
    """
    deadline = Deadline(args.deadline_s)
    warmup = args.warmup if args.warmup is not None else (
        QUICK_WARMUP_MS if args.quick else DEFAULT_WARMUP_MS)  # fmt: skip
    rep = args.rep if args.rep is not None else (QUICK_REP_MS if args.quick else DEFAULT_REP_MS)
    try:
        spec = make_rows(
            [n for n in args.rows.split(",") if n], args.seed, total=args.tokens,
            window_left=args.window, **(size or {}),
        )  # fmt: skip
    except ValueError as exc:
        print(f"packed: error: {exc}", file=sys.stderr)
        return 2
    info = run_info(getattr(args, "commit", None))
    if device is None:
        if not info["cuda_available"]:
            print(f"{header_line(info)}\npacked: needs a CUDA GPU; nothing timed", file=sys.stderr)
            return 1
        import torch

        from .timing import do_bench_ms, warm_up_gpu

        device = torch.device("cuda", torch.cuda.current_device())
        timer = timer or do_bench_ms
        warm_up_gpu(device, GPU_WARMUP_S)
    timer = timer or wall_clock_ms
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "header": info,
        "header_line": header_line(info),
        "command": getattr(args, "command_line", None) or shlex.join(sys.argv),
        "settings": {"warmup_ms": warmup, "rep_ms": rep, "repeats": args.repeats,
                     "seed": args.seed, "deadline_s": args.deadline_s,
                     "providers": args.providers, "baseline": BASELINE},
    }  # fmt: skip
    names = [r.name for r in spec]
    if args.append:
        meta, previous = earlier_rows(args.out / "packed.json", meta, names)
    else:
        meta, previous = {**meta, "runs": [run_record(meta, names)]}, []
    with LogTo(args.out / "packed.log", append=args.append):
        print(meta["header_line"], flush=True)
        rows = run_packed(
            spec, providers_for, out_dir=args.out, meta=meta, timer=timer, device=device,
            deadline=deadline, warmup=warmup, rep=rep, repeats=args.repeats, seed=args.seed,
            patterns=args.providers, previous=previous,
        )  # fmt: skip
        try:
            plot = plot_packed(rows, args.out / "packed.png", meta["header_line"])
        except Exception as exc:  # noqa: BLE001 - the CSV and JSON are written; say why no PNG
            print(f"no plot: {short_reason(exc)}")
            plot = None
        print(summary_table(rows))
        print(f"files: {args.out / 'packed.csv'}, {args.out / 'packed.json'}"
              + (f", {plot}" if plot else "") + f"; total {deadline.elapsed():.0f} s")  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None, **doubles: Any) -> int:
    """``python -m dash_attn.bench.packed``; ``doubles`` go to ``run`` (tests)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    add_bench_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command_line = f"{PROG} {shlex.join(argv)}"
    return run(args, **doubles)


if __name__ == "__main__":
    sys.exit(main())
