#!/bin/bash
# Session 65, call 4: "_dve" (dv_early, session 62's second build: each step's dV GEMM issued
# once P^T is packed, before the dP^T wait, with dS^T from the 16-bit P^T, so dq/dk bits
# differ and the flash-attn rule is checked) on the hd-64 full det twin and counted kernel,
# never timed at hd 64 in that build: after the dS barrier only the dQ GEMMs would be left in
# the tensor pipe (session 64's trace: 940 cycles from the barrier to dQ done, dV's and dQ's
# of both warpgroups). 12 interleaved rounds beside FA4 at full 4k and 2k, and its step trace.
#   bash benchmarks/results/h100/session65/call4/run.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
el kit
timeout 220 python3 -m tools.hopper.variant_ab --suffix _dve --headdim 64 --rounds 12 \
  --bits rule --rule-max 4096 4096:full 2048:full 2>&1 | grep -v -e UserWarning -e exe_args \
  > "$R/ab_dve_d64.txt"
el "ab d64 rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check" "$R/ab_dve_d64.txt" | cut -c1-220
timeout 90 python3 tools/hopper/step_trace.py --headdim 64 --modes det --suffix _dve \
  4096:full > "$R/trace_dve_d64.txt" 2>&1
el "trace rc $?"; grep -e "^| \|^At the\|^##" "$R/trace_dve_d64.txt" | cut -c1-160
gzip -f "$R"/trace*.txt "$R"/ab_*.txt
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
