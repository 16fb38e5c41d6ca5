#!/bin/bash
# Prepared in session 50, not run (no device was lent; about 7-8 minutes): the dQ cast beside
# the main kernel (NOTES item 276). The "_ct" variants are the shipped kernels whose CTAs let
# the polled cast (bwd_pre_post.DqFragmentCastPolled) start at once; on a plan with sm_margin=4
# (128 workers: the same busiest-worker load as 132 at every sweep config, cpu/spare_sms.txt)
# its CTAs run on the 4 free SMs while the main kernel runs, each waiting for its tile's last
# turn, instead of all after it (~47 us per backward at every length).
# (1) The two GPU tests: the polled cast against the plain one (bits, CTA counter, a bounded
#     wait that times out and reports), and whole backwards with it at sm_margin=4 equal to the
#     shipped ones at sm_margin=0, repeats equal, also with a busy stream.
# (2) An A/A of the shipped kernels at sm_margin=4 (what 4 SMs fewer cost alone), then
#     `--suffix _ct --variant-sm-margin 4` beside FA4 at hd 64 and 128 (the >= 1.10x cells and
#     two long rows). Ship it (BWD_VARIANT + "_ct" for det, auto's plans on the free SMs) only
#     where it keeps the bits and is faster.
#   bash benchmarks/results/h200/session50-5723982/next-not-run/polled_cast.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "$(dirname "${BASH_SOURCE[0]}")/polled_cast.sh" "$R/"
el kit
timeout 150 python3 -m pytest -v -rA -p no:cacheprovider tests/backends/hopper/test_bwd_pre_post.py \
  -k "polled" > "$R/polled_tests.log" 2>&1
el "polled tests rc $?"; grep -E "PASSED|FAILED|ERROR|passed|failed" "$R/polled_tests.log" | cut -c1-200 | tail -12
AB="python3 -m tools.hopper.variant_ab --rounds 30"
timeout 100 $AB --suffix "" --variant-sm-margin 4 1024:full 2048:full 2>&1 \
  | grep -v -e UserWarning -e exe_args > "$R/aa_margin4.txt"
el "aa rc ${PIPESTATUS[0]}"; grep -e "^==" -e "check" -e "(>1" "$R/aa_margin4.txt" | cut -c1-160
timeout 200 $AB --suffix _ct --variant-sm-margin 4 512:full 1024:full 2048:full 4096:full \
  1024:causal 16384:full 2>&1 | grep -v -e UserWarning -e exe_args > "$R/ct64_ab.txt"
el "ct64 rc ${PIPESTATUS[0]}"; grep -e "^==" -e "check" -e "(>1" "$R/ct64_ab.txt" | cut -c1-160
timeout 150 $AB --headdim 128 --suffix _ct --variant-sm-margin 4 1024:full 2048:full 4096:full \
  8192:full 2>&1 | grep -v -e UserWarning -e exe_args > "$R/ct128_ab.txt"
el "ct128 rc ${PIPESTATUS[0]}"; grep -e "^==" -e "check" -e "(>1" "$R/ct128_ab.txt" | cut -c1-160
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
