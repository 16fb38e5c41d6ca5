"""Packed documents and sliding window: dash-attn against FA4 and FlexAttention (issue #12).

    python -m dash_attn.bench.packed --out DIR [--quick] [--rows varlen,window] [--providers ...]
        [--deadline-s S]

Rows and FLOPs: ``packed_rows``; providers: ``packed_providers``. For every row, provider and
mode (``fwd``, ``bwd``) it writes one line of ``DIR/packed.csv``: median ms, TFLOPS on the pairs
the mask keeps, the speed ratio to ``fa4_det`` measured in the same run (``fa4_det ms / ms``,
> 1 = faster), whether three calls gave the same bits, the largest |out - reference| (the first
provider that ran, ``fa4_det`` unless it failed: a provider with another mask than the others
shows here), and a status with the reason when it did not run. ``DIR/packed.json`` holds the
same rows with the machine, versions, command and document lengths; ``DIR/packed.png`` the bars.
A provider that cannot run is a row with its reason; nothing stops the run but a broken CUDA
context or ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..schedule.report import text_table
from .main import DEFAULT_REP_MS, DEFAULT_WARMUP_MS, QUICK_REP_MS, QUICK_WARMUP_MS
from .packed_providers import BHSD, BSHD, THD, PackedProvider, providers_for_row
from .packed_rows import ROW_NAMES, TOTAL_TOKENS, WINDOW_LEFT, PackedRow, make_rows
from .providers import ProviderUnavailable, select
from .report import header_line, write_csv, write_json
from .runinfo import Deadline, LogTo, _dist_version, machine_info
from .timing import (
    Timer,
    bench_step,
    cleanup,
    gpu_alive,
    repeat_diffs,
    short_reason,
    tflops,
    wall_clock_ms,
)

PACKED_MODES = ("fwd", "bwd")
BASELINE = "fa4_det"
REPEATS = 3
GPU_WARMUP_S = 2.0
CSV_FIELDS = (
    "row", "mode", "provider", "family", "deterministic", "schedule", "status", "reason", "ms",
    "tflops", "ratio_vs_fa4_det", "bits_repeatable", "max_out_diff", "tokens", "docs", "heads",
    "kv_heads", "headdim", "window_left", "pairs",
)  # fmt: skip
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


def _launched_schedule(provider: PackedProvider, mode: str) -> str | None:
    """The schedule a dash backward really ran (``auto`` resolved), if the launcher says."""
    if provider.family != "dash" or mode != "bwd":
        return provider.schedule
    from dash_attn import last_launch_info

    info = last_launch_info()
    return getattr(info, "schedule_name", None) or provider.schedule


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
) -> list[dict[str, Any]]:
    """Time ``provider`` on ``row`` in each mode; check its bits over ``repeats`` calls.

    A failure of ``make`` (unavailable) or of one mode (error) is recorded in the rows, never
    raised, except when the CUDA context broke (``RuntimeError``): nothing can run after that.
    """
    rows = base_rows(row, provider, "ok", None)
    try:
        fn = provider.make(row, device)
    except ProviderUnavailable as exc:
        return base_rows(row, provider, "unavailable", str(exc))
    except Exception as exc:  # noqa: BLE001 - e.g. a compile error: report it, go on
        return base_rows(row, provider, "error", short_reason(exc))
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
            out_row["schedule"] = _launched_schedule(provider, mode)
            del step  # frees the timed graph before the check builds its own
            if repeats >= 2:
                out_row["bits_repeatable"] = repeat_diffs(fn, leaves, dout, repeats, mode)[1]
        except Exception as exc:  # noqa: BLE001 - one failing mode never stops the run
            out_row.update(status="error", reason=short_reason(exc))
            cleanup(device)
            if not gpu_alive(device):
                raise RuntimeError(f"CUDA context broken by {provider.name}") from exc
            continue
        out_row.update(ms=ms, tflops=tflops(row.flops(mode), ms))
    return rows


# ------------------------------------------------------------------------------------------------
# Ratios and tables


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


def _yes_no(value: Any) -> str:
    return "" if value is None else ("yes" if value else "NO")


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
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# The run


def write_outputs(out_dir: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """packed.csv and packed.json (atomically: rewritten after every provider)."""
    add_ratios(rows)
    write_csv(out_dir / "packed.csv", rows, CSV_FIELDS)
    write_json(out_dir / "packed.json", {**meta, "rows": rows})


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
) -> list[dict[str, Any]]:
    """Every provider on every row; returns the CSV rows (files rewritten after each provider).

    Once ``deadline`` has passed no provider is started: the rest get ``status="not run"``.
    """
    rows: list[dict[str, Any]] = []
    meta = {**meta, "rows_spec": [], "schedule_notes": {}, "references": {}}
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
            try:
                done = measure_provider(
                    provider, row, inputs, reference, timer=timer, warmup=warmup, rep=rep,
                    repeats=repeats, device=device,
                )  # fmt: skip
            except RuntimeError as exc:  # the CUDA context is gone: record and stop measuring
                stop = str(exc)
                done = base_rows(row, provider, "error", stop)
            rows.extend(done)
            cleanup(device)
            print(_progress_line(done, deadline), flush=True)
            write_outputs(out_dir, rows, meta)
        meta["references"][row.name] = reference.name
        del inputs, reference
        cleanup(device)
    write_outputs(out_dir, rows, meta)
    return rows


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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m dash_attn.bench.packed", description=__doc__.splitlines()[0]
    )
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
        "--deadline-s", type=float, default=None,
        help="start no provider after this many seconds (files are still written)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = QUICK_WARMUP_MS if args.quick else DEFAULT_WARMUP_MS
    if args.rep is None:
        args.rep = QUICK_REP_MS if args.quick else DEFAULT_REP_MS
    return args


def run_info() -> dict[str, Any]:
    """``machine_info`` plus the versions this benchmark's peers bring (CuTe-DSL, FA4)."""
    info = machine_info()
    info["cutlass_dsl"] = _dist_version("nvidia-cutlass-dsl")
    return info


def main(
    argv: Sequence[str] | None = None,
    *,
    device: Any = None,
    timer: Timer | None = None,
    providers_for: ProvidersFor = providers_for_row,
    size: Mapping[str, int] | None = None,
) -> int:
    """The command; ``device``, ``timer``, ``providers_for`` and ``size`` (``make_rows``
    keywords) are replaceable so that the CPU tests run it whole with test doubles."""
    args = parse_args(argv)
    deadline = Deadline(args.deadline_s)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        spec = make_rows(
            [n for n in args.rows.split(",") if n], args.seed, total=args.tokens,
            window_left=args.window, **(size or {}),
        )  # fmt: skip
    except ValueError as exc:
        print(f"packed: error: {exc}", file=sys.stderr)
        return 2
    info = run_info()
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
        "command": "python -m dash_attn.bench.packed " + shlex.join(argv),
        "settings": {"warmup_ms": args.warmup, "rep_ms": args.rep, "repeats": args.repeats,
                     "seed": args.seed, "deadline_s": args.deadline_s,
                     "providers": args.providers, "baseline": BASELINE},
    }  # fmt: skip
    with LogTo(args.out / "packed.log"):
        print(meta["header_line"], flush=True)
        rows = run_packed(
            spec, providers_for, out_dir=args.out, meta=meta, timer=timer, device=device,
            deadline=deadline, warmup=args.warmup, rep=args.rep, repeats=args.repeats,
            seed=args.seed, patterns=args.providers,
        )  # fmt: skip
        plot = plot_packed(rows, args.out / "packed.png", meta["header_line"])
        print(summary_table(rows))
        print(f"files: {args.out / 'packed.csv'}, {args.out / 'packed.json'}"
              + (f", {plot}" if plot else "") + f"; total {deadline.elapsed():.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
