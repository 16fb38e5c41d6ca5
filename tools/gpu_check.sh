#!/usr/bin/env bash
# One device call: environment, the GPU tests, then a benchmark run. Logs go under $OUT.
# Usage on the GPU machine, from the repository root:
#   [KIT=.peers/fa4] [TESTS="-k triton"] [BENCH="--providers dash"] bash tools/gpu_check.sh
# KIT (optional) is the CuTe-DSL/FA4 kit to source first (needed by the hopper backend and FA4).
# Everything written is packed into $OUT/gpu_check.tgz at the end: the device tool brings back
# at most 8 files per call, and the benchmark alone writes 6.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
R=$OUT
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/device_setup.sh"
if [ "${TESTS:-}" != "none" ]; then
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-330}" python3 -m pytest tests/backends/test_gpu.py -q -x -rfEs \
    -p no:cacheprovider --durations=8 ${TESTS:-} 2>&1 | grep -v "^DEBUG" | tee "$OUT/gpu_tests.log" | tail -25
fi
if [ -n "${BENCH:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-240}" python3 -m dash_attn bench --out-dir "$OUT/bench" \
    --commit "${COMMIT:-unknown}" $BENCH 2>&1 | grep -v "UserWarning\|exe_args, func_types" \
    | tee "$OUT/bench.log" | tail -40
fi
# One archive of everything above; the benchmark's folder then goes, so that what is left
# (env.txt, gpu_tests.log, bench.log and the archive) comes back whole.
tar czf /tmp/gpu_check.tgz -C "$OUT" . && mv /tmp/gpu_check.tgz "$OUT/gpu_check.tgz" \
  && rm -rf "$OUT/bench"
