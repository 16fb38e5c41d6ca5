#!/bin/bash
# Prepared in session 65 (not run: no H200 came when asked for with needs_h200): the hd-64 and
# hd-128 backward sweeps on the kernels shipped now (hopper det auto and non-det beside FA4
# det / non-det, four interleaved rounds; session 60's H100 command), for the README's H200
# targets table, which still shows session 55's kernels. Results under
# benchmarks/results/h200/<session>/callN.
#   bash benchmarks/results/h200/session65/next-not-run/sweep_64_128.sh <commit>
#   (carry [".peers"], ~8 minutes)
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
el kit
for HD in 64 128; do
  timeout 235 python3 -m dash_attn bench --mode bwd --headdims $HD --no-determinism \
    --no-model --hidden 2048 --providers dash_hopper_auto,dash_hopper_nondet,fa4_det,fa4_nondet \
    --rounds 4 --repeat-check 0 --no-plot --deadline-s 215 --commit "$COMMIT" \
    --out-dir "$R/bwd$HD" > "$R/bwd$HD.log" 2>&1
  el "bench $HD rc $?"
  grep "^\[" "$R/bwd$HD.log" | cut -c1-220
  gzip -f "$R/bwd$HD.log"
done
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
