"""The CuTe-DSL Hopper forward compiles for sm_90a on the CPU (no GPU needed), for every claimed
(head_dim, dtype, causal), and the PTX has the structure the speed depends on: WGMMA of the right
shapes, the setmaxnreg register split with .minnctapersm 1 (without it ptxas drops setmaxnreg),
TMA loads on mbarriers and a TMA store, no local-memory traffic. Bad arguments fail clearly."""

from __future__ import annotations

import concurrent.futures
import doctest
import multiprocessing
import os
import re
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("cutlass")
torch = pytest.importorskip("torch")

from dash_attn.backends.hopper import fwd  # noqa: E402
from dash_attn.backends.hopper import fwd_launch as hfwd  # noqa: E402
from dash_attn.backends.hopper._tensor_args import tma_view  # noqa: E402
from dash_attn.backends.hopper.launch import forward_lpt_order  # noqa: E402

# Every (head_dim, dtype, causal) the backend claims. On a small box (< 4 cores: ~4 s of CPU
# per compile) the head dims auto does not run on hopper (192/256) are compiled in one config
# each to stay near a minute; DASH_ATTN_FWD_COMPILE_ALL=1 forces the full matrix.
_SMALL_BOX = (os.cpu_count() or 1) < 4 and os.environ.get("DASH_ATTN_FWD_COMPILE_ALL") != "1"
# (hd, dtype, causal, consumer warpgroups, persistent); then the 3-warpgroup hd-64 kernels
# (192-row tiles, run from FWD_3WG_MIN_SEQLEN tokens on, per mask kind), then the persistent
# kernels: on full masks one per dtype, on causal ones (tile lists from the host, the TVM-FFI
# entry) one per warpgroup count, and both masks' at hd 96 (persistent there since session 37).
CONFIGS = (
    [
        (hd, dtype, causal, 2, False)
        for hd in hfwd.SUPPORTED_HEAD_DIMS
        for dtype in (torch.bfloat16, torch.float16)
        for causal in (False, True)
        if hd in (64, 96, 128) or not _SMALL_BOX or (dtype == torch.bfloat16 and causal)
    ]
    + [
        (64, dtype, causal, 3, False)
        for dtype in (torch.bfloat16, torch.float16)
        for causal in (False, True)
    ]
    + [(64, torch.bfloat16, False, 3, True), (128, torch.float16, False, 2, True)]
    + [(64, torch.bfloat16, True, 3, True), (128, torch.float16, True, 2, True)]
    + [(96, torch.bfloat16, False, 2, True), (96, torch.bfloat16, True, 2, True)]
)


@pytest.fixture(scope="module")
def ptx_of() -> Iterator[Callable[[int, torch.dtype, bool, int], str]]:
    """PTX of every config, compiled once per module. A compile is ~3-5 s of single-threaded
    CPU, so the configs compile in one spawned worker process per core (spawned, not forked:
    the parent already holds MLIR state); on a single core, in-process."""
    # (hd, dtype, causal, wgs, tvm_ffi, persistent, p_smem, tile_n, skip_unit_rescale,
    # lpt_order): lpt_order as the backend sets it for the per-tile causal kernels (at 192/256).
    jobs = [
        (hd, str(dt).removeprefix("torch."), c, wgs, pers and c, pers, False, None, True,
         forward_lpt_order(hd, 1024, c))
        for hd, dt, c, wgs, pers in CONFIGS
    ]  # fmt: skip
    workers = min(len(jobs), os.cpu_count() or 1)
    if workers > 1:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = list(pool.map(hfwd.compile_report, *zip(*jobs, strict=True)))
    else:
        results = [hfwd.compile_report(*job) for job in jobs]
    cache = {cfg: ptx for cfg, (ptx, _) in zip(CONFIGS, results, strict=True)}
    # Shown with `pytest -s`: the compile cost per config (wall time inside its worker).
    for (hd, dt, causal, wgs, pers), (_, sec) in zip(CONFIGS, results, strict=True):
        print(
            f"compile hd={hd} {dt} causal={causal} consumer_wgs={wgs} persistent={pers}: {sec:.2f}s"
        )
    yield lambda hd, dtype, causal, wgs, pers=False: cache[(hd, dtype, causal, wgs, pers)]


@pytest.mark.parametrize(("hd", "dtype", "causal", "wgs", "persistent"), CONFIGS)
def test_compiles_with_expected_ptx(
    ptx_of, hd: int, dtype: torch.dtype, causal: bool, wgs: int, persistent: bool
) -> None:
    ptx = ptx_of(hd, dtype, causal, wgs, persistent)
    _check_ptx(ptx, hd, dtype, wgs)
    # The persistent kernel walks tiles: a loop around the whole per-tile body, so its PTX has
    # the per-tile kernel's instructions and more; the O store no longer waits for its read
    # inside the loop (one wait per tile before sO is rewritten, one at the end).
    reads = len(re.findall(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx))
    assert reads == (2 if persistent else 1)
    if persistent:
        per_tile = ptx_of(hd, dtype, causal, wgs, False)
        assert len(ptx) > len(per_tile)


def test_persistent_only_where_it_is_implemented() -> None:
    for hd, causal in ((192, False), (256, False), (192, True)):
        with pytest.raises(NotImplementedError, match="persistent"):
            hfwd.compile_fwd(hd, torch.bfloat16, causal, persistent=True)
    # The causal kernel's tile lists have no plain-number entry.
    with pytest.raises(NotImplementedError, match="TVM-FFI"):
        hfwd.compile_fwd(64, torch.bfloat16, True, persistent=True, tvm_ffi=False)


def test_forward_persistent_by_mask_and_length() -> None:
    """Persistent up to FWD_PERSISTENT_MAX_SEQLEN_K key tokens per mask kind and head dim;
    never at head dims without a bound."""
    from dash_attn.backends.hopper import FWD_PERSISTENT_MAX_SEQLEN_K
    from dash_attn.backends.hopper.launch import forward_persistent

    for causal, kind in ((False, "full"), (True, "causal")):
        limit = FWD_PERSISTENT_MAX_SEQLEN_K[kind][128]
        assert forward_persistent(128, limit, causal)
        assert not forward_persistent(128, limit + 1, causal)
        assert forward_persistent(64, 1 << 20, causal) and forward_persistent(96, 1 << 20, causal)
        assert not any(forward_persistent(hd, 512, causal) for hd in (192, 256))
    # Every bound is a head dim whose persistent kernel exists (<= 128).
    assert all(hd <= 128 for limits in FWD_PERSISTENT_MAX_SEQLEN_K.values() for hd in limits)


# The TVM-FFI launch (hfwd.TVM_FFI_LAUNCH): both main head dims, both dtypes, causal and full.
FFI_CONFIGS = [(128, torch.bfloat16, True), (64, torch.float16, False)]


def _kernel_text(ptx: str) -> str:
    """The PTX without the mangled kernel names (they spell the host entry's argument types)."""
    return re.sub(r"kernel_cutlass\S*", "kernel", ptx)


def test_forward_lpt_order_by_head_dim_and_length() -> None:
    """The grouped launch order only where it was measured faster: the per-tile causal
    kernel at hd 192/256 up to FWD_LPT_ORDER_MAX_SEQLEN_K keys; never on full masks, the
    persistent kernels or hd 128's per-tile causal kernel (0.9945x at 16k)."""
    from dash_attn.backends.hopper import FWD_LPT_ORDER_MAX_SEQLEN_K
    from dash_attn.backends.hopper.launch import forward_persistent

    for hd, limit in FWD_LPT_ORDER_MAX_SEQLEN_K.items():
        assert not forward_persistent(hd, limit, True)  # a CTA per tile, where the order acts
        assert forward_lpt_order(hd, limit, True)
        assert not forward_lpt_order(hd, limit + 1, True)
        assert not forward_lpt_order(hd, 1024, False)
    assert set(FWD_LPT_ORDER_MAX_SEQLEN_K) == {192, 256}
    assert not any(forward_lpt_order(128, s, True) for s in (512, 8192, 16384))
    assert not forward_lpt_order(64, 1024, True)


@pytest.mark.slow
@pytest.mark.parametrize(("hd", "dtype", "causal"), FFI_CONFIGS)
def test_tvm_ffi_launch_compiles_the_same_kernel(
    ptx_of, hd: int, dtype: torch.dtype, causal: bool
) -> None:
    """Compiled from symbolic fake tensors with --enable-tvm-ffi, the forward has the expected
    PTX, and it is the plain-number launch's PTX: only the host side differs."""
    ptx, _ = hfwd.compile_report(hd, str(dtype).removeprefix("torch."), causal, tvm_ffi=True)
    _check_ptx(ptx, hd, dtype, 2)
    assert _kernel_text(ptx) == _kernel_text(ptx_of(hd, dtype, causal, 2, False))


def _check_ptx(ptx: str, hd: int, dtype: torch.dtype, wgs: int, votes: int = 2) -> None:
    ab = "bf16" if dtype == torch.bfloat16 else "f16"
    # QK^T: 64 x tile_n per warpgroup, k = head_dim; PV: 64 x head_dim, k = tile_n.
    qk = f"wgmma.mma_async.sync.aligned.m64n{hfwd.TILE_N[hd]}k16.f32.{ab}.{ab}"
    pv = f"wgmma.mma_async.sync.aligned.m64n{hd}k16.f32.{ab}.{ab}"
    assert qk in ptx
    assert pv in ptx
    # PV reads P from registers (RS): its A operand is a register list, not a descriptor.
    assert re.search(re.escape(pv) + r"\s*\{[^}]*\},\s*\{", ptx), "PV is not RS"
    # Warp specialisation: producer gives registers away, consumers take them.
    consumer_regs, producer_regs = hfwd.CONSUMER_REGS[wgs]
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{producer_regs};", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{consumer_regs};", ptx)
    assert re.search(r"\.minnctapersm\s+1\b", ptx)
    assert re.search(rf"\.reqntid\s+{128 * (wgs + 1)}, 1, 1\b", ptx)
    # TMA loads of Q/K/V completing on mbarriers, and the TMA store of O.
    assert "cp.async.bulk.tensor.4d.shared::cta.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "cp.async.bulk.tensor.4d.global.shared::cta" in ptx
    assert "mbarrier.try_wait" in ptx
    # Named barriers between the consumer warpgroups (GEMM hand-off) and O staged by stmatrix.
    assert re.search(r"bar\.arrive\s+%r\d+, 256;", ptx)
    assert "stmatrix.sync.aligned" in ptx
    # P and O are converted with the paired cvt (one instruction per two values).
    assert f"cvt.rn.{ab}x2.f32" in ptx
    # exp2-based softmax; no local memory (a stack array or spill in PTX would show up here).
    assert "ex2.approx" in ptx
    assert not re.search(r"\b(ld|st)\.local", ptx)
    # skip_unit_rescale: one warp vote per step loop (masked and unmasked blocks) decides
    # whether O is rescaled.
    assert ptx.count("vote.sync.any.pred") == votes


def test_rescale_skip_can_be_turned_off() -> None:
    """skip_unit_rescale=False (the A/B baseline: the same bits) compiles the rescale of every
    step without a vote, as its own cache entry."""
    ptx, _ = hfwd.compile_report(128, "bfloat16", True, skip_unit_rescale=False)
    _check_ptx(ptx, 128, torch.bfloat16, 2, votes=0)
    assert hfwd.compile_fwd(128, torch.bfloat16, True, keep_ptx=True) is not hfwd.compile_fwd(
        128, torch.bfloat16, True, keep_ptx=True, skip_unit_rescale=False
    )


def test_compile_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """One compile per (head_dim, dtype, causal); the real compile is stubbed (the PTX tests
    above compile for real) so only the cache logic is under test here."""
    calls: list[object] = []

    def fake_compile(kernel: object, *args: object, **kwargs: object) -> object:
        calls.append(kernel)
        return object()

    monkeypatch.setattr(hfwd, "_CACHE", {})
    monkeypatch.setattr(hfwd.cute, "compile", fake_compile)
    # In memory only: the stand-in kernels cannot be exported to a disk cache.
    monkeypatch.setenv("DASH_ATTN_KERNEL_CACHE", "0")
    # The plain-number launch first (the shipped default is the TVM-FFI one).
    monkeypatch.setattr(hfwd, "TVM_FFI_LAUNCH", False)
    first = hfwd.compile_fwd(64, torch.bfloat16, False)
    assert hfwd.compile_fwd(64, torch.bfloat16, False) is first
    assert len(calls) == 1
    assert hfwd.compile_fwd(64, torch.bfloat16, True) is not first
    assert hfwd.compile_fwd(128, torch.bfloat16, False) is not first
    assert hfwd.compile_fwd(64, torch.float16, False) is not first
    assert len(calls) == 4
    # The TVM-FFI launch is another kernel object (another entry, another signature), and the
    # module switch selects it when tvm_ffi is not given.
    ffi = hfwd.compile_fwd(64, torch.bfloat16, False, tvm_ffi=True)
    assert ffi is not first and len(calls) == 5
    monkeypatch.setattr(hfwd, "TVM_FFI_LAUNCH", True)
    assert hfwd.compile_fwd(64, torch.bfloat16, False) is ffi
    assert hfwd.compile_fwd(64, torch.bfloat16, False, tvm_ffi=False) is first
    assert len(calls) == 5
    # The persistent causal kernel has the TVM-FFI entry only: not given, tvm_ffi is True for
    # it whatever the module switch says.
    monkeypatch.setattr(hfwd, "TVM_FFI_LAUNCH", False)
    tiled = hfwd.compile_fwd(64, torch.bfloat16, True, persistent=True)
    assert hfwd.compile_fwd(64, torch.bfloat16, True, persistent=True, tvm_ffi=True) is tiled
    assert len(calls) == 6


def test_tma_view_fixes_only_odd_strides_of_size_one_dims() -> None:
    q = torch.empty(1, 8, 4, 64, dtype=torch.bfloat16)
    assert tma_view(q) is q  # batch 1, contiguous: its batch stride is a 16-B multiple
    odd = torch.empty(2, 8, 1, 64, dtype=torch.bfloat16).as_strided((2, 8, 1, 64), (512, 64, 3, 1))
    fixed = tma_view(odd)
    assert fixed.stride() == (512, 64, 8, 1) and fixed.data_ptr() == odd.data_ptr()
    expanded = odd.as_strided((2, 8, 1, 64), (512, 64, 0, 1))
    assert tma_view(expanded).stride() == (512, 64, 8, 1)


@pytest.mark.parametrize("hd", [32, 48, 80, 160, 512])
def test_unsupported_head_dim_raises(hd: int) -> None:
    with pytest.raises(NotImplementedError, match="head_dim"):
        hfwd.compile_fwd(hd, torch.bfloat16, False)
    q = torch.empty(1, 8, 2, hd, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="head_dim"):
        hfwd.hopper_fwd(q, q, q, causal=False, softmax_scale=1.0)


def test_three_warpgroups_only_for_hd64() -> None:
    with pytest.raises(NotImplementedError, match="consumer_wgs=3"):
        hfwd.compile_fwd(128, torch.bfloat16, False, consumer_wgs=3)
    with pytest.raises(ValueError, match="consumer_wgs"):
        hfwd.compile_fwd(64, torch.bfloat16, False, consumer_wgs=4)


def test_forward_warpgroups_by_mask_and_length() -> None:
    """hd 64 runs 192-row tiles on full masks at every length and on causal ones from
    FWD_3WG_MIN_SEQLEN query tokens, hd 96 from its own lengths (with P through shared memory,
    the only way three warpgroups fit there); hd 128 and up run 128-row tiles."""
    from dash_attn.backends.hopper import FWD_3WG_MIN_SEQLEN, FWD_P_SMEM_HEADDIMS
    from dash_attn.backends.hopper.launch import forward_consumer_wgs

    assert [forward_consumer_wgs(64, s, False) for s in (1, 512, 1 << 20)] == [3, 3, 3]
    for causal in (False, True):
        for headdim, threshold in FWD_3WG_MIN_SEQLEN["causal" if causal else "full"].items():
            assert forward_consumer_wgs(headdim, threshold, causal) == 3
            if threshold > 1:
                assert forward_consumer_wgs(headdim, threshold - 1, causal) == 2
        assert {forward_consumer_wgs(hd, 1 << 20, causal) for hd in (128, 192, 256)} == {2}
    assert forward_consumer_wgs(96, 512, False) == 2
    assert sorted(FWD_P_SMEM_HEADDIMS) == [96]


def test_unsupported_dtype_raises() -> None:
    with pytest.raises(ValueError, match="dtype"):
        hfwd.compile_fwd(64, torch.float32, False)


def _t(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype)


@pytest.mark.parametrize(
    ("q", "k", "v", "match"),
    [
        (_t(2, 8, 4), _t(2, 8, 4, 64), _t(2, 8, 4, 64), "q must be 4-D"),
        (_t(2, 8, 4, 64), _t(2, 8, 3, 64), _t(2, 8, 3, 64), "multiple of kv_heads"),
        (_t(2, 8, 4, 64), _t(2, 8, 4, 64), _t(2, 9, 4, 64), "k and v shapes differ"),
        (_t(2, 8, 4, 64), _t(1, 8, 4, 64), _t(1, 8, 4, 64), "incompatible"),
        (_t(2, 8, 4, 64), _t(2, 8, 4, 128), _t(2, 8, 4, 128), "incompatible"),
        (_t(2, 8, 4, 64), _t(2, 8, 4, 64, dtype=torch.float16), _t(2, 8, 4, 64), "k.dtype"),
        (_t(2, 8, 4, 128)[..., ::2], _t(2, 8, 4, 64), _t(2, 8, 4, 64), "unit-stride"),
        # Misaligned for TMA: 2-byte offset base and a 130-byte head stride.
        (_t(2, 8, 4, 65)[..., 1:], _t(2, 8, 4, 64), _t(2, 8, 4, 64), "16-byte aligned"),
        # Valid shapes but CPU tensors: refused before any compile or launch.
        (_t(2, 8, 4, 64), _t(2, 8, 2, 64), _t(2, 8, 2, 64), "CUDA device"),
    ],
)
@pytest.mark.parametrize("tvm_ffi", [False, True], ids=["ints", "tvm_ffi"])
def test_bad_arguments_raise(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    match: str,
    tvm_ffi: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused before any compile or launch, on either launch path."""
    monkeypatch.setattr(hfwd, "TVM_FFI_LAUNCH", tvm_ffi)
    with pytest.raises(ValueError, match=match):
        hfwd.hopper_fwd(q, k, v, causal=False, softmax_scale=1.0)


@pytest.mark.parametrize(
    ("dtype", "causal"), [("bfloat16", True), ("float16", False)], ids=["bf16-causal", "fp16-full"]
)
def test_p_smem_kernel_compiles_at_hd96_with_three_warpgroups(dtype: str, causal: bool) -> None:
    """``p_smem`` (P through shared memory, PV as an SS WGMMA; the backend's hd-96 kernel from
    FWD_3WG_MIN_SEQLEN tokens on, persistent) lets the 192-row tile compile at hd 96: PV reads
    its A operand from a descriptor, each warpgroup waits for its own P slab (a 128-thread
    barrier), no local memory. Without it hd 96 keeps the 2-warpgroup limit."""
    ptx, _ = hfwd.compile_report(96, dtype, causal, 3, True, True, True)
    ab = "bf16" if dtype == "bfloat16" else "f16"
    pv = f"wgmma.mma_async.sync.aligned.m64n96k16.f32.{ab}.{ab}"
    assert pv in ptx
    assert not re.search(re.escape(pv) + r"\s*\{[^}]*\},\s*\{", ptx), "PV is still RS"
    assert re.search(r"bar\.sync\s+%r\d+, 128;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+160;", ptx)
    assert not re.search(r"\b(ld|st)\.local", ptx)
    with pytest.raises(NotImplementedError, match="96 with p_smem"):
        hfwd.compile_fwd(96, torch.bfloat16, True, consumer_wgs=3)


def test_tile_n_option_compiles_and_checks_shared_memory() -> None:
    """``tile_n`` (keys per block; the backend keeps ``TILE_N``): FA4's 144-key block at hd 96
    with 192-row tiles and P through shared memory compiles for sm_90a per tile (QK^T an N=144
    WGMMA, no local memory); the persistent kernel's own O tile would take it past 227 KiB, and
    that, like a width that is no multiple of 16, raises before any compile."""
    ptx, _ = hfwd.compile_report(96, "bfloat16", False, 3, False, False, True, 144)
    assert "wgmma.mma_async.sync.aligned.m64n144k16.f32.bf16.bf16" in ptx
    assert not re.search(r"\b(ld|st)\.local", ptx)
    assert hfwd.fwd_smem_bytes(96, 3, 144, persistent=True, p_smem=True) > hfwd.SMEM_LIMIT
    examples = doctest.testmod(fwd)  # fwd_smem_bytes' examples
    assert examples.attempted >= 2 and examples.failed == 0
    with pytest.raises(ValueError, match="shared memory"):
        hfwd.compile_fwd(96, torch.bfloat16, False, consumer_wgs=3, persistent=True, p_smem=True,
                         tile_n=144)  # fmt: skip
    with pytest.raises(ValueError, match="multiple of 16"):
        hfwd.compile_fwd(96, torch.bfloat16, False, tile_n=100)
    # Every configuration the backend runs fits (persistent at hd <= 128 on some lengths).
    from dash_attn.backends.hopper import FWD_3WG_MIN_SEQLEN, FWD_P_SMEM_HEADDIMS

    three = set(FWD_3WG_MIN_SEQLEN["full"]) | set(FWD_3WG_MIN_SEQLEN["causal"])
    for hd, n in hfwd.TILE_N.items():
        for wgs in (2, 3) if hd in three else (2,):
            p_smem = wgs == 3 and hd in FWD_P_SMEM_HEADDIMS
            assert hfwd.fwd_smem_bytes(hd, wgs, n, hd <= 128, p_smem) <= hfwd.SMEM_LIMIT


def test_lpt_order_compiles_only_into_the_per_tile_causal_kernel(ptx_of) -> None:
    """lpt_order (the per-tile causal kernel's CTAs take their tiles in L2 groups, longest
    first; ``fwd_tiles.grouped_tile``; the backend's at hd 192/256 up to 8k keys) adds the
    remap's divisions there (the L2 group's in 64 bits) and leaves the full-mask kernel as it
    is."""
    ptx = ptx_of(256, torch.bfloat16, True, 2)  # the shipped kernel: with it
    without, _ = hfwd.compile_report(256, "bfloat16", True, lpt_order=False)
    _check_ptx(without, 256, torch.bfloat16, 2)
    assert len(re.findall(r"\bdiv\.[su](32|64)\b", ptx)) > len(
        re.findall(r"\bdiv\.[su](32|64)\b", without)
    )
    assert "div.u64" in ptx and "div.u64" not in without
    full, _ = hfwd.compile_report(128, "bfloat16", False, lpt_order=True)
    assert _kernel_text(full) == _kernel_text(ptx_of(128, torch.bfloat16, False, 2))
