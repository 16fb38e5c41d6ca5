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


def test_all_configs_cover_every_variant_and_the_dkv_sum_kernels() -> None:
    """``--all``: each shipped det kernel once more with ``dkv_sum``, and every variant at the
    head dims of its step layout (the swapped one's at 192 and 256 only), det causal and
    non-det full."""
    from dash_attn.backends.hopper.bwd import SWAPPED_TILES
    from dash_attn.backends.hopper.bwd_launch import VARIANTS

    configs = list(ptx_digest.variant_configs())
    sums = [c for c in configs if c[4]]
    assert sorted((c[0], c[1]) for c in sums) == sorted(
        (d, causal) for d in BWD_HEADDIMS for causal in (False, True)
    )
    assert all(c[2] and c[3] == bwd_variant(c[0], c[1], deterministic=True) for c in sums)
    plain = [c for c in configs if not c[4]]
    assert {c[3] for c in plain} == set(VARIANTS)
    for head_dim, causal, det, variant, _ in plain:
        assert (head_dim in SWAPPED_TILES) == bool(VARIANTS[variant].get("dkv_swap"))
        assert (causal, det) in ((True, True), (False, False))
    assert len(set(configs)) == len(configs)


def test_forward_configs_are_the_launch_choices() -> None:
    """``--fwd``: the forward kernel of every (head dim, mask, sequence length) the backend
    runs is listed, each once."""
    from dash_attn.backends.hopper import FWD_HEADDIMS, FWD_P_SMEM_HEADDIMS, launch

    configs = ptx_digest.forward_configs()
    assert len(set(configs)) == len(configs)
    for head_dim in FWD_HEADDIMS:
        for causal in (False, True):
            for seqlen in (1, 100, 1024, 2047, 2048, 4096, 8192, 8193, 16384, 32768, 1 << 17):
                wgs = launch.forward_consumer_wgs(head_dim, seqlen, causal)
                assert (
                    head_dim, causal, wgs, launch.forward_persistent(head_dim, seqlen, causal),
                    wgs == 3 and head_dim in FWD_P_SMEM_HEADDIMS,
                    launch.forward_lpt_order(head_dim, seqlen, causal),
                ) in configs  # fmt: skip


def test_forward_masked_ptx_masks_the_generated_names() -> None:
    ptx = ptx_digest.forward_masked_ptx(ptx_digest.forward_configs()[0])
    assert "cutlass_" not in ptx and "wgmma" in ptx and ".entry kernel_K(" in ptx


def test_pre_post_configs_cover_the_shipped_tiles() -> None:
    """``--pre-post``: both preprocess builds per head dim, the three dQ casts per shipped Q
    tile (the full and causal tiles of each head dim), each once."""
    from dash_attn.backends.hopper import bwd_tiles

    configs = ptx_digest.pre_post_configs()
    assert len(set(configs)) == len(configs)
    for head_dim in BWD_HEADDIMS:
        assert {("pre", head_dim, 0), ("pre_pdl", head_dim, 0)} <= set(configs)
        for causal in (False, True):
            block_m = bwd_tiles(head_dim, causal).block_m
            for kind in ("cast", "cast_pdl", "cast_poll"):
                assert (kind, head_dim, block_m) in configs


def test_pre_post_masked_ptx_masks_the_generated_names() -> None:
    pre = ptx_digest.pre_post_masked_ptx("pre", 64, 0)
    polled = ptx_digest.pre_post_masked_ptx("cast_poll", 64, 128)
    assert "cutlass_" not in pre + polled
    assert "ld.global.v4" in pre and "griddepcontrol" not in pre
    assert "griddepcontrol" in polled and pre != polled
