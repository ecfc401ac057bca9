// bench/dynamic.cpp: the run-time path (issue 3) on W1c, W2c and W3c with the batch dimension
// `dyn`, beside the static path on the same shapes, in one run:
//   - JIT vs static speed after warm-up, for the first (exact) specialisation and for the
//     symbolic one that follows a batch change;
//   - cold compile seconds per graph (the kernel prelude precompiled first, and its one-time cost
//     reported on its own line);
//   - warm start in a fresh process from the disk cache: process start to first result, less the
//     benchmark's own input set-up (100 MB of weights filled with random numbers), which is
//     timed and reported on its own;
//   - a variable-batch workload (sizes drawn from 1..256): compiles stay at 2 with `automatic`;
//   - regional compilation: cold first result of 12 layers of one compiled residual block against
//     1 layer, and of 2 blocks written as one graph (each in a fresh process whose kernels are
//     all new; the prelude is warm).
// Prints JSON lines (BENCHMARKS.md fields) and a table.
//   dynamic [--threads N]               everything
//   dynamic --modes [--threads N]       only what options::mode buys on the CPU (max_autotune vs
//                                       default on GEMM and conv shapes; reduce_overhead's per-call
//                                       host time on a small dyn model)
//   dynamic --schedule [--threads N]    only kernels whose run-time schedule changed in issue 21
//                                       (dimension merging, column-reduction task split): the
//                                       run-time path's time per call and the static path's on the
//                                       same shapes; build it against old and new headers and
//                                       alternate the binaries
//   dynamic --call [--threads N]        the host's time per call of a small model (static, dyn
//                                       default, dyn reduce_overhead, a dyn value_and_grad): the
//                                       entry point and the call pipeline; alternate old and new
//                                       binaries
//   dynamic --warm-child W CACHE        (internal) the fresh process of the warm-start measurement
//   dynamic --regional-child V CACHE    (internal) cold first result of variant V (1, 12 or 2g)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <fusebox/fusebox.hpp>

#include "harness.hpp"

namespace fb = fusebox;
namespace bench = fusebox::bench;
using bench::fmt;

namespace {

const auto process_start = std::chrono::steady_clock::now();

auto w1 = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x); };
auto w2 = [](auto x, auto g, auto b) { return fb::layer_norm(fb::softmax(x), g, b, 1e-5f); };
auto w3 = [](auto x, auto w1_, auto b1, auto w2_, auto b2, auto w3_, auto b3) {
  auto h1 = fb::gelu(fb::matmul(x, w1_) + b1);
  auto h2 = fb::gelu(fb::matmul(h1, w2_) + b2);
  return fb::matmul(h2, w3_) + b3;
};

template <std::size_t N>
using vec = fb::tensor<float, fb::shape<N>>;
template <std::size_t R, std::size_t C>
using mat = fb::tensor<float, fb::shape<R, C>>;
template <std::size_t C>
using dmat = fb::tensor<float, fb::shape<fb::dyn, C>>;

struct mlp_weights {
  mat<1024, 4096> w1;
  vec<4096> b1;
  mat<4096, 4096> w2;
  vec<4096> b2;
  mat<4096, 1024> w3;
  vec<1024> b3;
  mlp_weights() { bench::fill_w3_weights(w1, b1, w2, b2, w3, b3); }
};

std::vector<bench::record> records;
bench::table tab({"workload", "mode", "threads", "median ms", "vs static", "compile s", "note"});

void add(bench::record r, double static_us) {
  tab.add({r.workload, r.mode, std::to_string(r.threads), r.median_us > 0 ? fmt("%.3f", r.median_us / 1e3) : "-",
           r.median_us > 0 && static_us > 0 ? fmt("%.2fx", static_us / r.median_us) : "-",
           r.compile_s >= 0 ? fmt("%.2f", r.compile_s) : "-", r.note});
  std::printf("%s\n", bench::to_json(r).c_str());
  records.push_back(std::move(r));
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Static vs JIT (exact, then symbolic) for one workload at batch B.
template <class Model, class StaticArgs, class DynArgs, class OtherArgs>
void compare(const char* name, Model model, unsigned threads, const StaticArgs& s_args, const DynArgs& d_args,
             const OtherArgs& other_args) {
  auto fast_static = fb::compile(model, {.threads = threads});
  const bench::timing ts = bench::measure([&] { std::apply([&](const auto&... a) { (void)fast_static(a...); }, s_args); });
  bench::record rs{name, "fusebox", "compiled"};
  rs.threads = threads;
  rs.set(ts);
  rs.note = "static path";
  add(rs, ts.median_us);

  auto fast_dyn = fb::compile(model, {.threads = threads});
  const auto compiles0 = fb::jit::counters().compiles.load();
  const auto t0 = std::chrono::steady_clock::now();
  std::apply([&](const auto&... a) { (void)fast_dyn(a...); }, d_args);
  const double cold = seconds(t0);
  const bench::timing te = bench::measure([&] { std::apply([&](const auto&... a) { (void)fast_dyn(a...); }, d_args); });
  bench::record re{std::string(name) + "_dyn", "fusebox", "jit"};
  re.threads = threads;
  re.set(te);
  re.compile_s = cold;
  re.note = "exact specialisation; first call " + fmt("%.2f s", cold) + ", " +
            std::to_string(fb::jit::counters().compiles.load() - compiles0) + " compile(s)";
  add(re, ts.median_us);

  // A different batch first: the batch becomes symbolic; then time the original batch on it.
  const auto t1 = std::chrono::steady_clock::now();
  std::apply([&](const auto&... a) { (void)fast_dyn(a...); }, other_args);
  const double recompile = seconds(t1);
  const bench::timing tsym = bench::measure([&] { std::apply([&](const auto&... a) { (void)fast_dyn(a...); }, d_args); });
  bench::record rsym{std::string(name) + "_dyn", "fusebox", "jit"};
  rsym.threads = threads;
  rsym.set(tsym);
  rsym.compile_s = recompile;
  rsym.note = "batch symbolic (after a recompile of " + fmt("%.2f s", recompile) + ")";
  add(rsym, ts.median_us);
}

int warm_child(const std::string& which) {
  // Fresh process, warm disk cache: nothing may compile. The inputs are made first and timed,
  // so what is left of "process start to first result" is fusebox's part and the run.
  fb::jit::forbid_compiles(true);
  if (which == "W3c") {
    const auto setup0 = std::chrono::steady_clock::now();
    mlp_weights w;
    dmat<1024> x(32);
    x.fill_random(1);
    const double setup = seconds(setup0);
    auto fast = fb::compile(w3);
    const auto before = std::chrono::steady_clock::now();
    const auto y = fast(x, w.w1, w.b1, w.w2, w.b2, w.w3, w.b3);
    const double first = seconds(before);
    const auto again = std::chrono::steady_clock::now();
    (void)fast(x, w.w1, w.b1, w.w2, w.b2, w.w3, w.b3);
    const double run = seconds(again);
    const double since_start = seconds(process_start);
    std::printf("%.4f %.4f %.4f %.4f %g\n", since_start, setup, first, run, static_cast<double>(y.flat(7)));
  }
  return 0;
}

/// One residual block of width D: x + gelu(layer_norm(x) @ w + b). Every block of a stack has
/// the same structure (its own weights), so its kernels are identical.
template <std::size_t D>
struct block_weights {
  vec<D> gamma, beta, bias;
  mat<D, D> w;
  explicit block_weights(std::uint64_t seed) {
    gamma.fill_random(seed, 0.5f, 1.5f);
    beta.fill_random(seed + 1);
    bias.fill_random(seed + 2);
    w.fill_random(seed + 3, -1.0f / D, 1.0f / D);
  }
};

auto residual_block = [](auto x, auto gamma, auto beta, auto w, auto bias) {
  return x + fb::gelu(fb::matmul(fb::layer_norm(x, gamma, beta, 1e-5f), w) + bias);
};

/// L blocks as one expression. Each use of `h` copies its expression, so the tree grows as 4^L:
/// only small L (the structural-key measurement); deep stacks compile the block (regional).
template <std::size_t L, class X, class Blocks>
auto residual_stack(const X& x, const Blocks& blocks) {
  if constexpr (L == 0) {
    return x;
  } else {
    const auto h = residual_stack<L - 1>(x, blocks);
    const auto& p = blocks[L - 1];
    return residual_block(h, p.gamma, p.beta, p.w, p.bias);
  }
}

/// Cold first result of an L-layer model in this fresh process: prints seconds, compiles and
/// kernels compiled. `InGraph`: the L blocks written as one expression and compiled as one
/// graph; otherwise torch.compile's regional form, one compiled block called L times with each
/// layer's weights. Widths differ between the variants, so none finds another's kernels in the
/// shared cache directory.
template <std::size_t L, std::size_t D, bool InGraph>
int regional_child_run() {
  std::vector<block_weights<D>> blocks;
  for (std::size_t l = 0; l < L; ++l) blocks.emplace_back(100 + 10 * l);
  dmat<D> x(64);
  x.fill_random(7);
  dmat<D> y = x;
  const auto compiles0 = fb::jit::counters().compiles.load();
  const auto t0 = std::chrono::steady_clock::now();
  if constexpr (InGraph) {
    auto fast = fb::compile([&blocks](auto in) { return residual_stack<L>(in, blocks); });
    y = fast(x);
  } else {
    auto layer = fb::compile(residual_block);
    for (const auto& p : blocks) y = layer(y, p.gamma, p.beta, p.w, p.bias);
  }
  const double first = seconds(t0);
  std::printf("%.4f %llu %zu %g\n", first,
              static_cast<unsigned long long>(fb::jit::counters().compiles.load() - compiles0),
              static_cast<std::size_t>(fb::jit::counters().kernels_compiled.load()), static_cast<double>(y.flat(3)));
  return 0;
}

int regional_child(const std::string& variant) {
  if (variant == "1") return regional_child_run<1, 384, false>();
  if (variant == "12") return regional_child_run<12, 448, false>();
  if (variant == "2g") return regional_child_run<2, 320, true>();
  return 2;
}


}  // namespace

/// --modes (issue 20, item 14): what options::mode buys on the CPU, each pair timed in interleaved
/// rounds in one process (medians):
///   max_autotune vs default on GEMM and conv2d shapes (static extents; the first max_autotune
///     call times the candidates, FUSEBOX_LOGS=autotune prints them; timing starts after it);
///   reduce_overhead vs default per call on a small dyn model, where the call is mostly host work.
template <class Model, class... Args>
void mode_pair(const char* what, Model model, unsigned threads, const Args&... args) {
  auto plain = fb::compile(model, fb::options{.threads = threads});
  auto tuned = fb::compile(model, fb::options{.mode = fb::mode::max_autotune, .threads = threads});
  fb::jit::set_logs("autotune");
  const auto t0 = std::chrono::steady_clock::now();
  (void)tuned(args...);
  const double tune_s = seconds(t0);
  fb::jit::set_logs("");
  const auto t = bench::measure_interleaved({{nullptr, [&] { (void)plain(args...); }}, {nullptr, [&] { (void)tuned(args...); }}});
  std::printf("%-44s default %10.1f us  max_autotune %10.1f us  default/max_autotune %.2fx  (tuning %.3f s)\n", what,
              t[0].median_us, t[1].median_us, t[0].median_us / t[1].median_us, tune_s);
}

int modes(unsigned threads) {
  fb::jit::temp_directory cache(fb::jit::detail::temp_root(), "fusebox-bench-modes-");
  ::setenv("FUSEBOX_CACHE_DIR", cache.path().c_str(), 1);
  auto linear = [](const auto& x, const auto& w, const auto& b) { return fb::relu(fb::matmul(x, w) + b); };
  auto conv = [](const auto& x, const auto& w) { return fb::relu(fb::conv2d(x, w)); };
  {
    mat<256, 512> x;
    mat<512, 512> w;
    vec<512> b;
    x.fill_random(1), w.fill_random(2), b.fill_random(3);
    mode_pair("gemm relu(x w + b) [256,512]x[512,512]", linear, threads, x, w, b);
  }
  {
    mat<4, 1024> x;
    mat<1024, 1024> w;
    vec<1024> b;
    x.fill_random(1), w.fill_random(2), b.fill_random(3);
    mode_pair("gemm relu(x w + b) [4,1024]x[1024,1024]", linear, threads, x, w, b);
  }
  {
    mat<16, 64> x;
    mat<64, 64> w;
    vec<64> b;
    x.fill_random(1), w.fill_random(2), b.fill_random(3);
    mode_pair("gemm relu(x w + b) [16,64]x[64,64]", linear, threads, x, w, b);
  }
  {
    fb::tensor<float, fb::shape<32, 32, 12, 12>> x;
    fb::tensor<float, fb::shape<64, 32, 5, 5>> w;
    x.fill_random(1), w.fill_random(2, -0.1f, 0.1f);
    mode_pair("conv2d 5x5 [32,32,12,12] o64 (T2 layer 2)", conv, threads, x, w);
  }
  {
    fb::tensor<float, fb::shape<8, 8, 10, 10>> x;
    fb::tensor<float, fb::shape<8, 8, 5, 5>> w;
    x.fill_random(1), w.fill_random(2, -0.1f, 0.1f);
    mode_pair("conv2d 5x5 [8,8,10,10] o8", conv, threads, x, w);
  }
  {
    fb::tensor<float, fb::shape<16, 3, 28, 28>> x;
    fb::tensor<float, fb::shape<16, 3, 3, 3>> w;
    x.fill_random(1), w.fill_random(2, -0.1f, 0.1f);
    mode_pair("conv2d 3x3 [16,3,28,28] o16 (direct only)", conv, threads, x, w);
  }
  // reduce_overhead: a small dyn model (batch 8): the call's time is mostly the host's.
  {
    auto small = [](const auto& x, const auto& w, const auto& b) { return fb::softmax(fb::matmul(x, w) + b); };
    mat<32, 16> w;
    vec<16> b;
    dmat<32> x(8);
    x.fill_random(1), w.fill_random(2), b.fill_random(3);
    auto plain = fb::compile(small, fb::options{.threads = threads});
    auto fast = fb::compile(small, fb::options{.mode = fb::mode::reduce_overhead, .threads = threads});
    (void)plain(x, w, b);
    (void)fast(x, w, b);
    const auto before = fb::jit::counters().snapshot().fast_path_calls;
    bench::interleave_config cfg;
    cfg.min_iters = 2000;
    const auto t = bench::measure_interleaved({{nullptr, [&] { (void)plain(x, w, b); }}, {nullptr, [&] { (void)fast(x, w, b); }}}, cfg);
    std::printf("%-44s default %10.2f us  reduce_overhead %7.2f us  saved %.2f us a call (%llu fast-path calls)\n",
                "dyn softmax(x w + b) [8,32]x[32,16] per call", t[0].median_us, t[1].median_us,
                t[0].median_us - t[1].median_us,
                static_cast<unsigned long long>(fb::jit::counters().snapshot().fast_path_calls - before));
  }
  return 0;
}

/// --schedule (issue 21): kernels whose decisions moved into schedule/, on the run-time path
/// (batch `dyn`) beside the static path on the same shapes, each pair timed in interleaved rounds.
///   T2's relu mask: an elementwise kernel over [128, 64, 4, 4], 32768 rows of 4 unless merged;
///   T2's bias gradient: a column sum over the batch of [128, 32, 24, 24], 24 columns a row unless
///     the dimensions after the axis merge, and one task unless output rows are split too.
template <class Model, class Dyn, class Static>
void schedule_pair(const char* what, Model model, unsigned threads, const Dyn& dyn_args, const Static& static_args) {
  auto f = fb::compile(model, fb::options{.threads = threads});
  (void)std::apply(f, dyn_args);  // compile the run-time path's kernels
  (void)std::apply(f, static_args);
  const auto t = bench::measure_interleaved({{nullptr, [&] { (void)std::apply(f, dyn_args); }},
                                             {nullptr, [&] { (void)std::apply(f, static_args); }}});
  std::printf("%-52s run-time path %9.1f us  static path %9.1f us  run-time/static %.2fx\n", what, t[0].median_us,
              t[1].median_us, t[0].median_us / t[1].median_us);
}

int schedule_changes(unsigned threads) {
  fb::jit::temp_directory cache(fb::jit::detail::temp_root(), "fusebox-bench-schedule-");
  ::setenv("FUSEBOX_CACHE_DIR", cache.path().c_str(), 1);
  {
    auto mask = [](const auto& x, const auto& g) { return fb::where(fb::gt(x, 0.0f), g, 0.0f); };
    using S = fb::shape<128, 64, 4, 4>;
    using D = fb::shape<fb::dyn, 64, 4, 4>;
    fb::tensor<float, S> x, g;
    fb::tensor<float, D> xd(128), gd(128);
    x.fill_random(1), g.fill_random(2), xd.fill_random(1), gd.fill_random(2);
    schedule_pair("relu mask where(x > 0, g, 0) [128, 64, 4, 4]", mask, threads, std::tie(xd, gd), std::tie(x, g));
  }
  {
    auto bias_grad = [](const auto& g) { return fb::sum(g, fb::axis<0>); };
    using S = fb::shape<128, 32, 24, 24>;
    using D = fb::shape<fb::dyn, 32, 24, 24>;
    fb::tensor<float, S> g;
    fb::tensor<float, D> gd(128);
    g.fill_random(1), gd.fill_random(1);
    schedule_pair("column sum over the batch [128, 32, 24, 24]", bias_grad, threads, std::tie(gd), std::tie(g));
  }
  return 0;
}

/// --call (issue 21): the host's time per call of small models, where a call is mostly the entry
/// point and the pipeline below it (capture, bind, select, the call's shapes, outputs, run):
/// static extents, a dyn batch in the default mode (guards and one specialisation per call) and in
/// reduce_overhead (a repeat skips both), and a compiled value_and_grad on a dyn batch. Timed in
/// interleaved rounds in one process; build it against old and new headers and alternate the
/// binaries.
int call_overhead(unsigned threads) {
  fb::jit::temp_directory cache(fb::jit::detail::temp_root(), "fusebox-bench-call-");
  ::setenv("FUSEBOX_CACHE_DIR", cache.path().c_str(), 1);
  auto small = [](const auto& x, const auto& w, const auto& b) { return fb::softmax(fb::matmul(x, w) + b); };
  auto loss = [](const auto& x, const auto& w, const auto& b) { return fb::mean(fb::mean(fb::relu(fb::matmul(x, w) + b))); };
  mat<32, 16> w;
  vec<16> b;
  mat<8, 32> xs;
  dmat<32> xd(8);
  w.fill_random(2), b.fill_random(3), xs.fill_random(1), xd.fill_random(1);
  auto plain = fb::compile(small, fb::options{.threads = threads});
  auto fast = fb::compile(small, fb::options{.mode = fb::mode::reduce_overhead, .threads = threads});
  auto vg = fb::compile(fb::value_and_grad(loss, fb::wrt<1, 2>), fb::options{.threads = threads});
  (void)plain(xs, w, b), (void)plain(xd, w, b), (void)fast(xd, w, b), (void)vg(xd, w, b);
  bench::interleave_config cfg;
  cfg.min_iters = 2000;
  const auto t = bench::measure_interleaved({{nullptr, [&] { (void)plain(xs, w, b); }},
                                             {nullptr, [&] { (void)plain(xd, w, b); }},
                                             {nullptr, [&] { (void)fast(xd, w, b); }},
                                             {nullptr, [&] { (void)vg(xd, w, b); }}},
                                            cfg);
  std::printf("softmax(x w + b) [8,32]x[32,16] per call: static %.2f us  dyn default %.2f us  dyn reduce_overhead "
              "%.2f us;  value_and_grad(mean(mean(relu(x w + b)))) dyn %.2f us\n",
              t[0].median_us, t[1].median_us, t[2].median_us, t[3].median_us);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--warm-child") {
    ::setenv("FUSEBOX_CACHE_DIR", argv[3], 1);
    return warm_child(argv[2]);
  }
  if (argc == 4 && std::string(argv[1]) == "--regional-child") {
    ::setenv("FUSEBOX_CACHE_DIR", argv[3], 1);
    return regional_child(argv[2]);
  }
  unsigned threads = 2;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--threads") threads = static_cast<unsigned>(std::atoi(argv[i + 1]));
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--modes") return modes(threads);
    if (std::string(argv[i]) == "--schedule") return schedule_changes(threads);
    if (std::string(argv[i]) == "--call") return call_overhead(threads);
  }
  fb::jit::temp_directory cache(fb::jit::detail::temp_root(), "fusebox-bench-cache-");
  ::setenv("FUSEBOX_CACHE_DIR", cache.path().c_str(), 1);

  {  // the one-time cost: the precompiled kernel prelude, built by the first compile in a cache
    auto trivial = fb::compile([](auto x) { return x * 2.0f; });
    dmat<8> x(3);
    x.fill_random(1);
    const auto t0 = std::chrono::steady_clock::now();
    (void)trivial(x);
    bench::record r{"jit_prelude_pch", "fusebox", "jit"};
    r.compile_s = seconds(t0);
    r.note = "once per compiler, flags and headers (kept in the cache directory)";
    add(r, 0);
  }

  {
    mat<4096, 4096> xs;
    dmat<4096> xd(4096), xo(4000);
    vec<4096> w, b;
    xs.fill_random(1);
    xd.fill_random(1);
    xo.fill_random(3);
    w.fill_random(2);
    b.fill_random(3);
    compare("W1c", w1, threads, std::tie(xs, w, b), std::tie(xd, w, b), std::tie(xo, w, b));
    compare("W2c", w2, threads, std::tie(xs, w, b), std::tie(xd, w, b), std::tie(xo, w, b));
  }
  {
    mlp_weights m;
    mat<32, 1024> xs;
    dmat<1024> xd(32), xo(48);
    xs.fill_random(5);
    xd.fill_random(5);
    xo.fill_random(6);
    compare("W3c_b32", w3, threads, std::tie(xs, m.w1, m.b1, m.w2, m.b2, m.w3, m.b3),
            std::tie(xd, m.w1, m.b1, m.w2, m.b2, m.w3, m.b3), std::tie(xo, m.w1, m.b1, m.w2, m.b2, m.w3, m.b3));

    // Variable batch: sizes drawn from 1..256 with the default policy.
    auto fast = fb::compile(w3, {.threads = threads});
    std::mt19937 rng(42);
    const auto compiles0 = fb::jit::counters().compiles.load();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 60; ++i) {
      dmat<1024> x(std::uniform_int_distribution<std::size_t>(1, 256)(rng));
      x.fill_random(static_cast<std::uint64_t>(i));
      (void)fast(x, m.w1, m.b1, m.w2, m.b2, m.w3, m.b3);
    }
    bench::record r{"W3c_dyn_variable_batch", "fusebox", "jit"};
    r.threads = threads;
    r.median_us = seconds(t0) / 60 * 1e6;
    r.note = "60 calls, batch in 1..256: " + std::to_string(fb::jit::counters().compiles.load() - compiles0) +
             " compile(s), " + std::to_string(fast.recompiles()) + " recompile(s)";
    add(r, 0);
  }

  {  // Warm start of W3c in a fresh process from this cache.
    const std::string line = bench::run_child(argv[0], "--warm-child W3c '" + cache.path().string() + "'");
    double since_start = -1, setup = -1, first = -1, run = -1;
    bench::record r{"W3c_b32_dyn_warm_start", "fusebox", "jit"};
    if (std::sscanf(line.c_str(), "%lf %lf %lf %lf", &since_start, &setup, &first, &run) == 4) {
      // Process start to first result, less the benchmark's input set-up; the target is
      // "<= 50 ms plus the run itself", so the run is reported beside it.
      r.compile_s = since_start - setup;
      r.median_us = run * 1e6;
      r.note = "fresh process, compiles forbidden: start to first result " + fmt("%.1f ms", (since_start - setup) * 1e3) +
               " without input set-up (" + fmt("%.0f ms", setup * 1e3) + "); first call " + fmt("%.1f ms", first * 1e3) +
               ", a warm call " + fmt("%.1f ms", run * 1e3) + "; overhead over the run " +
               fmt("%.1f ms", (since_start - setup - run) * 1e3);
    } else {
      r.note = "child failed: " + line;
    }
    add(r, 0);
  }
  {  // Regional compilation: 1 and 12 layers of one compiled block, and 2 blocks in one graph,
     // each cold in a fresh process.
    struct variant {
      const char* arg;
      const char* name;
      const char* how;
    };
    const variant variants[] = {{"1", "residual_block_x1_dyn", "one compiled block, 1 layer"},
                                {"12", "residual_block_x12_dyn", "one compiled block called for 12 layers (regional)"},
                                {"2g", "residual_stack2_graph_dyn", "2 blocks in one graph (structural key)"}};
    double one_s = -1;
    for (const auto& v : variants) {
      double s = -1;
      unsigned long long c = 0;
      std::size_t k = 0;
      const std::string line = bench::run_child(argv[0], std::string("--regional-child ") + v.arg + " '" + cache.path().string() + "'");
      const bool ok = std::sscanf(line.c_str(), "%lf %llu %zu", &s, &c, &k) == 3;
      if (ok && one_s < 0) one_s = s;
      bench::record r{v.name, "fusebox", "jit"};
      r.compile_s = s;
      r.note = ok ? std::string(v.how) + ": cold first result (compile + run), " + std::to_string(c) + " compile(s), " +
                        std::to_string(k) + " kernel(s) compiled; " + fmt("%.2fx", s / one_s) + " the one-block time"
                  : "child failed: " + line;
      add(r, 0);
    }
  }
  std::printf("\n");
  tab.print();
  return 0;
}
