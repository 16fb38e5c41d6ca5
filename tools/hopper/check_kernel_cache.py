"""GPU check of the disk cache of compiled hopper kernels (``hopper/kernel_cache.py``).

Run on an H100/H200 from the repository root::

    PYTHONPATH=$PWD python3 tools/hopper/check_kernel_cache.py [--out DIR]

Three processes, two of them sharing one empty cache directory (``DASH_ATTN_KERNEL_CACHE``), each
running the same forward and backward through the public API (backend "hopper", deterministic,
head dims 64 and 128, causal and full, GQA, a length that is not a tile multiple) on the same
seeded inputs:

1. ``compile``: the cache is empty, so every kernel is compiled and exported;
2. ``load``: every kernel comes from the object files (the process counts ``cute.compile``
   calls: there must be none);
3. ``off``: the cache off (``DASH_ATTN_KERNEL_CACHE=0``), every kernel compiled in-process (the
   reference).

The outputs (out, dq, dk, dv) of the three must be ``torch.equal``; the first-call wall time of
each process (compile vs load) is printed. Exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [(64, True), (64, False), (128, True), (128, False)]


def child(out_path: Path) -> None:
    """One process: run every case, save outputs and timings to ``out_path``."""
    import cutlass.cute as cute
    import torch

    import dash_attn
    from dash_attn.backends.hopper import bwd_launch, fwd_launch

    compiles = []
    real_compile = cute.compile

    def counting_compile(*args, **kwargs):
        compiles.append(1)
        return real_compile(*args, **kwargs)

    bwd_launch.cute.compile = counting_compile
    fwd_launch.cute.compile = counting_compile
    results, timings = {}, {}
    for head_dim, causal in CASES:
        # Every input from the seeded generator (randn_like would draw from the unseeded
        # global one: other inputs in every process).
        gen = torch.Generator(device="cuda").manual_seed(head_dim + causal)
        q_shape, kv_shape = (2, 1000, 8, head_dim), (2, 1000, 2, head_dim)
        q, k, v, dout = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
            for shape in (q_shape, kv_shape, kv_shape, q_shape)
        )
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        start = time.perf_counter()
        out = dash_attn.dash_attn_func(q, k, v, causal=causal, backend="hopper")
        out.backward(dout)
        torch.cuda.synchronize()
        name = f"d{head_dim}-{'causal' if causal else 'full'}"
        timings[name] = time.perf_counter() - start
        results[name] = [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]
    torch.save({"results": results, "timings": timings, "compiles": len(compiles)}, out_path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON summary")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return 0

    import torch

    summary: dict = {"runs": {}}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        cache, runs = Path(tmp) / "cache", {}
        for run in ("compile", "load", "off"):
            env = dict(os.environ)
            env["DASH_ATTN_KERNEL_CACHE"] = str(cache) if run != "off" else "0"
            out = Path(tmp) / f"{run}.pt"
            cmd = [sys.executable, os.path.abspath(__file__), "--child", str(out)]
            code = subprocess.run(cmd, env=env, timeout=600).returncode
            if code != 0:
                print(f"{run}: child exit {code}")
                return 1
            runs[run] = torch.load(out)
            objects = sorted(p.name for p in cache.rglob("*.o")) if cache.exists() else []
            summary["runs"][run] = {
                "compiles": runs[run]["compiles"],
                "first_call_s": runs[run]["timings"],
                "object_files": len(objects),
            }
            print(f"{run}: {runs[run]['compiles']} compiles, {len(objects)} object files, "
                  f"first calls {runs[run]['timings']}")  # fmt: skip
    if runs["load"]["compiles"] != 0 or runs["compile"]["compiles"] == 0:
        print("FAIL: the load run compiled, or the compile run did not")
        ok = False
    for name, reference in runs["off"]["results"].items():
        for run in ("compile", "load"):
            pairs = zip(runs[run]["results"][name], reference, strict=True)
            equal = all(torch.equal(a, b) for a, b in pairs)
            summary["runs"].setdefault("equal", {})[f"{run} {name}"] = equal
            print(f"{name}: {run} outputs equal to the in-process compile: {equal}")
            ok &= equal
    summary["ok"] = ok
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "check_kernel_cache.json").write_text(json.dumps(summary, indent=1))
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
