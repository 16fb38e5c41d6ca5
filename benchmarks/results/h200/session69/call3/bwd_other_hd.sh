#!/bin/bash
# Session 69, call 3 (the same warm H200): the backward at head dims 96, 192 and 256 on the
# kernels shipped now (the README's H200 rows there are sessions 51, 45 and 56's), hopper det
# auto and non-det beside FA4 det / non-det, four interleaved rounds. Results under
# benchmarks/results/h200/session69/call3.
#   bash benchmarks/results/h200/session69/bwd_other_hd.sh <commit>   (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
for HD in 96 192 256; do
  timeout 125 python3 -m dash_attn bench --mode bwd --headdims $HD --no-determinism \
    --no-model --hidden 2048,96:3072,192:3072,256:2048 \
    --providers dash_hopper_auto,dash_hopper_nondet,fa4_det,fa4_nondet \
    --rounds 4 --repeat-check 0 --no-plot --deadline-s 110 --commit "$COMMIT" \
    --out-dir "$R/bwd$HD" > "$R/bwd$HD.log" 2>&1
  el "bench $HD rc $?"
  grep "^\[" "$R/bwd$HD.log" | cut -c1-220
  gzip -f "$R/bwd$HD.log"
done
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
