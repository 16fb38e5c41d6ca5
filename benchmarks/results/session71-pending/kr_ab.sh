#!/bin/bash
# Session 71: K in registers as the A operand of S^T at hd 64 (`k_regs`, the "_kr" variants of
# the shipped det twins and counted kernels; bwd_step.py): each of S^T's k-blocks then reads 4 KiB
# of shared memory instead of 6, a chain's first step loading K by ldmatrix and issuing S^T again.
# Compiled on the CPU without spills or serialised WGMMAs. The same bits (checked: torch.equal to
# the shipped kernels, det repeats), timed in 8 interleaved rounds beside FA4 det / non-det at
# d64 full 4k (the H200 cell at 1.04x of the 1.10x target), full 2k and causal 4k. About 4 minutes.
# Runs on whichever Hopper card comes; env.txt says which.
#   bash benchmarks/results/session71-pending/kr_ab.sh <commit>   (carry [".peers"])
# With little device time left: AB_CONFIGS="4096:full" AB_ROUNDS=6 AB_TIMEOUT=200 bash ...
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
echo "AB_CONFIGS=${AB_CONFIGS:-} AB_ROUNDS=${AB_ROUNDS:-} AB_TIMEOUT=${AB_TIMEOUT:-}" >> "$R/env.txt"
# shellcheck disable=SC2086 (the configs are words)
timeout "${AB_TIMEOUT:-280}" python3 -m tools.hopper.variant_ab --suffix _kr --headdim 64 \
  --rounds "${AB_ROUNDS:-8}" ${AB_CONFIGS:-4096:full 2048:full 4096:causal} 2>&1 | grep -v -e UserWarning -e exe_args > "$R/ab_kr_d64.txt"
el "ab rc ${PIPESTATUS[0]}"; grep -e "^==\|^ab \|^   \|check\|Error\|error" "$R/ab_kr_d64.txt" | cut -c1-220
gzip -f "$R"/ab_*.txt
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
