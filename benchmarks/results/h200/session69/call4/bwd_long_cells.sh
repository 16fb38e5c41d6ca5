#!/bin/bash
# Session 69, call 4 (the same warm H200): the four backward configs call 3's deadlines left
# out (full 8k and 16k at head dims 192 and 256), the same providers and rounds.
#   bash benchmarks/results/h200/session69/bwd_long_cells.sh <commit>   (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
timeout 330 python3 -m dash_attn bench --mode bwd --headdims 192,256 --masks full \
  --seqlens 8192,16384 --no-determinism --no-model --hidden 2048,96:3072,192:3072,256:2048 \
  --providers dash_hopper_auto,dash_hopper_nondet,fa4_det,fa4_nondet \
  --rounds 4 --repeat-check 0 --no-plot --deadline-s 300 --commit "$COMMIT" \
  --out-dir "$R/bwd_long" > "$R/bwd_long.log" 2>&1
el "bench rc $?"
grep "^\[" "$R/bwd_long.log" | cut -c1-220
gzip -f "$R/bwd_long.log"
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
