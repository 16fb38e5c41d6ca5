#!/bin/bash
# Session 66, call 3: "_dps" again with the sum of the two warpgroups' partials split between
# the step's dQ warp and an adder warp (warp 3): call 2's trace had the MMA warpgroups waiting
# 4700 cycles a step for the buffers while one warp added 32 KB. 8 interleaved rounds beside
# FA4 at full 4k and 2k (the flash-attn rule, det repeats bitwise), under a timeout, then its
# step trace at 4k.
#   bash benchmarks/results/h100/session66/call3/run.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
el kit
timeout 200 python3 -m tools.hopper.variant_ab --suffix _dps --headdim 64 --rounds 8 \
  --bits rule --rule-max 4096 4096:full 2048:full 2>&1 | grep -v -e UserWarning -e exe_args \
  > "$R/ab_dps_d64.txt"
el "ab rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check\|Error\|error" "$R/ab_dps_d64.txt" | cut -c1-220
timeout 75 python3 tools/hopper/step_trace.py --headdim 64 --modes det --suffix _dps \
  4096:full > "$R/trace_dps_d64.txt" 2>&1
el "trace rc $?"; grep -e "^| \|^At the\|^##\|Error" "$R/trace_dps_d64.txt" | cut -c1-160
gzip -f "$R"/trace*.txt "$R"/ab_*.txt
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
