"""Session 65, call 2 (a probe): where our deterministic backward's extra time over the
non-deterministic one goes at the two full-mask 4k cells. The step trace has both modes'
steps equally long (session 64, item 361), yet the whole backward takes 1-3% longer in det
mode; here each kernel's GPU time (CUPTI records under torch.profiler, 20 backwards a round,
rounds interleaved) for our det and non-det backwards and FA4's two, so that the main
kernel's share and the dQ cast's can be told apart.

    OUT=out PYTHONPATH=$PWD python3 det_cost.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd() / "tools" / "hopper"))
from kernel_times import kernel_us, short  # noqa: E402

from dash_attn import dash_attn_func  # noqa: E402


def dash_fn(q, k, v, dout, deterministic: bool):
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = dash_attn_func(qg, kg, vg, deterministic=deterministic, backend="hopper")
    return lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)


def fa4_fn(q, k, v, dout, deterministic: bool):
    from flash_attn.cute import flash_attn_func

    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = flash_attn_func(qg, kg, vg, deterministic=deterministic)
    out = out[0] if isinstance(out, tuple) else out
    return lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)


def wall_ms(fn, calls: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    for head_dim in (64, 128):
        batch, seqlen, heads = 4, 4096, 2048 // head_dim
        gen = torch.Generator(device="cuda").manual_seed(head_dim)
        q, k, v, dout = (
            torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=gen)
            for _ in range(4)
        )  # fmt: skip
        providers = {
            "ours det": dash_fn(q, k, v, dout, True),
            "ours non-det": dash_fn(q, k, v, dout, False),
            "FA4 det": fa4_fn(q, k, v, dout, True),
            "FA4 non-det": fa4_fn(q, k, v, dout, False),
        }
        kernels: dict[str, dict[str, list[float]]] = {name: {} for name in providers}
        walls: dict[str, list[float]] = {name: [] for name in providers}
        for _ in range(args.rounds):
            for name, fn in providers.items():
                walls[name].append(wall_ms(fn))
                for kernel, us in kernel_us(fn).items():
                    kernels[name].setdefault(short(kernel), []).append(us)
        print(f"## d{head_dim} full {seqlen} b{batch} h{heads}, {args.rounds} rounds")
        for name in providers:
            med = statistics.median(walls[name])
            parts = "; ".join(
                f"{kernel} {statistics.median(us):.1f} us"
                for kernel, us in sorted(kernels[name].items(), key=lambda kv: -max(kv[1]))
            )
            rounds = ", ".join(f"{w:.3f}" for w in walls[name])
            print(f"{name}: wall {med:.3f} ms (rounds {rounds}); {parts}")


if __name__ == "__main__":
    main()
