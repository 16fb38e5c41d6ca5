"""GPU probe: the GPU time of each kernel of one backward, for the hopper backward's two host
paths (``default``: Triton preprocess, zero fill, main kernel, Triton dQ cast; ``cute``: the
CuTe-DSL preprocess and cast of ``bwd_pre_post``) and FA4-det beside them.

Per config (16k tokens, hidden 2048, det, ``auto`` schedule), 20 backward calls under
``torch.profiler`` (CUPTI kernel records); per kernel: mean microseconds per backward and, for
the small kernels, the bandwidth that time means (bytes they must move / time). Run from the
repository root on an sm_90 GPU with the CuTe-DSL/FA4 kit::

    OUT=out PYTHONPATH=$PWD python3 tools/hopper/kernel_times.py   # writes out/kernel_times.csv
"""

from __future__ import annotations

import argparse
import csv
import os

import torch
from compare_host_paths import fa4_fn, grads_fn  # beside this script

from dash_attn.backends.hopper import launch

CALLS = 20


def backward_fn(provider: str, q, k, v, dout, causal: bool):
    """One backward of ``provider`` ("default", "cute" or "fa4") as a closure (the same ones
    ``compare_host_paths.py`` times)."""
    if provider == "fa4":
        return fa4_fn(q, k, v, dout, causal)
    return grads_fn(provider, q, k, v, dout, causal)


def short(name: str) -> str:
    """A kernel's name without the CuTe-DSL decorations (its class name, or the Triton name)."""
    return name.split("_object_at")[0].split("_pre_post")[-1].split("flash_attncute")[-1][-34:]


def kernel_us(fn) -> dict[str, float]:
    """Mean GPU microseconds per call of each kernel ``fn`` launches (CUPTI records)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total = getattr(event, "device_time_total", None)
            total = event.cuda_time_total if total is None else total
            times[event.key[:80]] = times.get(event.key[:80], 0.0) + total / CALLS
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="512,2048,8192")
    args = parser.parse_args()
    rows = []
    for head_dim in (64, 128):
        for causal in (False, True):
            for seqlen in (int(s) for s in args.seqlens.split(",")):
                batch, heads = 16384 // seqlen, 2048 // head_dim
                q, k, v, dout = (
                    torch.randn(batch, seqlen, heads, head_dim, device="cuda",
                                dtype=torch.bfloat16)
                    for _ in range(4)
                )  # fmt: skip
                # What the small kernels must move: read O and dO (preprocess), write the fp32
                # accumulator's zeros, read it back and write dQ (cast).
                elems = batch * seqlen * heads * head_dim
                for provider in ("default", "cute", "fa4"):
                    try:
                        times = kernel_us(backward_fn(provider, q, k, v, dout, causal))
                    except Exception as exc:  # a probe: a failing provider is a line, not a stop
                        print(f"{provider}: {type(exc).__name__}: {exc}"[:200])
                        continue
                    total = sum(times.values())
                    mask = "causal" if causal else "full"
                    print(f"d{head_dim} {mask} {seqlen} {provider}: total {total:.1f} us; "
                          + "; ".join(f"{short(name)} {us:.1f}"
                                      for name, us in sorted(times.items(),
                                                             key=lambda kv: -kv[1])))  # fmt: skip
                    for name, us in times.items():
                        rows.append({"head_dim": head_dim, "mask": mask, "seqlen": seqlen,
                                     "provider": provider, "kernel": name,
                                     "us_per_backward": round(us, 2),
                                     "elements": elems})  # fmt: skip
    launch.CUTE_PRE_POST = False
    path = os.path.join(os.environ.get("OUT", "."), "kernel_times.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["kernel"])
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
