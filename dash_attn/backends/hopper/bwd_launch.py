"""Torch launcher for the Hopper CuTe-DSL backward (:mod:`.bwd`), with an in-memory compile cache.

Importing this module imports torch and cutlass only; kernels are compiled on first use, one per
(head dim, dtype, causal, deterministic, tiles, variant), and reused for every shape and
schedule. Every kernel is compiled from symbolic fake tensors and called through TVM-FFI
(``tvm_ffi`` is imported when the first kernel compiles): the torch tensors go to the compiled
function as they are, ~20 us of host time per call.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from dataclasses import dataclass
from typing import Any

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64
from cutlass.cute.runtime import make_fake_stream

from ...schedule import TABLE_FIELDS
from . import (
    BWD_DET_TWIN,
    NONDET_COUNTED_SUFFIX,
    bwd_variant,
    counted_nondet_twins,
    kernel_cache,
)
from ._tensor_args import TORCH_TO_CUTLASS, fake_tensor, tma_view
from .bwd import SUPPORTED_HEAD_DIMS, SUPPORTED_TILES, HopperAttnBwd
from .dq_cast import scale_cast_fragments

# Kernel variants by name: compile-time options of HopperAttnBwd (see its constructor) and,
# per head dim, the tiles (block_m, block_n) they run with (the schedule tables must be built
# with the same tiles). The shipped one per head dim and mask is ``hopper.BWD_VARIANT``;
# tools/hopper/check_bwd.py --variants checks and times them side by side. Earlier variants
# (sessions 5-8: swizzled dQ alone, the 3-deep ring, the plain-number and DLPack launches, ...)
# are in git history (commit b09bcda) and benchmarks/NOTES.md.
VARIANTS: dict[str, dict[str, Any]] = {
    # Session 9: 128 x 128 tiles at hd 64 (FA4's tile there), 64 x 128 at hd 128; the dQ
    # partial staged and accumulated in fragment order (16-byte stores, one flat bulk reduce
    # per step; the final cast decodes the layout). (Session 8's other changes, edge-only
    # masks, stmatrix dS, metadata from the ring slot, FA4's dV/dS order, 32-bit dK/dV stores,
    # the early table reads and the late ticket, are every kernel's now; its dQ tile, 128-byte
    # swizzled row-major, "t128_smq" and "t128_dq2", is in git history at aca05d6.)
    "t128_fq": {"tiles": {64: (128, 128)}},
}
# Two dQ staging buffers (dS single-buffered to make room).
VARIANTS["t128_fq2"] = {**VARIANTS["t128_fq"], "dq_double": True}
# (The exponentials in their own pass after the FMAs that feed them, split_exp "t128_fqx", no
# faster: ptxas interleaves them already; git history at 102690c.)
# Session 10: FA4's 80 x 128 tiles at hd 128 (dQ computed transposed, one dQ buffer); the
# plan gives them to full masks only (causal keeps 64 x 128, as FA4).
VARIANTS["t80_fq"] = {**VARIANTS["t128_fq"], "tiles": {64: (128, 128), 128: (80, 128)}}
# Session 11: FA4's per-warpgroup dQ hand-off (each warpgroup's half reduced on its own) on
# each shipped variant.
for _name in ("t128_fq", "t128_fq2", "t80_fq"):
    VARIANTS[_name.replace("_fq", "_wg")] = {**VARIANTS[_name], "dq_wg": True}
# Session 15: the dQ turn taken while the step is computed (early_turn) on each of those
# (shipped at hd 64; slower with two dQ buffers: NOTES item 59).
# (LSE2 and delta read into registers in a fragment-order layout, stat_frag, measured
# 0.91-0.99x: git history, 0da812d.)
for _name in ("t128_wg", "t128_wg2", "t80_wg"):
    VARIANTS[_name.replace("_wg", "_et")] = {**VARIANTS[_name], "early_turn": True}
# (Session 15: S^T and dP^T awaited together, P^T and dS^T in one block, joint_wait "t128_ej",
# "t128_jw2", "t80_jw": 0.97-1.06x, no faster, benchmarks/NOTES.md item 60; git history at
# 102690c.)
# Session 16: the last exponentials after the dP^T wait, beside the dS arithmetic (exp_tail).
# (64 exponentials per thread and step at hd 64, 32 at hd 128 causal, 40 at hd 128 full.)
for _tail in (16, 24, 32, 40, 48):
    VARIANTS[f"t128_xt{_tail}"] = {**VARIANTS["t128_et"], "exp_tail": _tail}
for _tail in (8, 16):
    VARIANTS[f"t128_xw{_tail}"] = {**VARIANTS["t128_wg2"], "exp_tail": _tail}
    VARIANTS[f"t80_xt{_tail}"] = {**VARIANTS["t80_wg"], "exp_tail": _tail}
# Session 16: the step's tile indices read before S^T/dP^T are issued (early_meta): no
# measurable effect; shipped at hd 64 with exp_tail 24 (t128_xm24, as checked and swept), not
# at hd 128 (t80_em, t128_em2). (Delta read into registers before the exponentials,
# early_delta, measured 0.97-1.00x at hd 128: git history, faace62.)
VARIANTS["t128_xm24"] = {**VARIANTS["t128_xt24"], "early_meta": True}
VARIANTS["t80_em"] = {**VARIANTS["t80_wg"], "early_meta": True}
VARIANTS["t128_em2"] = {**VARIANTS["t128_wg2"], "early_meta": True}
# Session 20: at 80-row tiles a second dQ staging buffer (dq_double), made room for by dO in
# one buffer (do_single) and dS in one (dq_double's), so that a partial waiting for its turn
# holds one of two buffers; the warpgroups' dS hand-over guarded by a barrier (ds_guard).
# t80_do1 is do_single alone (what dO's single buffer costs), t128_wg2g the shipped hd-128
# causal kernel with the guard.
VARIANTS["t80_do1"] = {**VARIANTS["t80_wg"], "do_single": True}
VARIANTS["t80_wg2"] = {**VARIANTS["t80_do1"], "dq_double": True, "ds_guard": True}
VARIANTS["t128_wg2g"] = {**VARIANTS["t128_wg2"], "ds_guard": True}
# Session 21: the chain's dK/dV stores with one bounds test and row address per fragment row,
# the chain's indices read at its last step only (dkv_row_ptr), on each of session 20's shipped
# variants (shipped at hd 128; at hd 64 slower in det mode from 8k tokens: NOTES item 95).
for _name in ("t128_xm24", "t80_wg", "t80_wg2", "t128_wg2g"):
    VARIANTS[_name + "r"] = {**VARIANTS[_name], "dkv_row_ptr": True}
# Session 22: k of every n exponentials by a polynomial on the FMA pipe (exp_poly; degree 5,
# "d3" degree 3), on the shipped variants of each head dim and mask: "_p14" is 1 of 4.
for _name in ("t128_xm24", "t80_wgr", "t80_wg2r", "t128_wg2gr"):
    for _k, _n in ((1, 4), (1, 3), (2, 5), (1, 2)):
        VARIANTS[f"{_name}_p{_k}{_n}"] = {**VARIANTS[_name], "exp_poly": (_k, _n)}
    VARIANTS[f"{_name}_p25d3"] = {**VARIANTS[_name], "exp_poly": (2, 5), "exp_poly_degree": 3}
# 1 of 5, 6 and 8, and 1 of 4 at degree 3, on the 80-row kernels (hd 128 full), where 1 of 4
# measured faster from 8k keys.
for _name in ("t80_wgr", "t80_wg2r"):
    for _n in (5, 6, 8):
        VARIANTS[f"{_name}_p1{_n}"] = {**VARIANTS[_name], "exp_poly": (1, _n)}
    VARIANTS[f"{_name}_p14d3"] = {**VARIANTS[_name], "exp_poly": (1, 4), "exp_poly_degree": 3}
# Session 22: early_meta (tile indices before the GEMMs) on the shipped hd-128 kernels. (With
# early_lse, the LSE2 rows read into registers while S^T runs, "_el" and "_eml": 0.92-0.97x det;
# git history at 102690c.)
for _name in ("t80_wgr", "t80_wg2r", "t128_wg2gr"):
    VARIANTS[_name + "_em"] = {**VARIANTS[_name], "early_meta": True}
# Session 25: dK/dV through shared memory (the K/V tiles) as 16-byte row chunks (dkv_smem).
# (dV alone stored while the last step's dQ and dK GEMMs run, early_dv, "_ev", measured less:
# git history, 2fbfb69.)
for _name in ("t128_xm24r", "t80_wgr_p14", "t80_wg2r_p14", "t128_wg2gr"):
    VARIANTS[_name + "_sm"] = {**VARIANTS[_name], "dkv_smem": True}
    VARIANTS[_name + "_sm2"] = {**VARIANTS[_name + "_sm"], "dkv_smem_unroll": 2}
# Session 26: deterministic kernels store each dQ tile's rank-0 partial instead of adding it, so
# the preprocess zeroes only the flags (dq_first_store), on the shipped variants.
for _name in ("t128_xm24r_sm2", "t80_wgr_p14_sm2", "t128_wg2gr_sm2", "t80_wg2r_p14"):
    VARIANTS[_name + "_fs"] = {**VARIANTS[_name], "dq_first_store": True}
# Session 26 (not timed yet): the main kernel launched as a programmatic dependent of the
# preprocess and the dQ cast of the main kernel (pdl, FA4's launches), on those.
for _name in ("t128_xm24r_sm2_fs", "t80_wgr_p14_sm2_fs", "t128_wg2gr_sm2_fs", "t80_wg2r_p14_fs"):
    VARIANTS[_name + "_pdl"] = {**VARIANTS[_name], "pdl": True}
# Session 28: under dynamic dispatch the next ticket only once the chain's last dQ turn is
# released (drain_ticket, "_dr": the fa3 and descending orders on causal masks; shipped there in
# session 29), on the variants without do_single (whose barrier it reuses).
for _name in ("t128_xm24r_sm2_fs", "t80_wgr_p14_sm2_fs", "t128_wg2gr_sm2_fs"):
    VARIANTS[_name + "_dr"] = {**VARIANTS[_name], "drain_ticket": True}
# Session 29 (not shipped): at hd 64 the deterministic kernel costs 3-4% over the
# non-deterministic one from 8k tokens (session 28's run), where both run the same tables. Slack
# for the writer's turns: two dQ staging buffers (dS single-buffered, with the dS guard,
# "_dq2"), the turn taken after the partial is written (early_turn off, "_nt"), and both.
VARIANTS["t128_xm24r_sm2_fs_dq2"] = {
    **VARIANTS["t128_xm24r_sm2_fs"], "dq_double": True, "ds_guard": True,
}  # fmt: skip
VARIANTS["t128_xm24r_sm2_fs_nt"] = {**VARIANTS["t128_xm24r_sm2_fs"], "early_turn": False}
VARIANTS["t128_xm24r_sm2_fs_nt2"] = {**VARIANTS["t128_xm24r_sm2_fs_dq2"], "early_turn": False}
VARIANTS["t128_xm24r_sm2_fs_dq2_dr"] = {**VARIANTS["t128_xm24r_sm2_fs_dq2"], "drain_ticket": True}
# Session 29: the drain's arrival at the chain's last turn instead of after its adds
# (drain_at_turn, "_dt"), on the causal kernels then shipped (shipped in session 30).
# (Session 30, measured and not kept, code in git history at fc8ff44: warpgroup 0 computing both
# dQ halves, dq_wg0 "_q0"; LSE2/delta shuffled between lanes, stat_shfl "_ss"; dS per ring
# stage beside two dQ buffers, ds_staged "_ds2"; benchmarks/NOTES.md items 138-141. The
# exponentials after the dP^T wait re-tuned, exp_tail 16-48 on the shipped hd-64 kernels, "_x16"
# ... "_x48": within the rounds' spread, item 143; variants in git history at 414c0da.)
for _name in ("t128_xm24r_sm2_fs_dq2", "t128_wg2gr_sm2_fs"):
    VARIANTS[_name + "_dt"] = {**VARIANTS[_name], "drain_ticket": True, "drain_at_turn": True}
# (Session 31, measured and not kept, code in git history at 21ecbdb: LSE2 and delta written in
# lane order by the preprocess and read with one 128-bit load per four values, stat_vec "_sv":
# 0.97-1.02x at hd 64, 0.98-1.04x at hd 128, the same shared-load wavefronts; NOTES item 145.)
# Two dQ warps, one per staging buffer (dq_writers=2, "_w2"), on the shipped kernels with two
# staging buffers (all but hd 128 full below 8k keys): deterministic runs take them
# (``hopper.BWD_DET_TWIN``).
for _name in (
    "t128_xm24r_sm2_fs_dq2", "t128_xm24r_sm2_fs_dq2_dt", "t80_wg2r_p14_fs", "t128_wg2gr_sm2_fs_dt",
):  # fmt: skip
    VARIANTS[_name + "_w2"] = {**VARIANTS[_name], "dq_writers": 2}
# (Sessions 33-34, measured and not kept: the hd-64 det twins with dS per ring stage and no dS
# guard, ds_staged "_ds2_w2", 0.96-0.99x, code in git history at e616bec; the next step's S^T
# issued once this step's dQ GEMM is done, st_prefetch "_sp", 0.91-0.95x (0.98-0.99x issued
# after the dQ hand-off), code in git history at f1921c2; benchmarks/NOTES.md items 156-157.)
# Session 40: head dims 192 and 256 with the swapped dK/dV layout (dkv_swap; FA4's tiles there,
# 64 x 96 and 64 x 48), one dQ staging buffer, dO single-buffered, rank-0 partials stored;
# "_et" takes the dQ turn while the step is computed.
VARIANTS["sw_fs"] = {
    "tiles": {192: (64, 96), 256: (64, 48)}, "dq_wg": True, "do_single": True,
    "dkv_swap": True, "dq_first_store": True,
}  # fmt: skip
VARIANTS["sw_et_fs"] = {**VARIANTS["sw_fs"], "early_turn": True}
# Two dQ warps sharing the one staging buffer (dq_shared_writers): one warp's wait for its adds
# to land and its release overlap the other's turn and reduce. Deterministic runs take it
# (hopper.BWD_DET_TWIN; session 41).
VARIANTS["sw_w2_fs"] = {**VARIANTS["sw_et_fs"], "dq_writers": 2}
# Session 47: the next chain's K/V prefetched into L2 with the loads of the chain's last step
# (kv_prefetch=0, "_kp"; static dispatch only), on the hd-64 kernels and their twins (shipped
# there: NOTES items 249-250). (Three steps before the last, and the same at hd 96/128, in git
# history at d12b58c.)
for _name in ("t128_xm24r_sm2_fs", "t128_xm24r_sm2_fs_dq2", "t128_xm24r_sm2_fs_dq2_dt"):
    VARIANTS[_name + "_kp"] = {**VARIANTS[_name], "kv_prefetch": 0}
    if _name != "t128_xm24r_sm2_fs":
        VARIANTS[_name + "_kp_w2"] = {**VARIANTS[_name + "_kp"], "dq_writers": 2}
# Session 47: the chain's dK/dV staged in a buffer of their own (dkv_stage, "_st"), so that
# K/V are free at the start of the chain's epilogue, on the hd-64 kernels (shipped on all of
# them: NOTES item 251).
for _name in (
    "t128_xm24r_sm2_fs_kp", "t128_xm24r_sm2_fs_dq2_kp", "t128_xm24r_sm2_fs_dq2_kp_w2",
    "t128_xm24r_sm2_fs_dq2_dt_kp", "t128_xm24r_sm2_fs_dq2_dt_kp_w2",
):  # fmt: skip
    VARIANTS[_name + "_st"] = {**VARIANTS[_name], "dkv_stage": True}
# (Session 48, measured and not kept: the staged dK/dV leave by TMA stores from one thread per
# warpgroup, dkv_tma "_st_tma": the same bits, 0.975-1.000x det; code in git history at
# ab35427, benchmarks/NOTES.md item 256.)
# Session 48: the same staging at hd 96 (162 KiB used, 48 KiB more), on its kernel and twin
# (their names serve hd 128 causal too, which has no room: the constructor refuses it there).
for _name in ("t128_wg2gr_sm2_fs_dt", "t128_wg2gr_sm2_fs_dt_w2"):
    VARIANTS[_name + "_st"] = {**VARIANTS[_name], "dkv_stage": True}
    # With the next chain's K/V prefetched too (neutral at hd 96 alone, session 47).
    VARIANTS[_name + "_st_kp"] = {**VARIANTS[_name + "_st"], "kv_prefetch": 0}
# Session 55 (prepared, not timed): the shipped hd-128 full kernels with every exponential on
# MUFU ("_mufu", exp_poly off), to time session 22's exp_poly (1, 4) again on the kernels
# shipped now: their exponentials' FFMAs wait on the LSE2 loads (benchmarks/NOTES.md item 300).
# The shipped hd-128 full kernels: below 8k keys, from 8k non-det, from 8k det (its twin).
_D128_FULL = ("t80_wgr_p14_sm2_fs", "t80_wg2r_p14_fs", "t80_wg2r_p14_fs_w2")
for _name in _D128_FULL:
    VARIANTS[_name + "_mufu"] = {**VARIANTS[_name], "exp_poly": (0, 1)}
# Session 56 (timed in call 4): options the shipped hd-128 full kernels do not take, each alone
# on top of them, again on the kernels shipped now: the next chain's K/V prefetched ("_kp"), the
# step's tile indices read before the GEMMs ("_em"), the last 16 / 32 exponentials after the
# dP^T wait ("_xt16", "_xt32"); "_kf" below.
# "_kf": K/V on the chain's first ring barrier, each step's S^T GEMM before its flags are read.
_KF = {"kv_on_full": True, "gemm_before_flags": True}
for _name in _D128_FULL:
    VARIANTS[_name + "_kp"] = {**VARIANTS[_name], "kv_prefetch": 0}
    VARIANTS[_name + "_em"] = {**VARIANTS[_name], "early_meta": True}
    for _tail in (16, 32):
        VARIANTS[f"{_name}_xt{_tail}"] = {**VARIANTS[_name], "exp_tail": _tail}
    # K/V on the chain's first ring barrier ("_kf0"), and each step's S^T GEMM before its
    # flags are read ("_kf"). Calls 4-5 (an H100, NOTES item 308) timed them slower, "_kf"
    # 0.95-1.00x det and 0.95-0.99x non-det at full 2k-8k, "_kf0" 0.93-1.02x and 0.93-0.96x,
    # with the chain's dK/dV zeroing if-converted into 128 selects in every step. Fixed, timed
    # again in session 57 (call 1): "_kf" 1.006-1.018x det, "_kf0" 0.975-1.012x; "_kf" ships.
    VARIANTS[_name + "_kf0"] = {**VARIANTS[_name], "kv_on_full": True}
    VARIANTS[_name + "_kf"] = {**VARIANTS[_name], **_KF}
# Session 57: "_kf" on the hd-64 full kernels (base, det twin, non-det twin). Shipped at hd 64
# and 128 (hopper.BWD_VARIANT, which gives the measurements).
_D64_FULL = (
    "t128_xm24r_sm2_fs_dq2_kp_st", "t128_xm24r_sm2_fs_dq2_kp_w2_st", "t128_xm24r_sm2_fs_kp_st",
)  # fmt: skip
# And on the causal kernels of hd 64 and hd 128 (with their det twins): 1.4-3.0% faster det
# from 4k keys; shipped in session 58, once the GQA split's dK add was an explicit FMA
# (hopper.BWD_VARIANT_LONG's comment says why that mattered).
_CAUSAL_64_128 = (
    "t128_xm24r_sm2_fs_dq2_dt_kp_st", "t128_xm24r_sm2_fs_dq2_dt_kp_w2_st",
    "t128_wg2gr_sm2_fs_dt", "t128_wg2gr_sm2_fs_dt_w2",
)  # fmt: skip
for _name in _D64_FULL + _CAUSAL_64_128:
    VARIANTS[_name + "_kf"] = {**VARIANTS[_name], **_KF}
# Session 58: the shipped hd-128 full kernels (base, long, its det twin) with the step's tile
# indices and edge test read before the S^T wait ("_kf_em", early_meta; then no shared load
# sits between that wait and the first FFMA).
for _name in _D128_FULL:
    VARIANTS[_name + "_kf_em"] = {**VARIANTS[_name + "_kf"], "early_meta": True}
# Session 56: the shipped hd-128 full kernels with another ptxas setting ("ptxas", passed as
# --ptxas-options). Compiled on the CPU (non-det, det with the cast trigger): -O2 gives the
# same SASS as the default -O3; register-usage levels 0-3 give one other code (1888 / 1976
# instructions against 1832 / 1912, no spills), 4-5 the default's, 6-10 one that spills
# (20 / 26 local-memory instructions). "_ru0", the first: det 0.98-0.99x, non-det 0.98-1.00x
# the shipped kernels at full 2k-16k (session56-644086d call6, an H100; NOTES item 309).
for _name in _D128_FULL:
    VARIANTS[_name + "_ru0"] = {**VARIANTS[_name], "ptxas": "--register-usage-level=0"}
# Session 63: the hd-128 full kernel below 8k keys with two dQ warps sharing its one staging
# buffer (dq_writers=2 with early_turn, as sw_w2_fs; prepared as "_dw2" in session 62): each
# warp takes every other step, so one warp's wait for its adds to land and its release overlap
# the other's turn and reduce. Shipped as that kernel's det twin (hopper.BWD_DET_TWIN) and so
# in its counted non-det kernel; the kernel before it and its counted twin stay registered
# (_DET_TWIN_BEFORE_63) for A/Bs and the probes below, which ran on them.
VARIANTS["t80_wgr_p14_sm2_fs_w2_kf"] = {
    **VARIANTS["t80_wgr_p14_sm2_fs_kf"], "dq_writers": 2, "early_turn": True,
}  # fmt: skip
# And the long kernel's det twin (from 8k keys) with the dQ turn taken while the step is
# computed ("_et", early_turn), as the one-buffer twin has it: bits equal; det 1.014x at full
# 8k and 1.008x at 16k (every round faster), its counted non-det kernel 0.995x / 1.002x, in
# interleaved rounds beside FA4 (session63 call 5, ab_et_long.txt, an H100). Shipped; the
# twin before it and its counted kernel stay registered.
VARIANTS["t80_wg2r_p14_fs_w2_kf_et"] = {**VARIANTS["t80_wg2r_p14_fs_w2_kf"], "early_turn": True}
# The det twins as they were before session 63 (the probes of sessions 61-62 ran on them and
# their counted kernels).
_DET_TWIN_BEFORE_63 = {
    **BWD_DET_TWIN,
    "t80_wgr_p14_sm2_fs_kf": "t80_wgr_p14_sm2_fs_kf",
    "t80_wg2r_p14_fs_kf": "t80_wg2r_p14_fs_w2_kf",
}
# Session 59: the counted non-deterministic kernels ("_nc", nondet_first_store;
# ``hopper.counted_nondet_twin``, shipped as ``hopper.BWD_NONDET_TWIN``), one per shipped
# variant: the kernel of its det twin, whose options they keep (in deterministic mode the option
# changes nothing); and those of the det twins before session 63.
_COUNTED_DET_KERNELS = {
    *(BWD_DET_TWIN.get(_name, _name) for _name in counted_nondet_twins()),
    *(_DET_TWIN_BEFORE_63.get(_name, _name) for _name in counted_nondet_twins()),
}
for _det in sorted(_COUNTED_DET_KERNELS):
    VARIANTS[_det + NONDET_COUNTED_SUFFIX] = {**VARIANTS[_det], "nondet_first_store": True}
# Sessions 58-65's probes of the step's order on these kernels, none faster than the shipped
# step, left the kernel in session 67 with their options (code in git history at 8a7b4f3;
# benchmarks/NOTES.md items 326-374 have their numbers): LSE2 rows read while S^T runs
# ("_le*", lse_early), dK before the dS barrier ("_dke", dk_early) or at the next step ("_dkd",
# dk_defer), dP^T issued late ("_dpl", dp_late), dV before the dP^T wait ("_dve", dv_early), a
# barrier at each step's top ("_ts", top_sync), the step without its element-wise work
# ("_noew", skip_elementwise), the rotated loop ("_rot", rotate), the warpgroups staggered
# ("_sg", wg_stagger), bf16 by truncation ("_pt1", "_pt2", pack_truncated) and S^T in two
# halves ("_ss", s_halves).
# Session 63 (a probe): the hd-64 full det twin and its counted kernel with 1 of 4 / 1 of 8
# exponentials by the FMA pipe's polynomial ("_p14", "_p18", exp_poly): at d64 full 4k the
# step goes to the stretch from S^T to the dS barrier (NOTES item 358); session 22 timed
# exp_poly at hd 64 slower on the kernels of then. Other last bits. Slower again: "_p14"
# 0.973x det / 0.969x non-det, "_p18" 0.976x / 0.992x at d64 full 4k (session63 calls 7-8).
_D64_FULL_4K = ("t128_xm24r_sm2_fs_dq2_kp_w2_st_kf", "t128_xm24r_sm2_fs_dq2_kp_w2_st_kf_nc")
for _name in _D64_FULL_4K:
    for _n in (4, 8):
        VARIANTS[f"{_name}_p1{_n}"] = {**VARIANTS[_name], "exp_poly": (1, _n)}
# Session 64 (a probe): the hd-64 full det twin and counted kernel with more of each thread's
# 64 exponentials after the dP^T wait (exp_tail 48 / 64; 24 shipped), beside the dS^T
# arithmetic they can interleave with: before that wait the exponentials run back to back, one
# MUFU every 8 cycles with nothing else to issue (the compiled step's stall counts).
for _name in _D64_FULL_4K:
    for _tail in (48, 64):
        VARIANTS[f"{_name}_xt{_tail}"] = {**VARIANTS[_name], "exp_tail": _tail}
# Session 65 (a probe): the same two hd-64 kernels under other ptxas register-usage levels
# ("_ru0": levels 0-3 give one other code, 2432 instructions against 2360; "_ru6": levels
# 6-10 another, 2368; neither spills), as session 56 timed "_ru0" at hd 128.
for _name in _D64_FULL_4K:
    for _level in (0, 6):
        VARIANTS[f"{_name}_ru{_level}"] = {
            **VARIANTS[_name], "ptxas": f"--register-usage-level={_level}"
        }  # fmt: skip
# (Session 71, measured in session 72 and not kept: K held in registers as S^T's A operand at
# hd 64, k_regs "_kr" on the det twins and counted kernels: the same bits, 0.968x [0.959, 1.016]
# det at d64 full 4k, 0.967x causal 4k, 3.171 against 3.029 ms under Nsight Compute with 4% fewer
# shared-memory wavefronts; code in git history at f1b274c, benchmarks/NOTES.md item 391.)
# Launcher-level keys of a variant (not kernel options): its tiles and ptxas flags.
_LAUNCH_KEYS = ("tiles", "ptxas")
DEFAULT_TILES = (64, 128)


def variant_tiles(variant: str, head_dim: int) -> tuple[int, int]:
    """(block_m, block_n) of ``variant`` at ``head_dim``."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (known: {sorted(VARIANTS)})")
    return VARIANTS[variant].get("tiles", {}).get(head_dim, DEFAULT_TILES)


def dq_first_store(variant: str) -> bool:
    """Whether ``variant``'s deterministic kernel stores each dQ tile's rank-0 partial (so the
    accumulator needs no zero fill where every tile has a rank-0 step)."""
    return bool(VARIANTS[variant].get("dq_first_store"))


def counts_nondet_adds(variant: str) -> bool:
    """Whether ``variant``'s non-deterministic kernel stores each dQ tile's first partial and
    counts every add on the tile's semaphore (``HopperAttnBwd``'s nondet_first_store): then,
    as a deterministic kernel, it needs no zero fill where every tile has a rank-0 step, may
    run with the polled dQ cast beside it, and reports a timed-out wait."""
    return bool(VARIANTS[variant].get("nondet_first_store"))


def takes_turns(variant: str, deterministic: bool) -> bool:
    """Whether ``variant``'s kernel in this mode waits on and releases the dQ semaphores."""
    return deterministic or counts_nondet_adds(variant)


def programmatic_launches(variant: str) -> bool:
    """Whether ``variant``'s main kernel is launched as a programmatic dependent (PDL) of the
    preprocess, and the dQ cast of the main kernel (``HopperAttnBwd``'s ``pdl``)."""
    return bool(VARIANTS[variant].get("pdl"))


def dq_acc_shape(q_shape: tuple[int, ...], q_tiles: int, block_m: int) -> tuple[int, ...]:
    """The fp32 dQ accumulator's shape for q of ``q_shape`` (b, s, h, d): one tile of
    ``block_m * head_dim`` values in fragment order (``dq_fragment``) per Q tile and head."""
    batch, _, heads, head_dim = q_shape
    return (batch, heads, q_tiles, block_m * head_dim)


def cast_dq(
    dq_acc: torch.Tensor,
    softmax_scale: float,
    dtype: torch.dtype,
    *,
    seqlen_q: int,
    block_m: int,
) -> torch.Tensor:
    """dq (batch, seqlen_q, heads, head_dim) in ``dtype`` from ``hopper_bwd_main``'s
    accumulator: ``dq_acc * softmax_scale``, decoded from fragment order."""
    return scale_cast_fragments(dq_acc, softmax_scale, dtype, seqlen_q, block_m)


def _variant_options(variant: str) -> dict[str, Any]:
    """The kernel constructor options of ``variant`` (the same at every head dim)."""
    return {k: v for k, v in VARIANTS[variant].items() if k not in _LAUNCH_KEYS}


def _fake_kernel_args(dtype: type[cutlass.Numeric], head_dim: int, dq_last: int) -> list:
    """Fake tensors in the order of ``HopperAttnBwd.__call__``'s tensor parameters: q, k, v,
    dout (b, s, h, head_dim), lse2 and delta (b * h, rows_pad) fp32, dq_acc fp32 (4-D, last
    dim ``dq_last``: block_m * head_dim, in fragment order), dk, dv like q
    and k, the dK/dV accumulator (1-D fp32), flags and the six int32 tables (1-D). The head dim
    is static (the kernel is compiled per head dim; a tensor with another one is refused by
    TVM-FFI)."""
    return [
        *(fake_tensor(dtype, 4, head_dim, 16) for _ in range(4)),
        *(fake_tensor(Float32, 2, cute.sym_int(), 16) for _ in range(2)),
        fake_tensor(Float32, 4, dq_last, 16),
        *(fake_tensor(dtype, 4, head_dim, 16) for _ in range(2)),
        fake_tensor(Float32, 1, cute.sym_int(), 16),
        *(fake_tensor(Int32, 1, cute.sym_int(), 4) for _ in range(1 + len(TABLE_FIELDS))),
    ]


def _check_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse2: torch.Tensor,
    delta: torch.Tensor,
    tables: dict[str, torch.Tensor],
    block_m: int,
    block_n: int,
    q_tiles: int,
    kv_tiles: int,
) -> None:
    """Clear errors for arguments the kernel cannot take (never asserts)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (batch, seqlen, heads, head_dim), got {t.dim()}-D"
            )
        if t.dtype not in TORCH_TO_CUTLASS:
            raise ValueError(f"{name} must be bfloat16 or float16, got {t.dtype}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype}, q has {q.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit stride in its last dimension")
        if t.data_ptr() % 16 or any(s * t.element_size() % 16 for s in t.stride()[:-1]):
            raise ValueError(f"{name} must have a 16-byte aligned base and strides (TMA)")
    batch, seqlen_q, heads, head_dim = q.shape
    _, seqlen_k, kv_heads, _ = k.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise NotImplementedError(
            f"head_dim={head_dim} is not supported by the Hopper backward "
            f"(supported: {SUPPORTED_HEAD_DIMS})"
        )
    if (block_m, block_n) not in SUPPORTED_TILES:
        raise NotImplementedError(
            f"tiles block_m={block_m}, block_n={block_n} are not supported (supported: "
            f"{SUPPORTED_TILES})"
        )
    if k.shape[0] != batch or k.shape[3] != head_dim or v.shape != k.shape:
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} do not match q {tuple(q.shape)}"
        )
    if dout.shape != q.shape:
        raise ValueError(f"dout {tuple(dout.shape)} must have q's shape {tuple(q.shape)}")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if q_tiles != -(-seqlen_q // block_m) or kv_tiles != -(-seqlen_k // block_n):
        raise ValueError(
            f"q_tiles={q_tiles}, kv_tiles={kv_tiles} do not tile seqlen_q={seqlen_q}, "
            f"seqlen_k={seqlen_k} with block_m={block_m}, block_n={block_n}"
        )
    rows_pad = q_tiles * block_m
    for name, t in (("lse2", lse2), ("delta", delta)):
        if t.dtype != torch.float32 or t.dim() != 2 or t.shape[0] != batch * heads:
            raise ValueError(
                f"{name} must be fp32 (batch * heads, rows_pad), got {t.dtype} {tuple(t.shape)}"
            )
        if t.shape[1] < rows_pad or t.shape[1] % 4 or not t.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous with rows_pad >= {rows_pad} rows, a multiple of 4; "
                f"got {tuple(t.shape)}"
            )
    for name in TABLE_FIELDS:
        if name not in tables:
            raise ValueError(f"tables is missing {name!r}")
        t = tables[name]
        if t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous() or t.device != q.device:
            raise ValueError(
                f"tables[{name!r}] must be a contiguous 1-D int32 tensor on {q.device}"
            )


def compile_bwd(
    dtype: torch.dtype,
    head_dim: int,
    *,
    causal: bool,
    deterministic: bool,
    block_m: int | None = None,
    block_n: int | None = None,
    arch: str = "sm_90a",
    extra_options: str = "",
    variant: str | None = None,
    dkv_sum: bool = False,
    cast_trigger: bool = False,
) -> Any:
    """Compile (or fetch) the kernel for q's ``dtype`` and ``head_dim``, the mask and the mode
    (``dkv_sum``: the GQA split's in-kernel dK/dV sums; ``cast_trigger``: the polled dQ cast
    may start beside it; both ``HopperAttnBwd``'s options, added to the variant's).

    Shapes, strides and schedule tables are runtime values, so the same kernel serves every
    problem; it is compiled from symbolic stand-ins, without a GPU. ``variant`` defaults to the
    shipped one, the tiles to the variant's. ``extra_options`` are further CuTe-DSL compile
    options (e.g. ``--keep-ptx --keep-cubin --dump-dir DIR`` for tests that inspect the code).
    """
    if dtype not in TORCH_TO_CUTLASS:
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    if variant is None:
        variant = bwd_variant(head_dim, causal, deterministic=deterministic)
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (known: {sorted(VARIANTS)})")
    tiles = variant_tiles(variant, head_dim)
    block_m, block_n = block_m or tiles[0], block_n or tiles[1]
    options = _variant_options(variant)
    if dkv_sum:
        options["dkv_sum"] = True
    if cast_trigger:
        options["cast_trigger"] = True
    ptxas = VARIANTS[variant].get("ptxas", "")
    key = (
        "bwd", head_dim, dtype, bool(causal), bool(deterministic), block_m, block_n, arch,
        extra_options, tuple(sorted(options.items())), ptxas,
    )  # fmt: skip
    flags = f"--gpu-arch {arch} --enable-tvm-ffi {extra_options}".strip()
    if ptxas:
        flags += f" --ptxas-options '{ptxas}'"

    # The tensors are fake (symbolic shapes and strides), the scalars typed placeholders and the
    # stream the caller's current one, read by TVM-FFI at every call (torch's current stream of
    # the tensors' device): nothing is specialised on a value.
    def build() -> Any:
        if importlib.util.find_spec("tvm_ffi") is None:
            raise ImportError(
                "the hopper backward launches through TVM-FFI, which is not installed "
                "(pip install 'apache-tvm-ffi>=0.1.15,<0.2')"
            )
        kernel = HopperAttnBwd(
            TORCH_TO_CUTLASS[dtype], head_dim, bool(causal), bool(deterministic), block_m,
            block_n, **options,
        )  # fmt: skip
        with warnings.catch_warnings():
            # The step's and the epilogue's loops over accumulator fragments are static on
            # purpose (each element is a register of its own), so the DSL's advice to make
            # them runtime loops (its DSLOptimizationWarning) does not apply: not shown.
            warnings.filterwarnings("ignore", message="This static loop has", category=Warning)
            return cute.compile(
                kernel,
                *_fake_kernel_args(kernel.dtype, head_dim, block_m * head_dim),
                Int32(1), Int32(1), Int32(1), Int32(1), Int32(0), Float32(1.0), Int64(1),
                make_fake_stream(use_tvm_ffi_env_stream=True),
                options=flags,
            )  # fmt: skip

    # Through the disk cache, except for compiles that keep PTX/SASS for inspection.
    return kernel_cache.compile_once(key, build, disk=not extra_options)


def _scalar_args(
    q_tiles: int,
    kv_tiles: int,
    num_chains: int,
    num_workers: int,
    dynamic: bool,
    softmax_scale: float,
    timeout_ns: int,
) -> tuple[int, int, int, int, int, float, int]:
    """The trailing scalars of ``HopperAttnBwd.__call__`` (before the stream), as plain Python
    numbers (TVM-FFI converts them in C)."""
    return (
        int(q_tiles), int(kv_tiles), int(num_chains), int(num_workers), 1 if dynamic else 0,
        float(softmax_scale), int(timeout_ns),
    )  # fmt: skip


def hopper_bwd_main(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse2: torch.Tensor,
    delta: torch.Tensor,
    tables: dict[str, torch.Tensor],
    *,
    block_m: int,
    block_n: int,
    num_workers: int,
    q_tiles: int,
    kv_tiles: int,
    num_chains: int,
    causal: bool,
    softmax_scale: float,
    deterministic: bool,
    dynamic: bool,
    timeout_ns: int,
    variant: str | None = None,
    dkv_heads: int | None = None,
    dkv_sum: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the persistent Hopper backward. Returns (dq_acc fp32 unscaled, dk, dv, status);
    ``cast_dq`` turns dq_acc into dq (its layout: ``dq_acc_shape``).
    ``dkv_heads``: the heads of the chains, k's (default) or q's (a GQA split: each chain reads
    K/V of its group). dk/dv have ``dkv_heads`` heads (a split's per-q-head partials), or
    with ``dkv_sum`` (a split whose kernel adds each group in q-head order) k's.

    Same contract as the Triton ``attn_bwd_main``: ``lse2``/``delta`` from the Triton
    preprocess with ``rows_pad >= q_tiles * block_m`` rows; static dispatch needs all
    ``num_workers`` CTAs co-resident (one per SM); ``status[1] == 1`` after the kernel means a
    dQ wait timed out and the gradients were poisoned with NaN.

    Every argument is checked here, on every call; a caller that runs one shape many times can
    check once and keep ``prepare_bwd``'s launch instead (``launch.run_backward`` does, per plan).
    """
    _check_args(q, k, v, dout, lse2, delta, tables, block_m, block_n, q_tiles, kv_tiles)
    if variant is None:
        variant = bwd_variant(q.shape[-1], causal, k.shape[1], deterministic)
    if dkv_heads is None:
        dkv_heads = k.shape[2]
    if dkv_heads not in (k.shape[2], q.shape[2]):
        raise ValueError(f"dkv_heads ({dkv_heads}) must be k's heads or q's heads")
    if dkv_sum and (dkv_heads != q.shape[2] or q.shape[2] == k.shape[2]):
        raise ValueError(
            "dkv_sum adds the per-q-head chains of a GQA split: it needs dkv_heads = q's "
            f"heads ({q.shape[2]}) and fewer kv heads ({k.shape[2]})"
        )
    expected_chains = q.shape[0] * dkv_heads * kv_tiles
    if num_chains != expected_chains:
        raise ValueError(
            f"num_chains={num_chains} but batch * dkv_heads * kv_tiles = {expected_chains}"
        )
    launch = prepare_bwd(
        q.shape, q.dtype, tables, block_m=block_m, block_n=block_n, num_workers=num_workers,
        q_tiles=q_tiles, kv_tiles=kv_tiles, num_chains=num_chains, causal=causal,
        deterministic=deterministic, dynamic=dynamic, timeout_ns=timeout_ns, variant=variant,
        dkv_heads=dkv_heads, dkv_sum=dkv_sum, kv_heads=k.shape[2], seqlen_k=k.shape[1],
    )  # fmt: skip
    return launch(q, k, v, dout, lse2, delta, softmax_scale)


@dataclass(frozen=True)
class BwdLaunch:
    """The main kernel with everything but the tensors and the softmax scale fixed: what
    ``hopper_bwd_main`` does per call once its arguments are checked. Made by ``prepare_bwd``;
    a caller that runs one shape many times keeps it (``launch.run_backward``: one per plan),
    since for a small backward the host time per call is as long as the GPU work."""

    compiled: Any
    tables: tuple[torch.Tensor, ...]  # TABLE_FIELDS order
    counts: tuple[int, int, int, int, int]  # q_tiles, kv_tiles, num_chains, num_workers, dynamic
    timeout_ns: int
    dq_shape: tuple[int, ...]
    dq_size: int
    flag_count: int
    dkv_heads: int  # of the chains: k's, or q's (GQA split)
    dkv_sum: bool  # a split whose kernel adds dK/dV per group (dk/dv with k's heads)
    cast_trigger: bool = False  # its CTAs let the polled dQ cast start beside it
    # Its dQ writers wait on and release the semaphores (deterministic, or a counted non-det
    # kernel): a wait may time out, raising the error flag.
    takes_turns: bool = False

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dout: torch.Tensor,
        lse2: torch.Tensor,
        delta: torch.Tensor,
        softmax_scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq_acc fp32 unscaled, dk, dv, status) as ``hopper_bwd_main`` returns them; q, k,
        v, dout must have the shapes and dtype the launch was prepared for."""
        # One zeroed allocation (one fill launch) for the fp32 dQ accumulator and, after it,
        # the int32 flags: ticket counter, error flag, one semaphore per dQ tile (and with
        # dkv_sum two per (batch, kv head, KV tile)).
        zeroed = torch.zeros(self.dq_size + self.flag_count, device=q.device, dtype=torch.float32)
        dq_acc, flags = self.split_zeroed(zeroed)
        dk, dv = self.launch(q, k, v, dout, lse2, delta, dq_acc, flags, softmax_scale)
        return dq_acc, dk, dv, flags[:2]

    def split_zeroed(self, zeroed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(dq_acc, flags): views of the zeroed fp32 buffer, the accumulator first, then the
        int32 flags (ticket counter, error flag, one semaphore per dQ tile)."""
        dq_acc = zeroed[: self.dq_size].view(self.dq_shape)
        flags = zeroed[self.dq_size : self.dq_size + self.flag_count].view(torch.int32)
        return dq_acc, flags

    def launch(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dout: torch.Tensor,
        lse2: torch.Tensor,
        delta: torch.Tensor,
        dq_acc: torch.Tensor,
        flags: torch.Tensor,
        softmax_scale: float,
        dkv_scratch: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Launch the main kernel on zeroed ``dq_acc`` and ``flags``; returns (dk, dv) with
        ``dkv_heads`` heads, or k's with ``dkv_sum``. ``dkv_scratch``: an fp32 buffer passed
        where the kernel takes the dK/dV sums' accumulator when it adds none, which the kernel
        then never reads or writes but with ``step_trace`` (a probe's clock stamps; by default
        a stand-in view of ``dq_acc``)."""
        batch, seqlen_k, kv_heads, head_dim = k.shape
        dkv_shape = (batch, seqlen_k, kv_heads if self.dkv_sum else self.dkv_heads, head_dim)
        dk = torch.empty(dkv_shape, device=k.device, dtype=q.dtype)
        dv = torch.empty(dkv_shape, device=v.device, dtype=q.dtype)
        if self.dkv_sum:
            # fp32 dK then dV of the kv heads: rank 0 of each sum stores, so no zero fill.
            dkv_acc = torch.empty(2 * dk.numel(), device=k.device, dtype=torch.float32)
        elif dkv_scratch is not None:
            dkv_acc = dkv_scratch
        else:
            dkv_acc = dq_acc.view(-1)  # not read: a stand-in of the right type
        # Tensors as they are (TVM-FFI checks dtype, rank, head dim, alignment and the stride
        # divisibility against the compiled signature); the stream is the current one.
        self.compiled(
            tma_view(q), tma_view(k), tma_view(v), tma_view(dout), lse2, delta,
            dq_acc, dk, dv, dkv_acc, flags, *self.tables, *self.counts, float(softmax_scale),
            self.timeout_ns,
        )  # fmt: skip
        return dk, dv


def prepare_bwd(
    q_shape: tuple[int, ...],
    dtype: torch.dtype,
    tables: dict[str, torch.Tensor],
    *,
    block_m: int,
    block_n: int,
    num_workers: int,
    q_tiles: int,
    kv_tiles: int,
    num_chains: int,
    causal: bool,
    deterministic: bool,
    dynamic: bool,
    timeout_ns: int,
    variant: str,
    dkv_heads: int,
    dkv_sum: bool = False,
    kv_heads: int = 0,
    seqlen_k: int = 0,
    cast_trigger: bool = False,
) -> BwdLaunch:
    """The ``BwdLaunch`` of q's shape (b, s, h, d) and dtype: the table sizes and counts
    checked, the kernel compiled (or fetched). ``dkv_heads``, ``dkv_sum``: as
    ``hopper_bwd_main``'s; ``dkv_sum`` needs k's ``kv_heads`` and ``seqlen_k`` (the dK/dV
    semaphores are per (batch, kv head, KV tile))."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    # Table sizes are metadata (no device sync); wrong sizes would make the kernel read past them.
    if tables["chain_start"].numel() != num_chains + 1 or tables["order"].numel() != num_chains:
        raise ValueError(
            f"tables['chain_start'] must have num_chains + 1 = {num_chains + 1} entries and "
            f"tables['order'] num_chains = {num_chains}"
        )
    if not dynamic and tables["worker_start"].numel() < num_workers + 1:
        raise ValueError(
            f"tables['worker_start'] has {tables['worker_start'].numel()} entries, static dispatch "
            f"on {num_workers} workers needs at least {num_workers + 1}"
        )
    if timeout_ns < 1:
        raise ValueError(f"timeout_ns must be >= 1, got {timeout_ns}")
    batch, _, heads, head_dim = q_shape
    dq_shape = dq_acc_shape(tuple(q_shape), q_tiles, block_m)
    if dkv_sum and not (0 < kv_heads < heads and -(-seqlen_k // block_n) == kv_tiles):
        raise ValueError(
            f"dkv_sum needs k's kv_heads (got {kv_heads}, q has {heads} heads) and seqlen_k "
            f"(got {seqlen_k}; {kv_tiles} KV tiles of {block_n})"
        )
    # The polled cast counts the releases: kernels without turns give none.
    turns = takes_turns(variant, deterministic)
    cast_trigger = bool(cast_trigger and turns)
    compiled = compile_bwd(
        dtype, head_dim, causal=causal, deterministic=deterministic, block_m=block_m,
        block_n=block_n, variant=variant, dkv_sum=dkv_sum, cast_trigger=cast_trigger,
    )  # fmt: skip
    # The kernel's trailing scalars in order; the softmax scale (scalars[5]) comes with each call.
    scalars = _scalar_args(q_tiles, kv_tiles, num_chains, num_workers, dynamic, 1.0, timeout_ns)
    return BwdLaunch(
        compiled=compiled,
        tables=tuple(tables[name] for name in TABLE_FIELDS),
        counts=scalars[:5],
        timeout_ns=scalars[6],
        dq_shape=dq_shape,
        dq_size=math.prod(dq_shape),
        flag_count=2 + batch * heads * q_tiles + (2 * batch * kv_heads * kv_tiles) * dkv_sum,
        dkv_heads=int(dkv_heads),
        dkv_sum=bool(dkv_sum),
        cast_trigger=cast_trigger,
        takes_turns=turns,
    )


@dataclass(frozen=True)
class FullBackward:
    """A whole hopper backward as three TVM-FFI launches (``bwd_pre_post``'s preprocess, the
    main kernel, the dQ cast) on one fp32 allocation for LSE2, delta, the dQ accumulator and the
    flags: what ``launch.run_backward`` runs per call for the fragment-order variants (all the
    shipped ones). Made by ``prepare_full``."""

    main: BwdLaunch
    preprocess: Any
    cast: Any
    rows_pad: int  # LSE2 / delta rows per (batch x head)
    # The allocation's parts in order, in fp32 words: LSE2 and delta (batch * heads * rows_pad
    # each), the dQ accumulator, the int32 flags, padding to whole 16-byte rows.
    parts: tuple[int, int, int, int, int]
    # Where the preprocess's zero fill starts: at the accumulator, or at the flags where the
    # kernel stores every tile's first partial (dq_first_store); it runs to the end.
    zero_start: int
    # The polled cast's per-tile contribution counts (``Schedule.dq_tile_counts``, on the
    # device), or None for the cast after the main kernel; with them the flags have one more
    # word, the polled cast's CTA counter.
    dq_counts: torch.Tensor | None = None
    # The polled cast's bound on each tile's wait (ns).
    cast_timeout_ns: int = 0

    @property
    def buf_size(self) -> int:
        return sum(self.parts)

    def __call__(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        softmax_scale: float,
        error_addr: int,
        launch_id: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv, flags); a timed-out dQ wait writes ``launch_id`` to the host-mapped
        word at ``error_addr`` (0: no word; ``flags[1]`` is the launch's flag either way)."""
        # One split of one allocation: each tensor object costs host microseconds, and a small
        # backward's host time is as long as its GPU time (benchmarks/NOTES.md, item 116).
        buf = torch.empty(self.buf_size, device=q.device, dtype=torch.float32)
        lse2, delta, dq_acc, flags, _ = buf.split_with_sizes(self.parts)
        lse2 = lse2.view(-1, self.rows_pad)
        delta = delta.view(-1, self.rows_pad)
        flags = flags.view(torch.int32)
        self.preprocess(
            tma_view(out), tma_view(dout), lse, lse2, delta, buf[self.zero_start :].view(-1, 4)
        )
        dq_acc = dq_acc.view(self.main.dq_shape)
        dk, dv = self.main.launch(q, k, v, dout, lse2, delta, dq_acc, flags, softmax_scale)
        dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)  # contiguous, as the fake op's
        if self.dq_counts is None:
            self.cast(dq_acc, dq, flags, float(softmax_scale), error_addr, launch_id)
        else:
            self.cast(
                dq_acc, dq, flags, self.dq_counts, float(softmax_scale), self.cast_timeout_ns,
                error_addr, launch_id,
            )  # fmt: skip
        return dq, dk, dv, flags


def prepare_full(
    main: BwdLaunch,
    q_shape: tuple[int, ...],
    dtype: torch.dtype,
    variant: str,
    *,
    zero_acc: bool = True,
    dq_counts: torch.Tensor | None = None,
    cast_timeout_ns: int = 0,
) -> FullBackward:
    """The ``FullBackward`` around ``main`` for q's shape and dtype.

    ``zero_acc=False`` leaves the dQ accumulator unzeroed (the flags are zeroed either way):
    only for a ``dq_first_store`` kernel that takes turns (deterministic, or a counted non-det
    one) whose tables give every dQ tile a rank-0 step (``Schedule.starts_every_dq_tile``),
    which then writes every tile first. ``dq_counts`` (int32 on the device, each dQ tile's
    contributions: the schedule's ``dq_tile_counts``) runs the polled cast beside the main
    kernel: only for a kernel prepared with ``cast_trigger``, whose CTAs let it start.
    ``cast_timeout_ns`` bounds each of the polled cast's waits for a tile (0: the main kernel's
    per-wait timeout). Its CTAs start with the main kernel and a tile the tables finish last is
    waited for about as long as the whole main kernel, so ``launch._prepare`` gives it the
    plan's timeout plus a bound of the main kernel's length."""
    if dq_counts is not None and not main.cast_trigger:
        raise ValueError("dq_counts: the main kernel does not let the polled cast start")
    if dq_counts is not None and main.dkv_sum:
        # Its CTA counter would sit where the dK/dV semaphores start.
        raise ValueError("dq_counts: the polled cast does not run beside a dkv_sum kernel")
    if dq_counts is not None and programmatic_launches(variant):
        # There the main kernel lets its dependent start before it waits for the preprocess,
        # which zeroes the flags: the cast could read the last call's semaphores.
        raise ValueError(f"dq_counts: the polled cast does not run after a pdl variant ({variant})")
    from .bwd_pre_post import compile_dq_cast, compile_preprocess

    batch, _, heads, head_dim = q_shape
    # The accumulator is (batch, heads, q_tiles, block_m * head_dim): its tiles are main's.
    q_tiles, tile_size = main.dq_shape[2:]
    block_m = tile_size // head_dim
    rows_pad = q_tiles * block_m
    cutlass_dtype = TORCH_TO_CUTLASS[dtype]
    pdl = programmatic_launches(variant)
    rows = batch * heads * rows_pad
    # rows_pad is a multiple of block_m and dq_size of block_m * head_dim: the accumulator and
    # the flags start on 16-byte boundaries, and the zeroed region is whole 16-byte rows.
    polled = dq_counts is not None
    flag_words = main.flag_count + polled
    padding = -flag_words % 4
    return FullBackward(
        main=main,
        preprocess=compile_preprocess(cutlass_dtype, head_dim, pdl=pdl),
        cast=compile_dq_cast(cutlass_dtype, head_dim, block_m, pdl=pdl, poll=polled),
        rows_pad=rows_pad,
        parts=(rows, rows, main.dq_size, flag_words, padding),
        zero_start=2 * rows + (0 if zero_acc else main.dq_size),
        dq_counts=dq_counts,
        cast_timeout_ns=int(cast_timeout_ns or main.timeout_ns),
    )
