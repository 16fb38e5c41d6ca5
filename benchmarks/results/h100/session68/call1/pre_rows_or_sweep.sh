#!/bin/bash
# Session 68's device call. On an H200: the H200 sweep for the README's H200 targets table
# (session 66's sweep_if_h200.sh, both head dims), then the preprocess probe if time is left.
# On an H100: the preprocess probe alone (tools/hopper/preprocess_rows_ab.py, ~2 minutes).
#   bash benchmarks/results/h100/session68/next-not-run/pre_rows_or_sweep.sh <commit>
#   (carry [".peers"]; results under benchmarks/results/<h100|h200>/session68/callN)
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
  LEFT=$(( 560 - ($(date +%s) - T0) ))
else
  LEFT=400
fi
if [ "$LEFT" -gt 60 ]; then
  timeout "$LEFT" python3 -m tools.hopper.preprocess_rows_ab --rounds 12 2>&1 | tee "$R/pre_rows.txt"
  el "pre_rows rc ${PIPESTATUS[0]}"
fi
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
