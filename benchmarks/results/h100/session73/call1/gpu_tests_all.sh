#!/bin/bash
# Session 72: every GPU test on the kernels shipped now (`-m gpu`: 353 collected on the CPU at
# f1b274c), in one device call split into nine pytest processes that run at once
# (tools/parallel_tests.py), the groups of session 55's calls 1-2, the last run of the whole set
# (benchmarks/results/h200/session55-73abb0b). Logs: r/<group>.log, one summary line per group.
#   bash benchmarks/results/session72-pending/gpu_tests_all.sh <commit>   (carry [".peers"])
# (Run in session 73 on an H100 with GROUPS renamed TEST_GROUPS: bash keeps GROUPS for itself
# and the first call ran no group. Superseded by tools/gpu_tests.sh.)
# With little device time: NO_TRITON=1 TESTS_TIMEOUT=400 bash ...
COMMIT="$1"; KIT=.peers/fa4; R=$OUT/r
source tools/device_setup.sh
cp "${BASH_SOURCE[0]}" "$R/"
el kit
G=tests/backends/test_gpu.py
TEST_GROUPS=(
  "hopper_ref=$G -m gpu -k 'not triton and test_matches_fp32'"
  "hopper_bits=$G -m gpu -k 'not triton and test_bitwise'"
  "hopper_rest1=$G -m gpu -k 'not triton and not test_matches_fp32 and not test_bitwise and forward'"
  "hopper_rest2=$G -m gpu -k 'not triton and not test_matches_fp32 and not test_bitwise and not forward'"
  "varlen=tests/backends/test_gpu_varlen.py -m gpu"
  "pre_post=tests/backends/hopper -m gpu"
  "api=tests/test_gpu_graphs.py tests/test_gpu_integrations.py tests/test_gpu_errors.py -m gpu"
)
# NO_TRITON=1 leaves out the Triton kernels' own groups (unchanged since session 55's run).
if [ "${NO_TRITON:-}" != 1 ]; then
  TEST_GROUPS+=(
    "triton_ref=$G -m gpu -k 'triton and test_matches_fp32'"
    "triton_rest=$G -m gpu -k 'triton and not test_matches_fp32'"
  )
fi
echo "NO_TRITON=${NO_TRITON:-} TESTS_TIMEOUT=${TESTS_TIMEOUT:-}" >> "$R/env.txt"
python3 -m tools.parallel_tests --out "$R" --timeout "${TESTS_TIMEOUT:-500}" "${TEST_GROUPS[@]}"
el "tests rc $?"
for f in "$R"/*.log; do
  grep -v -e UserWarning -e exe_args "$f" > "$f.tmp" && mv "$f.tmp" "$f"
  echo "$(basename "$f"): $(tail -1 "$f")"
done
grep -h -e "^FAILED" -e "^ERROR" "$R"/*.log | cut -c1-200 | head -40
cd "$OUT" && tar czf r.tgz r && rm -rf r; el done
