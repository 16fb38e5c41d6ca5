#!/bin/bash
# Session 65, call 5: "_dqk" (dq_ksplit: each warpgroup computes dQ for the whole Q tile over
# its own 64 KV rows, warpgroup 1 adds its partial to warpgroup 0's in the staging buffer, so
# the warpgroups no longer meet at a dS barrier every step; other dQ bits, the flash-attn rule
# is checked) on the hd-64 full det twin and counted kernel: 12 interleaved rounds beside FA4
# at full 4k and 2k (S/S_v > 1: the variant faster), then its step trace at 4k.
#   bash benchmarks/results/h100/session65/call5/run.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
el kit
timeout 220 python3 -m tools.hopper.variant_ab --suffix _dqk --headdim 64 --rounds 12 \
  --bits rule --rule-max 4096 4096:full 2048:full 2>&1 | grep -v -e UserWarning -e exe_args \
  > "$R/ab_dqk_d64.txt"
el "ab d64 rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check\|Error\|error" "$R/ab_dqk_d64.txt" | cut -c1-220
timeout 90 python3 tools/hopper/step_trace.py --headdim 64 --modes det --suffix _dqk \
  4096:full > "$R/trace_dqk_d64.txt" 2>&1
el "trace rc $?"; grep -e "^| \|^At the\|^##\|Error" "$R/trace_dqk_d64.txt" | cut -c1-160
gzip -f "$R"/trace*.txt "$R"/ab_*.txt
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
