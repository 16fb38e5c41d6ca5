#!/bin/bash
# Session 70, the second half of next-not-run/ncu_full4k.sh alone (too little device time was
# left for the whole): det `descending` beside `auto` (symmetric_shift) and non-det at hd 192 and
# 256, causal 8k/16k, three interleaved rounds (NOTES item 389). About 4 minutes.
#   bash benchmarks/results/h200/session70/next-not-run/desc_ab.sh <commit>   (carry [".peers"])
# Prepared in session 70, not run: no machine came (NOTES session 70).
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
timeout 330 python3 -m dash_attn bench --mode bwd --headdims 192,256 --masks causal \
  --seqlens 8192,16384 --no-determinism --no-model --hidden 2048,192:3072 \
  --providers dash_hopper_auto,dash_hopper_descending,dash_hopper_nondet \
  --rounds 3 --repeat-check 0 --no-plot --deadline-s 300 --commit "$COMMIT" \
  --out-dir "$R/bwd_causal" > "$R/bwd_causal.log" 2>&1
el "bench causal rc $?"
grep "^\[" "$R/bwd_causal.log" | cut -c1-220
gzip -f "$R/bwd_causal.log"
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
