#!/bin/bash
# Session 69, call 2 (the H200 of call 1 still warm): the forward sweep on the kernels shipped
# now (the README's H200 forward rows are sessions 42-43's), hopper auto beside FA4, four
# interleaved rounds, every head dim. Results under benchmarks/results/h200/session69/call2.
#   bash benchmarks/results/h200/session69/fwd_sweep.sh <commit>   (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
for HD in 64 128 96 192 256; do
  timeout 110 python3 -m dash_attn bench --mode fwd --headdims $HD --no-determinism \
    --no-model --hidden 2048,96:3072,192:3072,256:2048 --providers dash_hopper_auto,fa4_det \
    --rounds 4 --repeat-check 0 --no-plot --deadline-s 95 --commit "$COMMIT" \
    --out-dir "$R/fwd$HD" > "$R/fwd$HD.log" 2>&1
  el "fwd $HD rc $?"
  grep "^\[" "$R/fwd$HD.log" | cut -c1-200
  gzip -f "$R/fwd$HD.log"
done
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
