#!/usr/bin/env bash
# One device call (session 4, call 15): the new tile defaults (head dims 96/128: three stages
# with the step tables read ahead; 192/256: release after the first matmul) beside the previous
# ones, deterministic results checked bit for bit between them in the same run, after the
# deterministic subset of the GPU tests at the new defaults. Session 3's version of this script
# (TMA loads, table prefetch, register prefetch; call 14) is in git history.
# 8 files at most under $OUT (all the device tool returns).
# Usage on the GPU machine: bash benchmarks/probe_next.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/env.txt"
timeout "${TEST_TIMEOUT:-230}" python3 -m pytest tests/test_attn_gpu.py -q -x -rA \
  -k "bf16 or bitwise or broken or compile or nondeterministic" 2>&1 | tail -40 \
  | tee "$OUT/gpu_tests_det.log"
PREVIOUS=96:64x128w8s2,128:64x128w8s2,192:64x64w8s1,256:64x64w8s1
CONFIGS=${PROBE_CONFIGS:-128:c:16384,128:f:4096,128:c:2048,128:f:16384,96:c:8192,192:c:8192,192:f:2048,256:c:8192,256:f:2048}
timeout "${PROBE_TIMEOUT:-280}" python3 benchmarks/probe_bwd.py --no-fa4 --json "$OUT/probe.json" \
  --configs "$CONFIGS" --variants "${PROBE_VARIANTS:-;$PREVIOUS}" \
  2>&1 | grep -v Warning | tee "$OUT/probe.log"
