#!/bin/bash
# Prepared in session 50, not run (no device was lent; about 8 minutes): the backward sweep at
# head dims 128 and 96 with the current kernels, four interleaved rounds, beside FA4 det and
# non-det. `python -m tools.targets_table` takes each config from the newest committed run: at
# hd 128 that is session 50's three-round run (call 3; d128 full 512 read 0.99x with rounds
# from 0.85x to 1.02x), at hd 96 session 39's. Commit r/bwd128 and r/bwd96 (bench.csv gzipped
# beside bench.json) and regenerate the README's targets section from them.
# Run after session48-06c1ec2/next-not-run/run.sh and tests.sh.
#   bash benchmarks/results/h200/session50-5723982/next-not-run/sweep.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "$(dirname "${BASH_SOURCE[0]}")/sweep.sh" "$R/"
el kit
for HD in 128 96; do
  timeout 280 python3 -m dash_attn bench --mode bwd --headdims $HD --no-determinism --no-model \
    --hidden 2048,96:3072 --providers dash_hopper_auto,dash_hopper_nondet,fa4_det,fa4_nondet \
    --rounds 4 --repeat-check 0 --no-plot --deadline-s 260 --commit "$COMMIT" \
    --out-dir "$R/bwd$HD" > "$R/bwd$HD.log" 2>&1
  el "bench $HD rc $?"
  grep "^\[" "$R/bwd$HD.log" | cut -c1-220
done
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
