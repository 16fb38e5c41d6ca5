"""GPU check of the CuTe-DSL Hopper forward (`dash_attn.backends.hopper.fwd_launch.hopper_fwd`).

Run on an H100/H200 from the repository root:

    PYTHONPATH=$PWD python3 tools/hopper/check_fwd.py --out OUT_DIR

1. Numerics against an fp32 PyTorch reference by the flash-attn rule: the kernel's max error
   (out and lse) must be <= 2x the error of the same computation done by PyTorch in bf16/fp16,
   plus a small atol. Shapes are deliberately not tile multiples (s = 1000, 333, 77), include
   seqlen_q != seqlen_k both ways (so causal has rows that see no key), GQA 8/2, a strided
   (packed-qkv) layout and a single-head tensor. Rows that see no key must give out == 0 and
   lse == -inf exactly.
2. Bitwise repeat: three runs give torch.equal out and lse.
3. Timing in TFLOPS (4*b*h*sq*sk*d, halved for causal) at 16k tokens, h=16, hd 64/128,
   s = 2k/8k/16k, causal/full, beside FA4 (flash_attn.cute) and the Triton forward if they import.

Every case runs in its own try/except; a compact table is printed last; results go to
OUT_DIR/check_fwd.json and OUT_DIR/*.csv. --dry-run compiles the kernels on the CPU (sm_90a, no
GPU needed) and walks the case lists without launching anything, to check the script itself.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

TIME_BUDGET_S = 210.0  # the lead's limit is 4 minutes for the whole script, compiles included
_T0 = time.perf_counter()


def _elapsed() -> float:
    return time.perf_counter() - _T0


@dataclass
class NumCase:
    name: str
    dtype: str
    head_dim: int
    causal: bool
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    kv_heads: int
    layout: str = "contiguous"  # or "packed" (q/k/v slices of one qkv tensor: odd strides)
    # or "dash-cute-3wg" (the 192-row hd-64 kernel), "dash-cute-pers" / "dash-cute-3wg-pers"
    # (the persistent kernel; causal: the host's tile lists)
    provider: str = "dash-cute"
    status: str = "not run"
    out_err: float = float("nan")
    out_ref_err: float = float("nan")
    lse_err: float = float("nan")
    lse_ref_err: float = float("nan")
    empty_rows: int = 0
    detail: str = ""


@dataclass
class TimeCase:
    provider: str
    head_dim: int
    causal: bool
    batch: int
    seqlen: int
    heads: int = 16
    status: str = "not run"
    ms: float = float("nan")
    tflops: float = float("nan")
    detail: str = ""


@dataclass
class Report:
    env: dict = field(default_factory=dict)
    compile_s: dict = field(default_factory=dict)
    numerics: list = field(default_factory=list)
    repeat: list = field(default_factory=list)
    timing: list = field(default_factory=list)


# ----------------------------------------------------------------------------- references
def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, s, hk, d) -> (b, heads, s, d): q head h reads kv head h // (heads // hk)."""
    return t.repeat_interleave(heads // t.shape[2], dim=2).transpose(1, 2)


def torch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    compute_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain attention in compute_dtype (fp32 = reference, bf16/fp16 = the PyTorch baseline
    whose error sets the tolerance). Softmax statistics in fp32 either way, as kernels do."""
    heads, sq, sk = q.shape[2], q.shape[1], k.shape[1]
    qh = q.to(compute_dtype).transpose(1, 2)
    kh = _expand_kv(k.to(compute_dtype), heads)
    vh = _expand_kv(v.to(compute_dtype), heads)
    s = (qh @ kh.transpose(-1, -2)).float() * scale
    if causal:
        rows = torch.arange(sq, device=q.device)[:, None]
        cols = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(cols > rows + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf for rows that see no key
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # all -inf rows give NaN -> 0
    out = (p.to(compute_dtype) @ vh).transpose(1, 2)
    return out, lse


def _max_err(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor) -> float:
    return (a.float() - b.float()).abs()[keep].max().item() if keep.any() else 0.0


# ----------------------------------------------------------------------------- inputs
def make_inputs(c: NumCase, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dt = getattr(torch, c.dtype)
    g = torch.Generator(device=device).manual_seed(1234)
    if c.layout == "packed":
        # One (b, s, h + 2*hk, d) buffer: q, k, v are head-slices with a non-compact s stride.
        assert c.seqlen_q == c.seqlen_k
        shape = (c.batch, c.seqlen_q, c.heads + 2 * c.kv_heads, c.head_dim)
        qkv = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dt)
        q = qkv[:, :, : c.heads]
        k = qkv[:, :, c.heads : c.heads + c.kv_heads]
        v = qkv[:, :, c.heads + c.kv_heads :]
        return q, k, v
    q = torch.randn(c.batch, c.seqlen_q, c.heads, c.head_dim, generator=g, device=device)
    k = torch.randn(c.batch, c.seqlen_k, c.kv_heads, c.head_dim, generator=g, device=device)
    v = torch.randn(c.batch, c.seqlen_k, c.kv_heads, c.head_dim, generator=g, device=device)
    return q.to(dt), k.to(dt), v.to(dt)


def numerics_cases() -> list[NumCase]:
    shapes = [
        # name, batch, sq, sk, heads, kv_heads, layout
        ("s1000", 2, 1000, 1000, 4, 4, "contiguous"),
        ("s333-gqa8/2", 1, 333, 333, 8, 2, "contiguous"),
        ("s77", 3, 77, 77, 2, 2, "contiguous"),
        ("sq1000>sk333", 1, 1000, 333, 4, 2, "contiguous"),
        ("sq77<sk1000", 2, 77, 1000, 4, 4, "contiguous"),
        ("packed-s333", 2, 333, 333, 4, 2, "packed"),
        ("h1-s200", 1, 200, 200, 1, 1, "contiguous"),
    ]
    from dash_attn.backends.hopper.fwd import SUPPORTED_HEAD_DIMS

    cases = []
    for dtype in ("bfloat16", "float16"):
        for hd in SUPPORTED_HEAD_DIMS:
            # The main head dims get every shape; 96/192/256 (other tile widths) a subset that
            # still covers GQA, empty causal rows, sq < sk and odd lengths.
            subset = shapes if hd in (64, 128) else [shapes[i] for i in (1, 3, 4)]
            for causal in (False, True):
                for name, b, sq, sk, h, hk, layout in subset:
                    cases.append(NumCase(name, dtype, hd, causal, b, sq, sk, h, hk, layout))
        for causal in (False, True):  # the 3-warpgroup hd-64 variant: 192-row tiles
            for name, b, sq, sk, h, hk, layout in [shapes[i] for i in (0, 1, 3, 4)]:
                cases.append(
                    NumCase(name, dtype, 64, causal, b, sq, sk, h, hk, layout, "dash-cute-3wg")
                )
        # The persistent kernel: both masks, every shape (the packed layout included).
        for hd, provider in ((64, "dash-cute-pers"), (128, "dash-cute-pers"),
                             (96, "dash-cute-pers"), (64, "dash-cute-3wg-pers")):  # fmt: skip
            for causal in (False, True):
                for name, b, sq, sk, h, hk, layout in shapes:
                    cases.append(
                        NumCase(name, dtype, hd, causal, b, sq, sk, h, hk, layout, provider)
                    )
    return cases


def timing_cases(providers: list[str]) -> list[TimeCase]:
    """Provider-major order: if the time budget runs out (FA4 compiles on first call), the
    kernel under test has been timed on every shape and the comparisons lose the tail."""
    cases = []
    for p in providers:
        for hd in (64, 128):
            if p == "dash-cute-3wg" and hd != 64:
                continue
            for causal in (False, True):
                for s in (2048, 8192, 16384):
                    cases.append(TimeCase(p, hd, causal, 16384 // s, s))
    return cases


# ----------------------------------------------------------------------------- providers
def load_providers() -> tuple[dict[str, Callable], dict[str, str]]:
    """name -> fn(q, k, v, causal, scale); and name -> why it is missing."""
    from dash_attn.backends.hopper.fwd_launch import hopper_fwd

    found: dict[str, Callable] = {
        "dash-cute": lambda q, k, v, causal, scale: hopper_fwd(
            q, k, v, causal=causal, softmax_scale=scale
        ),
        "dash-cute-3wg": lambda q, k, v, causal, scale: hopper_fwd(
            q, k, v, causal=causal, softmax_scale=scale, consumer_wgs=3
        ),
        # The persistent kernel (head dims <= 128), at both warpgroup counts.
        "dash-cute-pers": lambda q, k, v, causal, scale: hopper_fwd(
            q, k, v, causal=causal, softmax_scale=scale, persistent=True
        ),
        "dash-cute-3wg-pers": lambda q, k, v, causal, scale: hopper_fwd(
            q, k, v, causal=causal, softmax_scale=scale, consumer_wgs=3, persistent=True
        ),
    }
    missing: dict[str, str] = {}
    try:
        from flash_attn.cute import flash_attn_func

        found["fa4"] = lambda q, k, v, causal, scale: flash_attn_func(
            q, k, v, softmax_scale=scale, causal=causal
        )
    except Exception as e:  # noqa: BLE001 - optional comparison, any import failure skips it
        missing["fa4"] = f"{type(e).__name__}: {e}"
    triton_fwd = None
    for mod in ("dash_attn.backends.triton.fwd",):
        try:
            triton_fwd = __import__(mod, fromlist=["attn_fwd"]).attn_fwd
            break
        except Exception as e:  # noqa: BLE001
            missing["triton"] = f"{mod}: {type(e).__name__}: {e}"
    if triton_fwd is not None:
        missing.pop("triton", None)
        found["triton"] = lambda q, k, v, causal, scale: triton_fwd(
            q, k, v, causal=causal, softmax_scale=scale
        )
    return found, missing


# ----------------------------------------------------------------------------- checks
def run_numerics(c: NumCase, fwd: Callable, device: str = "cuda") -> None:
    q, k, v = make_inputs(c, device)
    scale = 1.0 / math.sqrt(c.head_dim)
    out, lse = fwd(q, k, v, c.causal, scale)
    if device == "cuda":
        torch.cuda.synchronize()
    ref_out, ref_lse = torch_attention(q, k, v, c.causal, scale, torch.float32)
    low_out, low_lse = torch_attention(q, k, v, c.causal, scale, q.dtype)
    problems = []
    if out.shape != q.shape or out.dtype != q.dtype:
        problems.append(f"out {tuple(out.shape)} {out.dtype}")
    if lse.shape != (c.batch, c.heads, c.seqlen_q) or lse.dtype != torch.float32:
        problems.append(f"lse {tuple(lse.shape)} {lse.dtype}")
    empty = torch.isneginf(ref_lse)  # (b, h, sq): rows that see no key
    c.empty_rows = int(empty.sum().item())
    empty_o = empty.transpose(1, 2)[..., None].expand_as(out)  # (b, sq, h, d)
    if c.empty_rows:
        if not torch.isneginf(lse[empty]).all():
            problems.append("lse != -inf on rows with no key")
        if (out[empty_o] != 0).any():
            problems.append("out != 0 on rows with no key")
    if torch.isnan(out).any() or torch.isnan(lse).any():
        problems.append("NaN in output")
    keep_o, keep_l = ~empty_o, ~empty
    c.out_err = _max_err(out, ref_out, keep_o)
    c.out_ref_err = _max_err(low_out, ref_out, keep_o)
    c.lse_err = _max_err(lse, ref_lse, keep_l)
    c.lse_ref_err = _max_err(low_lse, ref_lse, keep_l)
    # flash-attn rule: no worse than twice PyTorch's own low-precision error, plus a small atol.
    if not c.out_err <= 2 * c.out_ref_err + 1e-3:
        problems.append(f"out err {c.out_err:.2e} > 2*{c.out_ref_err:.2e}+1e-3")
    if not c.lse_err <= 2 * c.lse_ref_err + 1e-3:
        problems.append(f"lse err {c.lse_err:.2e} > 2*{c.lse_ref_err:.2e}+1e-3")
    c.status = "FAIL" if problems else "ok"
    c.detail = "; ".join(problems)


def run_repeat(c: NumCase, fwd: Callable) -> dict:
    q, k, v = make_inputs(c, "cuda")
    scale = 1.0 / math.sqrt(c.head_dim)
    runs = [fwd(q, k, v, c.causal, scale) for _ in range(3)]
    torch.cuda.synchronize()
    same = all(torch.equal(r[0], runs[0][0]) and torch.equal(r[1], runs[0][1]) for r in runs[1:])
    return {"case": f"{c.name} hd{c.head_dim} {c.dtype} causal={c.causal}", "bitwise": same}


def time_case(c: TimeCase, fn: Callable) -> None:
    dt = torch.bfloat16
    shape = (c.batch, c.seqlen, c.heads, c.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dt) for _ in range(3))
    scale = 1.0 / math.sqrt(c.head_dim)
    for _ in range(3):  # warm-up, includes any compile
        fn(q, k, v, c.causal, scale)
    torch.cuda.synchronize()
    iters, best = 10, float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(q, k, v, c.causal, scale)
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / iters)
    flops = 4.0 * c.batch * c.heads * c.seqlen * c.seqlen * c.head_dim
    if c.causal:
        flops /= 2
    c.ms = best
    c.tflops = flops / (best * 1e-3) / 1e12
    c.status = "ok"


# ----------------------------------------------------------------------------- driver
def self_check() -> None:
    """Dry run: push two cases through the comparison code on the CPU with the fp16/bf16
    PyTorch path standing in for the kernel, so the checks themselves (empty rows, GQA, packed
    strides, tolerance rule) are exercised without a GPU."""

    def stand_in(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = torch_attention(q, k, v, causal, scale, torch.float32)
        return out.to(q.dtype).contiguous(), lse

    for c in (
        NumCase("sq1000>sk333", "bfloat16", 64, True, 1, 300, 100, 4, 2),
        NumCase("packed", "float16", 128, False, 1, 77, 77, 4, 2, "packed"),
    ):
        run_numerics(c, stand_in, device="cpu")
        print(f"self-check {c.name}: {c.status} {c.detail} (empty rows {c.empty_rows}, "
              f"out err {c.out_err:.2e} vs pt {c.out_ref_err:.2e})")  # fmt: skip
        if c.status != "ok" or (c.causal and c.empty_rows == 0):
            raise RuntimeError(f"self-check failed on {c.name}: {c.detail}")


def compile_all(report: Report) -> None:
    from dash_attn.backends.hopper.fwd_launch import SUPPORTED_HEAD_DIMS, compile_fwd

    dtypes = (torch.bfloat16, torch.float16)
    configs = (
        [
            (hd, dtype, causal, 2, False)
            for hd in SUPPORTED_HEAD_DIMS
            for dtype in dtypes
            for causal in (False, True)
        ]
        + [(64, dtype, causal, 3, False) for dtype in dtypes for causal in (0, 1)]
        + [(hd, dtype, c, 2, True) for hd in (64, 96, 128) for dtype in dtypes for c in (0, 1)]
        + [(64, dtype, c, 3, True) for dtype in dtypes for c in (0, 1)]
    )
    for hd, dtype, causal, wgs, persistent in configs:
        key = f"hd{hd}-{str(dtype).removeprefix('torch.')}-{'causal' if causal else 'full'}"
        key += "-3wg" if wgs == 3 else ""
        key += "-persistent" if persistent else ""
        start = time.perf_counter()
        try:
            compile_fwd(hd, dtype, bool(causal), consumer_wgs=wgs, persistent=persistent)
            report.compile_s[key] = round(time.perf_counter() - start, 2)
        except Exception as e:  # noqa: BLE001 - report and go on with the rest
            report.compile_s[key] = f"FAILED {type(e).__name__}: {e}"
            traceback.print_exc()


def print_tables(report: Report) -> None:
    print("\n==== compile (s) ====")
    for k, v in report.compile_s.items():
        print(f"  {k:28s} {v}")
    print(
        "\n==== numerics (max abs err vs fp32 ref; 'pt' = PyTorch in the same low precision) ===="
    )
    print(f"  {'case':20s} {'dtype':9s} {'hd':>3s} {'causal':6s} {'out':>9s} {'out_pt':>9s} "
          f"{'lse':>9s} {'lse_pt':>9s} {'empty':>5s}  status")  # fmt: skip
    for c in report.numerics:
        name = c.name + (" [3wg]" if c.provider == "dash-cute-3wg" else "")
        print(f"  {name:20s} {c.dtype:9s} {c.head_dim:3d} {c.causal!s:6s} {c.out_err:9.2e} "
              f"{c.out_ref_err:9.2e} {c.lse_err:9.2e} {c.lse_ref_err:9.2e} {c.empty_rows:5d}  "
              f"{c.status} {c.detail}")  # fmt: skip
    print("\n==== bitwise repeat (3 runs) ====")
    for r in report.repeat:
        print(f"  {r['case']:50s} {r.get('bitwise', r.get('error'))}")
    print("\n==== timing, bf16, 16k tokens, h=16 (TFLOPS) ====")
    providers = list(dict.fromkeys(t.provider for t in report.timing))  # in run order
    print(f"  {'hd':>3s} {'causal':6s} {'seqlen':>6s} " + " ".join(f"{p:>13s}" for p in providers))
    keys = sorted({(t.head_dim, t.causal, t.seqlen) for t in report.timing})
    for hd, causal, s in keys:
        cells = []
        for p in providers:
            t = next((x for x in report.timing if (x.provider, x.head_dim, x.causal, x.seqlen)
                      == (p, hd, causal, s)), None)  # fmt: skip
            if t is None:
                cells.append(f"{'-':>13s}")
            else:
                cells.append(f"{t.tflops:13.1f}" if t.status == "ok" else f"{t.status[:13]:>13s}")
        print(f"  {hd:3d} {causal!s:6s} {s:6d} " + " ".join(cells))
    n_fail = sum(c.status not in ("ok", "dry-run") for c in report.numerics)
    n_rep = sum(not r.get("bitwise", False) for r in report.repeat)
    if all(c.status == "dry-run" for c in report.numerics):
        print(f"\ndry run: {len(report.numerics)} numerics cases listed, nothing launched")
        return
    print(f"\nnumerics: {len(report.numerics) - n_fail}/{len(report.numerics)} ok; "
          f"bitwise repeat failures: {n_rep}; elapsed {_elapsed():.0f}s")  # fmt: skip


def write_outputs(report: Report, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    (out / "check_fwd.json").write_text(json.dumps(data, indent=1, default=str))
    for name, rows in (("numerics", data["numerics"]), ("timing", data["timing"])):
        if rows:
            with open(out / f"check_fwd_{name}.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for JSON/CSV results")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU only: compile the kernels for sm_90a and walk the cases without launching",
    )
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args(argv)

    report = Report()
    report.env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "dry_run": args.dry_run,
    }
    try:
        import cutlass

        report.env["cutlass"] = getattr(cutlass, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        report.env["cutlass"] = f"import failed: {e}"
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device; use --dry-run to check the script on a CPU", file=sys.stderr)
        return 2
    if not args.dry_run:
        torch.backends.cuda.matmul.allow_tf32 = False  # the reference must be real fp32
        torch.backends.cudnn.allow_tf32 = False

    compile_all(report)
    if args.dry_run:
        providers, missing = {}, {"fa4": "dry run", "triton": "dry run"}
    else:
        providers, missing = load_providers()
    report.env["missing_providers"] = missing

    report.numerics = numerics_cases()
    if args.dry_run:
        self_check()
    for c in report.numerics:
        if args.dry_run:
            c.status = "dry-run"
            continue
        try:
            run_numerics(c, providers[c.provider])
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            c.status, c.detail = "ERROR", f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
    repeat_cases = [
        NumCase("s1000", "bfloat16", 128, True, 2, 1000, 1000, 4, 4),
        NumCase("sq1000>sk333", "float16", 64, True, 1, 1000, 333, 4, 2),
        NumCase("s333-gqa8/2", "bfloat16", 64, False, 1, 333, 333, 8, 2),
        NumCase("s1000-3wg", "bfloat16", 64, True, 2, 1000, 1000, 4, 4, provider="dash-cute-3wg"),
        NumCase(
            "s1000-pers", "bfloat16", 128, False, 2, 1000, 1000, 4, 4, provider="dash-cute-pers"
        ),
    ]
    for c in repeat_cases:
        if args.dry_run:
            report.repeat.append({"case": c.name, "bitwise": "dry-run"})
            continue
        try:
            report.repeat.append(run_repeat(c, providers[c.provider]))
        except Exception as e:  # noqa: BLE001
            report.repeat.append({"case": c.name, "error": f"{type(e).__name__}: {e}"[:300]})

    if not args.skip_timing:
        report.timing = timing_cases(["dash-cute", "dash-cute-3wg", "fa4", "triton"])
        for t in report.timing:
            if args.dry_run:
                t.status = "dry-run"
            elif t.provider not in providers:
                t.status, t.detail = "missing", missing.get(t.provider, "")
            elif _elapsed() > TIME_BUDGET_S:
                t.status = "budget"  # skipped to stay inside the time limit
            else:
                try:
                    time_case(t, providers[t.provider])
                except Exception as e:  # noqa: BLE001
                    t.status, t.detail = "ERROR", f"{type(e).__name__}: {e}"[:300]
                    traceback.print_exc()
                finally:
                    torch.cuda.empty_cache()

    write_outputs(report, args.out)
    print_tables(report)
    ok = all(c.status in ("ok", "dry-run") for c in report.numerics) and all(
        r.get("bitwise") in (True, "dry-run") for r in report.repeat
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
