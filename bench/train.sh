#!/bin/sh
# bench/train.sh BUILD_DIR [ROUNDS]: T1 (10 epochs) and W5c, fusebox and libtorch 1.13 eager, in
# alternation, ROUNDS times (default 3), in the environment bench/run_all gives the libtorch peers
# (malloc tunables that keep freed memory, passive OpenMP waiting), 2 threads each. Prints the
# JSON lines of every run; docs/benchmarks.md quotes the "median_epoch_s" (T1) and "median_us"
# (W5c) lines. BUILD_DIR is a tree configured with -DFUSEBOX_BUILD_BENCH=ON and built with the
# targets train_fashion_mnist, bench_train and torch_train_fashion_mnist.
# T2_EPOCHS=N (default 0: skipped) adds T2 (the CNN, AdamW lr 3e-3 with per-epoch cosine annealing,
# docs/benchmarks.md's recipe) for N epochs each, fusebox then libtorch, at the end of each round.
set -e
B=${1:?usage: bench/train.sh BUILD_DIR [ROUNDS]}
ROUNDS=${2:-3}
T2_EPOCHS=${T2_EPOCHS:-0}
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
