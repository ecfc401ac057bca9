#!/usr/bin/env bash
# bench/gpu_profile.sh: where W4's device time goes on the GPU machine, fusebox and torch side by
# side, kernel by kernel. Nsight Compute (where the machine lets it read counters: the H100 kind)
# times each kernel with the caches as the call left them and the clocks as they run; torch's
# in-place times come from torch.profiler; fusebox's own breakdown from FUSEBOX_DEVICE_TIMES
# (CUDA events around each step: a microsecond or two more per step). Then the attention kernel
# alone, with Nsight Compute's occupancy, scheduler and stall sections.
# Run after `bash bench/gpu.sh --build-only --skip-tests` (same build tree, same device session):
#   bash bench/gpu_profile.sh [build-gpu]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${BUILD:-$root/build-gpu}}
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
export FUSEBOX_CACHE_DIR=${FUSEBOX_CACHE_DIR:-$build/fusebox-cache}
ncu_q="ncu --clock-control none --cache-control none"
# fusebox's W4, the default mode's second call (the first compiles): generated kernels are fbk_*,
# bfloat16 GEMMs nvjet or sm90 ones (the float32 GEMM that measures the limits first is neither).
$ncu_q -k "regex:nvjet|sm90_xmma|fbk_" --launch-skip 7 --launch-count 7 --metrics gpu__time_duration.sum \
  "$build/bench/bench_gpu" --quick --only W4 >"$out/ncu_w4.txt" 2>&1
grep -E "^  [a-zA-Z_]|gpu__time" "$out/ncu_w4.txt" | cut -c1-120
$ncu_q --nvtx --nvtx-include "w4/" --metrics gpu__time_duration.sum \
  python3 "$root/bench/peers/torch_kernel_times.py" --once >"$out/ncu_torch_w4.txt" 2>&1
grep -E "^  [a-zA-Z_]|gpu__time" "$out/ncu_torch_w4.txt" | cut -c1-120
python3 "$root/bench/peers/torch_kernel_times.py" --modes eager,default 2>&1 | tee "$out/torch_w4_kernels.txt" | grep -v Warn
FUSEBOX_DEVICE_TIMES=1 "$build/bench/bench_gpu" --quick --only W4 >"$out/w4.txt" 2>&1
grep -E "^W4|device time|us  " "$out/w4.txt" | cut -c1-150
# The attention kernel alone (batch 8 first): occupancy, scheduler, stall reasons.
$ncu_q -k regex:fbk_ --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --metrics "regex:smsp__average_warp_latency_issue_stalled_.*\.ratio$" \
  "$build/bench/bench_gpu" --quick --only attention >"$out/ncu_attn.txt" 2>&1
sed -n '/fbk_/,$p' "$out/ncu_attn.txt" | grep -vE "^ *-+ *-+|^ *$" | head -120
