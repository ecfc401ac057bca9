// bench/fast_math.cpp: options::fast_math on the host (issue 4). For elementwise workloads heavy in
// gelu, tanh and exp, and for W1c, W2c and W3c (b32) of the CPU suite, the same model compiled
// faithful (compile(model)) and fast (compile<options{.fast_math = true}>(model)), static shapes:
//   - error of each against a double reference (every element): max |y - ref| / max |ref| (the
//     fusebox::ab measure) and max |y - ref|;
//   - time: median of timed run(out, ...) calls after warm-up, the two interleaved in rounds
//     (bench/harness.hpp) so that load from other processes falls on both alike.
// Usage: bench_fast_math [--threads=N] [--quick]   (default: 1 thread)
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

struct row {
  std::string workload, what;
  double faithful_us = 0, fast_us = 0, faithful_rel = 0, fast_rel = 0, faithful_abs = 0, fast_abs = 0;
};

double max_abs_err(const float* y, const std::vector<double>& ref) {
  double d = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) d = std::max(d, std::fabs(double(y[i]) - ref[i]));
  return d;
}

double gelu_d(double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }
double sigmoid_d(double v) { return 1 / (1 + std::exp(-v)); }

/// Times and checks one model, faithful and fast, on the same arguments.
template <class Out, class Model, class... Args>
row compare(const char* workload, const char* what, Model model, const std::vector<double>& ref, unsigned threads,
            const bh::interleave_config& cfg, const Args&... args) {
  auto faithful = fb::compile(model, fb::options{.threads = threads});
  auto fast = fb::compile<fb::options{.fast_math = true, .threads = 0}>(model);
  Out y_faithful, y_fast;
  faithful.run(y_faithful, args...);
  fast.run(y_fast, args...);
  row r{workload, what};
  r.faithful_rel = bh::max_rel_err(y_faithful.data(), ref.data(), ref.size());
  r.fast_rel = bh::max_rel_err(y_fast.data(), ref.data(), ref.size());
  r.faithful_abs = max_abs_err(y_faithful.data(), ref);
  r.fast_abs = max_abs_err(y_fast.data(), ref);
  const auto t = bh::measure_interleaved({{{}, [&] { faithful.run(y_faithful, args...); }},
                                          {{}, [&] { fast.run(y_fast, args...); }}},
                                         cfg);
  r.faithful_us = t[0].median_us;
  r.fast_us = t[1].median_us;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 1;
  bh::interleave_config cfg;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) threads = unsigned(std::stoul(argv[i] + 10));
    else if (std::strcmp(argv[i], "--quick") == 0) cfg.warmup = 2, cfg.min_iters = 5, cfg.long_min_iters = 3, cfg.min_rounds = 2;
    else {
      std::fprintf(stderr, "usage: %s [--threads=N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  // The static-path fast program takes its threads from fusebox::default_threads().
  fb::set_default_threads(threads);
  std::vector<row> rows;

  constexpr std::size_t R = 1024, C = 4096;  // elementwise: 16 MiB in, 16 MiB out
  fb::tensor<float, fb::shape<R, C>> x;
  x.fill_random(1, -4.0f, 4.0f);
  using XT = fb::tensor<float, fb::shape<R, C>>;
  auto ref_of = [&](auto f) {
    std::vector<double> ref(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) ref[i] = f(double(x.flat(i)));
    return ref;
  };
  rows.push_back(compare<XT>(
      "gelu", "gelu(x), x [1024, 4096] in [-4, 4]", [](auto x) { return fb::gelu(x); }, ref_of(gelu_d), threads, cfg, x));
  rows.push_back(compare<XT>(
      "tanh", "tanh(x)", [](auto x) { return fb::tanh(x); }, ref_of([](double v) { return std::tanh(v); }), threads,
      cfg, x));
  rows.push_back(compare<XT>(
      "exp", "exp(x)", [](auto x) { return fb::exp(x); }, ref_of([](double v) { return std::exp(v); }), threads, cfg,
      x));
  auto mix = [](auto x) { return fb::gelu(x) + fb::tanh(x) * fb::sigmoid(x) + fb::exp(x * 0.5f); };
  rows.push_back(compare<XT>(
      "mix", "gelu(x) + tanh(x) sigmoid(x) + exp(x / 2)", mix,
      ref_of([](double v) { return gelu_d(v) + std::tanh(v) * sigmoid_d(v) + std::exp(0.5 * v); }), threads, cfg, x));

  // W1c and W2c of the CPU suite (bench/cpu_workloads.cpp), on a quarter of the rows.
  {
    fb::tensor<float, fb::shape<C>> w, b;
    fb::tensor<float, fb::shape<R, C>> xs;
    xs.fill_random(2), w.fill_random(3), b.fill_random(4);
    std::vector<double> ref(xs.size());
    for (std::size_t r = 0; r < R; ++r)
      for (std::size_t j = 0; j < C; ++j) {
        const double v = xs.flat(r * C + j);
        ref[r * C + j] = gelu_d(v * w.flat(j) + b.flat(j)) * sigmoid_d(v);
      }
    auto w1 = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x); };
    rows.push_back(compare<XT>("W1c", "gelu(x w + b) sigmoid(x), [1024, 4096]", w1, ref, threads, cfg,
                                            xs, w, b));
    auto w2 = [](auto x, auto g, auto b) { return fb::layer_norm(fb::softmax(x), g, b, 1e-5f); };
    for (std::size_t r = 0; r < R; ++r) {
      double mx = -1e300, s = 0;
      for (std::size_t j = 0; j < C; ++j) mx = std::max(mx, double(xs.flat(r * C + j)));
      std::vector<double> e(C);
      for (std::size_t j = 0; j < C; ++j) s += e[j] = std::exp(double(xs.flat(r * C + j)) - mx);
      double mean = 0, var = 0;
      for (std::size_t j = 0; j < C; ++j) mean += e[j] /= s;
      mean /= C;
      for (std::size_t j = 0; j < C; ++j) var += (e[j] - mean) * (e[j] - mean);
      var /= C;
      for (std::size_t j = 0; j < C; ++j) ref[r * C + j] = (e[j] - mean) / std::sqrt(var + 1e-5) * w.flat(j) + b.flat(j);
    }
    rows.push_back(compare<XT>("W2c", "layer_norm(softmax(x), g, b), [1024, 4096]", w2, ref, threads,
                                            cfg, xs, w, b));
  }

  // W3c at batch 32: the GELU MLP 1024 -> 4096 -> 4096 -> 1024 (matmuls with a gelu epilogue).
  {
    constexpr std::size_t B = 32;
    fb::tensor<float, fb::shape<B, 1024>> xm;
    fb::tensor<float, fb::shape<1024, 4096>> w1;
    fb::tensor<float, fb::shape<4096, 4096>> w2;
    fb::tensor<float, fb::shape<4096, 1024>> w3;
    fb::tensor<float, fb::shape<4096>> b1, b2;
    fb::tensor<float, fb::shape<1024>> b3;
    xm.fill_random(10);
    bh::fill_w3_weights(w1, b1, w2, b2, w3, b3);
    auto layer = [](const std::vector<double>& in, std::size_t K, const auto& w, const auto& b, std::size_t N, bool act) {
      std::vector<double> out(B * N);
      for (std::size_t i = 0; i < B; ++i)
        for (std::size_t n = 0; n < N; ++n) {
          double s = b.flat(n);
          for (std::size_t k = 0; k < K; ++k) s += in[i * K + k] * double(w.flat(k * N + n));
          out[i * N + n] = act ? gelu_d(s) : s;
        }
      return out;
    };
    std::vector<double> in(xm.size());
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = xm.flat(i);
    const auto ref = layer(layer(layer(in, 1024, w1, b1, 4096, true), 4096, w2, b2, 4096, true), 4096, w3, b3, 1024, false);
    auto mlp = [](auto x, auto w1, auto b1, auto w2, auto b2, auto w3, auto b3) {
      auto h1 = fb::gelu(fb::matmul(x, w1) + b1);
      auto h2 = fb::gelu(fb::matmul(h1, w2) + b2);
      return fb::matmul(h2, w3) + b3;
    };
    rows.push_back(compare<fb::tensor<float, fb::shape<B, 1024>>>(
        "W3c_b32", "GELU MLP 1024-4096-4096-1024, batch 32", mlp, ref, threads, cfg, xm, w1, b1, w2, b2, w3, b3));
  }

  std::printf("fast_math on the host: %u thread(s); median of timed run() calls after warm-up, faithful and fast "
              "interleaved\n\n",
              threads);
  std::printf("%-8s %-46s %12s %12s %8s  %-21s %-21s\n", "workload", "model", "faithful ms", "fast ms", "speedup",
              "faithful rel / abs", "fast rel / abs");
  for (const row& r : rows)
    std::printf("%-8s %-46s %12.3f %12.3f %7.2fx  %9.2e / %9.2e  %9.2e / %9.2e\n", r.workload.c_str(), r.what.c_str(),
                r.faithful_us / 1e3, r.fast_us / 1e3, r.faithful_us / r.fast_us, r.faithful_rel, r.faithful_abs,
                r.fast_rel, r.fast_abs);
  return 0;
}
