#!/usr/bin/env bash
# One device call for the open questions of benchmarks/NOTES.md (session 3): does prefetching the
# next steps' Q/dO (TMA loads, a third pipeline stage, the step tables read ahead, registers)
# remove the ~25% of each step spent waiting for loads? Each variant's speed beside the shipped
# kernel and FA4 (deterministic variants checked bit for bit against the shipped kernel in the
# same run), a per-step trace of the TMA-load kernel, then the TMA-load GPU tests if time is
# left. Every candidate variant was checked bitwise in the interpreter first
# (tests/test_probe_variants.py). 8 files at most under $OUT (all the device tool returns).
# Usage on the GPU machine: bash benchmarks/probe_next.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -f .peers/fa4/install.sh ]; then source .peers/fa4/install.sh >/dev/null 2>&1; fi
CONFIGS=${PROBE_CONFIGS:-128:c:16384,128:f:4096,64:c:8192}
{
  date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/env.txt"
# Variants: TILES@REDUCE@LOAD (empty = default). s3 = a third stage: the next step's loads are
# in flight during a whole step instead of being issued at its end and waited for at the next
# step's start (SASS of the shipped s2 loop: benchmarks/NOTES.md, attempt 13).
S3=128:64x128w8s3,64:128x128w8s3
timeout "${PROBE_TIMEOUT:-210}" python3 benchmarks/probe_bwd.py --json "$OUT/probe.json" \
  --configs "$CONFIGS" \
  --variants "${PROBE_VARIANTS:-;@@tma;$S3@@tma;$S3@atomic@tma;$S3}" \
  2>&1 | grep -v Warning | tee "$OUT/probe.log"
# The step tables read ahead with pointer loads: at the shipped depth, with a third stage (the
# pipeliner only keeps three buffers when the tables are read ahead), and with a third stage and
# atomics (the TMA reduction's bulk wait also waits for cp.async loads in flight; atomics do not).
for knobs in "auto:" "auto:$S3" "atomic:$S3"; do
  reduce=${knobs%%:*} tiles=${knobs#*:}
  echo "== DASH_ATTN_DQ_REDUCE=$reduce DASH_ATTN_BWD_TILES=$tiles" | tee -a "$OUT/table_prefetch.log"
  DASH_ATTN_DQ_REDUCE=$reduce DASH_ATTN_BWD_TILES=$tiles timeout "${PROTOCOL_TIMEOUT:-60}" \
    python3 benchmarks/probe_protocol.py --configs "$CONFIGS" --variants table_prefetch 2>&1 \
    | grep -v Warning | tee -a "$OUT/table_prefetch.log"
done
DASH_ATTN_QO_LOAD=tma DASH_ATTN_BWD_TILES=$S3 timeout "${TRACE_TIMEOUT:-60}" \
  python3 benchmarks/probe_trace.py --configs 128:f:4096 --out-dir "$OUT" 2>&1 | tee "$OUT/trace.log"
# Register prefetch at head dim 64 with 64x128 tiles, the one case where it does not spill.
echo "== register prefetch, hd64 64x128 one stage" | tee -a "$OUT/table_prefetch.log"
DASH_ATTN_BWD_TILES=64:64x128w8s1 timeout "${REGPF_TIMEOUT:-50}" python3 benchmarks/probe_protocol.py \
  --configs 64:c:8192 --variants register_prefetch 2>&1 | grep -v Warning \
  | tee -a "$OUT/table_prefetch.log"
# Head dim 256: the release at the step's start doubled the spill traffic there (NOTES attempt
# 11); the previous position beside it.
echo "== hd256 release position" | tee -a "$OUT/table_prefetch.log"
timeout "${HD256_TIMEOUT:-45}" python3 benchmarks/probe_protocol.py --configs 256:c:8192 \
  --variants release_after_qk 2>&1 | grep -v Warning | tee -a "$OUT/table_prefetch.log"
timeout "${TEST_TIMEOUT:-50}" python3 -m pytest tests/test_attn_gpu.py -q -x -rA -k tma_loads \
  2>&1 | tail -15 | tee "$OUT/gpu_tests_tma_loads.log"
