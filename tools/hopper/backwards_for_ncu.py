"""One backward each of dash-attn's hopper backend (deterministic, then not) and of FA4's
(the same), per shape, for Nsight Compute to profile (filter the kernels by name:
``-k regex:"HopperAttnBwd|FlashAttentionBackwardSm90"``): the kernels come in that order per
shape, which is the order of ``ncu_summary.py --table``'s labels.

    ncu --set full -k regex:"..." -o prof python3 tools/hopper/backwards_for_ncu.py \\
        16:1024:8:256:causal 2:8192:8:256:full

Each shape is ``batch:seqlen:heads:head_dim:mask`` (mask ``full`` or ``causal``), bf16, seeded
by its seqlen. Needs a GPU, FA4 (``flash_attn.cute``) and the CuTe-DSL kit.

``--ours det:auto,nondet:auto`` (the default) names our runs per shape, each ``mode:schedule``
(``det`` or ``nondet``, a schedule name or ``auto``), in that order, optionally
``mode:schedule:SUFFIX`` to run the kernel variant ``<shipped variant>SUFFIX`` of
``bwd_launch.VARIANTS`` instead of the shipped one (``nondet:auto:_kf0``); ``--no-fa4`` leaves
FA4's two out (then only ours run, and FA4 need not be installed).
"""

from __future__ import annotations

import argparse
import contextlib
import sys


def parse_shape(text: str) -> tuple[int, int, int, int, bool]:
    """``batch:seqlen:heads:head_dim:mask`` -> (batch, seqlen, heads, head_dim, causal)."""
    parts = text.split(":")
    if (
        len(parts) != 5
        or parts[4] not in ("full", "causal")
        or not all(p.isdigit() for p in parts[:4])
    ):
        raise ValueError(f"shape {text!r}: want batch:seqlen:heads:head_dim:full|causal")
    batch, seqlen, heads, head_dim = (int(p) for p in parts[:4])
    return batch, seqlen, heads, head_dim, parts[4] == "causal"


def parse_runs(text: str) -> list[tuple[bool, str, str]]:
    """``det:auto,nondet:descending:_kf0`` -> [(True, "auto", ""), (False, "descending",
    "_kf0")]: mode, schedule and kernel-variant suffix ("" for the shipped kernel)."""
    runs = []
    for item in text.split(","):
        mode, _, rest = item.partition(":")
        schedule, _, suffix = rest.partition(":")
        if mode not in ("det", "nondet") or not schedule or ":" in suffix:
            raise ValueError(f"run {item!r}: want det|nondet:SCHEDULE[:VARIANT_SUFFIX]")
        runs.append((mode == "det", schedule, suffix))
    return runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="+", help="batch:seqlen:heads:head_dim:full|causal")
    parser.add_argument("--ours", default="det:auto,nondet:auto", help="mode:schedule[:suffix],...")
    parser.add_argument("--fa4", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    shapes = [parse_shape(text) for text in args.shapes]
    runs = parse_runs(args.ours)

    import torch

    from dash_attn import dash_attn_func
    from dash_attn.backends.hopper import launch as hopper_launch
    from tools.hopper.bwd_probe import kernel_variant

    @contextlib.contextmanager
    def shipped_or_variant(suffix: str):
        """The shipped kernel, or with ``suffix`` the variant ``<shipped>suffix``, prepared
        afresh (the launch cache would give the kernel prepared before)."""
        if not suffix:
            yield
            return
        hopper_launch._launches.clear()
        try:
            with kernel_variant(lambda name: name + suffix):
                yield
        finally:
            hopper_launch._launches.clear()

    def ours(q, k, v, causal, run):
        det, schedule, _ = run
        return dash_attn_func(
            q, k, v, causal=causal, deterministic=det, schedule=schedule, backend="hopper"
        )

    def theirs(q, k, v, causal, det):
        from flash_attn.cute import flash_attn_func as fa4

        out = fa4(q, k, v, causal=causal, deterministic=det)
        return out[0] if isinstance(out, tuple) else out

    for text, (batch, seqlen, heads, head_dim, causal) in zip(args.shapes, shapes, strict=True):
        gen = torch.Generator(device="cuda").manual_seed(seqlen)
        q, k, v, dout = (
            torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=gen)
            for _ in range(4)
        )  # fmt: skip
        calls = [
            (f"ours {'det' if run[0] else 'non-det'} {run[1]}{run[2]}", ours, run, run[2])
            for run in runs
        ]
        if args.fa4:
            calls += [("fa4 det", theirs, True, ""), ("fa4 non-det", theirs, False, "")]
        for label, attention, option, suffix in calls:
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            with shipped_or_variant(suffix):
                out = attention(*leaves, causal, option)
                torch.autograd.grad(out, leaves, dout)
                torch.cuda.synchronize()
            print(label, text, flush=True)
    print("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
