#!/usr/bin/env bash
# One device call that runs every GPU test (`-m gpu`) on the checkout, in the parallel groups
# of tools/parallel_tests.py's EVERY_GPU_TEST (about 6 minutes on a fresh H100). Extra
# arguments go to tools.parallel_tests, e.g. `--skip triton_ref --skip triton_rest`.
#   [KIT=.peers/fa4] [COMMIT=<sha>] [TESTS_TIMEOUT=500] bash tools/gpu_tests.sh [ARGS]
# Writes $OUT/r/<group>.log and env.txt, prints one line per group and every failure, and
# packs r/ into $OUT/r.tgz (the device tool brings back a few files per call).
set -uo pipefail
OUT=${OUT:-/tmp/out}
R=$OUT/r
# shellcheck disable=SC1091
source "$(dirname "${BASH_SOURCE[0]}")/device_setup.sh"
echo "tools/gpu_tests.sh $* (TESTS_TIMEOUT=${TESTS_TIMEOUT:-500})" >> "$R/env.txt"
el "kit and env"
python3 -m tools.parallel_tests --out "$R" --timeout "${TESTS_TIMEOUT:-500}" --every-gpu-test "$@"
status=$?
el "tests rc $status"
# CuTe DSL's compile warnings fill the logs; the test results are what is kept.
for log in "$R"/*.log; do
  grep -v -e UserWarning -e exe_args "$log" > "$log.tmp" && mv "$log.tmp" "$log"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
exit $status
