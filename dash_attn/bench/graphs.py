"""Forward + backward run eagerly and replayed from a CUDA graph: dash-attn against FA4.

    dash-attn bench-graphs --out-dir DIR [--seqlens 512,1024,2048,4096]
        [--headdims 64,128] [--masks full,causal] [--providers P,...] [--rounds 3] [--commit C]

Why: at short sequences an attention call is host-bound. The sweep's d128 causal 512 backward
takes about 0.35 ms on the H200's GPU and 0.4 ms of host time (benchmarks/NOTES.md, session 26),
so an eager timing there measures Python and launch overhead as much as kernels. Training loops
that care remove that overhead with CUDA graphs (``torch.compile(mode="reduce-overhead")``,
``torch.cuda.make_graphed_callables``, ``torch.cuda.graph``); this benchmark measures both.

A step is the forward and ``torch.autograd.grad(out, (q, k, v), dout)`` (nothing accumulates
into ``.grad``, so a replay does the same work as an eager step). Eager: the step timed with
``do_bench_ms`` (L2 flushed before each call, median). Graph: the step captured once, after two
warm-up steps on a side stream, with leaves that no eager step has used (torch's recipe), then
its replay timed the same way. Each round times every provider's eager step and replay
back to back; a row holds the median over ``--rounds`` rounds and each round's time.

Configs are the sweep's (16,384 tokens, hidden 2048: batch = 16384 / seqlen, heads = 2048 /
head dim, bf16). Files in ``--out-dir``: ``graphs.json`` (machine, versions, command, rows) and
``graphs.log``; ``graphs_table(rows)`` is the README's table. A provider that cannot run or
cannot be captured is a row with its reason.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .configs import DEFAULT_HIDDEN, DEFAULT_TOKENS
from .providers import Case, Provider, ProviderUnavailable, providers_for_case, select
from .report import header_line, markdown_table, write_json
from .runinfo import LogTo, _dist_version, machine_info
from .timing import Timer, attention_flops, short_reason, tflops

DEFAULT_PROVIDERS = ("dash_hopper_auto", "dash_hopper_nondet", "fa4_det", "fa4_nondet")
DEFAULT_SEQLENS = (512, 1024, 2048, 4096)
DEFAULT_ROUNDS = 3
WARMUP_MS, REP_MS = 25.0, 60.0
OURS, BASELINE = "dash_hopper_auto", "fa4_det"

# (fn, leaves, dout) -> (replay, the graph's outputs): ``testing.capture_grad_step``.
Capture = Callable[[Callable[..., Any], Sequence[Any], Any], tuple[Callable[[], Any], Any]]


def capture_step(fn: Callable[..., Any], leaves: Sequence[Any], dout: Any) -> tuple[Any, Any]:
    """``testing.capture_grad_step`` (imported on first use: torch is not needed to list
    configs or print the machine header)."""
    from ..testing import capture_grad_step

    return capture_grad_step(fn, leaves, dout)


def graph_cases(
    seqlens: Sequence[int], headdims: Sequence[int], masks: Sequence[str]
) -> list[Case]:
    """The sweep's configs for these lengths, head dims and masks, in table order."""
    for name, values in (("--seqlens", seqlens), ("--headdims", headdims)):
        if not values or any(v <= 0 for v in values):
            raise ValueError(f"{name} must be positive integers, got {list(values)}")
    if not masks or any(m not in ("full", "causal") for m in masks):
        raise ValueError(f"--masks must be 'full' and/or 'causal', got {list(masks)}")
    cases = []
    for d in headdims:
        if DEFAULT_HIDDEN % d:
            raise ValueError(f"--headdims: {d} does not divide the hidden size {DEFAULT_HIDDEN}")
        for mask in masks:
            for s in seqlens:
                b, h = max(1, DEFAULT_TOKENS // s), DEFAULT_HIDDEN // d
                cases.append(Case(b, s, h, h, d, mask == "causal"))
    return cases


def measure_case(
    case: Case,
    providers: Sequence[Provider],
    device: Any,
    *,
    rounds: int,
    timer: Timer,
    capture: Capture,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per provider: eager and graph ms (median over rounds, and each round's)."""
    import torch

    from ..testing import grad_step

    gen = torch.Generator(device=device).manual_seed(seed)
    shape_q = (case.batch, case.seqlen, case.heads, case.headdim)
    shape_kv = (case.batch, case.seqlen, case.kv_heads, case.headdim)
    base = [
        torch.randn(s, generator=gen, device=device, dtype=torch.bfloat16)
        for s in (shape_q, shape_kv, shape_kv, shape_q)
    ]
    flops = attention_flops(
        case.batch, case.seqlen, case.seqlen, case.heads, case.headdim, case.causal, "fwd_bwd"
    )
    rows, steps = {}, {}
    for p in providers:
        row: dict[str, Any] = {
            "headdim": case.headdim, "causal": case.causal, "seqlen": case.seqlen,
            "batch": case.batch, "heads": case.heads, "provider": p.name,
            "deterministic": p.deterministic, "status": "ok",
        }  # fmt: skip
        rows[p.name] = row
        try:
            fn = p.make(case, device)
            eager_leaves = [x.detach().clone().requires_grad_() for x in base[:3]]
            eager = grad_step(fn, eager_leaves, base[3])
            eager()
        except ProviderUnavailable as exc:
            row["status"] = f"skipped: {exc}"
            continue
        except Exception as exc:  # noqa: BLE001 - a row with the reason, the others go on
            row["status"] = f"failed: {short_reason(exc)}"
            continue
        steps[p.name] = {"eager": eager}
        try:
            graph_leaves = [x.detach().clone().requires_grad_() for x in base[:3]]
            steps[p.name]["graph"] = capture(fn, graph_leaves, base[3])[0]
        except Exception as exc:  # noqa: BLE001 - eager is still timed
            row["status"] = f"capture failed: {short_reason(exc)}"
    times: dict[str, dict[str, list[float]]] = {n: {"eager": [], "graph": []} for n in steps}
    for _ in range(rounds):
        for name, by_mode in steps.items():
            for mode, fn in by_mode.items():
                times[name][mode].append(timer(fn, WARMUP_MS, REP_MS))
    for name, by_mode in times.items():
        for mode, values in by_mode.items():
            if values:
                ms = statistics.median(values)
                rows[name][f"{mode}_ms"] = ms
                rows[name][f"{mode}_tflops"] = tflops(flops, ms)
                rows[name][f"{mode}_rounds"] = values
    return list(rows.values())


def graphs_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The README table: per config, our deterministic step and FA4-det's, eager and replayed
    from a graph (ms), and the speed ratios FA4-det ms / ours ms (> 1: ours faster)."""
    by_config: dict[tuple[int, bool, int], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        by_config.setdefault((r["headdim"], r["causal"], r["seqlen"]), {})[r["provider"]] = r

    def ms(row: Mapping[str, Any] | None, mode: str) -> float | None:
        return None if row is None else row.get(f"{mode}_ms")

    def cell(value: float | None, digits: int = 3) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    def speed(base: float | None, ours: float | None) -> str:
        return "n/a" if base is None or ours is None else f"{base / ours:.2f}x"

    body = []
    for (d, causal, s), providers in by_config.items():
        ours, peer = providers.get(OURS), providers.get(BASELINE)
        cells = [str(d), "causal" if causal else "full", str(s)]
        for mode in ("eager", "graph"):
            mine, theirs = ms(ours, mode), ms(peer, mode)
            cells += [cell(mine), cell(theirs), speed(theirs, mine)]
        body.append(cells)
    header = [
        "head dim", "mask", "seqlen",
        "ours eager (ms)", "FA4-det eager (ms)", "speed",
        "ours graph (ms)", "FA4-det graph (ms)", "speed",
    ]  # fmt: skip
    return markdown_table(header, body, left=3)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    def ints(text: str) -> list[int]:
        try:
            return [int(x) for x in text.split(",") if x]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected integers like 512,1024: {text!r}") from exc

    parser.add_argument("--out-dir", type=Path, required=True, help="where graphs.json goes")
    parser.add_argument("--seqlens", type=ints, default=list(DEFAULT_SEQLENS))
    parser.add_argument("--headdims", type=ints, default=[64, 128])
    parser.add_argument(
        "--masks", type=lambda t: [m for m in t.split(",") if m], default=["full", "causal"]
    )
    parser.add_argument(
        "--providers", type=lambda t: [p for p in t.split(",") if p],
        default=list(DEFAULT_PROVIDERS), help="names or shell patterns (as dash-attn bench)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument(
        "--commit", default=None,
        help="the commit measured (a copied checkout's git HEAD may be stale; default: git's)",
    )  # fmt: skip


def run(
    args: argparse.Namespace,
    *,
    device: Any = None,
    timer: Timer | None = None,
    capture: Capture = capture_step,
    providers_for: Callable[[Case], Sequence[Provider]] | None = None,
) -> int:
    """The benchmark for parsed ``args``; ``device``, ``timer``, ``capture`` and
    ``providers_for`` are replaceable so that the CPU tests run it whole with test doubles."""
    try:
        cases = graph_cases(args.seqlens, args.headdims, args.masks)
        if args.rounds < 1:
            raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    except ValueError as exc:
        print(f"graphs: error: {exc}", file=sys.stderr)
        return 2
    info = machine_info(args.commit)
    info["cutlass_dsl"] = _dist_version("nvidia-cutlass-dsl")
    if device is None:
        if not info["cuda_available"]:
            print(f"{header_line(info)}\ngraphs: needs a CUDA GPU; nothing timed", file=sys.stderr)
            return 1
        import torch

        from .timing import do_bench_ms

        device = torch.device("cuda", torch.cuda.current_device())
        timer = timer or do_bench_ms
    if timer is None:
        raise ValueError("a timer is needed when a device is given")
    if providers_for is None:
        workers = info.get("sm_count") or 1

        def providers_for(case: Case) -> Sequence[Provider]:
            return providers_for_case(case, workers)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        **{k: info[k] for k in ("gpu", "sm_count", "driver", "cuda", "torch", "triton")},
        **{k: info[k] for k in ("cutlass_dsl", "flash_attn_4", "commit", "date")},
        "header_line": header_line(info),
        "command": getattr(args, "command_line", None) or shlex.join(sys.argv),
        "settings": {"rounds": args.rounds, "warmup_ms": WARMUP_MS, "rep_ms": REP_MS},
    }
    rows: list[dict[str, Any]] = []
    with LogTo(args.out_dir / "graphs.log"):
        print(meta["header_line"])
        for case in cases:
            chosen = select(providers_for(case), args.providers)
            case_rows = measure_case(
                case, chosen, device, rounds=args.rounds, timer=timer, capture=capture
            )
            rows += case_rows
            for r in case_rows:
                times = " ".join(
                    f"{mode} {r[f'{mode}_ms']:.3f} ms" for mode in ("eager", "graph")
                    if f"{mode}_ms" in r
                )  # fmt: skip
                print(f"{case.label}  {r['provider']:<20} {times or r['status']}", flush=True)
            write_json(args.out_dir / "graphs.json", {**meta, "rows": rows})
        print(graphs_table(rows))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dash-attn bench-graphs", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.command_line = f"dash-attn bench-graphs {shlex.join(argv)}"
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
