"""Digests of the PTX of every hopper backward kernel the backend ships, compiled for sm_90a on
the CPU (no GPU needed), so that two trees can be compared: a change meant to leave the shipped
kernels alone (a new opt-in variant, a probe, a refactor) must print the same lines.

    PYTHONPATH=$PWD python3 -m tools.hopper.ptx_digest > a.txt     # in each tree, then diff

One line per (head dim, mask, mode, key-length class) with the variant ``bwd_variant`` picks and
an MD5 of its PTX, the kernel and function names masked (they carry the class and the compile's
object names, not code). ``--keep DIR`` leaves each masked PTX there for a textual diff.
Compiles bypass the kernel cache; about 3 s per kernel.

A change of the kernel's parameters (one more or one fewer) changes every PTX digest without
changing what the kernel computes. ``--sass`` adds three digests of the SASS (``nvdisasm`` from
PATH or the Triton wheel), opcodes only: ``ops``, the whole sequence; ``math``, the sequence of
the GEMM, MUFU and floating-point instructions (equal: the same arithmetic in the same order,
so the same bits); ``mem``, the counts of the memory, barrier and fence instructions.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Key lengths below and above every BWD_VARIANT_LONG threshold.
SEQLEN_CLASSES = {"short": 1024, "long": 1 << 20}
_NAMES = re.compile(r"cutlass_\w+")
# An instruction line of ``nvdisasm -c``: address comment, optional predicate, opcode.
_SASS_OPCODE = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
# Opcode prefixes of the arithmetic that sets the bits (GEMMs, MUFU, fp32/fp16 ALU) and of the
# memory, barrier and fence instructions.
_MATH = ("HGMMA", "MUFU", "F", "H")
_MEMORY = ("LD", "ST", "RED", "ATOM", "SYNCS", "UTMA", "UBLK", "BAR", "MEMBAR", "FENCE")


def shipped_configs() -> Iterator[tuple[int, bool, bool, str, str]]:
    """(head dim, causal, deterministic, key-length class, variant) of every shipped kernel."""
    from dash_attn.backends.hopper import BWD_HEADDIMS, bwd_variant

    for head_dim in BWD_HEADDIMS:
        for causal in (False, True):
            for deterministic in (True, False):
                for label, seqlen_k in SEQLEN_CLASSES.items():
                    variant = bwd_variant(head_dim, causal, seqlen_k, deterministic)
                    yield head_dim, causal, deterministic, label, variant


def _kept_file(head_dim: int, causal: bool, deterministic: bool, variant: str, kind: str) -> bytes:
    """One bf16 kernel compiled with ``--keep-<kind>`` (``ptx`` or ``cubin``): the file's bytes."""
    import torch

    from dash_attn.backends.hopper import bwd_launch

    with tempfile.TemporaryDirectory() as dump:
        bwd_launch.compile_bwd(
            torch.bfloat16, head_dim, causal=causal, deterministic=deterministic,
            variant=variant, extra_options=f"--keep-{kind} --dump-dir {dump}",
        )  # fmt: skip
        (path,) = Path(dump).glob(f"*.{kind}")
        return path.read_bytes()


def masked_ptx(head_dim: int, causal: bool, deterministic: bool, variant: str) -> str:
    """The PTX of one bf16 kernel, its generated names replaced by ``K``."""
    ptx = _kept_file(head_dim, causal, deterministic, variant, "ptx").decode()
    return _NAMES.sub("K", ptx)


def sass_opcodes(sass: str) -> list[str]:
    """The opcodes of a ``nvdisasm -c`` listing, in order, predicates and operands dropped.

    >>> sass_opcodes("  /*0010*/  @!P0 FFMA R1, R2, R3, R4 ;\\n  /*0020*/  MOV R1, R2 ;")
    ['FFMA', 'MOV']
    """
    return [m.group(1) for line in sass.splitlines() if (m := _SASS_OPCODE.match(line))]


def sass_digests(opcodes: list[str]) -> dict[str, str]:
    """``ops``, ``math`` and ``mem`` digests of an opcode sequence (module docstring); 8 hex
    digits each.

    >>> a = sass_digests(["IMAD", "FFMA", "LDS", "FENCE.VIEW.ASYNC.S", "MUFU.EX2", "STG.E"])
    >>> b = sass_digests(["FENCE.VIEW.ASYNC.S", "FFMA", "STG.E", "MUFU.EX2", "IMAD.MOV", "LDS"])
    >>> (a["ops"] == b["ops"], a["math"] == b["math"], a["mem"] == b["mem"])
    (False, True, True)
    """

    def md5(text: str) -> str:
        return hashlib.md5(text.encode()).hexdigest()[:8]

    math = [op for op in opcodes if op.startswith(_MATH) and not op.startswith("FENCE")]
    memory = sorted(op for op in opcodes if op.startswith(_MEMORY))
    return {
        "ops": md5(" ".join(opcodes)),
        "math": md5(" ".join(math)),
        "mem": md5(" ".join(memory)),
    }


def kernel_sass(head_dim: int, causal: bool, deterministic: bool, variant: str) -> str | None:
    """``nvdisasm -c`` of one bf16 kernel's cubin; None without nvdisasm."""
    from tools.hopper.sass import disassemble

    return disassemble(_kept_file(head_dim, causal, deterministic, variant, "cubin"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write each masked PTX into this folder")
    parser.add_argument("--sass", action="store_true", help="add the SASS digests")
    args = parser.parse_args(argv)
    seen: dict[tuple, str] = {}
    for head_dim, causal, det, label, variant in shipped_configs():
        key = (head_dim, causal, det, variant)
        mask, mode = "causal" if causal else "full", "det" if det else "nondet"
        if key not in seen:
            ptx = masked_ptx(head_dim, causal, det, variant)
            seen[key] = hashlib.md5(ptx.encode()).hexdigest()
            if args.sass:
                sass = kernel_sass(head_dim, causal, det, variant)
                if sass is None:
                    parser.error("--sass needs nvdisasm (on PATH or in the Triton wheel)")
                digests = sass_digests(sass_opcodes(sass))
                seen[key] += "".join(f" {name} {value}" for name, value in digests.items())
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"hd{head_dim}-{mask}-{mode}-{variant}.ptx").write_text(ptx)
        print(f"hd{head_dim} {mask:6s} {mode:6s} {label:5s} {variant:30s} {seen[key]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
