"""Compile one hopper forward config for sm_90a on the CPU and count its SASS opcodes.

What ``ncu`` calls instruction mix, without a GPU: the counts are static (per kernel, not per
executed step), which is enough to see what a code change did to the step loop (GEMM
descriptor moves between the uniform and vector register files, exponentials, rescales).
nvdisasm comes from PATH or from the Triton wheel.

    python -m tools.hopper.fwd_sass --headdim 64 [--causal] [--wgs 3] [--persistent]
        [--p-smem] [--top 40] [--dump FILE] [--loop]

--loop counts only the instructions from the kernel's first HGMMA to its last (a rough cut
around the step loops, where per-step costs live).
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

import torch

from dash_attn.backends.hopper.fwd_launch import compile_fwd
from tools.hopper.sass import disassemble

_OPCODE = re.compile(
    r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)"
)


def opcodes(sass: str, loop_only: bool) -> list[str]:
    ops = [m.group(1) for line in sass.splitlines() if (m := _OPCODE.match(line))]
    if loop_only and "HGMMA" in ops:
        first = ops.index("HGMMA")
        last = len(ops) - 1 - ops[::-1].index("HGMMA")
        ops = ops[first : last + 1]
    return ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--headdim", type=int, required=True)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--wgs", type=int, default=2, help="consumer warpgroups (2 or 3)")
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--p-smem", action="store_true")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--dump", type=Path, help="write the SASS text here")
    args = parser.parse_args()

    compiled = compile_fwd(
        args.headdim, getattr(torch, args.dtype), args.causal, keep_ptx=True,
        consumer_wgs=args.wgs, persistent=args.persistent, p_smem=args.p_smem,
    )  # fmt: skip
    sass = disassemble(compiled.__cubin__)
    if sass is None:
        raise SystemExit("nvdisasm not found (PATH or the triton wheel)")
    if args.dump:
        args.dump.write_text(sass)
    ops = opcodes(sass, args.loop)
    counts = collections.Counter(ops)
    print(f"{len(ops)} instructions")
    for op, n in counts.most_common(args.top):
        print(f"{op:12s} {n}")


if __name__ == "__main__":
    main()
