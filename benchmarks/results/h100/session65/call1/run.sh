#!/bin/bash
# Session 65, call 1: "_ss" (s_halves: each step's S^T issued as two GEMMs over the Q tile's
# halves, so that the first 32 exponentials start once the first half is done) on the hd-64
# full det twin and counted kernel, 12 interleaved rounds beside FA4 at full 4k and 2k, its
# step trace at 4k, and on the hd-128 full kernels below 8k keys, 8 rounds at 4k (S/S_v > 1:
# "_ss" faster; bits must stay equal).
#   bash benchmarks/results/h100/session65/call1/run.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
el kit
timeout 200 python3 -m tools.hopper.variant_ab --suffix _ss --headdim 64 --rounds 12 \
  --rule-max 0 4096:full 2048:full 2>&1 | grep -v -e UserWarning -e exe_args > "$R/ab_ss_d64.txt"
el "ab d64 rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check" "$R/ab_ss_d64.txt" | cut -c1-200
timeout 90 python3 tools/hopper/step_trace.py --headdim 64 --modes det --suffix _ss \
  4096:full > "$R/trace_ss_d64.txt" 2>&1
el "trace rc $?"; grep -e "^| \|^At the\|^##" "$R/trace_ss_d64.txt" | cut -c1-160
timeout 150 python3 -m tools.hopper.variant_ab --suffix _ss --headdim 128 --rounds 8 \
  --rule-max 0 4096:full 2>&1 | grep -v -e UserWarning -e exe_args > "$R/ab_ss_d128.txt"
el "ab d128 rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check" "$R/ab_ss_d128.txt" | cut -c1-200
gzip -f "$R"/trace*.txt "$R"/ab_*.txt
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
