#!/bin/bash
# Session 67, call 5, on whichever Hopper card came (the call named nvidia-h200). Results under
# benchmarks/results/<h200|h100>/session67/call5.
# - On an H200: the hd-64/128 backward sweep for the README's H200 targets table (as call 2).
# - On an H100: the shipped hd-64 full kernels on 64 x 128 tiles instead of 128 x 128
#   (`variant_ab --tiles 64x128`: their own plans and tables, other bits, so the rule is
#   checked), 8 interleaved rounds at full 4k and 2k: what half the Q rows per step costs or
#   gains before any change to the step itself.
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
  timeout 200 python3 -m tools.hopper.variant_ab --tiles 64x128 --headdim 64 --rounds 8 \
    --bits rule --rule-max 4096 4096:full 2048:full 2>&1 | grep -v -e UserWarning -e exe_args \
    > "$R/ab_t64_d64.txt"
  el "ab rc ${PIPESTATUS[0]}"; grep -e "^==\|^ab \|^   \|check\|Error\|error" "$R/ab_t64_d64.txt" | cut -c1-220
  gzip -f "$R"/ab_*.txt
fi
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
