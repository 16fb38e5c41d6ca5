"""tools/hopper/ptx_digest.py: the shipped kernels' PTX digests, used to show that a change
leaves the shipped kernels alone (compiled for sm_90a on the CPU)."""

from __future__ import annotations

import doctest
import hashlib

import pytest

pytest.importorskip("cutlass")
pytest.importorskip("torch")

from dash_attn.backends.hopper import (  # noqa: E402
    BWD_HEADDIMS,
    BWD_VARIANT,
    BWD_VARIANT_LONG,
    bwd_variant,
)
from tools.hopper import ptx_digest  # noqa: E402


def test_configs_cover_every_shipped_variant() -> None:
    configs = list(ptx_digest.shipped_configs())
    assert len(configs) == len(BWD_HEADDIMS) * 2 * 2 * len(ptx_digest.SEQLEN_CLASSES)
    variants = {c[-1] for c in configs}
    # Every head dim and mask's variant, or its det / non-det twin, and the long-key ones.
    for head_dim, mask in BWD_VARIANT:
        for det in (True, False):
            assert bwd_variant(head_dim, mask == "causal", 0, det) in variants
    for head_dim, mask in BWD_VARIANT_LONG:
        assert bwd_variant(head_dim, mask == "causal", 1 << 30, True) in variants


def test_masked_ptx_is_reproducible_and_names_are_masked() -> None:
    variant = bwd_variant(64, False, 0, True)
    first = ptx_digest.masked_ptx(64, False, True, variant)
    second = ptx_digest.masked_ptx(64, False, True, variant)
    assert "cutlass_" not in first and "wgmma" in first
    assert hashlib.md5(first.encode()).digest() == hashlib.md5(second.encode()).digest()


def test_sass_digests_worked_examples() -> None:
    assert doctest.testmod(ptx_digest).failed == 0


def test_sass_digests_of_a_kernel_are_reproducible() -> None:
    variant = bwd_variant(64, False, 0, False)
    first = ptx_digest.kernel_sass(64, False, False, variant)
    if first is None:
        pytest.skip("no nvdisasm")
    opcodes = ptx_digest.sass_opcodes(first)
    # Five GEMMs per step at hd 64 with 128 x 128 tiles: S, dP (4 k-blocks each), dV, dK (8
    # each) and dQ (8), as HGMMA instructions.
    assert sum(op.startswith("HGMMA") for op in opcodes) == 2 * 4 + 2 * 8 + 8
    second = ptx_digest.kernel_sass(64, False, False, variant)
    assert second is not None
    assert ptx_digest.sass_digests(opcodes) == ptx_digest.sass_digests(
        ptx_digest.sass_opcodes(second)
    )
