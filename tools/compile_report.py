"""Compile the backward kernel for Hopper without a GPU and report what the compiler made of it.

Triton ships ``ptxas`` and ``cuobjdump``, so the whole pipeline (TTGIR, PTX, SASS) runs on a CPU
machine. That answers the questions a tuning run would otherwise spend device time on: registers
and spill stack per thread, shared memory, whether the step loop is software-pipelined
(``LDGSTS`` = cp.async prefetch), which atomics the dQ add became, how many fences the protocol
costs. The tests use it to keep the GPU-only code paths (inline PTX) compiling in CPU CI.

    python -m tools.compile_report --headdim 128 [--nondet] [--tiles 64x128w8s2]
        [--dq-reduce atomic]

Arguments are specialised the way a real launch specialises them (16-byte aligned pointers,
strides and sequence lengths divisible by 16), so the report matches the kernel that runs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dash_attn.backends.triton.tiles import BackwardTiles, backward_tiles, parse_tiles
from dash_attn.backends.triton.utils import next_power_of_2

HOPPER = GPUTarget("cuda", 90, 32)

# SASS opcodes worth counting, and what they mean for this kernel.
SASS_COUNTS = {
    "HGMMA": "warpgroup MMA instructions",
    "LDGSTS": "cp.async copies (the step loop prefetches Q/dO only if > 0)",
    "REDG": "fire-and-forget global reductions (dQ adds, releases)",
    "ATOMG": "global atomics that return a value",
    "MEMBAR": "memory barriers (each release costs one)",
    "CCTL": "L1 invalidations (each acquire load costs one)",
    "STL": "spill stores",
    "LDL": "spill loads",
    "BAR.SYNC": "CTA barriers",
}

# What the outline keeps: where the kernel moves memory, multiplies, synchronises and branches.
_OUTLINE = re.compile(
    r"^(LDGSTS|LDGDEPBAR|LDG|STG|REDG|ATOMG|UTMA\w*|SYNCS|HGMMA|WARPGROUP|DEPBAR|BAR|MEMBAR|"
    r"CCTL|BRA|STL|LDL)\b"
)

_POINTERS_FP32 = {"LSE2", "DELTA", "DQ_ACC"}
_POINTERS_INPUT = {"Q", "K", "V", "DO", "DK", "DV"}
_FLOATS = {"qk_scale", "softmax_scale"}
_INT64 = {"timeout"}


@dataclass(frozen=True)
class KernelReport:
    """What one compiled variant of the backward kernel uses."""

    registers: int
    stack_bytes: int
    shared_bytes: int
    sass_counts: dict[str, int]
    ptx: str
    sass: str

    def outline(self) -> list[str]:
        """The SASS in program order, reduced to memory, MMA, synchronisation and branch
        instructions, repeats of one opcode folded (``HGMMA.64x64x16.F32.BF16 x8``). Shows where
        the step loop issues its loads and where it waits for them (branch targets are
        addresses, so the loop is the span between a backward ``BRA`` and its target)."""
        lines: list[str] = []
        last, repeats = "", 0
        for match in re.finditer(
            r"^\s+/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?)([A-Z][A-Z0-9_.]*)([^;]*);",
            self.sass,
            re.M,
        ):
            address, predicate, opcode, operands = match.groups()
            if not _OUTLINE.match(opcode):
                continue
            # Waits, branches and barriers keep their operands (which counter, which target).
            keep = opcode.startswith(("DEPBAR", "BRA", "WARPGROUP", "SYNCS"))
            text = f"{predicate}{opcode}{operands if keep else ''}".strip()
            if text == last:
                repeats += 1
                lines[-1] = f"{lines[-1].split(' x')[0]} x{repeats}"
                continue
            last, repeats = text, 1
            lines.append(f"{address}  {text}")
        return lines

    def summary(self) -> str:
        counts = "  ".join(f"{name} {count}" for name, count in self.sass_counts.items())
        return (
            f"registers {self.registers}  spill stack {self.stack_bytes} B  "
            f"shared {self.shared_bytes} B\n{counts}"
        )


def _signature(fn, constexprs: dict, dtype: str) -> tuple[dict[str, str], dict]:
    signature: dict[str, str] = {}
    attrs: dict = {}
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        if name == "DQ_DESC":
            if constexprs.get("DQ_TMA"):
                block = [1, constexprs["BLOCK_M"], 1, constexprs["HEAD_DIM_PAD"]]
                signature[name] = f"tensordesc<fp32{block}>"
                continue
            kind = "*fp32"  # unused: the accumulator itself
        elif name in _POINTERS_INPUT:
            kind = f"*{dtype}"
        elif name in _POINTERS_FP32:
            kind = "*fp32"
        elif name.isupper():  # semaphores, status and the schedule tables
            kind = "*i32"
        elif name in _FLOATS:
            kind = "fp32"
        elif name in _INT64:
            kind = "i64"
        elif name.startswith("stride_") or name in ("seqlen_q", "seqlen_k", "rows_pad_total"):
            kind = "i32"
        elif name in (
            "q_heads", "kv_heads", "kv_group", "kv_tiles", "q_tiles", "num_chains", "causal_shift",
            "window_left", "window_right",
        ):  # fmt: skip
            kind = "i32"
            signature[name] = kind
            continue  # no divisibility: these are small counts
        else:
            raise ValueError(f"compile_report: no rule for kernel argument {name!r}")
        signature[name] = kind
        # A real launch sees 16-byte aligned pointers and (for the shapes that matter) strides
        # and lengths divisible by 16; Triton specialises on exactly that.
        attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, attrs


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_backward(
    headdim: int,
    *,
    deterministic: bool = True,
    dynamic: bool = False,
    causal: bool = True,
    tiles: BackwardTiles | None = None,
    dtype: str = "bf16",
    dq_tma: bool = False,
    window: bool = False,
    varlen: bool = False,
    kernel=None,
) -> KernelReport:
    """Compile ``attn_bwd_kernel`` (or a variant ``kernel``) for sm_90a and report on it
    (``window``: the sliding-window mask instead of ``causal``; ``varlen``: packed sequences)."""
    from dash_attn.backends.triton.bwd import attn_bwd_kernel

    kernel = kernel or attn_bwd_kernel
    tiles = tiles or backward_tiles(headdim, "tma" if dq_tma else "atomic")
    constexprs = dict(
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        HEAD_DIM=headdim,
        HEAD_DIM_PAD=next_power_of_2(headdim),
        CAUSAL=causal,
        DETERMINISTIC=deterministic,
        DYNAMIC=dynamic,
        TIMED_WAIT=True,
    )
    options = (
        ("WINDOW", window),
        ("IS_VARLEN", varlen),
        ("DQ_TMA", dq_tma),
        ("TABLES_AHEAD", tiles.tables_ahead),
        ("RELEASE_AFTER_QK", tiles.release_after_qk),
    )
    for option, value in options:
        if option in kernel.arg_names:
            constexprs[option] = value
        elif value:
            raise ValueError(f"this kernel has no {option} option")
    signature, attrs = _signature(kernel, constexprs, dtype)
    compiled = triton.compile(
        ASTSource(kernel, signature, constexprs, attrs),
        target=HOPPER,
        options=dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages),
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage, sass = (
            subprocess.run(
                [_tool("cuobjdump"), flag, str(cubin)], capture_output=True, text=True, check=True
            ).stdout
            for flag in ("-res-usage", "-sass")
        )
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    opcodes = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
    counts = {
        name: sum(1 for op in opcodes if op == name or op.startswith(name + "."))
        for name in SASS_COUNTS
    }
    return KernelReport(
        registers=registers,
        stack_bytes=stack,
        shared_bytes=int(compiled.metadata.shared),
        sass_counts=counts,
        ptx=compiled.asm["ptx"],
        sass=sass,
    )


def _parse_tiles(text: str) -> BackwardTiles:
    try:
        return parse_tiles(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--nondet", action="store_true", help="the non-deterministic kernel")
    parser.add_argument("--dynamic", action="store_true", help="ticket dispatch (fa3, descending)")
    parser.add_argument("--full", action="store_true", help="full mask instead of causal")
    parser.add_argument(
        "--tiles",
        type=_parse_tiles,
        default=None,
        help="e.g. 64x128w8s2; a trailing a reads the tables ahead, r releases late",
    )
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument(
        "--dq-reduce",
        choices=("tma", "atomic"),
        default="tma",
        help="how dQ partials are added: TMA bulk reductions (the default on Hopper) or atomics",
    )
    parser.add_argument(
        "--outline", action="store_true", help="print the SASS outline (loads, MMAs, waits)"
    )
    parser.add_argument("--dump", type=Path, default=None, help="write kernel.ptx / kernel.sass")
    args = parser.parse_args(argv)
    report = compile_backward(
        args.headdim,
        deterministic=not args.nondet,
        dynamic=args.dynamic,
        causal=not args.full,
        tiles=args.tiles,
        dtype=args.dtype,
        dq_tma=args.dq_reduce == "tma",
    )
    print(report.summary())
    if args.outline:
        print("\n".join(report.outline()))
    if args.dump is not None:
        args.dump.mkdir(parents=True, exist_ok=True)
        (args.dump / "kernel.ptx").write_text(report.ptx)
        (args.dump / "kernel.sass").write_text(report.sass)
        print(f"wrote {args.dump / 'kernel.ptx'} and {args.dump / 'kernel.sass'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
