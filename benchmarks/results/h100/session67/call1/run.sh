#!/bin/bash
# Session 67, call 1, on whichever Hopper card came (the call named nvidia-h200; H100s come
# more often). Its results go under benchmarks/results/<h200|h100>/session67/call1.
# - On an H200: the hd-64/128 backward sweep for the README's H200 targets table, which still
#   shows session 55's kernels (session 66's next-not-run/sweep_if_h200.sh loop, unchanged).
# - On an H100: NOTES item 379's probe "_dpnh" ("_dpn", the two warpgroups' dQ partials
#   dropped, wrong dQ by construction, with warpgroup 1 started 2100 cycles after warpgroup 0).
#   Its code is not in the tree: .peers/dpnh.tgz (ignored, carried) holds 1cfbe4e's five
#   backward modules, unpacked over the copy on the device only.
#   bash benchmarks/results/session67-pending/run.sh <commit>   (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for HD in 64 128; do
    timeout 235 python3 -m dash_attn bench --mode bwd --headdims $HD --no-determinism \
      --no-model --hidden 2048 --providers dash_hopper_auto,dash_hopper_nondet,fa4_det,fa4_nondet \
      --rounds 4 --repeat-check 0 --no-plot --deadline-s 215 --commit "$COMMIT" \
      --out-dir "$R/bwd$HD" > "$R/bwd$HD.log" 2>&1
    el "bench $HD rc $?"
    grep "^\[" "$R/bwd$HD.log" | cut -c1-220
    gzip -f "$R/bwd$HD.log"
  done
else
  tar xzf .peers/dpnh.tgz && el "probe sources (1cfbe4e) unpacked"
  timeout 150 python3 -m tools.hopper.variant_ab --suffix _dpnh --headdim 64 --rounds 6 \
    --bits rule --rule-max 4096 4096:full 2>&1 | grep -v -e UserWarning -e exe_args \
    > "$R/ab_dpnh_d64.txt"
  el "ab rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check\|Error\|error" "$R/ab_dpnh_d64.txt" | cut -c1-220
  timeout 75 python3 tools/hopper/step_trace.py --headdim 64 --modes det --suffix _dpnh \
    4096:full > "$R/trace_dpnh_d64.txt" 2>&1
  el "trace rc $?"; grep -e "^| \|^At the\|^##\|Error" "$R/trace_dpnh_d64.txt" | cut -c1-160
  gzip -f "$R"/trace*.txt "$R"/ab_*.txt
fi
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
