#!/bin/bash
# The H200 sweep for the README's H200 targets table, which still shows session 55's kernels
# (prepared in session 65 as next-not-run/sweep_64_128.sh, since removed): hd 64 and 128
# backward, hopper det auto and non-det beside FA4 det / non-det, four interleaved rounds, 215 s
# a head dim. It runs only when the machine that came is an H200; on an H100 it stops after
# writing env.txt. Session 66 ran it twice: no machine, then an H100 (it stopped). Results under
# benchmarks/results/h200/<session>/callN, then `python -m tools.targets_table`.
#   [HDS="64"] bash benchmarks/results/h200/session66/next-not-run/sweep_if_h200.sh <commit>
#   (carry [".peers"], ~8 minutes on an H200, half that for one head dim)
# The card is checked before the kit is unpacked (session 68), so an H100 costs only the start.
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  mkdir -p "$R" && nvidia-smi --query-gpu=name --format=csv,noheader | tee "$R/gpu.txt"
  echo "not an H200: stop"; cd "$OUT" && tar czf r.tgz r && rm -rf r; exit 0
fi
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
for HD in ${HDS:-64 128}; do  # HDS="64": one head dim (215 s) when less time is left
  timeout 235 python3 -m dash_attn bench --mode bwd --headdims $HD --no-determinism \
    --no-model --hidden 2048 --providers dash_hopper_auto,dash_hopper_nondet,fa4_det,fa4_nondet \
    --rounds 4 --repeat-check 0 --no-plot --deadline-s 215 --commit "$COMMIT" \
    --out-dir "$R/bwd$HD" > "$R/bwd$HD.log" 2>&1
  el "bench $HD rc $?"
  grep "^\[" "$R/bwd$HD.log" | cut -c1-220
  gzip -f "$R/bwd$HD.log"
done
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
