"""Compile-only checks of the Hopper CuTe-DSL backward (no GPU needed).

Every claimed configuration is compiled for sm_90a from CPU tensors, then the PTX and the SASS
of the cubin are checked for the properties the design relies on: WGMMA, register
reallocation that ptxas actually kept, TMA bulk reduce-add of dQ, the acquire spin / release
protocol only in deterministic mode, and no local-memory spills in the MMA warpgroups.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from pathlib import Path

import pytest

cutlass = pytest.importorskip("cutlass")
torch = pytest.importorskip("torch")

from dash_attn.backends import hopper  # noqa: E402
from dash_attn.backends.hopper import (  # noqa: E402
    BWD_HEADDIMS,
    BWD_VARIANT_LONG,
    bwd_launch,
    bwd_variant,
)
from dash_attn.backends.hopper._tensor_args import tma_view  # noqa: E402
from dash_attn.backends.hopper.bwd import SWAPPED_TILES, HopperAttnBwd  # noqa: E402
from dash_attn.backends.hopper.bwd_step_swapped import fragment_rows  # noqa: E402
from dash_attn.schedule import TABLE_FIELDS  # noqa: E402
from tools.hopper.sass import disassemble  # noqa: E402

CONFIGS = list(
    itertools.product(BWD_HEADDIMS, (torch.bfloat16, torch.float16), (True, False), (True, False))
)
COMPILE_TIMES: dict[tuple, float] = {}


def _fake_inputs(
    head_dim: int, dtype: torch.dtype, batch: int = 2, seqlen: int = 100, heads: int = 4,
    kv_heads: int = 2,
) -> tuple:  # fmt: skip
    """CPU tensors that only carry types and ranks (shapes are compiled as runtime values);
    by default not tile multiples and with GQA."""
    q = torch.zeros(batch, seqlen, heads, head_dim, dtype=dtype)
    k = torch.zeros(batch, seqlen, kv_heads, head_dim, dtype=dtype)
    lse2 = torch.zeros(batch * heads, 128)
    dq_acc = torch.zeros(batch, seqlen, heads, head_dim)
    flags = torch.zeros(2 + batch * heads * 2, dtype=torch.int32)
    tables = {name: torch.zeros(4, dtype=torch.int32) for name in TABLE_FIELDS}
    return (
        q,
        k,
        k.clone(),
        q.clone(),
        lse2,
        lse2.clone(),
        dq_acc,
        k.clone(),
        k.clone(),
        flags,
        tables,
    )


def _compile(
    config: tuple,
    dump_dir: Path,
    variant: str | None = None,
    dkv_sum: bool = False,
    cast_trigger: bool = False,
):
    head_dim, dtype, causal, det = config
    variant = variant or bwd_variant(head_dim, causal, deterministic=det)
    dump_dir.mkdir(parents=True, exist_ok=True)
    block_m, block_n = bwd_launch.variant_tiles(variant, head_dim)
    start = time.perf_counter()
    compiled = bwd_launch.compile_bwd(
        dtype,
        head_dim,
        causal=causal,
        deterministic=det,
        block_m=block_m,
        block_n=block_n,
        extra_options=f"--keep-ptx --keep-cubin --dump-dir {dump_dir}",
        variant=variant,
        dkv_sum=dkv_sum,
        cast_trigger=cast_trigger,
    )
    COMPILE_TIMES[config] = time.perf_counter() - start
    return compiled


def _config_id(config: tuple) -> str:
    head_dim, dtype, causal, det = config
    mask, mode = "causal" if causal else "full", "det" if det else "nondet"
    return f"hd{head_dim}-{str(dtype)[6:]}-{mask}-{mode}"


@pytest.mark.parametrize("config", CONFIGS, ids=[_config_id(c) for c in CONFIGS])
def test_compiles_for_sm90a(config: tuple, tmp_path: Path) -> None:
    """The kernel the backend ships for this head dim, mask and mode (``hopper.BWD_VARIANT``,
    deterministic runs its ``BWD_DET_TWIN``), every config."""
    variant = bwd_variant(config[0], config[2], deterministic=config[3])
    if config[0] in SWAPPED_TILES:
        _check_swapped_kernel_code(config, variant, tmp_path)
    else:
        _check_kernel_code(config, variant, tmp_path)


LONG_CONFIGS = [c for c in CONFIGS if (c[0], "causal" if c[2] else "full") in BWD_VARIANT_LONG]


@pytest.mark.parametrize("config", LONG_CONFIGS, ids=[_config_id(c) for c in LONG_CONFIGS])
def test_long_sequence_variant_compiles_for_sm90a(config: tuple, tmp_path: Path) -> None:
    """The kernel the backend ships for long key sequences (``hopper.BWD_VARIANT_LONG``)."""
    variant = bwd_variant(config[0], config[2], seqlen_k=1 << 30, deterministic=config[3])
    _check_kernel_code(config, variant, tmp_path)


# The GQA split's in-kernel dK/dV sums (``dkv_sum``, deterministic plans) on every shipped
# variant: every head dim and mask, the long-sequence one, both dtypes.
DKV_SUM_CONFIGS = [
    (bwd_variant(96, True, deterministic=True), (96, torch.bfloat16, True, True)),
    (bwd_variant(64, True, deterministic=True), (64, torch.bfloat16, True, True)),
    (bwd_variant(64, False, deterministic=True), (64, torch.float16, False, True)),
    (bwd_variant(128, True, deterministic=True), (128, torch.bfloat16, True, True)),
    (bwd_variant(128, False, deterministic=True), (128, torch.float16, False, True)),
    (bwd_variant(128, False, 1 << 30, deterministic=True), (128, torch.bfloat16, False, True)),
]


@pytest.mark.parametrize(
    "variant,config", DKV_SUM_CONFIGS, ids=[f"{v}-{_config_id(c)}" for v, c in DKV_SUM_CONFIGS]
)
def test_dkv_sum_compiles_for_sm90a(variant: str, config: tuple, tmp_path: Path) -> None:
    """The chain epilogue of ``dkv_sum``: a bounded turn wait per warpgroup, rank 0's fp32
    stores, the middle ranks' L2 reductions, the last rank's L2 reads and 16-bit pairs, and
    the release after a GPU-scope fence; still no spills (``_check_kernel_code``)."""
    head_dim = config[0]
    ptx = _compile(config, tmp_path, variant, dkv_sum=True).__ptx__
    pairs = 64 * head_dim // 128 // 2  # per thread and tensor: its 64-row slab's column pairs
    assert ptx.count("st.global.v2.f32") == 2 * pairs
    assert ptx.count("red.relaxed.gpu.global.add.v2.f32") == 2 * pairs
    assert ptx.count("ld.global.cg.f32") == 4 * pairs
    # The last rank's dK add, one explicit FMA per element (dV's a plain add): whether the
    # compiler fuses the scale's product into it must not differ between variants (item 314).
    assert len(re.findall(r"\bfma\.rn\.f32\b", ptx)) == 2 * pairs
    assert "fence.acq_rel.gpu" in ptx
    # Release sites: each dQ writer's and the chain epilogue's.
    writers = bwd_launch._variant_options(variant).get("dq_writers", 1)
    assert ptx.count("red.release.gpu") == writers + 1
    _, sass = _check_kernel_code(config, variant, tmp_path, dkv_sum=True)
    mma_code = sass[sass.find("USETMAXREG.TRY_ALLOC.CTAPOOL") :]
    assert re.search(r"\bREDG\.E\.ADD\.F32x2\b|\bREDG\.E\.ADD\.64\b|REDG\.E\.ADD\.F32", mma_code)


SWAPPED_SUM_CONFIGS = [(192, torch.bfloat16, True, True), (256, torch.float16, False, True)]


@pytest.mark.parametrize("config", SWAPPED_SUM_CONFIGS, ids=_config_id)
def test_dkv_sum_compiles_for_sm90a_swapped(config: tuple, tmp_path: Path) -> None:
    """``dkv_sum`` with the transposed dK/dV accumulators of head dims 192 and 256: the same
    turns, element by element (a register's neighbour is the next KV row, not the next
    address); no spills."""
    head_dim = config[0]
    variant = bwd_variant(head_dim, config[2], deterministic=True)
    ptx, _ = _check_swapped_kernel_code(config, variant, tmp_path, dkv_sum=True)
    elements = head_dim * SWAPPED_TILES[head_dim][1] // 256  # per thread and tensor
    # Rank 0's fp32 stores: 32-bit stores of a register (the error flag's stores are of the
    # immediate 1).
    assert len(re.findall(r"st\.global\.b32\s+\[[^\]]+\], %", ptx)) == 2 * elements
    assert ptx.count("red.relaxed.gpu.global.add.f32") == 2 * elements
    assert ptx.count("ld.global.cg.f32") == 2 * elements
    # The last rank's dK add, one explicit FMA per element (as test_dkv_sum_compiles_for_sm90a).
    assert len(re.findall(r"\bfma\.rn\.f32\b", ptx)) == elements
    assert "fence.acq_rel.gpu" in ptx


def test_shared_dq_writers_compile_for_sm90a(tmp_path: Path) -> None:
    """Two dQ warps sharing one staging buffer (``sw_w2_fs``) in a non-deterministic kernel,
    which is not shipped (deterministic runs take it: test_compiles_for_sm90a); its hand-over
    barriers are checked by ``_check_swapped_kernel_code``."""
    _check_swapped_kernel_code((192, torch.float16, False, False), "sw_w2_fs", tmp_path)


def test_fragment_rows_reads_each_row_once() -> None:
    """Thread 0's rows of an m64nN accumulator fragment: rows 0 and 8, alternating in pairs."""
    coords0 = [(8 * ((i // 2) % 2), 8 * (i // 4) + i % 2) for i in range(12)]
    rows, slot = fragment_rows(coords0, 12)
    assert rows == [0, 8]
    assert slot == [0, 0, 1, 1] * 3


# The variants that are not shipped (hopper.BWD_VARIANT), at the configs where they differ most
# (hd 64: tiles; causal and det: the most code); the shipped ones are compiled for every config
# by test_compiles_for_sm90a.
VARIANT_CONFIGS = [
    # dQ in fragment order: one buffer at hd 128, two at hd 64 (the other head dim's choice).
    ("t128_fq", (128, torch.bfloat16, True, True)),
    ("t128_fq", (128, torch.float16, False, False)),
    ("t128_fq2", (64, torch.float16, False, False)),
    ("t128_fq2", (64, torch.bfloat16, True, True)),
    # The 64 x 128 kernel at hd 128 with a full mask (shipped, as t128_wg2, for causal only),
    # and the 80 x 128 one (dQ transposed, 32-byte swizzled dS) with a causal mask (shipped, as
    # t80_wg, for full only).
    ("t128_fq2", (128, torch.bfloat16, False, True)),
    ("t80_fq", (128, torch.bfloat16, True, True)),
    ("t80_fq", (128, torch.float16, True, False)),
    # Session 10's shipped kernels (one 288-thread dQ hand-off per step, not per warpgroup).
    ("t128_fq", (64, torch.bfloat16, True, True)),
    ("t80_fq", (128, torch.bfloat16, False, True)),
    # Session 14's kernel at hd 64 (the dQ turn taken after the partial is written), and the
    # early turn with two dQ buffers (slower at hd 128 causal, session 15).
    ("t128_wg", (64, torch.bfloat16, True, True)),
    ("t128_et2", (128, torch.bfloat16, True, True)),
    # Session 15's kernel at hd 64 (shipped before exp_tail and early_meta); the exponential
    # tail alone, and each on the hd-128 kernels (no faster there, session 16).
    ("t128_et", (64, torch.bfloat16, True, True)),
    ("t128_xt24", (64, torch.float16, False, False)),
    ("t80_xt16", (128, torch.bfloat16, False, True)),
    ("t128_em2", (128, torch.bfloat16, True, True)),
    # The hd-128 causal kernel before the dS guard (session 19's), and dO single-buffered
    # without the second dQ buffer at 80-row tiles (session 20).
    ("t128_wg2", (128, torch.bfloat16, True, True)),
    ("t80_do1", (128, torch.float16, False, True)),
    # Session 20's shipped kernels at hd 128 (dK/dV addressed per pair), and the hd-64 kernel
    # with dK/dV addressed per row (slower in det mode at 16k, session 21).
    ("t80_wg", (128, torch.bfloat16, False, True)),
    ("t80_wg2", (128, torch.float16, False, False)),
    ("t128_wg2g", (128, torch.bfloat16, True, True)),
    ("t128_xm24r", (64, torch.bfloat16, True, True)),
    # Session 21's shipped hd-128 full kernels (every exponential on the MUFU unit).
    ("t80_wgr", (128, torch.bfloat16, False, True)),
    ("t80_wg2r", (128, torch.float16, False, False)),
    # Session 22: a share of the exponentials by a polynomial (exp_poly; slower at hd 64).
    ("t128_xm24_p25", (64, torch.bfloat16, True, True)),
    ("t80_wgr_p14d3", (128, torch.float16, False, False)),
    # Session 22's shipped kernels (dK/dV stored from registers as 32-bit pairs); session 25's
    # dkv_smem without the read-back unroll, and on the hd-128 full kernel for long keys (0.94x).
    ("t128_xm24", (64, torch.bfloat16, True, True)),
    ("t128_xm24", (64, torch.float16, False, False)),
    ("t80_wgr_p14", (128, torch.bfloat16, False, True)),
    ("t128_wg2gr", (128, torch.bfloat16, True, True)),
    ("t80_wgr_p14_sm", (128, torch.bfloat16, False, False)),
    ("t80_wg2r_p14_sm2", (128, torch.bfloat16, False, True)),
    # Session 26: the main kernel as a programmatic dependent launch (not timed yet).
    ("t128_wg2gr_sm2_fs_pdl", (128, torch.bfloat16, True, True)),
    ("t128_xm24r_sm2_fs_pdl", (64, torch.float16, False, False)),
    # Session 28: the next dynamic ticket after the chain's last dQ turn (drain_ticket, shipped
    # on causal masks in session 29): the full-mask twins, and the hd-128 causal kernel without.
    ("t128_xm24r_sm2_fs_dr", (64, torch.float16, False, True)),
    ("t80_wgr_p14_sm2_fs_dr", (128, torch.float16, False, True)),
    ("t128_wg2gr_sm2_fs", (128, torch.bfloat16, True, True)),
    # Session 29: slack for the dQ turns at hd 64 (two staging buffers, the late turn, both).
    ("t128_xm24r_sm2_fs", (64, torch.bfloat16, True, True)),
    ("t128_xm24r_sm2_fs_nt", (64, torch.bfloat16, False, True)),
    ("t128_xm24r_sm2_fs_nt2", (64, torch.float16, True, True)),
    # Session 29: the drain's arrival at the last turn (drain_at_turn), both head dims.
    ("t128_xm24r_sm2_fs_dq2_dt", (64, torch.bfloat16, True, True)),
    ("t128_wg2gr_sm2_fs_dt", (128, torch.float16, True, True)),
    # Session 47: the K/V prefetch alone (shipped at hd 64 before dkv_stage joined it), and
    # the shipped causal det twin in non-det mode, which no run takes.
    ("t128_xm24r_sm2_fs_dq2_kp_w2", (64, torch.bfloat16, False, True)),
    ("t128_xm24r_sm2_fs_dq2_dt_kp_w2_st", (64, torch.float16, True, False)),
    # Session 48: the dK/dV staging at hd 96, on its kernel and det twin.
    ("t128_wg2gr_sm2_fs_dt_w2_st", (96, torch.bfloat16, True, True)),
    ("t128_wg2gr_sm2_fs_dt_st", (96, torch.float16, False, False)),
    ("t128_wg2gr_sm2_fs_dt_w2_st_kp", (96, torch.bfloat16, False, True)),
    # Session 31: two dQ warps, one per staging buffer (deterministic runs ship them; here
    # non-det, which does not).
    ("t128_xm24r_sm2_fs_dq2_dt_w2", (64, torch.float16, True, False)),
    ("t80_wg2r_p14_fs_w2", (128, torch.bfloat16, False, False)),
    # Session 58: the step's tile indices read before the S^T wait (early_meta), hd 128 full.
    ("t80_wgr_p14_sm2_fs_kf_em", (128, torch.bfloat16, False, False)),
    # Session 63: the kernels the twins shipped then replaced, kept for A/Bs: the counted
    # kernel of the hd-128 full kernel below 8k keys (one dQ warp), and the long kernel's
    # without the early turn.
    ("t80_wgr_p14_sm2_fs_kf_nc", (128, torch.float16, False, False)),
    ("t80_wg2r_p14_fs_w2_kf_nc", (128, torch.bfloat16, False, False)),
    # Session 63: exp_poly on the hd-64 full det twin (a probe, slower).
    ("t128_xm24r_sm2_fs_dq2_kp_w2_st_kf_p18", (64, torch.bfloat16, False, True)),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant,config",
    VARIANT_CONFIGS,
    ids=[f"{v}-hd{c[0]}-{'causal' if c[2] else 'full'}-{'det' if c[3] else 'nondet'}"
         for v, c in VARIANT_CONFIGS],
)  # fmt: skip
def test_variant_compiles_for_sm90a(variant: str, config: tuple, tmp_path: Path) -> None:
    _check_kernel_code(config, variant, tmp_path)


# Session 50: kernels that let the polled dQ cast start (cast_trigger): the hd-64 full det
# twin, the hd-128 full kernel, and a non-det one (no trigger there: no turns to count); the
# det kernels of head dims 96 (causal) and 256 (192 runs the same variant).
CAST_TRIGGER_CONFIGS = [
    ("t128_xm24r_sm2_fs_dq2_kp_w2_st_kf", (64, torch.bfloat16, False, True)),
    ("t80_wgr_p14_sm2_fs_kf", (128, torch.float16, False, True)),
    ("t128_xm24r_sm2_fs_kp_st_kf", (64, torch.bfloat16, False, False)),
    # Session 51: every head dim takes the polled cast (POLLED_CAST_HEADDIMS).
    ("t128_wg2gr_sm2_fs_dt_w2", (96, torch.bfloat16, True, True)),
    ("sw_w2_fs", (256, torch.bfloat16, False, True)),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant,config",
    CAST_TRIGGER_CONFIGS,
    ids=[f"{v}-{_config_id(c)}" for v, c in CAST_TRIGGER_CONFIGS],
)
def test_cast_trigger_compiles_for_sm90a(variant: str, config: tuple, tmp_path: Path) -> None:
    swapped = bwd_launch._variant_options(variant).get("dkv_swap")
    check = _check_swapped_kernel_code if swapped else _check_kernel_code
    check(config, variant, tmp_path, cast_trigger=True)


# Session 59: the counted non-deterministic kernels (nondet_first_store, "_nc"; what non-det
# backwards run): each shipped kernel's, non-det with the cast trigger, at every step layout and
# tile.
COUNTED_CONFIGS = [
    (hd, dtype, causal) for hd, dtype, causal in (
        (64, torch.bfloat16, False), (64, torch.float16, True), (96, torch.bfloat16, True),
        (128, torch.bfloat16, False), (128, torch.float16, True), (256, torch.bfloat16, False),
    )
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", COUNTED_CONFIGS, ids=[_config_id((*c, False)) for c in COUNTED_CONFIGS]
)
def test_counted_nondet_kernels_compile_for_sm90a(config: tuple, tmp_path: Path) -> None:
    """A counted non-det kernel (``hopper.counted_nondet_twin`` of the shipped variant) has
    the semaphore protocol of its det twin (the acquire loop, the first store beside each
    reduce, a release per dQ warp, the cast trigger)."""
    head_dim, dtype, causal = config
    kind = "causal" if causal else "full"
    counted = hopper.counted_nondet_twin(hopper.BWD_VARIANT[head_dim, kind])
    assert counted == bwd_variant(head_dim, causal)  # what non-det backwards run
    assert bwd_launch.counts_nondet_adds(counted)
    assert bwd_launch.takes_turns(counted, deterministic=False)
    swapped = head_dim in SWAPPED_TILES
    check = _check_swapped_kernel_code if swapped else _check_kernel_code
    ptx, _ = check((*config, False), counted, tmp_path / "nondet", cast_trigger=True)
    twin = bwd_variant(head_dim, causal, deterministic=True)
    det = _compile((*config, True), tmp_path / "det", twin, cast_trigger=True).__ptx__
    # (The compiler may fold the wait's first acquire load into its loop.)
    writers = bwd_launch.VARIANTS[counted].get("dq_writers", 1)
    assert writers <= ptx.count("ld.acquire.gpu") <= det.count("ld.acquire.gpu")
    assert ptx != det  # the waits compare otherwise


def test_counted_variant_in_det_mode_is_its_det_twin() -> None:
    """In deterministic mode ``nondet_first_store`` changes nothing: a counted variant compiles
    to its det twin's PTX (names masked)."""
    from tools.hopper.ptx_digest import masked_ptx

    name = hopper.BWD_VARIANT[128, "full"]
    twin = bwd_variant(128, False, deterministic=True)
    counted = hopper.counted_nondet_twin(name)
    assert counted == twin + hopper.NONDET_COUNTED_SUFFIX
    assert masked_ptx(128, False, True, counted) == masked_ptx(128, False, True, twin)


def test_counted_kernel_keeps_strict_turns_for_the_dkv_sums() -> None:
    """With the GQA split's in-kernel dK/dV sums (``dkv_sum``) a counted non-det kernel relaxes
    only its dQ waits: each dQ acquire is compared with 0 (the first store landed), each dK/dV
    one with the rank, as in the det kernel, since the sums' last rank reads the total."""
    from tools.hopper.ptx_digest import masked_ptx

    counted = hopper.counted_nondet_twin(hopper.BWD_VARIANT[128, "full"])

    def compares(deterministic: bool) -> list[str]:
        lines = masked_ptx(128, False, deterministic, counted, dkv_sum=True).splitlines()
        found = []
        for i, line in enumerate(lines):
            if "ld.acquire.gpu" in line:
                setp = next(x for x in lines[i + 1 : i + 4] if "setp." in x).split()
                found.append(f"{setp[0]} {'0' if setp[-1] == '0;' else 'rank'}")
        return found

    nondet, det = compares(False), compares(True)
    dq = nondet.count("setp.gt.s32 0")  # the dQ writer's (its first load and its loop's)
    assert dq >= bwd_launch.VARIANTS[counted].get("dq_writers", 1)
    assert nondet[:dq] == ["setp.gt.s32 0"] * dq and det[:dq] == ["setp.eq.b32 rank"] * dq
    assert nondet[dq:] == det[dq:] and set(det[dq:]) == {"setp.eq.b32 rank"}


def test_counted_variants_are_registered_for_every_shipped_kernel() -> None:
    """``bwd_launch.VARIANTS`` has the counted kernel of every shipped variant: its det twin's
    options with ``nondet_first_store``; ``counted_nondet_twins`` maps each shipped variant
    to it, and no other variant counts its adds."""
    twins = hopper.counted_nondet_twins()
    assert set(twins) == {
        *hopper.BWD_VARIANT.values(), *(v for _, v in hopper.BWD_VARIANT_LONG.values())
    }  # fmt: skip
    for name, counted in twins.items():
        det = hopper.BWD_DET_TWIN.get(name, name)
        assert bwd_launch.VARIANTS[counted] == {
            **bwd_launch.VARIANTS[det], "nondet_first_store": True
        }  # fmt: skip
    # The suffix names a counted kernel; a probe's suffix may follow it (variant_ab times
    # ``<shipped kernel><suffix>`` in both modes, so "<counted twin>_p18").
    counted_tag = hopper.NONDET_COUNTED_SUFFIX.lstrip("_")
    for name, options in bwd_launch.VARIANTS.items():
        counts = bwd_launch.counts_nondet_adds(name)
        assert counts == (counted_tag in name.split("_")), name
        assert counts == bool(options.get("nondet_first_store")), name
        assert bwd_launch.takes_turns(name, deterministic=True)
        assert bwd_launch.takes_turns(name, deterministic=False) == counts


def _check_kernel_code(
    config: tuple, variant: str, tmp_path: Path, dkv_sum: bool = False, cast_trigger: bool = False
) -> tuple[str, str]:
    """Compile ``variant`` at ``config`` and check its PTX and SASS: the GEMMs, the register
    split, the semaphore protocol (det only), the dQ staging and reduce, and, in the MMA
    warpgroups' code, stmatrix dS, 32-bit dK/dV stores, two copies of the exponential loop
    and no local memory. Returns the PTX and the SASS (skips without nvdisasm)."""
    head_dim, _, _, det = config
    # The semaphore protocol: deterministic kernels and counted non-det ones ("_nc").
    turns = bwd_launch.takes_turns(variant, det)
    block_m, block_n = bwd_launch.variant_tiles(variant, head_dim)
    compiled = _compile(config, tmp_path, variant, dkv_sum, cast_trigger)
    ptx = compiled.__ptx__
    assert isinstance(ptx, str) and ".target sm_90a" in ptx
    options = bwd_launch._variant_options(variant)
    # Five GEMMs per step, all WGMMA: S, dP (hd/16 k-blocks each), dV, dK (block_m/16 each), dQ
    # (block_n/16).
    gemm_blocks = 2 * head_dim // 16 + 2 * block_m // 16 + block_n // 16
    assert ptx.count("wgmma.mma_async") == gemm_blocks
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    assert "cp.async.bulk.tensor" in ptx  # TMA loads
    # The semaphore protocol exists in deterministic mode (and in counted non-det kernels) only.
    assert ("ld.acquire.gpu" in ptx) == turns
    assert ("red.release.gpu" in ptx) == (turns or dkv_sum)
    assert ("%globaltimer" in ptx) == (turns or dkv_sum)
    assert ("fence.proxy.async.global" in ptx) == turns
    # pdl: every thread waits for the preprocess's end; the producer lets the cast launch.
    # cast_trigger (kernels that take turns only): every thread lets it launch after the
    # prologue.
    assert ("griddepcontrol.wait" in ptx) == bool(options.get("pdl"))
    triggers = bool(options.get("pdl")) or (cast_trigger and turns)
    assert ("griddepcontrol.launch_dependents" in ptx) == triggers
    # kv_prefetch: the producer's two TMA prefetches of the next chain's K and V into L2.
    prefetches = ptx.count("cp.async.bulk.prefetch.tensor.4d.L2.global")
    # (At hd 96 K and V rows are 32-byte swizzled: each tile moves as six boxes of 16 columns.)
    boxes = 6 if head_dim == 96 else 1
    assert prefetches == (2 * boxes if options.get("kv_prefetch") is not None else 0)
    # No TMA stores: dK/dV leave by the MMA threads' own stores.
    assert not re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx)
    # dq_first_store: in det mode (and counted non-det) each reduce has a bulk copy beside it
    # (rank 0's partial). Each dQ warp's loop has its own (dq_writers).
    writers = options.get("dq_writers", 1)
    copies = ptx.count("cp.async.bulk.global.shared::cta.bulk_group")
    first_store = bool(options.get("dq_first_store")) and turns
    assert copies == ((2 if options.get("dq_wg") else 1) * writers if first_store else 0)
    if turns:
        # One acquire loop and one release per dQ warp.
        assert ptx.count("red.release.gpu") == writers + (1 if dkv_sum else 0)
    # One flat fp32 bulk reduce of the whole tile per step (one per warpgroup half with dq_wg),
    # no tensor (TMA) reduce.
    assert "cp.reduce.async.bulk.tensor" not in ptx
    reduces = ptx.count("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32")
    assert reduces == (2 if options.get("dq_wg") else 1) * writers
    sass = disassemble(compiled.__cubin__)
    if sass is None:
        pytest.skip("nvdisasm not available: SASS checks skipped")
    # ptxas keeps setmaxnreg only with .minnctapersm (else warning C7508 and no USETMAXREG).
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x18" in sass
    alloc = sass.find("USETMAXREG.TRY_ALLOC.CTAPOOL")
    assert alloc >= 0
    # Everything after the register increase is the MMA warpgroups' code.
    mma_code = sass[alloc:]
    staged = options.get("dkv_smem", False) and not dkv_sum
    spills = re.findall(r"\b(?:STL|LDL)\b[^;]*", mma_code)
    assert len(spills) <= _known_spills(config, staged), ("MMA warpgroups spill", spills)
    # No serialised WGMMA (ptxas C7510 inserts waits after every wgmma when it gives up).
    assert sass.count("HGMMA") >= ptx.count("wgmma.mma_async")
    # Nor serialised for want of registers (C7512: a WARPGROUP.ARRIVE before every HGMMA).
    assert sass.count("WARPGROUP.ARRIVE") < sass.count("HGMMA")
    dq_regs = block_m * head_dim // 256
    # Fragment order: each thread's dQ registers leave as 16-byte stores.
    assert len(re.findall(r"\bSTS\.128\b", mma_code)) >= dq_regs // 4
    assert "UBLKRED.G.S.ADD.F32" in sass
    assert "STG.E.U16" not in mma_code
    stores = re.findall(r"\bSTG\.E\b[^;]*", mma_code)
    dkv_stmatrix = 0
    if staged:
        # dK/dV through shared memory: stmatrix x4 of both (hd / 16 per thread and tensor), then
        # 16-byte global stores of whole rows (a loop: a few copies).
        dkv_stmatrix = head_dim // 8
        assert any(st.startswith("STG.E.128") for st in stores), stores
        assert len(re.findall(r"\bLDS\.128\b", mma_code)) >= 2
    else:
        # dK/dV leave as 32-bit pairs: 2 x (64 x hd / 128 threads / 2) stores, none 16-bit.
        assert len(stores) >= head_dim // 2
    if options.get("dkv_row_ptr") and not dkv_sum and not staged:
        # Per fragment row (2 per thread and tensor) one address; the row's other pairs are
        # stored at constant offsets from it.
        offset_stores = [st for st in stores if re.search(r"\.64\+0x[0-9a-f]+\]", st)]
        assert len(offset_stores) >= len(stores) - 4, stores
    # The dS barrier (id 1, the 256 MMA threads) once a step.
    ds_syncs = len(re.findall(r"\bBAR\.SYNC(?:\.DEFER_BLOCKING)? 0x1, 0x100\b", mma_code))
    assert ds_syncs == 1
    # dS leaves as stmatrix x4 (4 per thread and step; 8 with 128-row Q tiles), not as one
    # 32-bit store per register pair.
    stmatrix = len(re.findall(r"\bSTSM\.16\.M88\.4\b", mma_code))
    assert stmatrix == block_m // 16 + dkv_stmatrix
    # Two copies of the exponential loop: masked (edge tiles) and plain (interior tiles), each
    # with the MUFU exponentials of the elements exp_poly leaves to it and the polynomial (one
    # round-down addition each, from exp2_poly's PTX) for the others.
    per_thread = block_m * block_n // 256
    poly_count, poly_period = options.get("exp_poly", (0, 1))
    on_mufu = [i % poly_period < poly_period - poly_count for i in range(per_thread)]
    assert mma_code.count("MUFU.EX2") == 2 * sum(on_mufu)
    assert ptx.count("add.rm.ftz.f32") == 2 * on_mufu.count(False)
    # The wait for dP^T (the first full wgmma wait after the one for S^T, which leaves dP^T
    # running) comes after all exponentials of both copies but their last exp_tail each, which
    # follow it.
    before, after = _exponentials_around_dp_wait(mma_code)
    split = per_thread - min(options.get("exp_tail", 0), per_thread)
    assert (before, after) == (2 * sum(on_mufu[:split]), 2 * sum(on_mufu[split:]))
    # The dQ barriers hold both warpgroups and the dQ warp (288 threads, 0x120), or with dq_wg
    # one warpgroup and the dQ warp (160, 0xa0; then none holds 288).
    dq_threads = "0xa0" if options.get("dq_wg") else "0x120"
    if options.get("dq_wg"):
        assert not re.search(r"\bBAR\.[A-Z_.]+ [^,;]+, 0x120\b", sass)
    if options.get("dq_double") or options.get("dq_wg"):
        # Barrier "free" of buffer b and half w is 2 + 2 (b + bufs w) ("written" the next id):
        # the dQ writer frees every one at its start with immediate ids, later ones come from
        # a register.
        halves = 2 if options.get("dq_wg") else 1
        bufs = 2 if options.get("dq_double") else 1
        for index in range(halves * bufs):
            assert f"BAR.ARV {hex(2 + 2 * index)}, {dq_threads}" in sass
        assert re.search(rf"BAR\.SYNC(\.DEFER_BLOCKING)? R\d+, {dq_threads}", mma_code)
    return ptx, sass


def _check_swapped_kernel_code(
    config: tuple, variant: str, tmp_path: Path, dkv_sum: bool = False, cast_trigger: bool = False
) -> tuple[str, str]:
    """``_check_kernel_code`` for the kernels of head dims 192 and 256 (``dkv_swap``): their
    GEMMs (dK^T and dV^T with the head dim as M), P and dS to shared memory (stmatrix at hd
    192, 16-bit stores at hd 256), the transposing stmatrix of the chain's dK/dV into the K/V
    tiles and 16-byte row chunks out, and no local memory in the MMA warpgroups."""
    head_dim, _, _, det = config
    turns = bwd_launch.takes_turns(variant, det)
    block_m, block_n = bwd_launch.variant_tiles(variant, head_dim)
    assert (block_m, block_n) == SWAPPED_TILES[head_dim]
    options = bwd_launch._variant_options(variant)
    assert options["dkv_swap"] and options["dq_wg"] and options["do_single"]
    compiled = _compile(config, tmp_path, variant, dkv_sum, cast_trigger)
    ptx = compiled.__ptx__
    assert isinstance(ptx, str) and ".target sm_90a" in ptx
    triggers = bool(options.get("pdl")) or (cast_trigger and turns)
    assert ("griddepcontrol.launch_dependents" in ptx) == triggers
    # S and dP: hd/16 k-blocks each; dV^T and dK^T: block_m/16 k-blocks per 64 head-dim rows of
    # a warpgroup (all of them at hd 192, where the warpgroups split the KV rows, half at hd 256);
    # dQ: block_n/16.
    dkv_rows = head_dim if head_dim == 192 else head_dim // 2
    gemms = 2 * head_dim // 16 + 2 * (dkv_rows // 64) * (block_m // 16) + block_n // 16
    assert ptx.count("wgmma.mma_async") == gemms
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    assert ("ld.acquire.gpu" in ptx) == turns
    assert ("red.release.gpu" in ptx) == (turns or dkv_sum)
    # Per dQ warp (dq_writers): a release, and a reduce (and a first store) per warpgroup half.
    writers = options.get("dq_writers", 1)
    if turns:
        assert ptx.count("red.release.gpu") == writers + (1 if dkv_sum else 0)
    copies = ptx.count("cp.async.bulk.global.shared::cta.bulk_group")
    assert copies == (2 * writers if options.get("dq_first_store") and turns else 0)
    reduces = ptx.count("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32")
    assert reduces == 2 * writers
    # Two dQ warps sharing the staging buffer (dq_writers=2 without dq_double) hand it over on
    # one named barrier of the two warps per direction (ids 6 and 7: on one barrier a warp that
    # arrived and then waited would complete it alone): per warp, one wait and one arrival in
    # its step loop and one of each at its terminators; nothing else uses those ids.
    shared = writers == 2 and not options.get("dq_double")
    for bar_id in (6, 7):
        assert len(re.findall(rf"bar\.sync\s+{bar_id}, 64;", ptx)) == (2 if shared else 0)
        assert len(re.findall(rf"bar\.arrive\s+{bar_id}, 64;", ptx)) == (2 if shared else 0)
        assert len(re.findall(rf"bar\.(sync|arrive)\s+{bar_id},", ptx)) == (4 if shared else 0)
    if not dkv_sum:
        # dK/dV leave through the K/V tiles by a transposing stmatrix.
        assert "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    sass = disassemble(compiled.__cubin__)
    if sass is None:
        pytest.skip("nvdisasm not available: SASS checks skipped")
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x18" in sass
    mma_code = sass[sass.find("USETMAXREG.TRY_ALLOC.CTAPOOL") :]
    spills = re.findall(r"\b(?:STL|LDL)\b[^;]*", mma_code)
    assert not spills, ("MMA warpgroups spill", spills)
    assert sass.count("HGMMA") >= gemms
    dq_regs = block_m * head_dim // 256
    assert len(re.findall(r"\bSTS\.128\b", mma_code)) >= dq_regs // 4
    assert "UBLKRED.G.S.ADD.F32" in sass
    # P and dS of a step: stmatrix x4 at hd 192 (a warp's 16 x 48 slab is 12 8x8 matrices: 3
    # per tensor and thread), 16-bit stores at hd 256 (12 per tensor and thread).
    per_thread = block_m * block_n // 256
    stmatrix = len(re.findall(r"\bSTSM\.16\.M88\.4\b", mma_code))
    if head_dim == 192:
        assert stmatrix == 2 * per_thread // 8
    else:
        assert stmatrix == 0
        assert len(re.findall(r"\bSTS\.U16\b", mma_code)) >= 2 * per_thread
    if not dkv_sum:
        # The chain's dK/dV: transposing stmatrix x4 (hd x block_n / 256 values per thread and
        # tensor, 8 per instruction), then 16-byte global stores of whole rows.
        transposed = len(re.findall(r"\bSTSM\.16\.MT88\.4\b", mma_code))
        assert transposed == 2 * (head_dim * block_n // 256) // 8
        assert re.search(r"\bSTG\.E\.128\b", mma_code)
    # Two copies of the exponential loop (masked and plain), every exponential on the MUFU.
    assert mma_code.count("MUFU.EX2") == 2 * per_thread
    return ptx, sass


def _known_spills(config: tuple, staged: bool) -> int:
    """Local-memory instructions allowed in the MMA warpgroups' code: none, except with dK/dV
    through shared memory at hd 64, causal, det, where ptxas moves one register of the dS
    arithmetic through local memory (one STL and one LDL per step; measured faster than the
    kernel without it all the same: ``hopper.BWD_VARIANT``'s comment)."""
    head_dim, _, causal, det = config
    return 2 if staged and head_dim == 64 and causal and det else 0


def _exponentials_around_dp_wait(mma_code: str) -> tuple[int, int]:
    """MUFU.EX2 count of the step (SASS in address order) between the wait for S^T (the first
    ``WARPGROUP.DEPBAR.LE gsb0, 0x1``: dP^T, issued after S^T, still running) and the wait for
    dP^T (the next ``gsb0, 0x0``), and from there to the next GEMM."""
    lines = mma_code.splitlines()
    s_wait = next(i for i, line in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line)
    dp_wait = next(
        i for i in range(s_wait + 1, len(lines)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in lines[i]
    )
    next_gemm = next(i for i in range(dp_wait, len(lines)) if "HGMMA" in lines[i])
    count = lambda a, b: sum("MUFU.EX2" in line for line in lines[a:b])  # noqa: E731
    return count(s_wait, dp_wait), count(dp_wait, next_gemm)


def test_ffi_call_matches_the_kernel_signature() -> None:
    """The TVM-FFI call passes the tensors and scalars positionally: its argument list must
    follow HopperAttnBwd.__call__'s parameters (the stream comes from the environment). The
    call itself needs a GPU; this checks the order and the count on the CPU."""
    import inspect

    import cutlass

    params = list(inspect.signature(HopperAttnBwd.__call__).parameters)
    assert params[0] == "self" and params[-1] == "stream"
    fakes = bwd_launch._fake_kernel_args(cutlass.BFloat16, 128, 128)
    scalars = bwd_launch._scalar_args(2, 1, 4, 4, True, 0.125, 10**9)
    assert len(fakes) + len(scalars) == len(params) - 2
    assert params[len(fakes) + 1 : -1] == [
        "q_tiles", "kv_tiles", "num_chains", "num_workers", "dynamic", "softmax_scale",
        "timeout_ns",
    ]  # fmt: skip
    assert scalars[4] == 1 and isinstance(scalars[5], float)
    # q, k, v, dout, dk, dv at hd 128 with a static head dim; lse2/delta 2-D; the rest (the
    # dK/dV accumulator, the flags, the tables) 1-D.
    ranks = [len(f.shape) for f in fakes]
    assert ranks == [4, 4, 4, 4, 2, 2, 4, 4, 4] + [1] * (2 + len(TABLE_FIELDS))
    assert all(fakes[i].shape[3] == 128 for i in (0, 1, 2, 3, 6, 7, 8))


def test_ffi_view_fixes_zero_strides_of_size_one_dims() -> None:
    q = torch.zeros(1, 100, 4, 64, dtype=torch.bfloat16)
    assert tma_view(q) is q
    expanded = torch.zeros(1, 100, 1, 64, dtype=torch.bfloat16).expand(1, 100, 1, 64)
    broadcast = expanded.as_strided(expanded.shape, (0, 64, 0, 1))
    fixed = tma_view(broadcast)
    assert fixed.stride() == (8, 64, 8, 1)
    assert fixed.data_ptr() == broadcast.data_ptr()


def test_variants_resolve() -> None:
    from dash_attn.backends import hopper

    swapped = {n for n, o in bwd_launch.VARIANTS.items() if o.get("dkv_swap")}
    assert swapped == {"sw_fs", "sw_et_fs", "sw_w2_fs", "sw_w2_fs_nc"}
    for name in bwd_launch.VARIANTS:
        if name in swapped:
            for head_dim, tiles in SWAPPED_TILES.items():
                assert bwd_launch.variant_tiles(name, head_dim) == tiles
            continue
        assert bwd_launch.variant_tiles(name, 64) == (128, 128)
        expected = (80, 128) if name.startswith("t80_") else (64, 128)
        assert bwd_launch.variant_tiles(name, 128) == expected
    assert set(hopper.BWD_VARIANT.values()) <= set(bwd_launch.VARIANTS)
    # Long key sequences: the long variant from its length on, the other below.
    for (head_dim, kind), (min_seqlen_k, name) in hopper.BWD_VARIANT_LONG.items():
        causal = kind == "causal"
        short = hopper.BWD_VARIANT[head_dim, kind]
        nondet = hopper.BWD_NONDET_TWIN
        assert name in bwd_launch.VARIANTS and head_dim not in hopper.NONDET_UNCOUNTED_HEADDIMS
        assert bwd_variant(head_dim, causal, min_seqlen_k) == nondet.get(name, name)
        assert bwd_variant(head_dim, causal, min_seqlen_k - 1) == nondet.get(short, short)
        # Same tiles and the same arithmetic of the exponentials as the short variant, so the
        # bits do not depend on the launch's longest key sequence (order invariance: a sequence
        # packed with longer ones runs the long variant).
        options = {n: bwd_launch.VARIANTS[n] for n in (name, short)}
        for key in ("tiles", "exp_poly", "exp_poly_degree"):
            assert len({repr(o.get(key)) for o in options.values()}) == 1, (key, options)
    # Deterministic runs take the twin with two dQ warps where there is one, and only that
    # option and when the turn is taken differ (the same tiles and arithmetic: the same bits);
    # where the two warps share one staging buffer (no dq_double) they take their turns
    # early, as they must (with two buffers they may: the long hd-128 full twin, session 63).
    shipped = {*hopper.BWD_VARIANT.values(), *(n for _, n in hopper.BWD_VARIANT_LONG.values())}
    assert set(hopper.BWD_DET_TWIN) <= shipped
    for name, twin in hopper.BWD_DET_TWIN.items():
        assert twin in bwd_launch.VARIANTS
        base, two = bwd_launch.VARIANTS[name], bwd_launch.VARIANTS[twin]
        turn = {"early_turn": None}
        assert {**two, **turn} == {**base, **turn, "dq_writers": 2}, name
        assert base.get("dq_writers", 1) == 1
        assert two.get("early_turn") or base.get("dq_double"), name
    # Non-deterministic runs take the counted kernel of every shipped variant (its det twin's
    # kernel, test_counted_variants_are_registered_for_every_shipped_kernel); where they do not
    # (hd 256 from the non-det auto's descending length on) the kernel without turns, which at
    # hd 64 full is the one-buffer kernel: only the second dQ buffer and its dS guard differ.
    assert set(hopper.BWD_NONDET_TWIN) == shipped
    assert set(hopper.BWD_NONDET_UNCOUNTED) <= shipped
    for name, one_buffer in hopper.BWD_NONDET_UNCOUNTED.items():
        base, one = bwd_launch.VARIANTS[name], bwd_launch.VARIANTS[one_buffer]
        assert base == {**one, "dq_double": True, "ds_guard": True} and "dq_double" not in one
    for (head_dim, kind), name in hopper.BWD_VARIANT.items():
        causal = kind == "causal"
        twin = hopper.BWD_DET_TWIN.get(name, name)
        assert bwd_variant(head_dim, causal, deterministic=True) == twin
        assert bwd_variant(head_dim, causal) == hopper.counted_nondet_twin(name) == twin + "_nc"
    for (head_dim, kind), (min_seqlen_k, name) in hopper.BWD_VARIANT_LONG.items():
        twin = hopper.BWD_DET_TWIN.get(name, name)
        assert bwd_variant(head_dim, kind == "causal", min_seqlen_k, True) == twin
    assert bwd_variant(64, False, deterministic=True).endswith("_w2_st_kf")
    assert bwd_variant(256, True, deterministic=True) == "sw_w2_fs"
    assert bwd_variant(256, True, deterministic=False) == "sw_w2_fs_nc"
    for causal, length in ((True, 2048), (False, 1024)):  # the non-det auto's descending
        pair = (bwd_variant(256, causal, length - 1), bwd_variant(256, causal, length))
        assert pair == ("sw_w2_fs_nc", "sw_fs")
    assert bwd_variant(192, True, 1 << 20) == "sw_w2_fs_nc"
    assert bwd_variant(64, False) == "t128_xm24r_sm2_fs_dq2_kp_w2_st_kf_nc"
    assert bwd_variant(64, True, deterministic=True) == "t128_xm24r_sm2_fs_dq2_dt_kp_w2_st_kf"
    # Only hd 64 prefetches the next chain's K/V (a cache hint: the same bits as without).
    for name in {*hopper.BWD_VARIANT.values(), *hopper.BWD_DET_TWIN.values()}:
        options = bwd_launch.VARIANTS[name]
        assert (options.get("kv_prefetch") == 0) == name.startswith("t128_xm24r"), name
        assert options.get("dkv_stage", False) == name.startswith("t128_xm24r"), name
    kinds = ("full", "causal")
    assert set(hopper.BWD_VARIANT) == {(d, k) for d in hopper.BWD_HEADDIMS for k in kinds}
    with pytest.raises(NotImplementedError, match="head_dim=80"):
        bwd_variant(80, True)
    # Every variant's options are constructor arguments of the kernel.
    import cutlass

    for name in bwd_launch.VARIANTS:
        head_dim = 192 if name in swapped else 64
        block_m, block_n = bwd_launch.variant_tiles(name, head_dim)
        HopperAttnBwd(
            cutlass.BFloat16, head_dim, causal=True, deterministic=True, block_m=block_m,
            block_n=block_n, **bwd_launch._variant_options(name),
        )  # fmt: skip
    with pytest.raises(ValueError, match="unknown variant"):
        bwd_launch.variant_tiles("nope", 64)


@pytest.mark.parametrize("det", [True, False], ids=["det", "nondet"])
def test_kv_on_full_issues_the_first_gemm_before_the_flags(det: bool, tmp_path: Path) -> None:
    """``kv_on_full`` (the ``_kf`` variants): the chain's K/V bytes are counted into its first
    step's ring barrier, so the producer arms one mbarrier fewer and the MMA warpgroups wait on
    one fewer; in their step loop the first GEMM comes before the step's flag read, and no
    select is added."""
    config = (128, torch.bfloat16, False, det)
    base_ptx, base_sass = _check_kernel_code(config, "t80_wgr_p14_sm2_fs", tmp_path / "base")
    kf_ptx, kf_sass = _check_kernel_code(config, "t80_wgr_p14_sm2_fs_kf", tmp_path / "kf")
    # The accumulators are zeroed in the branch of a chain's epilogue: a branch at the first
    # step holding only the zeroing became 128 selects in every step (session 56, item 308).
    assert kf_sass.count("FSEL") == base_sass.count("FSEL")
    armed = "mbarrier.arrive.expect_tx"
    assert kf_ptx.count(armed) == base_ptx.count(armed) - 1
    waits = r"mbarrier\.try_wait\.parity"
    assert len(re.findall(waits, kf_ptx)) == len(re.findall(waits, base_ptx)) - 1
    # The MMA warpgroups' step loop starts at their first ring wait; its flags are the first
    # shared load there (an LDS of the slot's flags word).
    mma_code = kf_sass[kf_sass.find("USETMAXREG.TRY_ALLOC.CTAPOOL") :]
    loop = mma_code[mma_code.find("SYNCS.PHASECHK.TRANS64.TRYWAIT") :]
    assert 0 <= loop.find("HGMMA") < loop.find("LDS")


def test_step_trace_stamps_a_clock_per_trace_point(tmp_path: Path) -> None:
    """``step_trace`` (a probe, tools/hopper/step_trace.py): the MMA warpgroups read the SM
    clock at each of ``bwd_step.TRACE_POINTS`` but the fine ones (hd 64 only) and store it (no
    local memory); the kernel without it reads no clock."""
    from dash_attn.backends.hopper.bwd_step import FINE_POINTS, TRACE_POINTS

    config = (128, torch.bfloat16, False, False)
    name = bwd_variant(128, False, deterministic=False)
    shipped = _compile(config, tmp_path / "shipped", variant=name)
    bwd_launch.VARIANTS[name + "_tr"] = {**bwd_launch.VARIANTS[name], "step_trace": 64}
    try:
        traced = _compile(config, tmp_path / "traced", variant=name + "_tr")
    finally:
        del bwd_launch.VARIANTS[name + "_tr"]
    clock = r"mov\.u32\s+%r\d+,\s+%clock;"
    assert not re.findall(clock, shipped.__ptx__)
    assert len(re.findall(clock, traced.__ptx__)) == len(TRACE_POINTS) - len(FINE_POINTS)
    sass = disassemble(traced.__cubin__)
    if sass is None:
        pytest.skip("nvdisasm not available: SASS checks skipped")
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert shipped is not traced


def test_compile_cache_reuses_kernels(tmp_path: Path) -> None:
    """One kernel per configuration: the same configuration (the shipped variant and its tiles
    by default) comes from the in-memory cache."""
    config = CONFIGS[0]
    first = _compile(config, tmp_path)
    head_dim, dtype, causal, det = config
    start = time.perf_counter()
    again = bwd_launch.compile_bwd(
        dtype,
        head_dim,
        causal=causal,
        deterministic=det,
        extra_options=f"--keep-ptx --keep-cubin --dump-dir {tmp_path}",
    )
    assert again is first
    assert time.perf_counter() - start < 0.5


def test_unsupported_head_dim_raises() -> None:
    import cutlass

    with pytest.raises(NotImplementedError, match="head_dim=80"):
        HopperAttnBwd(cutlass.BFloat16, 80, causal=False, deterministic=True)
    # Head dims 192 and 256 run the swapped layout at their own tiles only, and it runs no other.
    with pytest.raises(NotImplementedError, match="head_dim=192 needs the swapped"):
        HopperAttnBwd(cutlass.BFloat16, 192, causal=False, deterministic=True)
    with pytest.raises(NotImplementedError, match="block_n=96"):
        HopperAttnBwd(
            cutlass.BFloat16, 256, causal=False, deterministic=True, block_n=96, dkv_swap=True
        )
    with pytest.raises(NotImplementedError, match="head_dim=128 cannot take"):
        HopperAttnBwd(cutlass.BFloat16, 128, causal=False, deterministic=True, dkv_swap=True)
    with pytest.raises(NotImplementedError, match="block_m=128"):
        HopperAttnBwd(cutlass.BFloat16, 96, causal=False, deterministic=True, block_m=128)
    with pytest.raises(NotImplementedError, match="block_m=128"):
        HopperAttnBwd(cutlass.BFloat16, 128, causal=False, deterministic=True, block_m=128)
    with pytest.raises(NotImplementedError, match="block_m=32"):
        HopperAttnBwd(cutlass.BFloat16, 64, causal=False, deterministic=True, block_m=32)


def test_bad_kernel_options_raise() -> None:
    import cutlass

    for bad in ((2, 1), (-1, 4), (1, 0)):
        with pytest.raises(ValueError, match="exp_poly"):
            HopperAttnBwd(cutlass.BFloat16, 64, causal=False, deterministic=True, exp_poly=bad)
    with pytest.raises(ValueError, match="exp_poly_degree"):
        HopperAttnBwd(
            cutlass.BFloat16, 64, causal=False, deterministic=True, exp_poly=(1, 4),
            exp_poly_degree=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="kv_prefetch"):
        HopperAttnBwd(cutlass.BFloat16, 64, causal=False, deterministic=True, kv_prefetch=-1)
    # hd 256's swapped step layout (dkv_swap) takes none of the step-order options.
    swapped = {
        "dtype": cutlass.BFloat16, "head_dim": 256, "causal": False, "deterministic": True,
        "block_m": 64, "block_n": 48, "dq_wg": True, "do_single": True, "dkv_swap": True,
    }  # fmt: skip
    with pytest.raises(ValueError, match="exp_tail"):
        HopperAttnBwd(**swapped, exp_tail=8)
    with pytest.raises(NotImplementedError, match="kv_on_full"):
        HopperAttnBwd(**swapped, kv_on_full=True)
    with pytest.raises(ValueError, match="nondet_first_store needs dq_first_store"):
        HopperAttnBwd(
            cutlass.BFloat16, 64, causal=False, deterministic=False, nondet_first_store=True
        )  # fmt: skip
    with pytest.raises(ValueError, match="step_trace must be >= 0"):
        HopperAttnBwd(cutlass.BFloat16, 128, causal=False, deterministic=True, step_trace=-1)
    with pytest.raises(ValueError, match="step_trace: not with dkv_sum"):
        HopperAttnBwd(
            cutlass.BFloat16, 128, causal=False, deterministic=True, dkv_sum=True, step_trace=8
        )  # fmt: skip
    with pytest.raises(ValueError, match="dkv_stage needs dkv_smem"):
        HopperAttnBwd(cutlass.BFloat16, 64, causal=False, deterministic=True, dkv_stage=True)
    # The staged dK/dV epilogue builds on the row-addressed one.
    base = {"dtype": cutlass.BFloat16, "head_dim": 128, "causal": True, "deterministic": True}
    for bad, match in (
        ({"dkv_smem": True}, "dkv_smem needs dkv_row_ptr"),
        ({"dkv_row_ptr": True, "dkv_smem": True, "dkv_smem_unroll": 0}, "dkv_smem_unroll"),
    ):
        with pytest.raises(ValueError, match=match):
            HopperAttnBwd(**base, **bad)
    # The swapped layout's fixed choices (one dQ buffer per warpgroup half, dO single-buffered,
    # its own P/dS and dK/dV paths).
    swap = {
        "head_dim": 192, "block_n": 96, "dkv_swap": True, "dq_wg": True, "do_single": True,
    }  # fmt: skip
    HopperAttnBwd(**{**base, **swap})
    for bad, match in (
        ({**swap, "dq_wg": False}, "missing \\['dq_wg'\\]"),
        ({**swap, "do_single": False}, "missing \\['do_single'\\]"),
        ({**swap, "dq_double": True}, "set \\['dq_double'\\]"),
        ({**swap, "exp_tail": 8}, "set \\['exp_tail'\\]"),
        ({**swap, "stages": 3}, "set \\['stages != 2'\\]"),
    ):
        with pytest.raises(ValueError, match=match):
            HopperAttnBwd(**{**base, **bad})
    # Two dQ warps own one staging buffer and ring stage each.
    two = {"block_m": 128, "head_dim": 64, "dq_writers": 2}
    for bad, match in (
        ({"dq_writers": 3}, "dq_writers must be 1 or 2"),
        ({**two}, "dq_writers=2 needs dq_double or early_turn"),
        ({**two, "dq_double": True, "stages": 3}, "dq_writers=2 needs"),
    ):
        with pytest.raises(ValueError, match=match):
            HopperAttnBwd(**{**base, **bad})


@pytest.mark.parametrize("variant", [None, "t128_fq", "t128_fq2"])
def test_launcher_rejects_bad_arguments(variant: str | None) -> None:
    """The launcher's checks come before any compile or launch, whatever the variant."""
    q, k, v, dout, lse2, delta, _, _, _, _, tables = _fake_inputs(64, torch.bfloat16)
    kwargs = dict(
        block_m=64, block_n=128, num_workers=4, q_tiles=2, kv_tiles=1, num_chains=4,
        causal=False, softmax_scale=0.125, deterministic=True, dynamic=False,
        timeout_ns=10**9, variant=variant,
    )  # fmt: skip
    q80 = torch.zeros(*q.shape[:3], 80, dtype=q.dtype)
    with pytest.raises(NotImplementedError, match="head_dim=80"):
        bwd_launch.hopper_bwd_main(
            q80, q80[:, :, :2], q80[:, :, :2], q80, lse2, delta, tables, **kwargs
        )
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        bwd_launch.hopper_bwd_main(q.float(), k, v, dout, lse2, delta, tables, **kwargs)
    with pytest.raises(ValueError, match="dout"):
        bwd_launch.hopper_bwd_main(q, k, v, dout[:, :50], lse2, delta, tables, **kwargs)
    with pytest.raises(ValueError, match="q_tiles"):
        bwd_launch.hopper_bwd_main(q, k, v, dout, lse2, delta, tables, **{**kwargs, "q_tiles": 3})
    with pytest.raises(ValueError, match="num_chains=5"):
        bwd_launch.hopper_bwd_main(
            q, k, v, dout, lse2, delta, tables, **{**kwargs, "num_chains": 5}
        )
    with pytest.raises(ValueError, match="dkv_heads \\(3\\)"):
        bwd_launch.hopper_bwd_main(q, k, v, dout, lse2, delta, tables, **kwargs, dkv_heads=3)
    # Split by q head: 2 batches x 4 q heads x 1 KV tile = 8 chains, so 4 is refused.
    with pytest.raises(ValueError, match="num_chains=4 but batch \\* dkv_heads"):
        bwd_launch.hopper_bwd_main(q, k, v, dout, lse2, delta, tables, **kwargs, dkv_heads=4)
    with pytest.raises(ValueError, match="dkv_sum adds the per-q-head chains"):
        bwd_launch.hopper_bwd_main(q, k, v, dout, lse2, delta, tables, **kwargs, dkv_sum=True)
    with pytest.raises(ValueError, match="num_chains \\+ 1"):
        bwd_launch.hopper_bwd_main(q, k, v, dout, lse2, delta, tables, **kwargs)
    with pytest.raises(ValueError, match="chain_start"):
        bad = {name: t for name, t in tables.items() if name != "chain_start"}
        bwd_launch.hopper_bwd_main(q, k, v, dout, lse2, delta, bad, **kwargs)
    with pytest.raises(ValueError, match="heads"):
        k3 = torch.zeros(2, 100, 3, 64, dtype=q.dtype)
        bwd_launch.hopper_bwd_main(q, k3, k3, dout, lse2, delta, tables, **kwargs)
    # A head stride of 68 elements (136 bytes): TMA (and the FFI signature) need 16 bytes.
    q_odd = torch.zeros(2, 100, 4, 68, dtype=q.dtype)[..., :64]
    with pytest.raises(ValueError, match="q must have a 16-byte aligned"):
        bwd_launch.hopper_bwd_main(q_odd, k, v, dout, lse2, delta, tables, **kwargs)


def test_shipped_variant_tiles_match_the_plan_tiles() -> None:
    """The plan builds the schedule tables with the tiles of hopper.bwd_tiles; the kernel variant
    each head dim runs must have the same tiles, or the kernel would walk other tables."""
    from dash_attn.backends import hopper

    shipped = [*hopper.BWD_VARIANT.items()]
    shipped += [(key, name) for key, (_, name) in hopper.BWD_VARIANT_LONG.items()]
    shipped += [
        (key, twins[name])
        for twins in (hopper.BWD_DET_TWIN, hopper.BWD_NONDET_TWIN, hopper.BWD_NONDET_UNCOUNTED)
        for key, name in shipped
        if name in twins
    ]
    for (headdim, kind), variant in shipped:
        tiles = hopper.bwd_tiles(headdim, kind == "causal")
        assert bwd_launch.variant_tiles(variant, headdim) == (tiles.block_m, tiles.block_n)


def test_prepared_launch_passes_the_kernel_signature_in_order() -> None:
    """``BwdLaunch`` (one per plan) calls the compiled kernel with the tensors, the tables and
    the scalars in ``HopperAttnBwd.__call__``'s order, and zeroes the dQ accumulator and the
    flags. The compiled kernel is a stand-in that records its arguments (the call needs a GPU)."""
    import inspect

    q, k, v, dout, lse2, delta, _, _, _, _, tables = _fake_inputs(128, torch.bfloat16)
    calls: list[tuple] = []
    launch = bwd_launch.BwdLaunch(
        compiled=lambda *args: calls.append(args),
        tables=tuple(tables[name] for name in TABLE_FIELDS),
        counts=(2, 1, 4, 4, 0),
        timeout_ns=10**9,
        dq_shape=bwd_launch.dq_acc_shape(tuple(q.shape), 2, 64),
        dq_size=2 * 4 * 2 * 64 * 128,
        flag_count=2 + 2 * 4 * 2,
        dkv_heads=k.shape[2],
        dkv_sum=False,
    )
    dq_acc, dk, dv, status = launch(q, k, v, dout, lse2, delta, 0.125)
    (args,) = calls
    params = list(inspect.signature(HopperAttnBwd.__call__).parameters)[1:-1]  # no self, stream
    assert len(args) == len(params)
    named = dict(zip(params, args, strict=True))
    assert named["mdQacc"] is dq_acc and named["mdK"] is dk and named["mdV"] is dv
    assert named["softmax_scale"] == 0.125 and named["timeout_ns"] == 10**9
    assert (named["q_tiles"], named["num_workers"], named["dynamic"]) == (2, 4, 0)
    assert dq_acc.shape == (2, 4, 2, 64 * 128) and not dq_acc.any()
    flags = named["mFlags"]
    assert flags.dtype == torch.int32 and flags.numel() == 18 and not flags.any()
    assert status.data_ptr() == flags.data_ptr() and status.numel() == 2
    assert dk.shape == k.shape and dk.dtype == q.dtype
    # A GQA split launch (dkv_heads = q's heads): the kernel gets per-q-head dK/dV partials
    # beside k and v with their own heads (it reads K/V of head // group).
    split = dataclasses.replace(launch, dkv_heads=q.shape[2])
    _, dk, dv, _ = split(q, k, v, dout, lse2, delta, 0.125)
    named = dict(zip(params, calls[-1], strict=True))
    assert named["mK"] is k and named["mdK"] is dk and named["mdV"] is dv
    assert dk.shape == dv.shape == (*k.shape[:2], q.shape[2], k.shape[3])
    # With the kernel's own sums (dkv_sum): dK/dV of k's heads, and an fp32 accumulator of
    # both beside them (not zeroed: rank 0 of every sum stores).
    summed = dataclasses.replace(split, dkv_sum=True)
    _, dk, dv, _ = summed(q, k, v, dout, lse2, delta, 0.125)
    named = dict(zip(params, calls[-1], strict=True))
    assert named["mdK"] is dk and dk.shape == dv.shape == k.shape
    acc = named["mdKVacc"]
    assert acc.dtype == torch.float32 and acc.shape == (2 * k.numel(),)
    # Without sums, a probe's scratch buffer (step_trace's stamps) takes that argument's place.
    scratch = torch.zeros(64, dtype=torch.float32)
    launch.launch(q, k, v, dout, lse2, delta, dq_acc, flags, 0.125, dkv_scratch=scratch)
    assert dict(zip(params, calls[-1], strict=True))["mdKVacc"] is scratch


def test_plan_launch_is_prepared_once_per_plan_and_device(monkeypatch) -> None:
    """``launch._main`` keeps each plan's ``BwdLaunch``: the checks and the compile-cache
    lookup run on the plan's first backward only; another plan gets its own."""
    from dash_attn.backends.hopper import launch
    from dash_attn.plan import CAUSAL, H200, Problem, make_backward_plan

    prepared: list[int] = []

    def fake_prepare(plan, q):
        prepared.append(id(plan))
        return lambda *args: ("launched", id(plan))

    monkeypatch.setattr(launch, "_prepare", fake_prepare)
    monkeypatch.setattr(launch, "_launches", {})
    plans = [
        make_backward_plan(Problem(2, s, s, 4, 2, 128, CAUSAL, "bfloat16"), device=H200)
        for s in (300, 400)
    ]
    q = torch.zeros(1)
    for plan in (plans[0], plans[0], plans[1], plans[0]):
        assert launch._main(plan, q, q, q, q, q, q, {}, 0.1) == ("launched", id(plan))
    assert prepared == [id(plans[0]), id(plans[1])]


@pytest.mark.parametrize("cute_pre_post", [True, False], ids=["cute", "triton_pre_post"])
def test_plan_launch_matches_the_plan(cute_pre_post: bool, monkeypatch) -> None:
    """The launch a plan gets: its tables, counts, timeout and accumulator sizes (the kernels
    are compiled for sm_90a on the CPU). With the CuTe host path (the default) the main
    kernel's launch is wrapped with the preprocess and the cast for the plan's tiles."""
    from dash_attn.backends.hopper import launch
    from dash_attn.backends.hopper.bwd_pre_post import compile_dq_cast, compile_preprocess
    from dash_attn.backends.tables import device_tables
    from dash_attn.plan import CAUSAL, H200, Problem, make_backward_plan

    monkeypatch.setattr(launch, "CUTE_PRE_POST", cute_pre_post)
    plan = make_backward_plan(Problem(2, 300, 300, 4, 2, 128, CAUSAL, "bfloat16"), device=H200)
    q = torch.zeros(2, 300, 4, 128, dtype=torch.bfloat16)
    tables = device_tables(plan.schedule, q.device)
    prepared = launch._prepare(plan, q)
    spec = plan.spec
    if cute_pre_post:
        assert isinstance(prepared, bwd_launch.FullBackward)
        block_m = plan.tiles.block_m
        assert prepared.rows_pad == spec.q_tiles * block_m
        assert prepared.parts[:2] == (2 * 4 * spec.q_tiles * block_m,) * 2
        assert prepared.preprocess is compile_preprocess(cutlass.BFloat16, 128)
        assert prepared.cast is compile_dq_cast(cutlass.BFloat16, 128, block_m)
        prepared = prepared.main
    else:
        assert isinstance(prepared, bwd_launch.BwdLaunch)
    assert prepared.tables == tuple(tables[name] for name in TABLE_FIELDS)
    assert prepared.counts == (spec.q_tiles, spec.kv_tiles, spec.num_chains, plan.grid, 0)
    assert prepared.timeout_ns == int(plan.timeout_s * 1e9)
    assert prepared.dq_size == 2 * 4 * spec.q_tiles * plan.tiles.block_m * 128
    assert prepared.flag_count == 2 + 2 * 4 * spec.q_tiles
    assert prepared.compiled is bwd_launch.compile_bwd(
        torch.bfloat16, 128, causal=True, deterministic=True
    )


@pytest.mark.parametrize(
    "deterministic,counted,seqlen_q,zeroes_acc",
    [
        (True, True, 300, False), (False, True, 300, False), (True, True, 700, True),
        (False, True, 700, True), (False, False, 300, True),
    ],
    ids=["det", "nondet", "det-rows-without-keys", "nondet-rows-without-keys", "uncounted"],
)  # fmt: skip
def test_plan_launch_zeroes_the_accumulator_unless_every_tile_is_first_stored(
    deterministic: bool, counted: bool, seqlen_q: int, zeroes_acc: bool, monkeypatch, request
) -> None:
    """The shipped kernels store each dQ tile's rank-0 partial (``dq_first_store``; in
    non-deterministic mode the counted kernels, ``nondet_first_store``), so the preprocess
    zeroes only the flags; it zeroes the accumulator too where some tile has no rank-0 step
    (causal, 700 queries on 300 keys: the first 400 rows see no key) and for a non-det kernel
    without turns (``uncounted_nondet``: every partial adds). Kernels are replaced by
    stand-ins (no compile)."""
    from dash_attn.backends.hopper import launch
    from dash_attn.plan import CAUSAL, H200, Problem, make_backward_plan

    if not counted:
        request.getfixturevalue("uncounted_nondet")
    monkeypatch.setattr(launch, "CUTE_PRE_POST", True)
    monkeypatch.setattr(bwd_launch, "compile_bwd", lambda *a, **kw: None)
    pre_post = "dash_attn.backends.hopper.bwd_pre_post"
    monkeypatch.setattr(f"{pre_post}.compile_preprocess", lambda *a, **kw: None)
    monkeypatch.setattr(f"{pre_post}.compile_dq_cast", lambda *a, **kw: None)
    problem = Problem(2, seqlen_q, 300, 4, 4, 128, CAUSAL, "bfloat16")
    plan = make_backward_plan(problem, device=H200, deterministic=deterministic)
    assert bwd_launch.dq_first_store(bwd_variant(128, True))
    prepared = launch._prepare(plan, torch.zeros(2, seqlen_q, 4, 128, dtype=torch.bfloat16))
    assert plan.schedule.starts_every_dq_tile() == (seqlen_q == 300)
    rows = prepared.parts[0]
    assert prepared.zero_start == 2 * rows + (0 if zeroes_acc else prepared.main.dq_size)


@pytest.mark.parametrize(
    "deterministic,counted", [(True, True), (False, True), (False, False)],
    ids=["det", "nondet", "uncounted"],
)  # fmt: skip
def test_plan_launch_polls_the_cast_where_the_plan_left_it_sms(
    deterministic: bool, counted: bool, monkeypatch, request
) -> None:
    """A plan with ``cast_sms`` (the sweep's d64 full 1k; det, or non-det on its counted kernel)
    gets a main kernel compiled with ``cast_trigger`` and the polled cast with the schedule's
    per-tile counts; a non-det plan on a kernel without turns (``uncounted_nondet``: nothing
    to count, no ``cast_sms``) the plain cast. Kernels are replaced by stand-ins (no
    compile)."""
    from dash_attn.backends.hopper import launch
    from dash_attn.plan import FULL, H200, Problem, make_backward_plan

    if not counted:
        request.getfixturevalue("uncounted_nondet")
    polls = counted
    monkeypatch.setattr(launch, "CUTE_PRE_POST", True)
    mains: list[dict] = []
    casts: list[dict] = []
    monkeypatch.setattr(bwd_launch, "compile_bwd", lambda *a, **kw: mains.append(kw))
    pre_post = "dash_attn.backends.hopper.bwd_pre_post"
    monkeypatch.setattr(f"{pre_post}.compile_preprocess", lambda *a, **kw: None)
    monkeypatch.setattr(f"{pre_post}.compile_dq_cast", lambda *a, **kw: casts.append(kw))
    problem = Problem(16, 1024, 1024, 32, 32, 64, FULL, "bfloat16")
    plan = make_backward_plan(problem, device=H200, deterministic=deterministic, backend="hopper")
    assert (plan.cast_sms > 0) == polls
    prepared = launch._prepare(plan, torch.zeros(16, 1024, 32, 64, dtype=torch.bfloat16))
    assert mains[-1]["cast_trigger"] == casts[-1]["poll"] == polls
    assert prepared.main.cast_trigger == prepared.main.takes_turns == polls
    counted_kernel = mains[-1]["variant"].endswith(hopper.NONDET_COUNTED_SUFFIX)
    assert counted_kernel == (counted and not deterministic)
    if polls:
        assert prepared.dq_counts.tolist() == plan.schedule.dq_tile_counts().tolist()
        assert prepared.parts[3] == prepared.main.flag_count + 1
    else:
        assert prepared.dq_counts is None and prepared.parts[3] == prepared.main.flag_count


def test_hopper_launch_refuses_a_plan_it_has_no_kernel_for(monkeypatch) -> None:
    """A plan for a sliding window handed to the hopper launcher (the planner gives it to
    triton) raises NotImplementedError on every call, not only the first."""
    from dash_attn.backends.hopper import launch
    from dash_attn.plan import H200, Problem, make_backward_plan
    from dash_attn.schedule import Mask

    window = Mask(causal=True, window_left=64, window_right=0)
    plan = make_backward_plan(Problem(1, 300, 300, 2, 2, 128, window, "bfloat16"), device=H200)
    assert plan.backend == "triton"
    plan = dataclasses.replace(plan, backend="hopper")
    monkeypatch.setattr(launch, "_launches", {})
    q = torch.zeros(1, 300, 2, 128, dtype=torch.bfloat16)
    for _ in range(2):
        with pytest.raises(NotImplementedError, match="sliding windows run on the triton"):
            launch.run_backward(plan, q, q, q, q, q, torch.zeros(1, 2, 300), 0.1)


def test_pair_rows_groups_a_fragments_pairs_by_row() -> None:
    """The row-addressed dK/dV store's plan: thread 0's pairs by row, in order of first
    appearance, with their first columns; a pair that is not two neighbours is refused."""
    from dash_attn.backends.hopper.bwd_epilogue import pair_rows

    coords = [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    assert pair_rows(coords, 4) == [(0, [(0, 0), (2, 8)]), (8, [(1, 0), (3, 8)])]
    with pytest.raises(ValueError, match="pair 1"):
        pair_rows([(0, 0), (0, 1), (8, 1), (8, 2)], 2)
    with pytest.raises(ValueError, match="pair 0"):
        pair_rows([(0, 0), (1, 1)], 1)


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [True, False])
def test_drain_ticket_adds_one_barrier_in_det_mode(deterministic: bool, tmp_path: Path) -> None:
    """drain_ticket ("_dr") gives the deterministic kernel one more mbarrier (initialised,
    arrived on by the dQ writer after a chain's last release, waited on by the producer before
    a dynamic ticket) and leaves the non-deterministic kernel as it was; drain_at_turn ("_dt")
    has the same barrier, its arrival moved from after the release to after the turn wait."""
    counts, ptxs = {}, {}
    variants = ("t128_xm24r_sm2_fs_dq2", "t128_xm24r_sm2_fs_dq2_dr", "t128_xm24r_sm2_fs_dq2_dt")
    for variant in variants:
        config = (64, torch.bfloat16, True, deterministic)
        ptxs[variant] = _compile(config, tmp_path / variant, variant).__ptx__
        ops = (r"mbarrier\.init", r"mbarrier\.try_wait", r"mbarrier\.arrive")
        counts[variant] = [len(re.findall(op, ptxs[variant])) for op in ops]
    shipped, drained, at_turn = counts.values()
    extra = 1 if deterministic else 0
    assert drained == [n + extra for n in shipped], counts
    assert at_turn == drained, counts
    if deterministic:
        # The writer's code from its turn wait (the acquire loop) to its release: _dr's extra
        # arrival comes after the release, _dt's before the bulk reduce.
        for variant, after_release in ((variants[1], True), (variants[2], False)):
            ptx = ptxs[variant]
            release = ptx.index("red.release.gpu")
            turn = ptx.rindex("ld.acquire.gpu", 0, release)
            reduce = ptx.index("cp.reduce.async.bulk", turn)
            assert ("mbarrier.arrive" in ptx[release : release + 2000]) == after_release
            assert ("mbarrier.arrive" in ptx[turn:reduce]) != after_release


def test_kernel_over_the_shared_memory_limit_raises(monkeypatch, tmp_path: Path) -> None:
    """The shipped hd-64 kernel takes all 232448 bytes of shared memory a CTA may have (with
    its dK/dV staging buffer); under a lower limit its compile stops with the bytes it needs
    instead of a kernel that fails at launch."""
    from dash_attn.backends.hopper import bwd

    monkeypatch.setattr(bwd, "SMEM_LIMIT", 232_447)
    with pytest.raises(ValueError, match="need 232448 bytes of shared memory, more than the 2324"):
        _compile((64, torch.bfloat16, False, True), tmp_path)


def test_kernel_mixins_define_each_method_once() -> None:
    """The kernels' warp roles are mixins of one class (``bwd_producer``, ``bwd_step``, ...;
    ``fwd_producer``, ``fwd_consumer``): a method defined in two of them, or in one and in the
    class, would be silently shadowed by the method resolution order."""
    from dash_attn.backends.hopper.fwd import HopperFwd

    for kernel in (HopperAttnBwd, HopperFwd):
        owners: dict[str, list[str]] = {}
        for klass in kernel.__mro__[:-1]:  # (not object)
            for name, value in vars(klass).items():
                if callable(value) or isinstance(value, (staticmethod, classmethod)):
                    owners.setdefault(name, []).append(klass.__name__)
        twice = {name: where for name, where in owners.items() if len(where) > 1}
        assert len(kernel.__mro__) > 3 and twice == {}, (kernel.__name__, twice)
