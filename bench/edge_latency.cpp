// bench/edge_latency.cpp: batch-1, one-thread latency of two float32 models (issue 23), fusebox
// compiled against XNNPACK (subgraph runtime) and Eigen 3.4 where those peers were built:
//   edge_T2_cnn_b1  BENCHMARKS.md's T2 CNN forward: conv 5x5 32, relu, pool 2, conv 5x5 64, relu,
//                   pool 2, linear 1024 -> 10 (bench/edge_models.hpp)
//   edge_mlp_b1     784 -> 512 -> relu -> 10
// Every system is built from the same weights (XNNPACK's converted to NHWC) and its output is
// checked against a double reference and against fusebox's before anything is timed; a model
// whose outputs disagree is not timed. Then all systems are timed in interleaved rounds
// (harness.hpp, measure_interleaved): each gets `--warmup` calls, then every round gives each in
// turn one untimed call and `--calls` timed ones, so drift in the machine's speed falls on all alike.
//
//   edge_latency [--rounds=20] [--calls=200] [--warmup=50] [--out=results.jsonl] [--explain]
//
// --explain first prints what fusebox's compile() makes of each model (fusebox/explain.hpp).
//
// Prints one JSON object per measurement (appended to --out), then a table with each system's
// median over all its timed calls and its ratio to fusebox's (> 1: fusebox is faster).
#include <fusebox/cpu.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "edge_models.hpp"
#include "harness.hpp"
#ifdef FUSEBOX_BENCH_HAVE_XNNPACK
#include "peers/xnnpack_cpu.hpp"
#endif
#ifdef FUSEBOX_BENCH_HAVE_EIGEN
#include "peers/eigen_edge.hpp"
#endif

namespace fb = fusebox;
using namespace fusebox::bench;

namespace {

constexpr double tolerance = 1e-4;  // max |y - ref| / max |ref|, against the double reference and fusebox

struct cli {
  int rounds = 20, calls = 200, warmup = 50;
  std::string out;
  bool explain = false;
};

cli parse(int argc, char** argv) {
  cli c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (k == "--rounds" && !v.empty()) c.rounds = std::max(1, std::stoi(v));
    else if (k == "--calls" && !v.empty()) c.calls = std::clamp(std::stoi(v), 1, 1000);  // harness: bursts <= 1000
    else if (k == "--warmup" && !v.empty()) c.warmup = std::max(1, std::stoi(v));
    else if (k == "--out") c.out = v;
    else if (k == "--explain" && v.empty()) c.explain = true;
    else {
      std::fprintf(stderr, "usage: edge_latency [--rounds=20] [--calls=200] [--warmup=50] [--out=FILE] [--explain]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  return c;
}

// ---- the double references --------------------------------------------------------------------

/// relu(max_pool2x2(conv(x, w) + b)), stride 1, no padding: x [C, S, S], w [O, C, K, K] ->
/// [O, P, P] with P = (S - K + 1) / 2.
std::vector<double> conv_relu_pool_ref(const std::vector<double>& x, std::size_t c, std::size_t s, const float* w,
                                       const float* b, std::size_t o, std::size_t k) {
  const std::size_t os = s - k + 1, ps = os / 2;
  std::vector<double> conv(o * os * os), y(o * ps * ps);
  for (std::size_t a = 0; a < o; ++a)
    for (std::size_t i = 0; i < os; ++i)
      for (std::size_t j = 0; j < os; ++j) {
        double v = b[a];
        for (std::size_t ch = 0; ch < c; ++ch)
          for (std::size_t u = 0; u < k; ++u)
            for (std::size_t t = 0; t < k; ++t)
              v += x[(ch * s + i + u) * s + j + t] * w[((a * c + ch) * k + u) * k + t];
        conv[(a * os + i) * os + j] = std::max(v, 0.0);
      }
  for (std::size_t a = 0; a < o; ++a)
    for (std::size_t i = 0; i < ps; ++i)
      for (std::size_t j = 0; j < ps; ++j) {
        const double* p = &conv[(a * os + 2 * i) * os + 2 * j];
        y[(a * ps + i) * ps + j] = std::max(std::max(p[0], p[1]), std::max(p[os], p[os + 1]));
      }
  return y;
}

/// x [in] @ w [in, out] + b, then relu if asked.
std::vector<double> linear_ref(const std::vector<double>& x, const float* w, const float* b, std::size_t out, bool relu) {
  std::vector<double> y(b, b + out);
  for (std::size_t i = 0; i < x.size(); ++i)
    for (std::size_t o = 0; o < out; ++o) y[o] += x[i] * w[i * out + o];
  if (relu)
    for (double& v : y) v = std::max(v, 0.0);
  return y;
}

// ---- checking and timing ------------------------------------------------------------------------

/// One system's model, ready to time: `call` runs one forward pass on the shared input into `out`.
struct entry {
  std::string system, mode, config;
  std::function<void()> call;
  const float* out;
};

/// fusebox's two entries: frozen first (parameters captured, options::freezing: fusebox's best
/// configuration, as XNNPACK's static weights are; the ratios are against it), then the same model
/// with its parameters as arguments.
std::vector<entry> fusebox_entries(std::function<void()> frozen, const float* frozen_out, std::function<void()> args,
                                   const float* args_out) {
  return {{"fusebox", "frozen",
           "parameters captured, fb::compile, options{.threads = 1, .freezing = true}, run(out, x) into a caller-owned "
           "tensor",
           std::move(frozen), frozen_out},
          {"fusebox-args", "compiled",
           "parameters as arguments, fb::compile, options{.threads = 1}, run(out, x, w1, ...) into a caller-owned tensor",
           std::move(args), args_out}};
}

/// A peer's model for one kind of parameters, as peers/*.hpp declare them.
template <class Params>
struct peer {
  const char* system;
  const char* mode;
  std::string (*describe)();
  std::unique_ptr<edge::runner> (*make)(const Params&);
};

std::vector<peer<edge::t2_cnn_params>> peers_of(const edge::t2_cnn_params&) {
  return {
#ifdef FUSEBOX_BENCH_HAVE_XNNPACK
      {"xnnpack", "runtime", edge::xnnpack_describe, edge::xnnpack_t2_cnn},
#endif
#ifdef FUSEBOX_BENCH_HAVE_EIGEN
      {"eigen", "eager", edge::eigen_edge_describe, edge::eigen_t2_cnn},
#endif
  };
}

std::vector<peer<edge::mlp_params>> peers_of(const edge::mlp_params&) {
  return {
#ifdef FUSEBOX_BENCH_HAVE_XNNPACK
      {"xnnpack", "runtime", edge::xnnpack_describe, edge::xnnpack_mlp},
#endif
#ifdef FUSEBOX_BENCH_HAVE_EIGEN
      {"eigen", "eager", edge::eigen_edge_describe, edge::eigen_mlp},
#endif
  };
}

/// A built peer model and the output it writes.
struct peer_model {
  std::unique_ptr<edge::runner> model;
  floats out;
};

/// Adds every peer built from `p`, reading `in` (with the slack edge::runner asks for). A peer
/// that fails to build is reported and left out (status 1).
template <class Params>
void add_peers(std::vector<entry>& es, std::vector<peer_model>& keep, const Params& p, const float* in, int& status) {
  const auto peers = peers_of(p);
  for (const auto& q : peers) {
    try {
      peer_model& m = keep.emplace_back(peer_model{q.make(p), floats(Params::outputs)});
      edge::runner* r = m.model.get();
      float* out = m.out.data();
      es.push_back({q.system, q.mode, q.describe(), [r, in, out] { r->run(in, out); }, out});
    } catch (const std::exception& e) {
      std::printf("# %s: could not build the model: %s\n", q.system, e.what());
      status = 1;
    }
  }
}

/// Checks every system against the reference and fusebox (es[0]); if all agree, times them all
/// interleaved, emits a record each and adds their rows to the table. Returns false on a mismatch.
bool check_and_time(const char* workload, double flops, const std::vector<entry>& es, const std::vector<double>& ref,
                    const cli& c, table& tab) {
  const std::size_t n = ref.size();
  std::vector<double> err(es.size()), vs_fusebox(es.size());
  for (const auto& e : es) e.call();
  const std::vector<double> fusebox_out(es[0].out, es[0].out + n);
  bool ok = true;
  for (std::size_t i = 0; i < es.size(); ++i) {
    err[i] = max_rel_err(es[i].out, ref.data(), n);
    vs_fusebox[i] = max_rel_err(es[i].out, fusebox_out.data(), n);
    const bool good = err[i] <= tolerance && vs_fusebox[i] <= tolerance;
    std::printf("# %s %-8s max rel err vs double %.2e, vs fusebox %.2e: %s\n", workload, es[i].system.c_str(), err[i],
                vs_fusebox[i], good ? "ok" : "CHECK FAILED");
    ok = ok && good;
  }
  if (!ok) {
    std::printf("# %s: outputs disagree; not timed\n", workload);
    return false;
  }

  interleave_config cfg;
  cfg.warmup = c.warmup;
  cfg.min_rounds = c.rounds;
  cfg.min_iters = c.calls * c.rounds;
  cfg.long_call_s = 1e9;     // every call counts as short: the same number of calls for each system
  cfg.burst_seconds = 1e9;   // so each round's burst is min_iters / min_rounds = --calls
  std::vector<contender> con;
  for (const auto& e : es) con.push_back({{}, e.call});
  const std::vector<timing> t = measure_interleaved(con, cfg);

  for (std::size_t i = 0; i < es.size(); ++i) {
    const double ratio = t[i].median_us / t[0].median_us;
    record r;
    r.workload = workload, r.system = es[i].system, r.mode = es[i].mode, r.config = es[i].config;
    r.threads = 1;
    r.set(t[i]);
    r.flops = flops;
    r.gflops = flops / (t[i].median_us * 1e3);
    r.max_rel_err = err[i];
    if (i > 0) r.note = fmt("median / fusebox's = %.3f", ratio);
    emit(r, c.out);
    tab.add({workload, es[i].system, fmt("%.2f", t[i].median_us), fmt("%.2f", t[i].p10_us), fmt("%.2f", t[i].p90_us),
             fmt("%.3f", ratio), fmt("%.2f", r.gflops), fmt("%.1e", err[i]), std::to_string(t[i].iters)});
  }
  return true;
}

// ---- the models ---------------------------------------------------------------------------------

/// Torch's default initialisation scale, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), so activations stay O(1).
template <class T>
void init(T& t, std::uint64_t seed, std::size_t fan_in) {
  const float a = 1.0f / std::sqrt(static_cast<float>(fan_in));
  t.fill_random(seed, -a, a);
}

bool t2_cnn(const cli& c, table& tab, int& status) {
  using P = edge::t2_cnn_params;
  fb::tensor<float, fb::shape<1, 1, 28, 28>> x;
  fb::tensor<float, fb::shape<32, 1, 5, 5>> w1;
  fb::tensor<float, fb::shape<32>> b1;
  fb::tensor<float, fb::shape<64, 32, 5, 5>> w2;
  fb::tensor<float, fb::shape<64>> b2;
  fb::tensor<float, fb::shape<1024, 10>> w3;
  fb::tensor<float, fb::shape<10>> b3;
  fb::tensor<float, fb::shape<1, 10>> y;
  x.fill_random(1, 0.0f, 1.0f);
  init(w1, 2, 25), init(b1, 3, 25), init(w2, 4, 800), init(b2, 5, 800), init(w3, 6, 1024), init(b3, 7, 1024);

  const auto model = [](auto x, auto w1, auto b1, auto w2, auto b2, auto w3, auto b3) {
    const auto h1 = fb::max_pool2d<2>(fb::relu(fb::conv2d(x, w1, b1)));
    const auto h2 = fb::max_pool2d<2>(fb::relu(fb::conv2d(h1, w2, b2)));
    return fb::matmul(fb::reshape<fb::shape<1, 1024>>(h2), w3) + b3;
  };
  const fb::options one_thread{.threads = 1};
  if (c.explain) fb::explain(model, one_thread, x, w1, b1, w2, b2, w3, b3);
  auto net = fb::compile(model, one_thread);
  // The same model with its parameters captured and options::freezing: they are constants, so the
  // Winograd-transformed weights of the second convolution are made once (XNNPACK's static weights).
  auto frozen = fb::compile([&](auto xi) { return model(xi, w1, b1, w2, b2, w3, b3); },
                            fb::options{.threads = 1, .freezing = true});
  fb::tensor<float, fb::shape<1, 10>> yf;
  std::vector<entry> es = fusebox_entries([&] { frozen.run(yf, x); }, yf.data(),
                                          [&] { net.run(y, x, w1, b1, w2, b2, w3, b3); }, y.data());

  const P p{w1.data(), b1.data(), w2.data(), b2.data(), w3.data(), b3.data()};
  floats in(P::inputs + edge::runner::input_slack_bytes / sizeof(float));
  std::memcpy(in.data(), x.data(), P::inputs * sizeof(float));
  std::vector<peer_model> keep;
  add_peers(es, keep, p, in.data(), status);

  const std::vector<double> xd(x.data(), x.data() + P::inputs);
  const auto h1 = conv_relu_pool_ref(xd, 1, P::side, p.w1, p.b1, P::c1, P::kernel);
  const auto h2 = conv_relu_pool_ref(h1, P::c1, P::pooled1, p.w2, p.b2, P::c2, P::kernel);
  const auto ref = linear_ref(h2, p.w3, p.b3, P::classes, false);
  const double k2 = P::kernel * P::kernel;
  const double flops = 2.0 * (P::c1 * P::side1 * P::side1 * k2 + P::c2 * P::side2 * P::side2 * P::c1 * k2 +
                              static_cast<double>(P::features) * P::classes);
  return check_and_time("edge_T2_cnn_b1", flops, es, ref, c, tab);
}

bool mlp(const cli& c, table& tab, int& status) {
  using P = edge::mlp_params;
  fb::tensor<float, fb::shape<1, 784>> x;
  fb::tensor<float, fb::shape<784, 512>> w1;
  fb::tensor<float, fb::shape<512>> b1;
  fb::tensor<float, fb::shape<512, 10>> w2;
  fb::tensor<float, fb::shape<10>> b2;
  fb::tensor<float, fb::shape<1, 10>> y;
  x.fill_random(11, 0.0f, 1.0f);
  init(w1, 12, 784), init(b1, 13, 784), init(w2, 14, 512), init(b2, 15, 512);

  const auto model = [](auto x, auto w1, auto b1, auto w2, auto b2) {
    return fb::matmul(fb::relu(fb::matmul(x, w1) + b1), w2) + b2;
  };
  const fb::options one_thread{.threads = 1};
  if (c.explain) fb::explain(model, one_thread, x, w1, b1, w2, b2);
  auto net = fb::compile(model, one_thread);
  // As the CNN: parameters captured and frozen first (W1's column blocks packed once for the GEMV).
  auto frozen = fb::compile([&](auto xi) { return model(xi, w1, b1, w2, b2); }, fb::options{.threads = 1, .freezing = true});
  fb::tensor<float, fb::shape<1, 10>> yf;
  std::vector<entry> es = fusebox_entries([&] { frozen.run(yf, x); }, yf.data(),
                                          [&] { net.run(y, x, w1, b1, w2, b2); }, y.data());

  const P p{w1.data(), b1.data(), w2.data(), b2.data()};
  floats in(P::inputs + edge::runner::input_slack_bytes / sizeof(float));
  std::memcpy(in.data(), x.data(), P::inputs * sizeof(float));
  std::vector<peer_model> keep;
  add_peers(es, keep, p, in.data(), status);

  const std::vector<double> xd(x.data(), x.data() + P::inputs);
  const auto ref = linear_ref(linear_ref(xd, p.w1, p.b1, P::hidden, true), p.w2, p.b2, P::outputs, false);
  const double flops = 2.0 * (P::inputs * P::hidden + P::hidden * P::outputs);
  return check_and_time("edge_mlp_b1", flops, es, ref, c, tab);
}

}  // namespace

int main(int argc, char** argv) {
  const cli c = parse(argc, argv);
#if defined(__AVX512F__)
  constexpr const char* avx512 = "yes";
#else
  constexpr const char* avx512 = "no";
#endif
#if defined(__AVX2__)
  constexpr const char* avx2 = "yes";
#else
  constexpr const char* avx2 = "no";
#endif
  std::printf("# edge_latency: batch 1, 1 thread; %d warm-up calls, then %d rounds of %d timed calls per system, "
              "interleaved\n",
              c.warmup, c.rounds, c.calls);
  std::printf("# ISA of fusebox's (and Eigen's) code, -march=native: __AVX512F__ %s, __AVX2__ %s; XNNPACK picks its "
              "own microkernels at run time\n",
              avx512, avx2);
#ifndef FUSEBOX_BENCH_HAVE_XNNPACK
  std::printf("# xnnpack: not built (libxnnpack-dev and libpthreadpool-dev not found at configure time)\n");
#endif
#ifndef FUSEBOX_BENCH_HAVE_EIGEN
  std::printf("# eigen: not built (Eigen 3.4 not found at configure time)\n");
#endif

  int status = 0;
  table tab({"workload", "system", "median us", "p10 us", "p90 us", "time / fusebox", "GFLOP/s", "max rel err", "calls"});
  if (!t2_cnn(c, tab, status)) status = 1;
  tab.separator();
  if (!mlp(c, tab, status)) status = 1;
  std::printf("\n");
  tab.print();
  std::printf("time / fusebox: a system's median over fusebox's; above 1, fusebox is faster\n");
  return status;
}
