// bench/cpu_workloads.hpp: the CPU workloads of BENCHMARKS.md (W1c, W2c, W3c) as plain data,
// shared by cpu_workloads.cpp (inputs, double references, fusebox, limits, the table) and the
// peers in peers/*.cpp, so every system runs on the same bytes and is checked the same way.
// A peer hands back its configurations as ready-to-run candidates; the caller times all systems
// in interleaved rounds, checks every output against the double reference and writes the records.
// Depends on: harness.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "harness.hpp"

namespace fusebox::bench {

/// W1c: y = gelu(x * w + b) * sigmoid(x); x [rows, cols], w and b [cols] broadcast along rows,
/// gelu exact (erf).
struct w1_data {
  std::size_t rows = 4096, cols = 4096;
  floats x, w, b;
};

/// W2c: y = layer_norm(softmax(x, -1), gamma, beta, eps); x [rows, cols], gamma and beta [cols].
struct w2_data {
  std::size_t rows = 4096, cols = 4096;
  floats x, gamma, beta;
  float eps = 1e-5f;
};

/// W3c: Linear 1024->4096, GELU, Linear 4096->4096, GELU, Linear 4096->1024, with biases, float32.
/// Each weight is held in both layouts a peer might prefer: w_kn[l] is [K, N] (y = x W), w_nk[l]
/// is [N, K] (torch.nn.Linear's layout, y = x W^T); they hold the same matrix.
struct w3_data {
  static constexpr std::array<std::size_t, 4> dim{1024, 4096, 4096, 1024};
  std::size_t batch = 1;
  floats x;  // [batch, 1024]
  std::array<floats, 3> w_kn, w_nk, b;
};

/// One configuration of one system, ready to run. `call` runs the workload once; after a call,
/// `output` gives the result (row-major) to check against the reference, or an empty span for a
/// configuration that is not a complete workload (then it is reported but not checked).
/// `prepare` (optional, untimed) re-applies process-wide settings such as thread counts before a
/// burst of calls, since other systems run in between. `state` keeps the buffers alive.
struct candidate {
  std::string system, mode, config, note;
  std::function<void()> prepare, call;
  std::function<std::span<const float>()> output;
  std::shared_ptr<void> state;
};
using candidates = std::vector<candidate>;

// Peers; each is compiled only when its library was found (FUSEBOX_BENCH_HAVE_<NAME>). All take
// the thread count to use. The *_describe functions say which library and how it was built.
std::string eigen_describe();
candidates eigen_w1(const w1_data&, unsigned threads);
candidates eigen_w2(const w2_data&, unsigned threads);
candidates eigen_w3(const w3_data&, unsigned threads);

std::string torch_describe();
candidates torch_w1(const w1_data&, unsigned threads);
candidates torch_w2(const w2_data&, unsigned threads);
candidates torch_w3(const w3_data&, unsigned threads);

std::string openblas_describe();
candidates openblas_w3(const w3_data&, unsigned threads);
/// The arithmetic limit: sgemm on square matrices of side n; returns GFLOP/s of the fastest call
/// (a limit is what the machine can do, as STREAM takes its best rep).
double openblas_sgemm_gflops(unsigned threads, std::size_t n, timing& t);

}  // namespace fusebox::bench
