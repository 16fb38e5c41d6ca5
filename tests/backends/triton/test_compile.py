"""The GPU kernels compiled for Hopper on the CPU (no GPU needed): ptxas accepts the inline PTX of
the wait/release protocol, every head dimension fits the SM, and the structure the speed depends
on (a software-pipelined step loop, no fence in the wait) stays in place."""

from __future__ import annotations

import os

import pytest

from dash_attn.backends.triton.tiles import SUPPORTED_HEADDIMS, BackwardTiles

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
    reason="compiles real kernels; the interpreter replaces them",
)

compile_report = pytest.importorskip("dash_attn.kernels.compile_report")

HOPPER_SHARED_BYTES = 227 * 1024  # the most dynamic shared memory one block can have on sm_90
REGISTER_LIMIT = 255


@pytest.fixture(scope="module")
def reports() -> dict:
    return {}


def _report(reports: dict, headdim: int, deterministic: bool, **kwargs):
    key = (headdim, deterministic, tuple(sorted(kwargs.items())))
    if key not in reports:
        reports[key] = compile_report.compile_backward(
            headdim, deterministic=deterministic, **kwargs
        )
    return reports[key]


@pytest.mark.parametrize("headdim", SUPPORTED_HEADDIMS)
def test_deterministic_kernel_compiles_and_fits(reports: dict, headdim: int) -> None:
    report = _report(reports, headdim, True)
    assert report.registers <= REGISTER_LIMIT
    assert 0 < report.shared_bytes <= HOPPER_SHARED_BYTES
    assert report.sass_counts["HGMMA"] > 0  # the matmuls run on wgmma, not mma.sync
    # The wait: acquire polls in a PTX loop bounded by %globaltimer, and no fence.acq_rel (a
    # full memory barrier per thread per step, ~10% at head dim 128).
    assert "ld.acquire.gpu.global.b32" in report.ptx
    assert "%globaltimer" in report.ptx
    assert "fence.acq_rel" not in report.ptx
    # The release: one release atomic per step, after a CTA barrier.
    assert "atom.global.gpu.release.add" in report.ptx or "red.release.gpu" in report.ptx


@pytest.mark.parametrize("headdim", SUPPORTED_HEADDIMS)
def test_nondeterministic_kernel_has_no_wait(reports: dict, headdim: int) -> None:
    report = _report(reports, headdim, False, dynamic=True, causal=False)
    assert report.registers <= REGISTER_LIMIT
    assert report.shared_bytes <= HOPPER_SHARED_BYTES
    assert "ld.acquire" not in report.ptx and "%globaltimer" not in report.ptx
    assert report.sass_counts["CCTL"] == 0
    # dQ partials are added with vector fp32 reductions (red.global.add.v4.f32 or wider).
    assert report.sass_counts["REDG"] > 0


def test_deterministic_step_loop_is_software_pipelined(reports: dict) -> None:
    # A tl.debug_barrier() or a Triton-level while loop inside the step loop makes the pipeliner
    # skip it: Q and dO are then loaded synchronously every step (no cp.async at all).
    report = _report(reports, 128, True)
    assert report.sass_counts["LDGSTS"] > 0


def test_one_stage_tiles_do_not_prefetch(reports: dict) -> None:
    report = _report(reports, 128, True, tiles=BackwardTiles(64, 128, 8, 1))
    assert report.sass_counts["LDGSTS"] == 0


@pytest.mark.parametrize("headdim", [96, 128])
@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "nondet"])
def test_tma_dq_reduction_compiles(reports: dict, headdim: int, deterministic: bool) -> None:
    # DASH_ATTN_DQ_REDUCE=tma: one bulk tensor reduction per step instead of per-thread atomics.
    report = _report(reports, headdim, deterministic, dq_tma=True)
    assert report.registers <= REGISTER_LIMIT
    assert report.shared_bytes <= HOPPER_SHARED_BYTES
    assert "cp.reduce.async.bulk.tensor" in report.ptx and ".add" in report.ptx
    # The adds are no longer per-thread vector atomics (REDG left: the releases, if any) ...
    assert report.sass_counts["REDG"] <= 2
    # ... and they are complete (not only read from shared memory) before the program releases a
    # turn or ends: a full wait on the bulk group, then a proxy fence.
    assert "cp.async.bulk.wait_group 0; fence.proxy.async.global;" in report.ptx
    if deterministic:
        # Without 8 vector atomics' 64-bit addresses, head dim 128 no longer spills much.
        atomic = _report(reports, headdim, deterministic)
        assert report.stack_bytes < atomic.stack_bytes


@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "nondet"])
def test_tma_loads_compile(reports: dict, headdim: int, deterministic: bool) -> None:
    # DASH_ATTN_QO_LOAD=tma: Q, dO, LSE and delta come in by TMA (mbarrier-completed bulk tensor
    # copies), so no cp.async is left in the step loop, and the loads are still prefetched by
    # the software pipeliner (more than one buffer of each in shared memory).
    report = _report(reports, headdim, deterministic, dq_tma=True, qo_tma=True)
    assert report.registers <= REGISTER_LIMIT
    assert report.shared_bytes <= HOPPER_SHARED_BYTES
    assert "cp.async.bulk.tensor.4d.shared::cluster.global" in report.ptx  # Q and dO
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in report.ptx  # LSE and delta
    assert report.sass_counts["LDGSTS"] == 0
    pointer = _report(reports, headdim, deterministic, dq_tma=True)
    assert report.shared_bytes >= pointer.shared_bytes  # same multi-buffering as cp.async


def test_outline_shows_where_the_step_loop_loads_and_waits(reports: dict) -> None:
    # The evidence of benchmarks/NOTES.md attempt 13, reproducible from the outline: the
    # shipped loop issues the next step's cp.async loads after its dQ reduction and waits for
    # all of them at the loop's top.
    outline = _report(reports, 128, True, dq_tma=True).outline()
    ops = [line.split(None, 1)[1] for line in outline]
    assert any(op.startswith("HGMMA") and " x" in op for op in ops)  # repeats are folded
    reduce_at = next(i for i, op in enumerate(ops) if "UTMAREDG" in op)
    loop_back = next(i for i in range(reduce_at, len(ops)) if "BRA" in ops[i])
    assert any("LDGSTS" in op for op in ops[reduce_at:loop_back])


def test_cli_prints_the_report(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    assert compile_report.main(["--headdim", "64", "--nondet", "--dump", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "registers" in out and "HGMMA" in out
    assert (tmp_path / "kernel.ptx").read_text().startswith("//")
    assert "HGMMA" in (tmp_path / "kernel.sass").read_text()
