#!/bin/bash
# Session 70: where the two cells short of 1.10x FA4-det on the H200 lose their time (NOTES
# item 388: d64 full 4k 1.04x, d128 full 4k 1.06x; ours takes 0.948x and 1.021x FA4 non-det's
# time there). Nsight Compute, full set with SASS, base clock: ours det and non-det (auto plan)
# beside FA4 det and non-det at full 4k, hd 64 (4 x 4096 x 32) and hd 128 (4 x 4096 x 16), one
# backward each (tools/hopper/backwards_for_ncu.py). Session 55's d128 profile of its kernels
# (h200/session55-73abb0b/call4) is the same table for the kernels shipped then. Runs on the card
# that comes and says which in env.txt. Then a short A/B at hd 192 and 256 causal 8k/16k
# (det/non-det 0.93x at d192 16k and 0.78x at d256 8k, item 388, where the plan's whole units
# put 1.062x and 1.159x the mean on the busiest worker, item 389; the DAG model gives det
# `descending` 3.8% and 5.5% less makespan there at r = c/2): hopper det auto
# (symmetric_shift), det descending and non-det, three interleaved rounds. About 7 minutes.
#   bash benchmarks/results/h200/session70/next-not-run/ncu_full4k.sh <commit>   (carry [".peers"])
# Prepared in session 70, not run: no machine came (NOTES session 70).
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
SHAPES="4:4096:32:64:full 4:4096:16:128:full"
el kit
timeout 150 python3 tools/hopper/backwards_for_ncu.py $SHAPES > "$R/warm.txt" 2>&1; el "warm rc $?"
timeout 300 ncu --set full --import-source yes --clock-control base \
  -k regex:"HopperAttnBwd|FlashAttentionBackwardSm90" -f -o /tmp/f4k \
  python3 tools/hopper/backwards_for_ncu.py $SHAPES \
  > "$R/ncu_console.txt" 2>&1
el "ncu rc $?"; grep -v -e UserWarning -e exe_args "$R/ncu_console.txt" | tail -3
ncu --import /tmp/f4k.ncu-rep --page raw --csv 2>/dev/null | gzip > /tmp/raw_f4k.csv.gz
ncu --import /tmp/f4k.ncu-rep --page source --csv --print-source sass 2>/dev/null \
  | gzip > /tmp/src_f4k.csv.gz
S=tools/hopper/ncu_summary.py
L="d64 ours det,d64 ours nondet,d64 fa4 det,d64 fa4 nondet"
L="$L,d128 ours det,d128 ours nondet,d128 fa4 det,d128 fa4 nondet"
python3 $S --raw /tmp/raw_f4k.csv.gz --cut "$R/raw_f4k_cols.csv.gz"
python3 $S --raw /tmp/raw_f4k.csv.gz --table "$L" > "$R/table_f4k.txt" 2>&1
python3 $S --raw /tmp/raw_f4k.csv.gz --table "$L" --busiest 15 > "$R/busiest_f4k.txt" 2>&1
python3 $S --raw /tmp/raw_f4k.csv.gz --source /tmp/src_f4k.csv.gz --top 30 \
  > "$R/ncu_summary.txt" 2>&1
cut -c1-220 "$R/table_f4k.txt"; ls -la /tmp/raw_f4k.csv.gz /tmp/src_f4k.csv.gz
gzip -f "$R/ncu_console.txt" "$R/ncu_summary.txt"
timeout 200 python3 -m dash_attn bench --mode bwd --headdims 192,256 --masks causal \
  --seqlens 8192,16384 --no-determinism --no-model --hidden 2048,192:3072 \
  --providers dash_hopper_auto,dash_hopper_descending,dash_hopper_nondet \
  --rounds 3 --repeat-check 0 --no-plot --deadline-s 180 --commit "$COMMIT" \
  --out-dir "$R/bwd_causal" > "$R/bwd_causal.log" 2>&1
el "bench causal rc $?"
grep "^\[" "$R/bwd_causal.log" | cut -c1-220
gzip -f "$R/bwd_causal.log"
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
