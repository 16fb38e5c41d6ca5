#!/bin/bash
# Session 66, call 2: each warpgroup's dQ partial over its own KV rows, combined by the dQ
# warps (dq_partials; no dS barrier shared by the warpgroups): "_dpl" (two reduces in order)
# and "_dps" (added in shared memory, one reduce), on the hd-64 full det twin and counted
# kernel. 8 interleaved rounds beside FA4 at full 4k (other dQ bits: the flash-attn rule is
# checked, det repeats bitwise), each A/B under its own timeout (session 65's "_dqk" check
# hung), then each one's step trace.
#   bash benchmarks/results/h100/session66/call2/run.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
el kit
for S in _dpl _dps; do
  timeout 165 python3 -m tools.hopper.variant_ab --suffix $S --headdim 64 --rounds 8 \
    --bits rule --rule-max 4096 4096:full 2>&1 | grep -v -e UserWarning -e exe_args \
    > "$R/ab${S}_d64.txt"
  el "ab $S rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check\|Error\|error" "$R/ab${S}_d64.txt" | cut -c1-220
done
for S in _dpl _dps; do
  timeout 75 python3 tools/hopper/step_trace.py --headdim 64 --modes det --suffix $S \
    4096:full > "$R/trace${S}_d64.txt" 2>&1
  el "trace $S rc $?"; grep -e "^| \|^At the\|^##\|Error" "$R/trace${S}_d64.txt" | cut -c1-160
done
gzip -f "$R"/trace*.txt "$R"/ab_*.txt
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
