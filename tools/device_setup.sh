# Sourced at the repository root by a device call's script (tools/gpu_check.sh, the call
# scripts kept beside their results under benchmarks/results/): sources the CuTe-DSL/FA4 kit
# when KIT names one, exports what the checkout runs with (no install), and writes env.txt (GPU,
# clocks, versions, date, commit) into R, printing it too.
#   KIT=.peers/fa4; COMMIT=<sha>; R="$OUT/r"
#   source tools/device_setup.sh
# (plain assignments, not prefixes of `source`: the caller reads R afterwards). Also defines
# `el MESSAGE`, which prints the seconds since T0 (set here unless the caller set it) before
# MESSAGE, and keeps compiled kernels in /tmp/kcache unless DASH_ATTN_KERNEL_CACHE says else.
R=${R:-${OUT:-/tmp/out}}
mkdir -p "$R"
T0=${T0:-$(date +%s)}
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
export DASH_ATTN_KERNEL_CACHE=${DASH_ATTN_KERNEL_CACHE:-/tmp/kcache}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -n "${KIT:-}" ] && [ -f "$KIT/install.sh" ]; then
  # shellcheck disable=SC1091
  source "$KIT/install.sh" /tmp/kit >/dev/null 2>&1 || echo "kit install failed"
fi
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  python3 -c "import cutlass; print('cutlass-dsl', cutlass.__version__)" 2>/dev/null || echo "no cutlass-dsl"
  echo "commit ${COMMIT:-unknown}"
} 2>&1 | tee "$R/env.txt"
