#!/usr/bin/env bash
# One device call for the open questions of benchmarks/NOTES.md (session 2): the tma_reduce
# candidates against the shipped kernel (with a bitwise check), then per-step traces of the
# shipped kernel. At most 6 files under $OUT (the device tool returns 8).
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
timeout "${PROTOCOL_TIMEOUT:-240}" python3 benchmarks/probe_protocol.py \
  --configs "${PROTOCOL_CONFIGS:-128:c:16384,128:f:4096,64:c:8192}" \
  --variants "${PROTOCOL_VARIANTS:-tma_reduce,tma_reduce_nondet,no_wait}" \
  --json "$OUT/protocol.json" 2>&1 | grep -v Warning | tee "$OUT/protocol.log"
timeout "${TRACE_TIMEOUT:-200}" python3 benchmarks/probe_trace.py \
  --configs "${TRACE_CONFIGS:-128:f:4096,128:c:4096}" --out-dir "$OUT" 2>&1 | tee "$OUT/trace.log"
