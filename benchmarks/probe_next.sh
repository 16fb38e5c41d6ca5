#!/usr/bin/env bash
# One device call for the open questions of benchmarks/NOTES.md (session 2): GPU tests of the TMA
# dQ reduction, its speed against the atomics (det and non-det, FA4 beside them), and
# per-step traces of the shipped kernel. 8 files under $OUT (all the device tool returns).
# Usage on the GPU machine: bash benchmarks/probe_next.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -f .peers/fa4/install.sh ]; then source .peers/fa4/install.sh >/dev/null 2>&1; fi
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/env.txt"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest tests/test_attn_gpu.py -q -x -rA -k tma 2>&1 \
  | tail -15 | tee "$OUT/gpu_tests_tma.log"
timeout "${PROBE_TIMEOUT:-240}" python3 benchmarks/probe_bwd.py --json "$OUT/probe.json" \
  --configs "${PROBE_CONFIGS:-128:c:16384,128:f:4096,64:c:8192,64:f:2048}" \
  --variants "${PROBE_VARIANTS:-;@tma;64:128x128w8s2@tma;64:64x128w8s2@tma}" 2>&1 | grep -v Warning \
  | tee "$OUT/probe.log"
timeout "${TRACE_TIMEOUT:-150}" python3 benchmarks/probe_trace.py \
  --configs "${TRACE_CONFIGS:-128:f:4096,128:c:4096}" --out-dir "$OUT" 2>&1 | tee "$OUT/trace.log"
