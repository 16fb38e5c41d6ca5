#!/bin/bash
# Session 50, call 3: the polled dQ cast shipped (deterministic hopper plans with static dispatch
# at hd 64/128 leave 4 SMs to it: plan.cast_sms, the "_ct" kernels). The GPU tests it touches
# (the polled cast's own, bitwise repeats of every schedule at hd 64/128 alone and with a busy
# stream, a broken table at hd 64), then the hd-64 and hd-128 backward sweeps beside FA4 (three
# rounds) for the targets table.
#   bash benchmarks/results/h200/session50-5723982/call3/ship_ct.sh <commit>  (carry [".peers"])
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "$(dirname "${BASH_SOURCE[0]}")/ship_ct.sh" "$R/"
el kit
timeout 150 python3 -m pytest -v -rA -p no:cacheprovider tests/backends/hopper/test_bwd_pre_post.py \
  tests/backends/test_gpu.py -k "polled or (hopper and (bitwise_repeatable or broken_table) and (64 or 128) and not 192)" \
  > "$R/gpu_tests.log" 2>&1
el "tests rc $?"; grep -E "FAILED|ERROR|passed|failed" "$R/gpu_tests.log" | cut -c1-200 | tail -8
for HD in 64 128; do
  timeout 175 python3 -m dash_attn bench --mode bwd --headdims $HD --no-determinism --no-model \
    --providers dash_hopper_auto,dash_hopper_nondet,fa4_det,fa4_nondet \
    --rounds 3 --repeat-check 0 --no-plot --deadline-s 165 --commit "$COMMIT" \
    --out-dir "$R/bwd$HD" > "$R/bwd$HD.log" 2>&1
  el "bench $HD rc $?"
  grep "^\[" "$R/bwd$HD.log" | cut -c1-200
done
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
