#!/usr/bin/env bash
# One device call: environment, GPU tests, then the tuning probe. Logs go under $OUT.
# Usage on the GPU machine: bash benchmarks/gpu_check.sh [pytest -k expression] [probe configs]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -f .peers/fa4/install.sh ]; then source .peers/fa4/install.sh >/dev/null 2>&1; fi
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  git rev-parse --short HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/env.txt"
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests/test_attn_gpu.py -q -x -rA --durations=10 \
  -k "${1:-bf16 or bitwise or broken or compile or nondeterministic}" 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
timeout "${PROBE_TIMEOUT:-240}" python3 benchmarks/probe_bwd.py --json "$OUT/probe.json" \
  ${2:+--configs "$2"} ${PROBE_VARIANTS:+--variants "$PROBE_VARIANTS"} 2>&1 | tee "$OUT/probe.log"
