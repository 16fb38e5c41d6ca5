"""GPU probe: the hopper backward's two host paths side by side, with FA4-det beside them.

``default``: the Triton preprocess and dQ cast around the main kernel, a zero fill, the error
flag copied per launch. ``cute``: ``hopper.launch.CUTE_PRE_POST`` (session 12): the CuTe-DSL
preprocess (which zeroes) and cast, three TVM-FFI launches, the flag through host-mapped
memory. Same main kernel. Per config (the sweep's 24: 16k tokens, hidden 2048), three
interleaved rounds of ``triton.testing.do_bench`` (median, L2 flushed) of
``torch.autograd.grad`` through ``dash_attn_func`` (det, ``auto`` schedule) and of FA4-det; and
whether each path repeats bitwise and how far the two paths' gradients are apart (they differ
in the last bits: delta is summed in another order). Run from the repository root on an sm_90
GPU with the CuTe-DSL/FA4 kit::

    OUT=out PYTHONPATH=$PWD python3 tools/hopper/compare_host_paths.py [--seqlens 512,1024]

``--table CSV`` prints the markdown table of a written CSV instead (any machine;
benchmarks/HISTORY.md's session-13 table is this output).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics

import torch
import triton.testing

from dash_attn import dash_attn_func
from dash_attn.backends.hopper import launch

PATHS = ("default", "cute")


def grads_fn(path: str, q, k, v, dout, causal: bool):
    """A closure that runs one backward on ``path`` (the switch is set per call: the plan's
    launch is cached per switch value)."""
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    launch.CUTE_PRE_POST = path == "cute"
    out = dash_attn_func(qg, kg, vg, causal=causal, backend="hopper")

    def run():
        launch.CUTE_PRE_POST = path == "cute"
        return torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)

    return run


def fa4_fn(q, k, v, dout, causal: bool):
    from flash_attn.cute import flash_attn_func

    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = flash_attn_func(qg, kg, vg, causal=causal, deterministic=True)
    out = out[0] if isinstance(out, tuple) else out
    return lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)


def compare(head_dim: int, causal: bool, seqlen: int, rounds: int) -> dict[str, object]:
    batch, heads = 16384 // seqlen, 2048 // head_dim
    gen = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
    q, k, v, dout = (
        torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                    generator=gen)
        for _ in range(4)
    )  # fmt: skip
    fns = {path: grads_fn(path, q, k, v, dout, causal) for path in PATHS}
    try:
        fns["fa4"] = fa4_fn(q, k, v, dout, causal)
    except Exception as exc:  # a probe: FA4 missing or failing leaves its column empty
        print(f"fa4: {type(exc).__name__}: {exc}"[:200])
    row: dict[str, object] = {"head_dim": head_dim, "mask": "causal" if causal else "full",
                              "seqlen": seqlen, "batch": batch, "heads": heads}  # fmt: skip
    first = {path: [g.clone() for g in fns[path]()] for path in PATHS}
    for path in PATHS:
        again = fns[path]()
        pairs = zip(first[path], again, strict=True)
        row[f"{path}_bitwise"] = all(torch.equal(a, b) for a, b in pairs)
    row["paths_max_diff"] = max(
        (a.float() - b.float()).abs().max().item()
        for a, b in zip(first["default"], first["cute"], strict=True)
    )
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(triton.testing.do_bench(fn, warmup=25, rep=100,
                                                       return_mode="median"))  # fmt: skip
    for name, ms in times.items():
        row[f"{name}_ms"] = round(statistics.median(ms), 4)
        row[f"{name}_rounds_ms"] = " ".join(f"{t:.4f}" for t in ms)
    row["cute_vs_default"] = round(row["default_ms"] / row["cute_ms"], 4)
    if "fa4" in times:
        for path in PATHS:
            row[f"{path}_vs_fa4"] = round(row["fa4_ms"] / row[f"{path}_ms"], 4)
    launch.CUTE_PRE_POST = False
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--table", default=None, help="print the markdown table of this CSV")
    args = parser.parse_args()
    if args.table:
        from host_paths_table import markdown_table  # beside this script

        with open(args.table, newline="") as f:
            print(markdown_table(list(csv.DictReader(f))))
        return
    rows = []
    for head_dim in (64, 128):
        for causal in (False, True):
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                rows.append(compare(head_dim, causal, seqlen, args.rounds))
                print(rows[-1], flush=True)
    fields = list(dict.fromkeys(key for row in rows for key in row))
    path = os.path.join(os.environ.get("OUT", "."), "compare_host_paths.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
