// bench/composite.cpp: composites chained both ways round (issue 20, item 12). layer_norm then
// softmax, and softmax then layer_norm, over [512, 1024] and [4096, 4096], gamma and beta
// captured by the model, eps a scalar: compiled (static shapes) against eager, interleaved in
// rounds (bench/harness.hpp), each checked against a double reference on every element.
//
// The floor: both are one row kernel reading x once and writing y once (a row of 1024 or 4096
// floats stays in L1/L2 across the passes), so compiled should stand to eager about as the bytes
// eager moves (each op reads and writes a [rows, cols] array: ~13 arrays for layer_norm then
// softmax; eager also allocates each result) stand to 2 arrays, less what the row kernel's passes cost in arithmetic.
// softmax then layer_norm is also timed against layer_norm written out with ops (compiled both):
// the library rewrites the pair without the division (ops/composite.hpp; docs/benchmarks.md, run AX).
// Usage: bench_composite [--threads=N]   (default: 1 thread)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fusebox/fusebox.hpp>

#include "harness.hpp"

namespace fb = fusebox;
namespace bh = fusebox::bench;

namespace {

std::vector<double> layer_norm_d(const std::vector<double>& x, std::size_t rows, std::size_t cols,
                                 const float* g, const float* b, double eps) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * cols];
    double mean = 0, var = 0;
    for (std::size_t c = 0; c < cols; ++c) mean += xr[c];
    mean /= double(cols);
    for (std::size_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= double(cols);
    for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] = (xr[c] - mean) / std::sqrt(var + eps) * g[c] + b[c];
  }
  return y;
}

std::vector<double> softmax_d(const std::vector<double>& x, std::size_t rows, std::size_t cols) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (std::size_t c = 0; c < cols; ++c) m = std::max(m, x[r * cols + c]);
    for (std::size_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
    for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] = std::exp(x[r * cols + c] - m) / s;
  }
  return y;
}

template <std::size_t R, std::size_t C>
void run(unsigned threads) {
  fb::tensor<float, fb::shape<R, C>> x;
  fb::tensor<float, fb::shape<C>> gamma, beta;
  x.fill_random(1, -3.0f, 3.0f);
  gamma.fill_random(2, 0.5f, 1.5f);
  beta.fill_random(3, -0.5f, 0.5f);
  std::vector<double> xd(R * C);
  for (std::size_t i = 0; i < R * C; ++i) xd[i] = x.data()[i];

  auto ln_sm = [&](const auto& v) { return fb::softmax(fb::layer_norm(v, gamma, beta, 1e-5f)); };
  auto sm_ln = [&](const auto& v) { return fb::layer_norm(fb::softmax(v), gamma, beta, 1e-5f); };
  const auto ref_ln_sm = softmax_d(layer_norm_d(xd, R, C, gamma.data(), beta.data(), 1e-5), R, C);
  const auto ref_sm_ln = layer_norm_d(softmax_d(xd, R, C), R, C, gamma.data(), beta.data(), 1e-5);

  auto one = [&](const char* name, auto model, const std::vector<double>& ref) {
    auto compiled = fb::compile(model, {.threads = threads});
    auto eager = fb::eager(model, {.threads = threads});
    fb::tensor<float, fb::shape<R, C>> yc, ye;
    compiled.run(yc, x);
    ye = eager(x);
    const double err_c = bh::max_rel_err(yc.data(), ref.data(), R * C);
    const double err_e = bh::max_rel_err(ye.data(), ref.data(), R * C);
    const auto t = bh::measure_interleaved({{{}, [&] { compiled.run(yc, x); }}, {{}, [&] { ye = eager(x); }}});
    std::printf("{\"bench\":\"composite\",\"model\":\"%s\",\"shape\":[%zu,%zu],\"threads\":%u,"
                "\"compiled_us\":%.1f,\"eager_us\":%.1f,\"speedup\":%.2f,\"err_compiled\":%.2e,\"err_eager\":%.2e}\n",
                name, R, C, threads, t[0].median_us, t[1].median_us, t[1].median_us / t[0].median_us, err_c, err_e);
  };
  one("layer_norm->softmax", ln_sm, ref_ln_sm);
  one("softmax->layer_norm", sm_ln, ref_sm_ln);

  // The same model with layer_norm's formula written out, which the rewrite does not match.
  auto sm_ln_written = [&](const auto& v) {
    const auto y = fb::softmax(v);
    const auto centered = y - fb::mean(y, fb::axis<-1>, fb::keepdim);
    return centered * fb::rsqrt(fb::mean(centered * centered, fb::axis<-1>, fb::keepdim) + 1e-5f) * gamma + beta;
  };
  auto rewritten = fb::compile(sm_ln, {.threads = threads});
  auto written = fb::compile(sm_ln_written, {.threads = threads});
  fb::tensor<float, fb::shape<R, C>> yr, yw;
  rewritten.run(yr, x);
  written.run(yw, x);
  const auto t = bh::measure_interleaved({{{}, [&] { rewritten.run(yr, x); }}, {{}, [&] { written.run(yw, x); }}});
  std::printf("{\"bench\":\"composite\",\"model\":\"softmax->layer_norm rewritten vs written out\",\"shape\":[%zu,%zu],"
              "\"threads\":%u,\"rewritten_us\":%.1f,\"written_out_us\":%.1f,\"time_ratio\":%.3f,\"err_rewritten\":%.2e,"
              "\"err_written_out\":%.2e}\n",
              R, C, threads, t[0].median_us, t[1].median_us, t[0].median_us / t[1].median_us,
              bh::max_rel_err(yr.data(), ref_sm_ln.data(), R * C), bh::max_rel_err(yw.data(), ref_sm_ln.data(), R * C));
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 1;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--threads=", 10) == 0) threads = static_cast<unsigned>(std::atoi(argv[i] + 10));
  run<512, 1024>(threads);
  run<4096, 4096>(threads);
}
