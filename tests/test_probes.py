"""The developer probes in benchmarks/ edit the kernel's source to build variants: every edit
anchor must still be in the kernel, and the variants must compile for Hopper (CPU only)."""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
pytestmark = [
    pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="not a source checkout"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        reason="compiles real kernels; the interpreter replaces them",
    ),
]


@pytest.fixture(scope="module")
def probes():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import probe_protocol
        import probe_trace
    finally:
        sys.path.remove(str(BENCHMARKS))
    return probe_protocol, probe_trace


def test_every_edit_anchor_is_in_the_kernel(probes) -> None:
    probe_protocol, probe_trace = probes
    source = probe_protocol.KERNEL_SOURCE.read_text()
    edits = [edit for variant in probe_protocol.VARIANTS.values() for edit in variant]
    for old, _ in [*edits, *probe_trace.EDITS]:
        assert old in source, f"probe edit anchor no longer in the kernel: {old!r}"


def test_trace_variant_compiles_for_hopper(probes) -> None:
    probe_protocol, probe_trace = probes
    from dash_attn.kernels.compile_report import compile_backward

    with tempfile.TemporaryDirectory(dir=probe_protocol.KERNEL_SOURCE.parent) as tmp:
        module = probe_protocol.load_variant_source(
            "trace", probe_trace.EDITS, pathlib.Path(tmp), extra_source=probe_trace.TRACE_HELPERS
        )
        report = compile_backward(128, deterministic=True, kernel=module.attn_bwd_kernel)
    assert "%globaltimer" in report.ptx and "%smid" in report.ptx
