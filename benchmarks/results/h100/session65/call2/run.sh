#!/bin/bash
# Session 65, call 2: what determinism costs at the full-mask 4k cells, kernel by kernel
# (det_cost.py: our det and non-det backwards and FA4's two, each kernel's GPU time, four
# interleaved rounds), and the hd-64 full det twin and counted kernel under two other ptxas
# register-usage levels ("_ru0", "_ru6": other SASS, no spills on the CPU), 8 interleaved
# rounds beside FA4 at full 4k (S/S_v > 1: the variant faster; bits must stay equal).
#   bash benchmarks/results/h100/session65/call2/run.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" benchmarks/results/h100/session65/call2/det_cost.py "$R/"
el kit
timeout 200 python3 benchmarks/results/h100/session65/call2/det_cost.py --rounds 4 \
  > "$R/det_cost.txt" 2>&1
el "det_cost rc $?"; grep -v -e Warning -e "^\s*$" "$R/det_cost.txt" | cut -c1-400 | tail -12
for lvl in 0 6; do
  timeout 120 python3 -m tools.hopper.variant_ab --suffix _ru$lvl --headdim 64 --rounds 8 \
    --rule-max 0 4096:full 2>&1 | grep -v -e UserWarning -e exe_args > "$R/ab_ru${lvl}_d64.txt"
  el "ab ru$lvl rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|check" "$R/ab_ru${lvl}_d64.txt" | cut -c1-200
done
gzip -f "$R"/ab_*.txt
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
