"""Digests of the PTX of every hopper backward kernel the backend ships, compiled for sm_90a on
the CPU (no GPU needed), so that two trees can be compared: a change meant to leave the shipped
kernels alone (a new opt-in variant, a probe, a refactor) must print the same lines.

    PYTHONPATH=$PWD python3 -m tools.hopper.ptx_digest > a.txt     # in each tree, then diff

One line per (head dim, mask, mode, key-length class) with the variant ``bwd_variant`` picks and
an MD5 of its PTX, the kernel and function names masked (they carry the class and the compile's
object names, not code). ``--keep DIR`` leaves each masked PTX there for a textual diff.
Compiles bypass the kernel cache; about 3 s per kernel.

``--all`` adds the kernels no shipped key selects but a call or a variant can: the shipped
det kernels with ``dkv_sum`` (the GQA split's in-kernel dK/dV sums, chosen at launch) and every
variant of ``bwd_launch.VARIANTS`` (det causal and non-det full, at the head dims of its step
layout; a combination the constructor refuses prints its error), about 600 compiles, 15-20
minutes. ``--fwd`` adds the forward kernels the backend runs (``fwd_launch.compile_report``);
``--pre-post`` the small kernels around the backward (``bwd_pre_post``: the preprocess, plain
and as a programmatic primary, and the dQ casts, plain, programmatic and polled, per head dim
and shipped Q tile).

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
from collections.abc import Callable, Iterator
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


def variant_configs() -> Iterator[tuple[int, bool, bool, str, bool]]:
    """(head dim, causal, deterministic, variant, dkv_sum) of ``--all``'s compiles."""
    from dash_attn.backends.hopper import BWD_HEADDIMS, bwd_variant
    from dash_attn.backends.hopper.bwd import SWAPPED_TILES
    from dash_attn.backends.hopper.bwd_launch import VARIANTS

    for head_dim in BWD_HEADDIMS:
        for causal in (False, True):
            yield head_dim, causal, True, bwd_variant(head_dim, causal, deterministic=True), True
    plain_dims = [d for d in BWD_HEADDIMS if d not in SWAPPED_TILES]
    for variant in sorted(VARIANTS):
        swapped = VARIANTS[variant].get("dkv_swap", False)
        for head_dim in sorted(SWAPPED_TILES) if swapped else plain_dims:
            yield head_dim, True, True, variant, False
            yield head_dim, False, False, variant, False


def forward_configs() -> list[tuple[int, bool, int, bool, bool, bool]]:
    """(head dim, causal, consumer warpgroups, persistent, p_smem, lpt_order) of every forward
    kernel the backend runs (``launch.run_forward``'s choices at each sequence length where
    one of its tables changes them), once each."""
    from dash_attn.backends import hopper
    from dash_attn.backends.hopper import launch

    bounds = {1, 1 << 20}
    for table in hopper.FWD_3WG_MIN_SEQLEN.values():
        bounds |= set(table.values())
    for table in [*hopper.FWD_PERSISTENT_MAX_SEQLEN_K.values(), hopper.FWD_LPT_ORDER_MAX_SEQLEN_K]:
        bounds |= {n + 1 for n in table.values()}
    configs: list[tuple[int, bool, int, bool, bool, bool]] = []
    for head_dim in hopper.FWD_HEADDIMS:
        for causal in (False, True):
            for seqlen in sorted(bounds):
                wgs = launch.forward_consumer_wgs(head_dim, seqlen, causal)
                config = (
                    head_dim, causal, wgs, launch.forward_persistent(head_dim, seqlen, causal),
                    wgs == 3 and head_dim in hopper.FWD_P_SMEM_HEADDIMS,
                    launch.forward_lpt_order(head_dim, seqlen, causal),
                )  # fmt: skip
                if config not in configs:
                    configs.append(config)
    return configs


def _dumped(compile_with: Callable[[str], object], kind: str) -> bytes:
    """The ``kind`` file (``ptx`` or ``cubin``) of one compile: ``compile_with(options)`` must
    pass ``options`` (``--keep-<kind>`` into a temporary folder) as its extra compile options."""
    with tempfile.TemporaryDirectory() as dump:
        compile_with(f"--keep-{kind} --dump-dir {dump}")
        (path,) = Path(dump).glob(f"*.{kind}")
        return path.read_bytes()


def _kept_file(
    head_dim: int, causal: bool, deterministic: bool, variant: str, kind: str, dkv_sum: bool = False
) -> bytes:
    """One bf16 kernel compiled with ``--keep-<kind>`` (``ptx`` or ``cubin``): the file's bytes."""
    import torch

    from dash_attn.backends.hopper import bwd_launch

    return _dumped(
        lambda options: bwd_launch.compile_bwd(
            torch.bfloat16, head_dim, causal=causal, deterministic=deterministic,
            variant=variant, dkv_sum=dkv_sum, extra_options=options,
        ),
        kind,
    )  # fmt: skip


def masked_ptx(
    head_dim: int, causal: bool, deterministic: bool, variant: str, dkv_sum: bool = False
) -> str:
    """The PTX of one bf16 kernel, its generated names replaced by ``K``."""
    ptx = _kept_file(head_dim, causal, deterministic, variant, "ptx", dkv_sum).decode()
    return _NAMES.sub("K", ptx)


def forward_masked_ptx(config: tuple[int, bool, int, bool, bool, bool]) -> str:
    """The PTX of one bf16 forward kernel (a ``forward_configs`` entry; the TVM-FFI entry the
    backend launches), its generated names replaced by ``K``."""
    from dash_attn.backends.hopper.fwd_launch import compile_report

    head_dim, causal, wgs, persistent, p_smem, lpt_order = config
    ptx, _ = compile_report(
        head_dim, "bfloat16", causal, wgs, tvm_ffi=True, persistent=persistent, p_smem=p_smem,
        lpt_order=lpt_order,
    )  # fmt: skip
    return _NAMES.sub("K", ptx)


def pre_post_configs() -> list[tuple[str, int, int]]:
    """(kind, head dim, Q tile rows) of ``--pre-post``'s compiles: kinds ``pre``, ``pre_pdl``
    (rows 0: the preprocess has no tile), ``cast``, ``cast_pdl``, ``cast_poll``."""
    from dash_attn.backends.hopper import BWD_HEADDIMS, bwd_tiles

    configs: list[tuple[str, int, int]] = []
    for head_dim in BWD_HEADDIMS:
        configs += [("pre", head_dim, 0), ("pre_pdl", head_dim, 0)]
        for block_m in sorted({bwd_tiles(head_dim, causal).block_m for causal in (False, True)}):
            configs += [(kind, head_dim, block_m) for kind in ("cast", "cast_pdl", "cast_poll")]
    return configs


def pre_post_masked_ptx(kind: str, head_dim: int, block_m: int) -> str:
    """The PTX of one bf16 ``pre_post_configs`` kernel, its generated names replaced by ``K``."""
    import cutlass

    from dash_attn.backends.hopper.bwd_pre_post import compile_dq_cast, compile_preprocess

    def compile_with(options: str) -> object:
        if kind.startswith("pre"):
            return compile_preprocess(
                cutlass.BFloat16, head_dim, pdl=kind == "pre_pdl", extra_options=options
            )
        return compile_dq_cast(
            cutlass.BFloat16, head_dim, block_m, pdl=kind == "cast_pdl",
            poll=kind == "cast_poll", extra_options=options,
        )  # fmt: skip

    return _NAMES.sub("K", _dumped(compile_with, "ptx").decode())


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


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
    math = [op for op in opcodes if op.startswith(_MATH) and not op.startswith("FENCE")]
    memory = sorted(op for op in opcodes if op.startswith(_MEMORY))
    return {
        "ops": _md5(" ".join(opcodes))[:8],
        "math": _md5(" ".join(math))[:8],
        "mem": _md5(" ".join(memory))[:8],
    }


def kernel_sass(head_dim: int, causal: bool, deterministic: bool, variant: str) -> str | None:
    """``nvdisasm -c`` of one bf16 kernel's cubin; None without nvdisasm."""
    from tools.hopper.sass import disassemble

    return disassemble(_kept_file(head_dim, causal, deterministic, variant, "cubin"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write each masked PTX into this folder")
    parser.add_argument("--sass", action="store_true", help="add the SASS digests")
    parser.add_argument(
        "--all", action="store_true", help="add dkv_sum kernels and every variant (PTX only)"
    )
    parser.add_argument("--fwd", action="store_true", help="add the forward kernels (PTX only)")
    parser.add_argument(
        "--pre-post", action="store_true", help="add the preprocess and dQ casts (PTX only)"
    )
    args = parser.parse_args(argv)
    seen: dict[tuple, str] = {}
    for head_dim, causal, det, label, variant in shipped_configs():
        key = (head_dim, causal, det, variant)
        mask, mode = "causal" if causal else "full", "det" if det else "nondet"
        if key not in seen:
            ptx = masked_ptx(head_dim, causal, det, variant)
            seen[key] = _md5(ptx)
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
    if args.all:
        for head_dim, causal, det, variant, dkv_sum in variant_configs():
            try:
                digest = _md5(masked_ptx(head_dim, causal, det, variant, dkv_sum))
            except (ValueError, NotImplementedError) as error:
                digest = f"refused: {str(error).splitlines()[0]}"
            kind = "sum" if dkv_sum else "variant"
            mask, mode = "causal" if causal else "full", "det" if det else "nondet"
            print(f"{kind} hd{head_dim} {mask:6s} {mode:6s} {variant:30s} {digest}", flush=True)
    if args.fwd:
        for config in forward_configs():
            head_dim, causal, wgs, persistent, p_smem, lpt_order = config
            options = [f"wg{wgs}"] + [
                name for name, on in
                (("persistent", persistent), ("p_smem", p_smem), ("lpt", lpt_order)) if on
            ]  # fmt: skip
            mask = "causal" if causal else "full"
            print(
                f"fwd hd{head_dim} {mask:6s} {' '.join(options):22s} "
                f"{_md5(forward_masked_ptx(config))}",
                flush=True,
            )
    if args.pre_post:
        for kind, head_dim, block_m in pre_post_configs():
            tile = f"bm{block_m}" if block_m else ""
            digest = _md5(pre_post_masked_ptx(kind, head_dim, block_m))
            print(f"{kind:9s} hd{head_dim} {tile:5s} {digest}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
