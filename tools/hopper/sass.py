"""SASS of a compiled cubin on a CPU machine: nvdisasm from PATH or from the Triton wheel (which
ships it). Used by ``fwd_sass.py`` and by the backward's compile tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path


def cuda_tool(name: str) -> str | None:
    """A CUDA binary tool from PATH or from the triton wheel, if either has it."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(path) if path.exists() else None


def disassemble(cubin: object) -> str | None:
    """``nvdisasm -c`` of a cubin's bytes; None without nvdisasm or without a cubin (a compile
    that did not keep it)."""
    nvdisasm = cuda_tool("nvdisasm")
    if nvdisasm is None or not isinstance(cubin, bytes):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        cubin_path = Path(tmp) / "kernel.cubin"
        cubin_path.write_bytes(cubin)
        return subprocess.run(
            [nvdisasm, "-c", str(cubin_path)], capture_output=True, text=True, check=True
        ).stdout
