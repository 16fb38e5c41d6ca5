"""GPU probe (session 7): dynamic tickets taken early vs late, and where a small backward's
time goes.

(A) For each shape and dynamic schedule (``fa3``, ``descending``; ``auto`` as the static
control), the hopper backward with the ticket taken as soon as a chain's last loads are issued
(variants ``t128``/``fast``) and once the CTA has finished the chain (``t128_lt``/``fast_lt``):
TFLOPS, 3 bitwise repeats, and the bits of the two arms compared (the order of the dQ additions
is the tables', so they must be equal). (B) torch.profiler's kernel times of one backward vs its
wall time (hopper auto and FA4-det) at 512-1024 tokens.

Run from the repository root on an H100/H200 with the CuTe-DSL kit installed::

    OUT=out PYTHONPATH=$PWD python3 tools/hopper/probe_tickets.py a b   # writes out/dev1.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import dash_attn.backends.hopper.launch as hopper_launch
from dash_attn import dash_attn_func, last_launch_info

ARMS = {"early": {64: "t128", 128: "fast"}, "late": {64: "t128_lt", 128: "fast_lt"}}


def _log(rows: list[dict], **row: object) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def _inputs(batch: int, seqlen: int, heads: int, headdim: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (batch, seqlen, heads, headdim)
    return [
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)
    ]


def _tflops(batch: int, seqlen: int, heads: int, headdim: int, causal: bool, ms: float) -> float:
    flops = 2.5 * 4 * batch * heads * seqlen * seqlen * headdim / (2 if causal else 1)
    return flops / ms / 1e9


def _backward(x: list[torch.Tensor], causal: bool, schedule: str) -> Callable[[], tuple]:
    q, k, v = (t.detach().requires_grad_() for t in x[:3])
    out = dash_attn_func(q, k, v, causal=causal, schedule=schedule, backend="hopper")
    return lambda: torch.autograd.grad(out, (q, k, v), x[3], retain_graph=True)


def tickets(rows: list[dict], deadline: float) -> None:
    shapes = [(128, True, 8, 2048, 16), (128, True, 4, 4096, 16), (128, True, 1, 16384, 4),
              (128, False, 1, 16384, 4), (128, False, 8, 2048, 16)]  # fmt: skip
    for headdim, causal, batch, seqlen, heads in shapes:
        x = _inputs(batch, seqlen, heads, headdim)
        first_arm: dict[str, tuple] = {}
        for arm in ("early", "late"):
            hopper_launch.BWD_VARIANT.update(ARMS[arm])
            for schedule in ("fa3", "descending", "auto"):
                if time.monotonic() > deadline:
                    _log(rows, part="A", skipped=f"{arm} {schedule} d{headdim} s{seqlen}")
                    continue
                run = _backward(x, causal, schedule)
                grads = run()
                ms = do_bench(run, warmup=10, rep=60)
                repeat = all(all(map(torch.equal, grads, run())) for _ in range(3))
                other = first_arm.setdefault(schedule, grads)
                same = None if other is grads else all(map(torch.equal, other, grads))
                _log(rows, part="A", arm=arm, d=headdim, causal=causal, b=batch, s=seqlen,
                     h=heads, schedule=schedule, ms=ms,
                     tflops=_tflops(batch, seqlen, heads, headdim, causal, ms),
                     repeat_bits=repeat,
                     bits_equal_other_arm=same,
                     info=str(last_launch_info())[:200])  # fmt: skip


def small_shape_profile(rows: list[dict], deadline: float) -> None:
    hopper_launch.BWD_VARIANT.update(ARMS["late"])
    try:
        from flash_attn.cute import flash_attn_func as fa4
    except ImportError as exc:
        fa4 = None
        _log(rows, part="B", fa4_import=repr(exc))
    shapes = [(128, False, 32, 512, 16), (128, False, 16, 1024, 16), (128, True, 32, 512, 16),
              (128, True, 16, 1024, 16)]  # fmt: skip
    for headdim, causal, batch, seqlen, heads in shapes:
        x = _inputs(batch, seqlen, heads, headdim)
        providers = {"dash_hopper_auto": _backward(x, causal, "auto")}
        if fa4 is not None:
            q, k, v = (t.detach().requires_grad_() for t in x[:3])
            out = fa4(q, k, v, causal=causal, deterministic=True)
            out = out[0] if isinstance(out, tuple) else out
            providers["fa4_det"] = lambda o=out, q=q, k=k, v=v, do=x[3]: torch.autograd.grad(
                o, (q, k, v), do, retain_graph=True
            )
        for name, run in providers.items():
            if time.monotonic() > deadline:
                _log(rows, part="B", skipped=name)
                continue
            run()
            ms = do_bench(run, warmup=10, rep=60)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    run()
                torch.cuda.synchronize()
            kernels: dict[str, list] = {}
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    entry = kernels.setdefault(event.name[:90], [0, 0.0])
                    entry[0] += 1
                    entry[1] += event.device_time / 1000.0
            per_iter = {n: [c // 5, round(t / 5, 4)] for n, (c, t) in kernels.items()}
            _log(rows, part="B", provider=name, d=headdim, causal=causal, b=batch, s=seqlen,
                 h=heads, ms=ms, tflops=_tflops(batch, seqlen, heads, headdim, causal, ms),
                 kernels_ms_per_iter=sum(t for _, t in kernels.values()) / 5,
                 kernels=per_iter)  # fmt: skip


def main() -> None:
    out_dir = os.environ["OUT"]
    budget = float(os.environ.get("BUDGET", "400"))
    start = time.monotonic()
    parts = sys.argv[1:] or ["a", "b"]
    rows: list[dict] = []
    try:
        if "a" in parts:
            tickets(rows, start + 0.6 * budget)
        if "b" in parts:
            small_shape_profile(rows, start + budget)
    finally:
        with open(os.path.join(out_dir, "dev1.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
