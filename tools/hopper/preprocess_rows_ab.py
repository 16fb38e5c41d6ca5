"""GPU probe: the hopper backward's preprocess (``bwd_pre_post.BwdPreprocess``: delta and LSE2
of every row) with other CTA shapes and grid orders, timed against the shipped one and against
what the memory system gives a plain elementwise kernel on the same bytes.

Why: at 16k tokens and hidden 2048 the preprocess reads O and dO (134 MB in bf16) in about 57 us
on an H100 (``benchmarks/NOTES.md`` item 370), 2.4 TB/s, a fixed 2-3% of a 4k-token backward
and up to 15% of a 512-token one. Its 8192 CTAs of 128 threads each keep 16 KB of loads in
flight for one memory latency and exit, so the CTA launches may cost more than the bytes; and
its grid walks one head's row blocks first, so the CTAs launched together read 128 bytes (hd
64) or 256 every 4 KB of O and dO. The knobs: rows and threads per CTA, and the grid's heads
first (``h``: CTAs launched together read neighbouring heads of the same rows, contiguous in
(b, s, h, d) memory). None changes a row's arithmetic, only which CTA computes it: every side's
LSE2 and delta must be ``torch.equal`` to the shipped kernel's (checked before timing).

Per head dim (the sweep's 4k shape: b4 x 4096 x hidden 2048), interleaved rounds of 20
back-to-back launches each (``tools.hopper.interleaved``): ``r64`` (shipped: 64 rows, 128
threads), ``r64h``, ``r128``, ``r128h``, ``r256h``, ``r128t256h``, ``r256t256h``, and ``add``,
``torch.add(o, do, out=...)`` (reads the same 134 MB, writes 67 MB): a bandwidth reference,
not a contender. Prints each side's median time per launch, the bandwidth its bytes mean, and
the ratios to ``r64``. From the repository root on an sm_90 GPU with the CuTe-DSL kit
sourced::

    python3 -m tools.hopper.preprocess_rows_ab --rounds 12
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

# (rows, threads, heads_fastest) of each side's CTAs and grid; the first is the shipped kernel.
SIDES = (
    (64, 128, False),
    (64, 128, True),
    (128, 128, False),
    (128, 128, True),
    (256, 128, True),
    (128, 256, True),
    (256, 256, True),
)
CALLS = 20


def compile_rows(dtype, head_dim: int, rows: int, threads: int = 128, heads_fastest=False):
    """``BwdPreprocess`` with ``rows`` rows and ``threads`` threads per CTA (and the grid's
    heads first), compiled as ``compile_preprocess`` does (not cached: a probe's kernel)."""
    import cutlass.cute as cute
    from cutlass import Float32
    from cutlass.cute.runtime import make_fake_stream

    from dash_attn.backends.hopper._tensor_args import fake_tensor
    from dash_attn.backends.hopper.bwd_pre_post import BwdPreprocess, row_stat_fakes

    return cute.compile(
        BwdPreprocess(dtype, head_dim, rows=rows, threads=threads, heads_fastest=heads_fastest),
        *row_stat_fakes(dtype, head_dim),
        fake_tensor(Float32, 2, 4, 16),
        make_fake_stream(use_tvm_ffi_env_stream=True),
        options="--gpu-arch sm_90a --enable-tvm-ffi",
    )


def side(kernel, o, do, lse, rows_pad: int, zero) -> tuple[Callable[[], None], tuple]:
    """A contender launching ``kernel`` on fresh LSE2/delta buffers, and those buffers."""
    import torch

    bh = o.shape[0] * o.shape[2]
    lse2 = torch.full((bh, rows_pad), float("nan"), device=o.device)
    delta = torch.full((bh, rows_pad), float("nan"), device=o.device)

    def run() -> None:
        for _ in range(CALLS):
            kernel(o, do, lse, lse2, delta, zero)

    return run, (lse2, delta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--headdims", default="64,128")
    args = parser.parse_args()

    import cutlass
    import torch

    from tools.hopper.interleaved import ratio_line, run_rounds

    for head_dim in (int(d) for d in args.headdims.split(",")):
        heads, batch, seqlen = 2048 // head_dim, 4, 4096
        gen = torch.Generator(device="cuda").manual_seed(head_dim)
        shape = (batch, seqlen, heads, head_dim)
        o = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        do = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        lse = torch.randn((batch, heads, seqlen), device="cuda", generator=gen)
        zero = torch.ones((64, 4), device="cuda")
        rows_pad = -(-seqlen // 128) * 128
        fns: dict[str, Callable[[], None]] = {}
        outs: dict[str, tuple] = {}
        for rows, threads, heads_fastest in SIDES:
            kernel = compile_rows(cutlass.BFloat16, head_dim, rows, threads, heads_fastest)
            name = f"r{rows}" + (f"t{threads}" if threads != 128 else "") + "h" * heads_fastest
            fns[name], outs[name] = side(kernel, o, do, lse, rows_pad, zero)
        summed = torch.empty_like(o)
        fns["add"] = lambda: [torch.add(o, do, out=summed) for _ in range(CALLS)]  # noqa: B023
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        for name in fns:
            if name.startswith("r") and name != "r64":
                same = all(torch.equal(a, b) for a, b in zip(outs[name], outs["r64"], strict=True))
                print(f"d{head_dim} {name}: LSE2 and delta equal to r64's: {same}")
                if not same:
                    raise SystemExit(f"{name} changed bits")
        times = run_rounds(fns, args.rounds)
        io_bytes = 2 * o.numel() * 2 + lse.numel() * 4 + 2 * batch * heads * rows_pad * 4
        add_bytes = 3 * o.numel() * 2
        print(f"== d{head_dim} b{batch} x {seqlen} h{heads}: {args.rounds} rounds of {CALLS}")
        for name, t in times.items():
            us = statistics.median(t) / CALLS * 1e3
            moved = add_bytes if name == "add" else io_bytes
            print(f"   {name}: {us:.1f} us a launch, {moved / us / 1e6:.2f} TB/s")
        for name in fns:
            if name not in ("r64", "add"):
                print(ratio_line(times, "r64", name))


if __name__ == "__main__":
    main()
