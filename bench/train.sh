#!/bin/sh
# bench/train.sh BUILD_DIR [ROUNDS]: T1 (10 epochs) and W5c, fusebox and libtorch 1.13 eager, in
# alternation, ROUNDS times (default 3), in the environment bench/run_all gives the libtorch peers
# (malloc tunables that keep freed memory, passive OpenMP waiting), 2 threads each. Prints the
# JSON lines of every run; docs/benchmarks.md quotes the "median_epoch_s" (T1) and "median_us"
# (W5c) lines. BUILD_DIR is a tree configured with -DFUSEBOX_BUILD_BENCH=ON and built with the
# targets train_fashion_mnist, bench_train and torch_train_fashion_mnist. The build's FUSEBOX_ARCH
# (-DFUSEBOX_ARCH=x86-64-v3 for AVX2) is the ISA libtorch and OpenBLAS are pinned to (isa_env.sh).
# T2_EPOCHS=N (default 0: skipped) adds T2 (the CNN, AdamW lr 3e-3 with per-epoch cosine annealing,
# docs/benchmarks.md's recipe) for N epochs each, fusebox then libtorch, at the end of each round.
#
# DEVICE=cuda: the GPU variant instead (the GPU machine has no libtorch C++): each round runs T1 on
# the GPU, `train_fashion_mnist --device cuda` (its "median_epoch_s" and "samples_per_s" lines), then,
# if python3 imports a torch that sees a GPU, bench/peers/torch_train_fashion_mnist.py eager and
# torch.compile (fused AdamW, the same recipe); T2_EPOCHS=N adds T2 the same way (fusebox trains T2 on
# the CPU, saying so, while conv2d has no CUDA kernel). BUILD_DIR needs only train_fashion_mnist.
# DATA=DIR is the Fashion-MNIST directory; by default .deps/usr/share/datasets/fashion-mnist (where
# ../shared/device/stage-deps.sh --data puts it) when that exists, else Debian's.
set -e
B=${1:?usage: bench/train.sh BUILD_DIR [ROUNDS]}
ROUNDS=${2:-3}
T2_EPOCHS=${T2_EPOCHS:-0}
if [ "${DEVICE:-cpu}" = cuda ]; then
  here=$(cd "$(dirname "$0")/.." && pwd)
  staged=$here/.deps/usr/share/datasets/fashion-mnist
  [ -d "$staged" ] && DATA=${DATA:-$staged/} || DATA=${DATA:-/usr/share/datasets/fashion-mnist/}
  peer="$here/bench/peers/torch_train_fashion_mnist.py"
  torch_ok=0
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && torch_ok=1
  [ $torch_ok = 1 ] || echo "# no PyTorch with a GPU in python3: the torch peer is skipped"
  round=1
  while [ "$round" -le "$ROUNDS" ]; do
    echo "# round $round $(date -u +%FT%T) (GPU) data $DATA"
    "$B/examples/train_fashion_mnist" --device cuda --epochs 10 --data "$DATA"
    if [ $torch_ok = 1 ]; then
      python3 "$peer" --data "$DATA" --epochs 10 --mode eager
      python3 "$peer" --data "$DATA" --epochs 10 --mode compile
    fi
    if [ "$T2_EPOCHS" -gt 0 ]; then
      "$B/examples/train_fashion_mnist" --device cuda --model cnn --epochs "$T2_EPOCHS" --lr 3e-3 --schedule cosine --data "$DATA"
      [ $torch_ok = 0 ] || python3 "$peer" --data "$DATA" --model cnn --epochs "$T2_EPOCHS" --lr 3e-3 --schedule cosine
    fi
    round=$((round + 1))
  done
  echo "# end $(date -u +%FT%T)"
  exit 0
fi
# The peers pinned to the vector ISA the build was made for (its FUSEBOX_ARCH; isa_env.sh).
isa_arch=$(sed -n 's/^FUSEBOX_ARCH:STRING=//p' "$B/CMakeCache.txt" 2>/dev/null)
. "$(dirname "$0")/isa_env.sh"
echo "# ISA: $isa_summary"
export GLIBC_TUNABLES="${FUSEBOX_BENCH_GLIBC_TUNABLES:-glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296:glibc.malloc.top_pad=268435456}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
round=1
while [ "$round" -le "$ROUNDS" ]; do
  echo "# round $round $(date -u +%FT%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$B/examples/train_fashion_mnist" --epochs 10 --threads 2
  "$B/bench/torch_train_fashion_mnist" --epochs 10 --threads 2
  "$B/bench/bench_train" --threads 2 --steps 20
  "$B/bench/torch_train_fashion_mnist" --w5c --threads 2 --steps 20
  if [ "$T2_EPOCHS" -gt 0 ]; then
    "$B/examples/train_fashion_mnist" --model cnn --epochs "$T2_EPOCHS" --lr 3e-3 --schedule cosine --threads 2
    "$B/bench/torch_train_fashion_mnist" --model cnn --epochs "$T2_EPOCHS" --lr 3e-3 --schedule cosine --threads 2
  fi
  round=$((round + 1))
done
echo "# end $(date -u +%FT%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
