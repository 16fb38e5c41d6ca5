"""Tuning probe: backward TFLOPS of kernel variants, each an explicit plan, on a few configs.

A developer tool for one device call (``dash-attn bench`` is the full sweep). A variant is
``TILES[@REDUCE]``: tiles as ``parse_tiles`` spells them (empty: the backend's table) and a dQ
reduction (``tma`` or ``atomic``; empty: the device's default). Each variant is a
``make_backward_plan`` call, run by ``run_backward``: nothing is steered through the environment.
Deterministic variants are checked bit for bit against the first one when their block sizes
match (the other options move data, not the summation order).

    PYTHONPATH=$PWD python3 tools/probe_bwd.py --configs 128:causal:16384,64:full:2048 \\
        --variants ';64x128w8s2;@atomic' [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from dash_attn.backends.triton.launch import run_backward
from dash_attn.backends.triton.tiles import parse_tiles
from dash_attn.bench.configs import parse_configs
from dash_attn.device import device_info
from dash_attn.dispatch import problem_of
from dash_attn.plan import make_backward_plan
from dash_attn.schedule import Mask
from dash_attn.schedule.report import paper_batch_heads

DEFAULT_CONFIGS = "128:causal:16384,128:causal:2048,128:full:16384,64:causal:8192,64:full:4096"


def _plan(q, k, causal: bool, variant: str, deterministic: bool):
    tiles, _, reduce = variant.partition("@")
    return make_backward_plan(
        problem_of(q, k, Mask(causal=causal)),
        device=device_info(q.device),
        deterministic=deterministic,
        backend="triton",
        tiles=parse_tiles(tiles) if tiles else None,
        dq_reduce=reduce or "auto",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="headdim:mask:seqlen,...")
    parser.add_argument("--variants", default="", help="';'-separated TILES[@REDUCE] variants")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args()
    rows = []
    for headdim, causal, seqlen in parse_configs(args.configs):
        batch, heads = paper_batch_heads(headdim, seqlen)
        torch.manual_seed(0)
        q, k, v = (
            torch.randn(batch, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16)
            for _ in range(3)
        )
        dout = torch.randn_like(q)
        scale = headdim**-0.5
        out, lse = torch.ops.dash_attn.fwd(q, k, v, causal, scale)
        label = f"{headdim}:{'causal' if causal else 'full'}:{seqlen}"
        reference = {}
        for variant in args.variants.split(";"):
            for det in (True, False):
                plan = _plan(q, k, causal, variant, det)
                call = (plan, dout, q, k, v, out, lse, scale)
                ms = triton.testing.do_bench(lambda c=call: run_backward(*c), warmup=50, rep=300)
                check = ""
                if det:
                    grads = run_backward(plan, dout, q, k, v, out, lse, scale, sync_check=True)
                    key = (plan.tiles.block_m, plan.tiles.block_n)
                    if key not in reference:
                        reference[key], check = grads, "reference"
                    else:
                        same = all(a.equal(b) for a, b in zip(grads, reference[key], strict=True))
                        check = "== reference" if same else "DIFFERS from the reference"
                tflops = plan.problem.flops("bwd") / ms / 1e9
                name = f"{variant or 'default'}/{'det' if det else 'nondet'}"
                rows.append(dict(config=label, variant=name, plan=plan.describe(), ms=ms,
                                 tflops=tflops, check=check))  # fmt: skip
                print(f"{label:>16} {name:>24} {ms:8.3f} ms {tflops:7.1f} TFLOPS  {check}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
