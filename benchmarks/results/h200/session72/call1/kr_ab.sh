#!/bin/bash
# Session 71: K in registers as the A operand of S^T at hd 64 (`k_regs`, the "_kr" variants of
# the shipped det twins and counted kernels; bwd_step.py): each of S^T's k-blocks then reads 4 KiB
# of shared memory instead of 6, a chain's first step loading K by ldmatrix and issuing S^T again.
# Compiled on the CPU without spills or serialised WGMMAs. The same bits (checked: torch.equal to
# the shipped kernels, det repeats), timed in 8 interleaved rounds beside FA4 det / non-det at
# d64 full 4k (the H200 cell at 1.04x of the 1.10x target), full 2k and causal 4k: about 4
# minutes. With NCU=1 (about 8 minutes in all), then Nsight Compute at full 4k, the two H200 cells
# short of 1.10x FA4-det: d64 (4 x 4096 x 32) ours det, non-det, det "_kr", then FA4 det and
# non-det; d128 (4 x 4096 x 16) ours det, non-det, FA4 det, non-det (session 70's
# ncu_full4k.sh without its hd-192/256 A/B; session 55's d128 table and session 60's H100 one are
# the same tables for the kernels of then). Runs on whichever Hopper card comes; env.txt says which.
#   NCU=1 bash benchmarks/results/session71-pending/kr_ab.sh <commit>   (carry [".peers"])
# With little device time left: AB_CONFIGS="4096:full" AB_ROUNDS=6 AB_TIMEOUT=200 bash ...
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
echo "NCU=${NCU:-} AB_CONFIGS=${AB_CONFIGS:-} AB_ROUNDS=${AB_ROUNDS:-} AB_TIMEOUT=${AB_TIMEOUT:-}" >> "$R/env.txt"
# shellcheck disable=SC2086 (the configs are words)
timeout "${AB_TIMEOUT:-280}" python3 -m tools.hopper.variant_ab --suffix _kr --headdim 64 \
  --rounds "${AB_ROUNDS:-8}" ${AB_CONFIGS:-4096:full 2048:full 4096:causal} 2>&1 \
  | grep -v -e UserWarning -e exe_args > "$R/ab_kr_d64.txt"
el "ab rc ${PIPESTATUS[0]}"; grep -e "^==\|^ab \|^   \|check\|Error\|error" "$R/ab_kr_d64.txt" | cut -c1-220
gzip -f "$R"/ab_*.txt
if [ "${NCU:-}" = 1 ]; then
  S=tools/hopper/ncu_summary.py
  F="ncu --set full --import-source yes --clock-control base"
  K='regex:HopperAttnBwd|FlashAttentionBackwardSm90'
  timeout 130 $F -k "$K" -f -o /tmp/d64 python3 tools/hopper/backwards_for_ncu.py \
    --ours det:auto,nondet:auto,det:auto:_kr 4:4096:32:64:full > "$R/ncu_d64.txt" 2>&1
  el "ncu d64 rc $?"
  timeout 110 $F -k "$K" -f -o /tmp/d128 python3 tools/hopper/backwards_for_ncu.py \
    4:4096:16:128:full > "$R/ncu_d128.txt" 2>&1
  el "ncu d128 rc $?"
  for P in d64 d128; do
    ncu --import /tmp/$P.ncu-rep --page raw --csv 2>/dev/null | gzip > /tmp/raw_$P.csv.gz
    ncu --import /tmp/$P.ncu-rep --page source --csv --print-source sass 2>/dev/null \
      | gzip > /tmp/src_$P.csv.gz
    python3 $S --raw /tmp/raw_$P.csv.gz --cut "$R/raw_${P}_cols.csv.gz"
    python3 $S --raw /tmp/raw_$P.csv.gz --source /tmp/src_$P.csv.gz --top 30 \
      > "$R/ncu_summary_$P.txt" 2>&1
  done
  L64="d64 ours det,d64 ours nondet,d64 ours det _kr,d64 fa4 det,d64 fa4 nondet"
  L128="d128 ours det,d128 ours nondet,d128 fa4 det,d128 fa4 nondet"
  python3 $S --raw /tmp/raw_d64.csv.gz --table "$L64" > "$R/table_d64.txt" 2>&1
  python3 $S --raw /tmp/raw_d128.csv.gz --table "$L128" > "$R/table_d128.txt" 2>&1
  python3 $S --raw /tmp/raw_d64.csv.gz --table "$L64" --busiest 15 > "$R/busiest_d64.txt" 2>&1
  python3 $S --raw /tmp/raw_d128.csv.gz --table "$L128" --busiest 15 > "$R/busiest_d128.txt" 2>&1
  cut -c1-220 "$R/table_d64.txt" "$R/table_d128.txt"
  gzip -f "$R"/ncu_*.txt
fi
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
