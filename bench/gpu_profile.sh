#!/usr/bin/env bash
# bench/gpu_profile.sh: where W4's device time goes on the GPU machine, fusebox and torch side by
# side: each one's per-kernel times (fusebox's profiler with FUSEBOX_DEVICE_TIMES, torch.profiler),
# and Nsight Compute's sections for the attention kernels (where the machine lets ncu read counters).
# Run after `bash bench/gpu.sh --build-only --skip-tests` (same build tree), in the same device
# session:   bash bench/gpu_profile.sh [build-gpu]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export FUSEBOX_CACHE_DIR=${FUSEBOX_CACHE_DIR:-$build/fusebox-cache}
ncu_q="ncu --clock-control none"
# The attention kernel alone (batch 8), full sections; then torch's SDPA kernels the same way.
$ncu_q -k regex:fusebox_kernel --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  "$build/bench/bench_gpu" --quick --only attention >"$out/ncu_attn.txt" 2>&1
sed -n '/fusebox_kernel/,$p' "$out/ncu_attn.txt" | head -120
$ncu_q -k "regex:flash|fmha|attn|cudnn" --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats python3 "$root/bench/peers/torch_attention.py" >"$out/ncu_torch_attn.txt" 2>&1
grep -vE "^==PROF==|^ *$" "$out/ncu_torch_attn.txt" | head -100
python3 "$root/bench/peers/torch_kernel_times.py" --modes eager,default 2>&1 | tee "$out/torch_w4_kernels.txt" | head -60
FUSEBOX_DEVICE_TIMES=1 "$build/bench/bench_gpu" --quick --only W4 >"$out/w4.jsonl" 2>"$out/w4.err"
grep -A14 "device time" "$out/w4.err" | head -30; tail -6 "$out/w4.jsonl"
