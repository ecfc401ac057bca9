#!/usr/bin/env bash
# bench/gpu.sh: everything GPU-related in one call on the GPU machine (issue 4): configure, build
# the CUDA tests and the GPU benchmark, run the tests (the [cuda] suite, the differential fuzzers
# with their CUDA half, compute-sanitizer memcheck on the CUDA tests), then fusebox's benchmark and
# torch_reference.py in the same run, and print one merged table.
#
#   ../shared/device/stage-deps.sh                 # here, once: header-only deps into .deps/
#   device run (carry .deps):  bash bench/gpu.sh [--quick] [--skip-torch] [--skip-tests] [--skip-fuzz]
#                              [--skip-bench] [--train] [--build-only | --no-build]
#
# Logs and JSON go to $OUT (the device tool brings them back) or ./gpu-out. Each step is timed
# and a failed step does not stop the others; the exit status is that of the test step.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
quick=""; torch=1; tests=1; fuzz=1; train=0; build_step=1; run_steps=1; bench=1
for a in "$@"; do
  case $a in
    --quick) quick=--quick ;;
    --skip-torch) torch=0 ;;
    --skip-tests) tests=0 ;;
    --skip-fuzz) fuzz=0 ;;  # the fuzzers take ~3 min to build on the GPU machine
    --skip-bench) bench=0 ;;
    --train) train=1 ;;     # also T1 on the GPU against torch (bench/train.sh DEVICE=cuda, one round)
    # One device command may run 10 minutes: --build-only in one call, then --no-build in the
    # next while the machine is still warm (its ignored build tree is kept between calls).
    --build-only) run_steps=0 ;;
    --no-build) build_step=0 ;;
  esac
done
build=${BUILD:-$root/build-gpu}
cuda_tagged="fusebox_test_ops_special_values fusebox_test_ops_cumsum fusebox_test_compile_backend fusebox_test_autodiff_grad fusebox_test_compile_capability_matrix"
jobs=$(nproc)
export FUSEBOX_CACHE_DIR=${FUSEBOX_CACHE_DIR:-$build/fusebox-cache}
step() { local t0=$SECONDS; echo "==> $1"; shift; "$@"; local rc=$?; echo "==> rc=$rc ($((SECONDS - t0)) s)"; return $rc; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
if [ $build_step = 1 ]; then
  step configure cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFUSEBOX_BUILD_TESTS=ON \
    -DFUSEBOX_BUILD_BENCH=ON -DFUSEBOX_BUILD_EXAMPLES=ON -DFUSEBOX_TEST_NVCC=ON -DFUSEBOX_TEST_CUDA_DEVICE=ON \
    -DCMAKE_PREFIX_PATH="$root/.deps/usr" >"$out/configure.log" 2>&1 || tail -30 "$out/configure.log"
  targets="bench_gpu"
  [ $tests = 1 ] && targets="$targets fusebox_test_cuda_loader fusebox_test_cuda_runtime fusebox_test_cuda_compiled fusebox_test_cuda_codegen fusebox_test_cuda_attention_backward fusebox_test_cuda_attention_backward_codegen fusebox_test_nn_gpt2_device fusebox_test_cuda_optim fusebox_test_cuda_cudnn fusebox_test_cuda_staging"
  # Tests labelled by what they test whose [cuda] cases need the GPU (they skip without one).
  [ $tests = 1 ] && targets="$targets $cuda_tagged"
  [ $tests = 1 ] && grep -q "building cuda.static_nvcc" "$out/configure.log" && targets="$targets fusebox_test_cuda_static_nvcc"
  [ $tests = 1 ] && [ $fuzz = 1 ] && targets="$targets fusebox_test_jit_fuzz_0 fusebox_test_jit_fuzz_ir"
  [ $train = 1 ] && targets="$targets train_fashion_mnist"
  # Not `cmake --build --target a b c`: CMake's top-level Makefile is .NOTPARALLEL, so the targets
  # would build one after another (one unit each, mostly: a 10-minute device call ran out that
  # way). Their `all` goals in CMakeFiles/Makefile2 build side by side.
  goals=""
  for t in $targets; do
    d=$(cd "$build" && find . -type d -name "$t.dir" -path "*CMakeFiles*" | head -1)
    goals="$goals ${d:+${d#./}/all}"
  done
  step build make -C "$build" -f CMakeFiles/Makefile2 -j "$jobs" -k $goals >"$out/build.log" 2>&1 ||
    grep -m20 -B2 -A8 "error" "$out/build.log"
fi
[ $run_steps = 1 ] || exit 0

test_rc=0
if [ $tests = 1 ]; then
  (cd "$build" && step tests ctest -L cuda --output-on-failure -j 1 --timeout 300) >"$out/tests.log" 2>&1
  test_rc=$?
  grep -B3 -A12 "FAILED" "$out/tests.log" | head -60
  tail -8 "$out/tests.log"
  for t in $cuda_tagged; do
    (cd "$build" && step "$t [cuda]" ./tests/$t "[cuda]") >"$out/$t.log" 2>&1 || test_rc=1
    tail -3 "$out/$t.log"
  done
  # Part 0 of the type-level fuzzer is the one that renders its programs as CUDA and runs them on
  # the GPU; fuzz_ir builds its 800-odd CUDA kernels into an sm_90 cubin where a GPU is present.
  for p in $([ $fuzz = 1 ] && echo 0 ir); do
    (cd "$build" && FUSEBOX_CXXFLAGS=-O1 step "fuzz $p (CPU + CUDA)" ./tests/fusebox_test_jit_fuzz_$p) >"$out/fuzz_$p.log" 2>&1 || test_rc=1
    tail -4 "$out/fuzz_$p.log"
  done
  if command -v compute-sanitizer >/dev/null; then
    (cd "$build" && step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
        ./tests/fusebox_test_cuda_compiled) >"$out/memcheck.log" 2>&1 || test_rc=1
    tail -6 "$out/memcheck.log"
  fi
fi

if [ $bench = 1 ]; then
  (cd "$build" && step "bench_gpu" ./bench/bench_gpu $quick) >"$out/fusebox.jsonl" 2>"$out/fusebox.err"
  tail -14 "$out/fusebox.jsonl"
fi
if [ $torch = 1 ]; then
  step torch_reference env PYTHONUNBUFFERED=1 python3 "$root/bench/peers/torch_reference.py" $quick ${TORCH_ARGS:-} \
    --workloads "${TORCH_WORKLOADS:-W1,W2,W3_b1_f32,W3_b32_f32,W3_b256_f32,W3_b1_bf16,W3_b32_bf16,W3_b256_bf16}" --json-out "$out/torch.jsonl" \
    >"$out/torch.log" 2>&1
  tail -5 "$out/torch.log"
fi
if [ $train = 1 ]; then
  (export DEVICE=cuda; step "T1 on the GPU (fusebox, torch eager, torch.compile)" sh "$root/bench/train.sh" "$build" 1) \
    >"$out/train.log" 2>&1
  grep -E '"median_epoch_s"|accuracy|error|T2 on the GPU' "$out/train.log" | tail -12
fi
merge=(); [ -f "$out/fusebox.jsonl" ] && merge+=("$out/fusebox.jsonl"); [ -f "$out/torch.jsonl" ] && merge+=("$out/torch.jsonl")
[ ${#merge[@]} = 0 ] || python3 "$root/bench/peers/merge_table.py" "${merge[@]}" 2>&1 | tee "$out/table.txt"
exit $test_rc
