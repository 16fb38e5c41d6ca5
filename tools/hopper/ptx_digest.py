"""Digests of the PTX of every hopper backward kernel the backend ships, compiled for sm_90a on
the CPU (no GPU needed), so that two trees can be compared: a change meant to leave the shipped
kernels alone (a new opt-in variant, a probe, a refactor) must print the same lines.

    PYTHONPATH=$PWD python3 -m tools.hopper.ptx_digest > a.txt     # in each tree, then diff

One line per (head dim, mask, mode, key-length class) with the variant ``bwd_variant`` picks and
an MD5 of its PTX, the kernel and function names masked (they carry the class and the compile's
object names, not code). ``--keep DIR`` leaves each masked PTX there for a textual diff.
Compiles bypass the kernel cache; about 3 s per kernel.
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


def shipped_configs() -> Iterator[tuple[int, bool, bool, str, str]]:
    """(head dim, causal, deterministic, key-length class, variant) of every shipped kernel."""
    from dash_attn.backends.hopper import BWD_HEADDIMS, bwd_variant

    for head_dim in BWD_HEADDIMS:
        for causal in (False, True):
            for deterministic in (True, False):
                for label, seqlen_k in SEQLEN_CLASSES.items():
                    variant = bwd_variant(head_dim, causal, seqlen_k, deterministic)
                    yield head_dim, causal, deterministic, label, variant


def masked_ptx(head_dim: int, causal: bool, deterministic: bool, variant: str) -> str:
    """The PTX of one bf16 kernel, its generated names replaced by ``K``."""
    import torch

    from dash_attn.backends.hopper import bwd_launch

    with tempfile.TemporaryDirectory() as dump:
        bwd_launch.compile_bwd(
            torch.bfloat16, head_dim, causal=causal, deterministic=deterministic,
            variant=variant, extra_options=f"--keep-ptx --dump-dir {dump}",
        )  # fmt: skip
        (ptx,) = Path(dump).glob("*.ptx")
        return _NAMES.sub("K", ptx.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="write each masked PTX into this folder")
    args = parser.parse_args(argv)
    seen: dict[tuple, str] = {}
    for head_dim, causal, det, label, variant in shipped_configs():
        key = (head_dim, causal, det, variant)
        mask, mode = "causal" if causal else "full", "det" if det else "nondet"
        if key not in seen:
            ptx = masked_ptx(head_dim, causal, det, variant)
            seen[key] = hashlib.md5(ptx.encode()).hexdigest()
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"hd{head_dim}-{mask}-{mode}-{variant}.ptx").write_text(ptx)
        print(f"hd{head_dim} {mask:6s} {mode:6s} {label:5s} {variant:30s} {seen[key]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
