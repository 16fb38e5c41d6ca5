#!/bin/bash
# Prepared in session 66 as its call 6, not run (no H100 came, then too little device time was
# left to start one). It needs the probe's code, removed from the tree: first
#   git checkout 1cfbe4e -- dash_attn/backends/hopper/{bwd,bwd_step,bwd_sync,bwd_dq_writer,bwd_launch}.py
# (the kernel sources of 2eee6cd plus start_stagger), then put the results under
# benchmarks/results/h100/<session>/callN and restore the sources.
# "_dpnh" ("_dpn", the partials dropped, wrong dQ, with warpgroup 1
# started 2100 cycles after warpgroup 0, start_stagger): whether the warpgroups stay about half a
# step apart once nothing holds them in phase, and what the step is then. 6 interleaved rounds
# beside FA4 at full 4k (its rule check fails by construction), then its step trace.
#   bash benchmarks/results/h100/session66/next-not-run/run_dpnh.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
el kit
timeout 150 python3 -m tools.hopper.variant_ab --suffix _dpnh --headdim 64 --rounds 6 \
  --bits rule --rule-max 4096 4096:full 2>&1 | grep -v -e UserWarning -e exe_args \
  > "$R/ab_dpnh_d64.txt"
el "ab rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check\|Error\|error" "$R/ab_dpnh_d64.txt" | cut -c1-220
timeout 75 python3 tools/hopper/step_trace.py --headdim 64 --modes det --suffix _dpnh \
  4096:full > "$R/trace_dpnh_d64.txt" 2>&1
el "trace rc $?"; grep -e "^| \|^At the\|^##\|Error" "$R/trace_dpnh_d64.txt" | cut -c1-160
gzip -f "$R"/trace*.txt "$R"/ab_*.txt
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
