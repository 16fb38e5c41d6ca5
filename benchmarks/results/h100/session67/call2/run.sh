#!/bin/bash
# Session 67, call 2: the hd-64/128 backward sweep (hopper det auto and non-det beside FA4 det /
# non-det, four interleaved rounds, 215 s a head dim) on the kernels shipped now, on whichever
# Hopper card came (the call named nvidia-h200; H100s come more often). On an H200 it is the
# README's H200 targets table, which still shows session 55's kernels; on an H100 it replaces
# session 63's sweep under the H100 table (run before the hd-128 full det twin's early dQ turn
# was shipped). Results under benchmarks/results/<h200|h100>/session67/call2, then
# `python -m tools.targets_table [--results benchmarks/results/h100]`.
#   bash benchmarks/results/session67-pending/run.sh <commit>   (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
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
