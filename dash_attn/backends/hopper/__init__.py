"""The Hopper backend: warp-specialised CuTe-DSL kernels for sm_90 (``nvidia-cutlass-dsl``).

This module is pure Python: it says what the backend covers without importing cutlass, torch or
the kernels (``launch`` does, on first use). The kernels run the same ``BackwardPlan`` as the
Triton backend: the same schedule tables, with this backend's tiles.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING

from ..triton.tiles import BackwardTiles

if TYPE_CHECKING:
    from ...plan import DeviceInfo, Problem

# What the kernels are written and tested for (register and shared-memory budgets per head dim:
# README, "Hopper backend").
FWD_HEADDIMS = (64, 96, 128, 192, 256)
BWD_HEADDIMS = (64, 96, 128, 192, 256)  # the head dims of _BWD_TILES
# Tiles per (head dim, mask kind). One KV tile (block_n rows) is one chain; each of the two MMA
# warpgroups owns 64 of its rows; block_m query rows per step. num_warps counts the producer/dQ
# warpgroup too; num_stages is the depth of the Q/dO ring. At hd 128 the full mask takes FA4's
# 80-row Q tiles (a quarter more work per step for the same per-step costs; dQ is computed
# transposed), the causal mask keeps 64 rows, as FA4 does. At hd 96 both masks take 64 x 128,
# FA4's tile there (128 Q rows would need ~270 accumulator registers per MMA thread).
_BWD_TILES = {
    (64, "full"): BackwardTiles(block_m=128, block_n=128, num_warps=12, num_stages=2),
    (64, "causal"): BackwardTiles(block_m=128, block_n=128, num_warps=12, num_stages=2),
    (96, "full"): BackwardTiles(block_m=64, block_n=128, num_warps=12, num_stages=2),
    (96, "causal"): BackwardTiles(block_m=64, block_n=128, num_warps=12, num_stages=2),
    (128, "full"): BackwardTiles(block_m=80, block_n=128, num_warps=12, num_stages=2),
    (128, "causal"): BackwardTiles(block_m=64, block_n=128, num_warps=12, num_stages=2),
    # FA4's tiles at 192 and 256, with its step layout there (``HopperAttnBwd``'s dkv_swap).
    (192, "full"): BackwardTiles(block_m=64, block_n=96, num_warps=12, num_stages=2),
    (192, "causal"): BackwardTiles(block_m=64, block_n=96, num_warps=12, num_stages=2),
    (256, "full"): BackwardTiles(block_m=64, block_n=48, num_warps=12, num_stages=2),
    (256, "causal"): BackwardTiles(block_m=64, block_n=48, num_warps=12, num_stages=2),
}
# The kernel variant (compile-time options, ``bwd_launch.VARIANTS``) each (head dim, mask kind)
# runs: the fastest correct one of the side-by-side checks (benchmarks/results/h200/session*/
# variants). All of them: masks only in edge tiles, dS stored by stmatrix, FA4's dV/dS order,
# vector dK/dV stores, the dQ partial in fragment order handed over per warpgroup (one flat
# bulk reduce per warpgroup half and step), the TVM-FFI launch. At hd 64: the dQ turn taken
# while the step is computed (early_turn: 0.99-1.07x at hd 64 to 4k tokens, 0.98x at full
# 8k-16k, 0.96-1.00x at hd 128 causal: session15 call2/call3 bwd_ab*.txt, git history at
# 3547dd0), the last 24 of 64 exponentials after the dP^T wait (exp_tail: 1.03x geomean,
# session16 call1/call2 bwd_ab*.txt, git history at 85ebde9) and the tile indices read before
# the GEMMs (early_meta: no measurable effect, call3/call4; kept, as checked and swept). At hd
# 128 causal two dQ staging buffers (with the dS guard: no cost, bits equal, session20 call2
# wg2_ab.txt), at hd 128 full 80 x 128 tiles; at hd 128 the chain's dK/dV stores addressed per
# fragment row (dkv_row_ptr: kernel time at a fixed clock 1.00-1.05x of session 20's kernels,
# most at 512 tokens, session21-ce675c5 call5 ncu_ab.txt, git history at cd36427; at hd 64
# 0.93x in det mode at full 16k, so not there). At hd 128 full one exponential in four by a
# polynomial on the FMA pipe (exp_poly (1, 4), degree 5, as accurate as ex2.approx: kernel
# time at a fixed clock det 1.017-1.025x from 8k keys in three runs, 0.994-1.005x to 4k,
# non-det 1.010-1.017x; session22-cb74eeb call1-call3 poly_ab.txt; slower at hd 64 and no
# faster at hd 128 causal).
# Everywhere the chain's dK/dV leave through shared memory (dkv_smem: stmatrix into the K/V
# tiles, then 16-byte chunks of whole rows; the read-back loop unrolled by 2): kernel time at a
# fixed clock 1.05-1.12x at hd 128 causal 512-2k, 1.01x at 8k-16k, 1.07x at hd 128 full 512,
# 1.02-1.04x at 1k-4k, 1.03-1.10x at hd 64 to 4k and 1.01x at 16k (det; non-det up to 1.16x),
# bits equal (session25-814acab call2/call3 ev_ab.txt.gz; ev_check.txt in git history at bdb8aa2);
# at hd 64 with dkv_row_ptr, which it needs (one register then goes through local memory once
# per step at hd 64 causal det, measured faster all the same). Not at hd 128 full from 8k keys
# (0.94x).
# Everywhere, deterministic kernels store each dQ tile's rank-0 partial instead of adding it
# (dq_first_store, "_fs"), so the preprocess zeroes only the flags: GPU time of the whole
# backward at a fixed clock 1.06-1.08x at 512 tokens, 1.01-1.07x at 1k-2k, 1.00-1.01x from 8k
# (det; non-det unchanged), the same values (session26-851077a call2 fs_ab.txt.gz; fs_check.txt in
# git history at bdb8aa2).
# On causal masks a CTA under dynamic dispatch takes its next ticket only once its chain's last
# dQ turn is released (drain_ticket, "_dr"): the fa3 order at 2k 6.3x (hd 64) and 5.0x (hd 128)
# faster, descending 1.7x and 1.4x, 4k fa3 4.6x and 3.9x; static orders (auto's
# symmetric_shift) never wait for it; gradients bitwise equal (session29 call1 fa3_probe.txt).
# Its arrival comes once that turn is taken, not after its adds ("_dt", drain_at_turn): causal
# descending 1.13x at hd 64 512, 1.07x at 2k, 1.02x at 16k, 1.02-1.03x at hd 128 to 2k, fa3
# 0.99-1.01x, bits equal (session30 call1 dt_probe.txt).
# At hd 64 two dQ staging buffers (dq_double, dS single-buffered, with the dS guard: "_dq2"):
# whole backward det 1.03-1.05x at full 2k-16k, 1.01x at causal 2k-16k, bits equal (session29
# call5 d64_ab.txt; a late partial holds a buffer while the next step is ready: uneven steps
# and the bulk copy's read of the buffer, benchmarks/NOTES.md item 135).
# At hd 96 both masks run the hd-128 causal kernel at the same 64 x 128 tiles (K in 32-byte
# swizzled rows: each warpgroup's dQ GEMM reads 48 of its 96 columns); drain_ticket only
# matters under dynamic dispatch, which full masks take only when asked (fa3, descending).
# At hd 192 and 256 the swapped step (sw_fs: dkv_swap, FA4's tiles and layout there; one dQ
# staging buffer per warpgroup half, dO in one buffer). The dQ turn taken while the step is
# computed (early_turn) and the programmatic dependent launch (pdl) measured 0.96-1.02x of it,
# det, bits equal (session40-19760df/call4/ab_det.txt.gz), so neither (the det twin below takes
# early_turn only because its two dQ warps share one buffer).
# At hd 64 ("_kp", session 47) the producer prefetches the next chain's K/V into L2 with the
# loads of a chain's last step (static dispatch): a chain's first step waited for K/V from HBM
# (benchmarks/NOTES.md item 164). Bits equal (a cache hint only); det 1.008-1.028x at full
# 1k-8k and 1.024-1.025x causal 1k-2k in interleaved rounds, non-det 0.994-1.019x
# (session47-54b87c1 calls 1-2, kp_ab.txt.gz); at hd 96 and 128 0.99-1.02x, so not there.
# And
# ("_st") the chain's dK/dV leave through a buffer of their own (dkv_stage: the hd-64 kernels
# then take all 227 KiB), so K/V are freed at the epilogue's start: bits equal, det 1.002-1.023x
# at full 1k-8k and causal 1k-4k in 11 of 12 interleaved A/Bs (0.997x causal 4k), non-det
# 0.989-1.008x (calls 5-6, st_ab.txt.gz).
# And ("_kf", sessions 57-58) at hd 64 and 128: the chain's K/V arrive on its first step's ring
# barrier (kv_on_full, no barrier of their own to wait for), so each step issues its S^T GEMM
# right after the ring wait, before its flags are read (gemm_before_flags). Bits equal; det
# 1.018-1.051x at hd 64 full 2k-16k, 1.006-1.018x at hd 128 full 2k-16k, 1.014-1.030x causal
# 4k-16k at both, non-det 0.991-1.029x, in interleaved rounds on an H100 (session57-2a889b2
# calls 1-2, ab_kf*, in git history at 2a047ca); causal 1k-2k 0.996-1.014x det
# (session58-066a382 call1, ab_nokf*).
# Its tiles must equal _BWD_TILES' (tests check).
BWD_VARIANT = {
    (64, "full"): "t128_xm24r_sm2_fs_dq2_kp_st_kf",
    (64, "causal"): "t128_xm24r_sm2_fs_dq2_dt_kp_st_kf",
    (96, "full"): "t128_wg2gr_sm2_fs_dt",
    (96, "causal"): "t128_wg2gr_sm2_fs_dt",
    (128, "full"): "t80_wgr_p14_sm2_fs_kf",
    (128, "causal"): "t128_wg2gr_sm2_fs_dt_kf",
    (192, "full"): "sw_fs",
    (192, "causal"): "sw_fs",
    (256, "full"): "sw_fs",
    (256, "causal"): "sw_fs",
}
# From this many key tokens on, per (head dim, mask kind), the backward runs this variant
# instead: the same tiles and arithmetic (gradients bitwise equal to BWD_VARIANT's for every
# schedule, checked), only the kernels' waits differ. At hd 128 full, two
# dQ staging buffers, dO and dS single-buffered to make room (t80_wg2): det 1.03-1.04x t80_wg
# at 8k-16k, 0.98-0.99x at 2k-4k (session20 call2 wg2_ab.txt, boost clock); det / non-det at
# the sustained clock 0.969x at 8k and 0.972x at 16k (call3, session 19's t80_wg: 0.945x and
# 0.935x); with dkv_row_ptr and exp_poly as BWD_VARIANT's, and dq_first_store (t80_wg2r_p14_fs);
# with "_kf" as BWD_VARIANT's. Every variant of a (head dim, mask) must give the same bits: under
# a GQA split (the in-kernel dK/dV sums) "_kf" and the kernels without it once rounded the last
# q head's dK add differently (one FMA against a multiply and an add, the compiler's choice;
# session57-2a889b2 call 4, kf_bits.txt.gz, in git history at 2a047ca), so that add is an
# explicit FMA (bwd_epilogue), and the two are equal for every schedule with and without GQA
# (session58-066a382 call1).
BWD_VARIANT_LONG = {(128, "full"): (8192, "t80_wg2r_p14_fs_kf")}
# Deterministic backwards run, in place of these variants, their twins with two dQ warps
# (dq_writers=2, "_w2": warp 2 is a second dQ writer, each writer owns one staging buffer and
# takes every other step's turn). Same tiles and arithmetic: gradients bitwise equal for every
# schedule (session32-1f5e3a2 call1 w2_probe64.txt, w2_probe128.txt). Timed in interleaved
# triples beside FA4 (call2 ab_pairs.txt, median of 40 per-triple ratios; an A/A row read
# 0.994x): det 1.016-1.020x at hd 64 full 4k-16k, 1.015-1.025x causal 4k-16k, 1.024x at hd 128
# full 8k, 1.015x causal 16k, 1.00-1.07x elsewhere; non-det 0.98-0.99x at hd 64 full 4k-16k, so
# non-deterministic backwards kept one dQ warp (until session 59's counted kernels, below).
# At hd 128 full below 8k keys (one staging buffer) both dQ warps share the buffer and take
# their turns early, as at hd 192/256 below (session 63): bits equal, det 1.080x and counted
# non-det 1.046x the one-warp kernel at full 4k in interleaved rounds beside FA4, an H100
# (session63 call1, ab_dw2_d128.txt), where the step trace had the second MMA warpgroup wait
# a median 988 cycles of its 4792-cycle step for the dQ warp to free that buffer
# (trace_d128.txt, NOTES items 350 and 354).
BWD_DET_TWIN = {
    "t80_wgr_p14_sm2_fs_kf": "t80_wgr_p14_sm2_fs_w2_kf",
    "t128_xm24r_sm2_fs_dq2_kp_st_kf": "t128_xm24r_sm2_fs_dq2_kp_w2_st_kf",
    "t128_xm24r_sm2_fs_dq2_dt_kp_st_kf": "t128_xm24r_sm2_fs_dq2_dt_kp_w2_st_kf",
    # With the dQ turn taken early since session 63 (bwd_launch: 1.008-1.014x det at 8k-16k).
    "t80_wg2r_p14_fs_kf": "t80_wg2r_p14_fs_w2_kf_et",
    "t128_wg2gr_sm2_fs_dt": "t128_wg2gr_sm2_fs_dt_w2",
    "t128_wg2gr_sm2_fs_dt_kf": "t128_wg2gr_sm2_fs_dt_w2_kf",
    # Head dims 192 and 256: both dQ warps share the one staging buffer (a second does not
    # fit) and take their turns early. Det 1.05-1.25x sw_fs in interleaved rounds beside FA4
    # (session41-110f25b calls 3-4, nine configs, 192/256 x full/causal x 2k-16k), bits equal;
    # non-deterministic runs keep one dQ warp (two without turns: 0.975-1.024x of one at seven
    # configs, session42-8a8b3d3 call3/ab_nondet_w2.txt.gz).
    "sw_fs": "sw_w2_fs",
}
# Non-deterministic backwards run, in place of these variants, their counted kernels
# (``HopperAttnBwd``'s nondet_first_store, ``counted_nondet_twin``: ``<det twin>_nc``, the det
# twin's kernel with that option; ``BWD_NONDET_TWIN`` below). Before session 59 they ran the
# shipped kernels without turns (at hd 64 full the one-buffer kernel, ``BWD_NONDET_UNCOUNTED``),
# which added every dQ partial into a zero-filled accumulator and cast dQ after the main kernel:
# our non-det backward took 1.03-1.31x the time of our det one at 512-2k tokens (hd 64/128,
# H100, session58-066a382 call4), since only the det kernel stores each dQ tile's first partial
# (no zero fill) and has its dQ cast run beside it (POLLED_CAST_SMS), both through the dQ
# semaphores. A counted kernel stores the first partial too, lets the others add in arrival
# order once that store has landed, and counts every add on the semaphore, so its plan leaves
# SMs to the cast as a det plan does. Whole backwards in interleaved rounds beside the uncounted
# kernel, dk/dv bits equal (session59-9b623ea calls 1 and 3, counted_ab_d*.txt, H100; in git
# history at a85b24d):
# 1.07-1.22x at hd 64 512-4k, 1.02-1.05x at 8k-16k (full 16k under descending: 1.03x), 1.04-1.23x
# at hd 128 512-2k, 1.03-1.05x causal 8k-16k, 0.99x full 4k and 1.00x full 16k (within their
# rounds' spread), 1.09-1.11x at hd 96, 1.05x at hd 192 full 2k, 1.01x causal 8k (descending);
# and the det backward, the same kernel with every turn, within 0-3% of it (the fixed order's
# own cost). At hd 256 1.10x where the non-det auto runs static tables (full 512, causal 1k)
# but 0.90x / 0.93x where it takes descending (full / causal 4k: there each dQ hand-off is
# about a step long, NOTES items 241-244, and the counted kernel's wait for the adds to land
# before each release adds to it), so from ``NONDET_DESCENDING_MIN_SEQLEN_K`` on at the head dims of
# ``NONDET_UNCOUNTED_HEADDIMS`` the uncounted kernel runs.
BWD_NONDET_UNCOUNTED = {"t128_xm24r_sm2_fs_dq2_kp_st_kf": "t128_xm24r_sm2_fs_kp_st_kf"}
NONDET_UNCOUNTED_HEADDIMS = frozenset({256})
NONDET_COUNTED_SUFFIX = "_nc"
# The hopper forward at hd 64 runs three consumer warpgroups (192-row Q tiles) from this many
# query tokens on, per mask kind, two (128 rows) below. Both kernels timed beside FA4 in one
# run (session14-034bb82/call2-5b20d68/fwd_variants.txt, git history at 70f1578): the 192-row
# tile is 0.89-0.96x FA4 on full masks from 1k tokens (128 rows: 0.81-0.89x) and 0.92-0.96x on
# causal ones from 2k (128 rows: 0.78-0.87x); at causal 1k the 128-row tile is ahead (1.01x
# against 0.93x). At 512 (call1-9ef11df/fwd_time.txt): full 0.87x against 0.86x, causal 0.94x
# against 1.02x.
# At hd 96 three warpgroups' P and O do not fit in 160 registers (ptxas: 240 B of spills), so
# the 192-row tile there stages P through shared memory (``FWD_P_SMEM_HEADDIMS``, FA4's choice
# too). Timed against the 128-row kernel in interleaved rounds, both persistent, bitwise equal
# outputs (session38-ace4448/call1-ace4448 and call2 fwd96_psmem.txt, 32 heads x 16k tokens):
# full 0.97x / 0.99x / 1.10x / 1.12x / 1.18x / 1.16x at 512 / 1k / 2k / 4k / 8k / 16k, causal
# 0.87x / 0.85x / 0.99x / 1.02x / 1.08x / 1.10x.
# A shape always runs the same kernel; per mask kind, head dim -> query tokens.
FWD_3WG_MIN_SEQLEN = {"full": {64: 1, 96: 2048}, "causal": {64: 2048, 96: 4096}}
FWD_P_SMEM_HEADDIMS = frozenset({96})
# The hopper forward runs persistent (one CTA per SM walking the tiles, the next tile's loads
# and the last O store overlapped) up to this many key tokens, per mask kind and head dim; one
# CTA per tile above. Both kernels timed beside FA4 in one run, bitwise equal outputs. Full
# masks (session18-b97d714/call1-ad4e627-wip/fwd_ab.txt, git history at 70f1578): at hd 64
# persistent is 1.00-1.14x the per-tile kernel at 512-16k tokens (FA4: 0.89x -> 1.02x at 512,
# 0.92x -> 0.98x at 1k); at hd 128 1.18x at 512, 1.01-1.11x to 4k, 0.99x at 8k-16k. Causal
# masks, the CTAs walking tile lists made on the host (session19-c219362/call5-8b75135/
# fwd_causal_ab.txt, git history at b887b0f): at hd 64 1.04-1.18x at 1k-16k (FA4: 0.92x ->
# 1.04x at 2k, 0.92x -> 1.00x at 4k); at hd 128 1.17x at 1k, 1.04-1.11x to 8k, 0.985x at 16k.
# At hd 96 (session37-a31ae6c/call2-d5b21b1/fwd96_ab.txt, interleaved rounds, 32 heads x 16k
# tokens, bitwise equal): persistent 1.057x / 1.001x / 1.005x the per-tile kernel at full 2k /
# 8k / 16k, 1.109x / 1.052x / 1.009x causal.
FWD_PERSISTENT_MAX_SEQLEN_K = {
    "full": {64: 1 << 30, 96: 1 << 30, 128: 4096},
    "causal": {64: 1 << 30, 96: 1 << 30, 128: 8192},
}
# The per-tile causal forward launches its tiles in L2 groups of (batch, head) pairs, longest
# first (``lpt_order``, ``fwd_tiles.grouped_tile``) up to this many key tokens, per head dim; each
# head's tiles in turn above (the same bits either way: only which CTA runs a tile changes).
# Interleaved rounds of both orders beside FA4's forward, out and lse torch.equal on odd GQA
# shapes (session43-2d2ab7d/call1 and call2 fwd_lpt_ab*.txt, 16k tokens, hidden 2048): hd 256
# 1.088x / 1.102x / 1.104x at causal 2k / 4k / 8k, 1.042x at 1k, 0.980x at 512 (range
# 0.954-1.059, host-bound), 0.997x at 16k; hd 192 1.057x / 1.053x / 1.075x at 2k / 4k / 8k,
# 1.003x at 1k, 0.998x at 16k. At hd 128 the per-tile causal kernel runs from 8k on
# (``FWD_PERSISTENT_MAX_SEQLEN_K``), and there the grouped order read 0.9945x at 16k.
FWD_LPT_ORDER_MAX_SEQLEN_K = {192: 8192, 256: 8192}
# A non-deterministic backward whose schedule is "auto" runs ``descending`` (dynamic tickets,
# every chain walking its Q tiles top-down) from this many key tokens on, per mask kind and head
# dim, instead of the deterministic auto's static shift tables: a non-det dQ is summed in arrival
# order, so there the schedule decides speed only. At hd 256 the static tables' chains of
# different heads and Q tiles run side by side and lose L2 reuse of Q, dO and the dQ accumulator
# (Nsight Compute, causal 2 x 8192 x 8: 3.05 GB read from DRAM, L2 hit rate 85.7%, against 0.41
# GB and 98.1% for descending; session44-feb3973/call4). Interleaved rounds, 16k tokens, hidden
# 2048, static / descending (session44-feb3973 call3, call5 and call7 bwd*_sched.txt): hd 256
# full 1.056x / 1.098x / 1.108x / 1.14x at 1k / 2k / 4k / 8k, causal 0.970x / 1.222x / 1.091x /
# 1.399x / 1.142x at 1k / 2k / 4k / 8k / 16k; hd 192 causal 1.004x / 1.015x / 1.023x / 1.049x
# at 2k / 4k / 8k / 16k, full 0.983x / 1.002x at 2k / 4k; hd 64 and 128 0.96-1.05x (not listed).
NONDET_DESCENDING_MIN_SEQLEN_K = {"full": {256: 1024}, "causal": {192: 8192, 256: 2048}}
# Deterministic backwards with static dispatch at these head dims run on POLLED_CAST_SMS SMs
# fewer where the schedule's busiest worker then gets no more steps (the order-invariant
# tables give the same bits on any worker count), and their dQ cast runs beside the main kernel
# on the SMs left free (main kernels compiled with cast_trigger, bwd_pre_post's
# DqFragmentCastPolled; in the session-50 A/B the "_ct" variant names), waiting for
# each tile's last turn, instead of after it (~47 us per backward of 16k tokens x hidden 2048).
# Whole backwards in interleaved rounds beside FA4, bits equal (session50-5723982 call2
# ct64_ab.txt.gz, ct128_ab.txt.gz): det 1.042x / 1.031x / 1.013x at hd 64 full 1k / 2k / 4k,
# 1.069x causal 1k, 1.055x / 1.028x / 1.015x / 1.011x at hd 128 full 1k-8k; the shipped kernels
# on 4 SMs fewer alone 1.003x / 0.996x (aa_margin4.txt). Not under dynamic dispatch: hd 64 full
# 16k (descending) read 0.973x. Session 51 (session51-8c102d0 call2 polled_ab.txt.gz, the cast
# beside / after, 15 rounds, bits equal): hd 128 causal 16k / 8k 1.010x / 1.016x, hd 64 causal
# 16k 1.005x; hd 96 full 1k / 4k 1.044x / 1.018x, causal 2k / 16k 1.051x / 1.008x; hd 256 full
# 4k / causal 4k 1.019x / 1.029x; hd 192 full 8k 1.001x. (At hd 192 and 256 fewer configs keep
# their busiest worker's load on 4 workers fewer: full 4k-8k and causal 8k at 192, full 2k-8k
# and causal 4k and 16k at 256 on the sweep's grid.)
POLLED_CAST_HEADDIMS = (64, 96, 128, 192, 256)
POLLED_CAST_SMS = 4


# CUDA's limit on a grid's second and third axes.
MAX_GRID_Y = 65535


def _mask_kind(causal: bool) -> str:
    return "causal" if causal else "full"


def bwd_tiles(headdim: int, causal: bool) -> BackwardTiles:
    """The backward tiles of the hopper kernels for ``headdim`` (one of BWD_HEADDIMS) and the
    mask (full or causal: the hopper backward has no other)."""
    return _BWD_TILES[headdim, _mask_kind(causal)]


def bwd_variant(headdim: int, causal: bool, seqlen_k: int = 0, deterministic: bool = False) -> str:
    """The kernel variant (``bwd_launch.VARIANTS``) the backend runs for this head dim, mask,
    key length and mode (``BWD_VARIANT_LONG`` from its length on, ``BWD_VARIANT`` below; a
    ``seqlen_k`` of 0 asks for the latter; deterministic runs take its ``BWD_DET_TWIN``,
    non-deterministic ones its ``BWD_NONDET_TWIN``, the counted kernel, or its
    ``BWD_NONDET_UNCOUNTED`` where ``NONDET_UNCOUNTED_HEADDIMS`` says). Every variant of one
    (head dim, mask) has the same tiles and the same exponentials (``exp_poly``): the bits do
    not depend on the key length or the twin that picks it."""
    if headdim not in BWD_HEADDIMS:
        raise NotImplementedError(
            f"head_dim={headdim} is not supported by the Hopper backward "
            f"(supported: {list(BWD_HEADDIMS)})"
        )
    key = (headdim, _mask_kind(causal))
    long = BWD_VARIANT_LONG.get(key)
    name = long[1] if long is not None and seqlen_k >= long[0] else BWD_VARIANT[key]
    if deterministic:
        return BWD_DET_TWIN.get(name, name)
    if headdim in NONDET_UNCOUNTED_HEADDIMS and nondet_auto_schedule(headdim, causal, seqlen_k):
        return BWD_NONDET_UNCOUNTED.get(name, name)
    return BWD_NONDET_TWIN.get(name, name)


def counted_nondet_twin(variant: str) -> str:
    """The counted non-deterministic kernel of a shipped ``variant`` (``BWD_VARIANT``'s or
    ``BWD_VARIANT_LONG``'s): its ``BWD_DET_TWIN``'s kernel, or its own where it has none, with
    ``nondet_first_store`` (``bwd_launch.VARIANTS`` registers one per shipped variant).

    >>> counted_nondet_twin("t80_wgr_p14_sm2_fs_kf")
    't80_wgr_p14_sm2_fs_kf_nc'
    >>> counted_nondet_twin("sw_fs")
    'sw_w2_fs_nc'
    """
    return BWD_DET_TWIN.get(variant, variant) + NONDET_COUNTED_SUFFIX


def counted_nondet_twins() -> dict[str, str]:
    """Each shipped variant's counted non-deterministic kernel (``BWD_NONDET_TWIN``)."""
    shipped = {*BWD_VARIANT.values(), *(name for _, name in BWD_VARIANT_LONG.values())}
    return {name: counted_nondet_twin(name) for name in sorted(shipped)}


def nondet_counts_adds(headdim: int, causal: bool, seqlen_k: int) -> bool:
    """Whether the non-deterministic hopper backward of this head dim, mask and key length
    runs a counted kernel (``counted_nondet_twin``): it needs no zero fill of the dQ
    accumulator where every dQ tile has a first contribution, and its plan may leave SMs to a
    dQ cast beside it (``BackwardPlan.cast_sms``)."""
    variant = bwd_variant(headdim, causal, seqlen_k, deterministic=False)
    return variant.endswith(NONDET_COUNTED_SUFFIX)


# The kernel each shipped variant's non-deterministic backwards run (above).
BWD_NONDET_TWIN = counted_nondet_twins()


def nondet_auto_schedule(headdim: int, causal: bool, seqlen_k: int) -> str | None:
    """The schedule a non-deterministic hopper backward runs for ``schedule="auto"`` where it
    differs from the deterministic auto's (``NONDET_DESCENDING_MIN_SEQLEN_K``), else None."""
    min_seqlen = NONDET_DESCENDING_MIN_SEQLEN_K[_mask_kind(causal)].get(headdim)
    return "descending" if min_seqlen is not None and seqlen_k >= min_seqlen else None


@functools.cache
def cutlass_available() -> bool:
    """Whether ``nvidia-cutlass-dsl`` is installed (found, not imported; asked once, as every
    forward asks)."""
    return importlib.util.find_spec("cutlass") is not None


def unsupported(problem: Problem, device: DeviceInfo, direction: str) -> str | None:
    """Why the hopper kernels cannot run ``problem`` (``direction`` "fwd" or "bwd") on
    ``device``; None if they can."""
    if device.capability != (9, 0):
        where = "Triton's interpreter" if device.is_interpreter else f"sm_{device.capability}"
        return f"needs an sm_90 GPU (Hopper), this is {where}"
    if problem.is_varlen:
        return "has no kernels for packed sequences (varlen) yet; they run on triton"
    if problem.mask.kind == "local":
        return "has no kernels for sliding windows yet; they run on triton"
    headdims = FWD_HEADDIMS if direction == "fwd" else BWD_HEADDIMS
    if problem.headdim not in headdims:
        return f"{direction} head dims {list(headdims)}, not {problem.headdim}"
    if not problem.tma_aligned:
        return "needs 16-byte aligned base pointers and strides of q, k, v (and dout) for TMA"
    if direction == "bwd" and problem.batch * problem.heads > MAX_GRID_Y:
        # The backward's preprocess and dQ cast put batch x heads on the grid's second axis.
        return (
            f"batch x heads ({problem.batch} x {problem.heads}) is over {MAX_GRID_Y}, the "
            "grid axis its preprocess and dQ cast launch on; it runs on triton"
        )
    if direction == "fwd" and max(problem.batch, problem.heads) > MAX_GRID_Y:
        return f"batch and heads must be at most {MAX_GRID_Y} each (the forward's grid axes)"
    if not cutlass_available():
        return "nvidia-cutlass-dsl is not installed (pip install nvidia-cutlass-dsl)"
    return None
