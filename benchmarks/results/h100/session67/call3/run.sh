#!/bin/bash
# Session 67, call 3, on whichever Hopper card came (the call named nvidia-h200). Results under
# benchmarks/results/<h200|h100>/session67/call3.
# - On an H200: the hd-64/128 backward sweep for the README's H200 targets table (as call 2).
# - On an H100: call 1's "_dpnh" A/B read 1.055x det but 1.005x non-det while its step trace
#   was no shorter (4219 cycles); "_dpn" (no start stagger) read 0.995x det in session 66. Both
#   again, 8 interleaved rounds each, in one call. Their code is 1cfbe4e's five backward
#   modules, carried as .peers/dpnh.tgz (ignored) and unpacked over the copy on the device only.
#   bash benchmarks/results/session67-pending/run.sh <commit>   (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for HD in 64 128; do
    timeout 235 python3 -m dash_attn bench --mode bwd --headdims $HD --no-determinism \
      --no-model --hidden 2048 --providers dash_hopper_auto,dash_hopper_nondet,fa4_det,fa4_nondet \
      --rounds 4 --repeat-check 0 --no-plot --deadline-s 215 --commit "$COMMIT" \
      --out-dir "$R/bwd$HD" > "$R/bwd$HD.log" 2>&1
    el "bench $HD rc $?"
    grep "^\[" "$R/bwd$HD.log" | cut -c1-220
    gzip -f "$R/bwd$HD.log"
  done
else
  tar xzf .peers/dpnh.tgz && el "probe sources (1cfbe4e) unpacked"
  for S in _dpnh _dpn _dpnh; do
    timeout 150 python3 -m tools.hopper.variant_ab --suffix $S --headdim 64 --rounds 8 \
      --bits rule --rule-max 512 4096:full 2>&1 | grep -v -e UserWarning -e exe_args >> "$R/ab$S.txt"
    el "ab $S rc ${PIPESTATUS[0]}"; grep -e "^ab \|^   \|Error\|error" "$R/ab$S.txt" | tail -6 | cut -c1-220
  done
  gzip -f "$R"/ab_*.txt
fi
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
