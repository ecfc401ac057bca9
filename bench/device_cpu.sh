#!/usr/bin/env bash
# bench/device_cpu.sh: the CPU suite on the GPU machine's host CPU (an Intel Xeon with AVX-512;
# docs/benchmarks.md, run AV), at two vector ISAs, in two device calls (one may run 10 minutes).
#
#   ../shared/device/stage-deps.sh, then copy Eigen (headers and share/eigen3/cmake) and Debian 12's
#   OpenBLAS (headers; libopenblas.so with libgfortran.so.5 and libquadmath.so.0) into .deps/usr
#   device run (carry .deps):  bash bench/device_cpu.sh build [ISA...]           # default: native x86-64-v3
#   device run (carry .deps):  bash bench/device_cpu.sh suite x86-64-v3 native [...]   # one round each, in order
#   device run (carry .deps):  bash bench/device_cpu.sh vmath           # VMATH_W1C_ROUNDS=N: W1c's body N more times
#   device run (carry .deps):  bash bench/device_cpu.sh train x86-64-v3 native [...]   # T1, one round each
#   device run (carry .deps):  bash bench/device_cpu.sh gemm x86-64-v3 native [...]    # bench_gemm, GEMM_ARGS
#
# build: cpu_workloads and bench_vmath at each -march (build-dev-*/, kept between calls while the
# machine is warm; about a minute each); libtorch is the image's PyTorch C++ API (not Debian's 1.13),
# OpenBLAS Debian 12's 0.3.21 from .deps, which the runs load through LD_LIBRARY_PATH. suite:
# cpu_workloads --threads=2,1 on two cores (taskset -c 2,3), under isa_env.sh's pins (at native it
# pins OpenBLAS to SkylakeX from the CPU's flags: 0.3.21 does not know that CPU and fell back to SSE3
# kernels) and run_all's environment; SUITE_ARGS adds cpu_workloads arguments (docs/benchmarks.md,
# run AW: SUITE_ARGS="--workloads=W3c_b256 --systems=fusebox,libtorch,openblas"). JSON lines and logs
# go to $OUT. A whole round takes 4-6 minutes, a W3c b256 round about 1.5. train: T1
# (train_fashion_mnist against the libtorch peer, EPOCHS epochs each, default 4) at 1 and then 2
# threads per ISA, under the same pins; it needs BUILD_TARGETS="train_fashion_mnist
# torch_train_fashion_mnist" at build time and Fashion-MNIST in .deps/usr/share/datasets
# (stage-deps.sh --data). The carry is 64 MiB: OpenBLAS may travel gzipped
# (.deps/usr/lib/x86_64-linux-gnu/libopenblas.so.gz), and is unpacked here. gemm: bench_gemm
# (BUILD_TARGETS=bench_gemm) on two cores per ISA under the same pins, with GEMM_ARGS (e.g. --t1: T1's
# products, run AY; --stream 3: case 4's loop orders and K blocks, run AZ;
# --stream-pages 3: its packed A^T layouts on 4 KiB and 2 MiB pages, run BA; --limits: the read and sgemm
# limits alone).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/device-cpu-out}
mkdir -p "$out"
lscpu | grep -E "Model name|^CPU\(s\)|L1d|L2|L3"
mode=${1:?usage: bench/device_cpu.sh build [ISA...] | suite ISA... | train ISA... | gemm ISA... | vmath}
shift
# Debian's OpenBLAS from .deps: the link step found libopenblas.so there; the loader wants its soname.
blas=$root/.deps/usr/lib/x86_64-linux-gnu
if [ ! -f "$blas/libopenblas.so" ] && [ -f "$blas/libopenblas.so.gz" ]; then
  gzip -dc "$blas/libopenblas.so.gz" >"$blas/libopenblas.so"
fi
if [ -f "$blas/libopenblas.so" ]; then
  ln -sf libopenblas.so "$blas/libopenblas.so.0"
  export LD_LIBRARY_PATH=$blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# Two cores away from core 0 (where the machine's own services run) where there are four or more.
if [ "$(nproc)" -ge 4 ]; then pair=2,3 one=2; else pair=0,1 one=0; fi
case $mode in
  build)
    torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
    isas=${*:-native x86-64-v3}
    for isa in $isas; do
      cmake -S "$root" -B "$root/build-dev-$isa" -DCMAKE_BUILD_TYPE=Release -DFUSEBOX_BUILD_BENCH=ON \
        -DFUSEBOX_BUILD_TESTS=OFF -DFUSEBOX_BUILD_EXAMPLES=ON -DFUSEBOX_ARCH=$isa \
        -DCMAKE_PREFIX_PATH="$root/.deps/usr;$torch_prefix" >"$out/configure-$isa.log" 2>&1 ||
        { echo "configure $isa failed"; tail -20 "$out/configure-$isa.log"; }
      grep "fusebox bench" "$out/configure-$isa.log"
    done
    for isa in $isas; do
      (make -C "$root/build-dev-$isa" -j8 ${BUILD_TARGETS:-cpu_workloads bench_vmath} >"$out/build-$isa.log" 2>&1
       echo "$isa build rc=$?") &
    done
    wait ;;
  suite)
    export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296:glibc.malloc.top_pad=268435456
    export OMP_WAIT_POLICY=passive
    round=0
    for isa in "$@"; do
      round=$((round + 1))
      (
        isa_arch=$isa
        . "$root/bench/isa_env.sh"
        echo "# round $round: $isa $(date -u +%T) $isa_summary"
        t0=$SECONDS
        taskset -c $pair "$root/build-dev-$isa/bench/cpu_workloads" --threads=2,1 --round=$round \
          --out="$out/suite-$round-$isa.jsonl" ${SUITE_ARGS:-} >"$out/suite-$round-$isa.txt" 2>&1
        echo "rc=$? $((SECONDS - t0)) s"
      )
    done ;;
  train)
    export GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296:glibc.malloc.top_pad=268435456
    export OMP_WAIT_POLICY=passive
    data=$root/.deps/usr/share/datasets/fashion-mnist/
    for isa in "$@"; do
      (
        isa_arch=$isa
        . "$root/bench/isa_env.sh"
        echo "# T1 $isa $(date -u +%T) $isa_summary"
        b=$root/build-dev-$isa
        for threads in 1 2; do
          cpus=$one; [ "$threads" = 2 ] && cpus=$pair
          taskset -c $cpus "$b/examples/train_fashion_mnist" --device cpu --epochs "${EPOCHS:-4}" --threads $threads --data "$data" |
            grep median_epoch_s
          taskset -c $cpus "$b/bench/torch_train_fashion_mnist" --epochs "${EPOCHS:-4}" --threads $threads --data "$data" |
            grep median_epoch_s
        done
      )
    done ;;
  gemm)
    for isa in "$@"; do
      (
        isa_arch=$isa
        . "$root/bench/isa_env.sh"
        echo "# bench_gemm $isa $(date -u +%T) $isa_summary"
        # The table (default), the T1 lines (--t1) or case 4's (--stream); the per-shape JSON stays in the file.
        taskset -c $pair "$root/build-dev-$isa/bench/bench_gemm" ${GEMM_ARGS:-} | tee "$out/gemm-$isa.txt" |
          grep -v -E '^\{"workload": "(gemm_|stream|sgemm_)'
      )
    done ;;
  vmath)
    for isa in x86-64-v3 native; do
      echo "# bench_vmath $isa"
      taskset -c $one "$root/build-dev-$isa/bench/bench_vmath" | tee "$out/vmath-$isa.log" | grep -v '^{'
      grep w1c "$out/vmath-$isa.log"
    done
    # W1c's body and its floor again, the ISAs alternated (VMATH_W1C_ROUNDS rounds, default 0).
    for ((r = 0; r < ${VMATH_W1C_ROUNDS:-0}; r++)); do
      for isa in x86-64-v3 native; do
        taskset -c $one "$root/build-dev-$isa/bench/bench_vmath" --w1c | sed "s/^{/{\"isa\":\"$isa\",/"
      done
    done ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
