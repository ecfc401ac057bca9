// bench/cpu_workloads.cpp: the CPU suite of BENCHMARKS.md. W1c, W2c and W3c (batch 1, 32, 256) on
// fusebox (eager and compiled) and on the peers that were found at configure time (Eigen 3.4,
// libtorch eager, OpenBLAS), with 1 and 2 threads; the machine's limits (STREAM copy, triad and a
// read-only pass, OpenBLAS sgemm) measured in the same run, before and after the workloads; each
// result's floor, max(bytes / bandwidth, flops / peak), and its time over that floor; every output
// checked against a double reference.
//
//   cpu_workloads [--systems=limit,fusebox,eigen,libtorch,openblas] [--workloads=W1c,W2c,W3c_b1,...]
//                 [--threads=1,2] [--out=results.jsonl] [--limits=results.jsonl] [--quick] [--round=N]
//   cpu_workloads --table=results.jsonl     the table and the targets from a results file
//   valgrind --tool=callgrind --instr-atstart=no cpu_workloads --calls=N --systems=fusebox ...
//                                           instructions, not time: each candidate makes exactly N
//                                           calls after its checked one, nothing is timed, and under
//                                           callgrind only those calls are counted, one dump each
//                                           (AB_CALLS=N bench/cpu_ab.sh compares two trees)
//
// For each workload and thread count, every configuration of every system is set up first, then
// all are timed in interleaved rounds (harness.hpp, measure_interleaved): on a shared machine the
// load from other processes comes and goes, and interleaving makes it fall on every system alike,
// so the ratios hold even when absolute times move. Each measurement prints one JSON line (and is
// appended to --out); --limits reads limits measured by an earlier process.
#include <fusebox/fusebox.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <thread>
#include <tuple>

#include "cpu_workloads.hpp"
#include "harness.hpp"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define FUSEBOX_BENCH_CALLGRIND 1
#else
#define FUSEBOX_BENCH_CALLGRIND 0
#endif

namespace fb = fusebox;

namespace fusebox::bench {
namespace {

constexpr double check_tolerance = 1e-4;  // max_rel_err above this marks the result as wrong
constexpr std::size_t w3_sum_kn = 1024 * 4096 + 4096 * 4096 + 4096 * 1024;

// ---- options ----------------------------------------------------------------------------------

struct cli {
  std::set<std::string> systems{"limit", "fusebox", "eigen", "libtorch", "openblas"};
  std::vector<std::string> workloads{"W1c", "W2c", "W3c_b1", "W3c_b32", "W3c_b256"};
  std::vector<unsigned> threads{1, 2};
  std::string out, limits, table;
  bool quick = false;
  int round = 0;
  int calls = 0;  ///< > 0: count instructions of this many calls per candidate instead of timing
  std::size_t stream_mib = 256;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) v.push_back(item);
  return v;
}

cli parse(int argc, char** argv) {
  cli c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (k == "--systems") {
      const auto l = split(v);
      c.systems = {l.begin(), l.end()};
    } else if (k == "--workloads") {
      c.workloads = split(v);
    } else if (k == "--threads") {
      c.threads.clear();
      for (const auto& t : split(v)) c.threads.push_back(static_cast<unsigned>(std::stoul(t)));
    } else if (k == "--out") {
      c.out = v;
    } else if (k == "--limits") {
      c.limits = v;
    } else if (k == "--table") {
      c.table = v;
    } else if (k == "--quick") {
      c.quick = true;
    } else if (k == "--stream-mib") {
      c.stream_mib = std::stoul(v);
    } else if (k == "--round") {
      c.round = std::stoi(v);
    } else if (k == "--calls") {
      c.calls = std::stoi(v);
    } else {
      std::fprintf(stderr,
                   "usage: cpu_workloads [--systems=limit,fusebox,eigen,libtorch,openblas] "
                   "[--workloads=W1c,W2c,W3c_b1,W3c_b32,W3c_b256] [--threads=1,2] [--out=FILE] [--limits=FILE] "
                   "[--quick] [--stream-mib=256] [--round=N] [--calls=N] | --table=FILE\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  return c;
}

/// Every record of this process carries the round it belongs to.
void put(record r, const cli& c) {
  r.round = c.round;
  emit(r, c.out);
}

// ---- limits -------------------------------------------------------------------------------------

/// Per thread count: STREAM copy and a read-only pass (GB/s), and sgemm (GFLOP/s).
struct limits {
  std::map<unsigned, double> copy_gbps, read_gbps, gflops;
};

limits limits_from(const std::vector<record>& rs) {
  limits l;
  for (const auto& r : rs) {
    if (r.system != "limit") continue;
    if (r.workload == "stream_copy") l.copy_gbps[r.threads] = r.gbps;
    if (r.workload == "stream_read") l.read_gbps[r.threads] = r.gbps;
    if (r.workload == "sgemm_peak") l.gflops[r.threads] = r.gflops;
  }
  return l;
}

void measure_limits(const cli& c, limits& l) {
  for (const unsigned t : c.threads) {
    const stream_result s = stream(t, c.stream_mib << 20);
    const std::string cfg = "3 x " + std::to_string(s.array_bytes >> 20) + " MiB float arrays, " + std::to_string(t) +
                            " std::thread(s), plain loops with cached stores; gbps from the best of " +
                            std::to_string(s.copy.iters) + " reps (STREAM counting)";
    record copy{"stream_copy", "limit", "measured", cfg};
    copy.threads = t;
    copy.set(s.copy);
    copy.gbps = s.copy_gbps;
    put(copy, c);
    record triad{"stream_triad", "limit", "measured", cfg};
    triad.threads = t;
    triad.set(s.triad);
    triad.gbps = s.triad_gbps;
    put(triad, c);
    record read{"stream_read", "limit", "measured", cfg};
    read.threads = t;
    read.set(s.read);
    read.gbps = s.read_gbps;
    put(read, c);
    l.copy_gbps[t] = s.copy_gbps;
    l.read_gbps[t] = s.read_gbps;
#ifdef FUSEBOX_BENCH_HAVE_OPENBLAS
    timing tt;
    const double g = openblas_sgemm_gflops(t, 4096, tt);
    record peak{"sgemm_peak", "limit", "measured", "OpenBLAS cblas_sgemm 4096^3, " + std::to_string(t) + " thread(s)"};
    peak.threads = t;
    peak.set(tt);
    peak.gflops = g;
    put(peak, c);
    l.gflops[t] = g;
#endif
  }
}

// ---- workloads: data, references, bytes and flops ------------------------------------------------

// Inputs: x, weights and biases uniform from fixed seeds. W3c weights and biases are scaled like
// torch.nn.Linear's initialisation, U(-1/sqrt(K), 1/sqrt(K)), so activations stay O(1).
w1_data make_w1() {
  w1_data d;
  d.x = floats(d.rows * d.cols), d.w = floats(d.cols), d.b = floats(d.cols);
  fill_uniform(d.x.data(), d.x.size(), 1, -3, 3);
  fill_uniform(d.w.data(), d.w.size(), 2, -1, 1);
  fill_uniform(d.b.data(), d.b.size(), 3, -1, 1);
  return d;
}

w2_data make_w2() {
  w2_data d;
  d.x = floats(d.rows * d.cols), d.gamma = floats(d.cols), d.beta = floats(d.cols);
  fill_uniform(d.x.data(), d.x.size(), 4, -3, 3);
  fill_uniform(d.gamma.data(), d.gamma.size(), 5, 0.5f, 1.5f);
  fill_uniform(d.beta.data(), d.beta.size(), 6, -0.5f, 0.5f);
  return d;
}

w3_data make_w3(std::size_t batch) {
  w3_data d;
  const auto& dim = w3_data::dim;
  d.batch = batch;
  d.x = floats(batch * dim[0]);
  fill_uniform(d.x.data(), d.x.size(), 7, -1, 1);
  for (int l = 0; l < 3; ++l) {
    const std::size_t K = dim[l], N = dim[l + 1];
    const float a = 1.0f / std::sqrt(static_cast<float>(K));
    d.w_kn[l] = floats(K * N), d.w_nk[l] = floats(N * K), d.b[l] = floats(N);
    fill_uniform(d.w_kn[l].data(), K * N, 10 + l, -a, a);
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t n = 0; n < N; ++n) d.w_nk[l][n * K + k] = d.w_kn[l][k * N + n];
    fill_uniform(d.b[l].data(), N, 20 + l, -a, a);
  }
  return d;
}

double gelu_d(double v) { return 0.5 * v * (1.0 + std::erf(v * 0.70710678118654752440)); }
double sigmoid_d(double v) { return 1.0 / (1.0 + std::exp(-v)); }

/// Runs body(r) for every row r in [0, rows) on up to two std::threads (references only).
template <class F>
void parallel_rows(std::size_t rows, F body) {
  const unsigned n = std::max(1u, std::min(2u, std::thread::hardware_concurrency()));
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < n; ++t)
    ts.emplace_back([&, t] {
      for (std::size_t r = rows * t / n; r < rows * (t + 1) / n; ++r) body(r);
    });
  for (auto& t : ts) t.join();
}

std::vector<double> reference_w1(const w1_data& d) {
  std::vector<double> y(d.rows * d.cols);
  parallel_rows(d.rows, [&](std::size_t r) {
    for (std::size_t j = 0; j < d.cols; ++j) {
      const double x = d.x[r * d.cols + j];
      y[r * d.cols + j] = gelu_d(x * d.w[j] + d.b[j]) * sigmoid_d(x);
    }
  });
  return y;
}

std::vector<double> reference_w2(const w2_data& d) {
  std::vector<double> y(d.rows * d.cols);
  parallel_rows(d.rows, [&](std::size_t r) {
    const float* x = d.x.data() + r * d.cols;
    double* o = y.data() + r * d.cols;
    double mx = -INFINITY, sum = 0;
    for (std::size_t j = 0; j < d.cols; ++j) mx = std::max(mx, static_cast<double>(x[j]));
    for (std::size_t j = 0; j < d.cols; ++j) sum += o[j] = std::exp(x[j] - mx);
    double mean = 0;
    for (std::size_t j = 0; j < d.cols; ++j) mean += o[j] /= sum;
    mean /= static_cast<double>(d.cols);
    double var = 0;
    for (std::size_t j = 0; j < d.cols; ++j) var += (o[j] - mean) * (o[j] - mean);
    var /= static_cast<double>(d.cols);
    const double inv = 1.0 / std::sqrt(var + d.eps);
    for (std::size_t j = 0; j < d.cols; ++j) o[j] = (o[j] - mean) * inv * d.gamma[j] + d.beta[j];
  });
  return y;
}

std::vector<double> reference_w3(const w3_data& d) {
  const auto& dim = w3_data::dim;
  const std::size_t B = d.batch;
  std::vector<double> in(d.x.data(), d.x.data() + d.x.size()), out;
  for (int l = 0; l < 3; ++l) {
    const std::size_t K = dim[l], N = dim[l + 1];
    out.assign(B * N, 0.0);
    constexpr std::size_t block = 8;  // rows that share each pass over W
    parallel_rows((B + block - 1) / block, [&](std::size_t blk) {
      const std::size_t r0 = blk * block, r1 = std::min(B, r0 + block);
      for (std::size_t k = 0; k < K; ++k) {
        const float* w = d.w_kn[l].data() + k * N;
        for (std::size_t r = r0; r < r1; ++r) {
          const double a = in[r * K + k];
          double* o = out.data() + r * N;
          for (std::size_t n = 0; n < N; ++n) o[n] += a * w[n];
        }
      }
      for (std::size_t r = r0; r < r1; ++r)
        for (std::size_t n = 0; n < N; ++n) {
          const double v = out[r * N + n] + d.b[l][n];
          out[r * N + n] = l < 2 ? gelu_d(v) : v;
        }
    });
    in.swap(out);
  }
  return in;
}

/// Bytes a workload must move at the least and the flops it must do; flops of elementwise ops as
/// fusebox's cost model counts them (ops/elementwise.hpp: add, mul 1; exp 16; sigmoid 20; gelu 28).
/// `read_only`: the bytes are all reads (W3c's weights), so the floor takes the bandwidth of a
/// read-only pass; otherwise (one read stream, one write stream: W1c, W2c) that of STREAM copy.
struct work {
  double bytes = 0, flops = 0;
  bool read_only = false;
};
work work_w1(const w1_data& d) {
  const double n = static_cast<double>(d.rows * d.cols);
  return {4.0 * (2 * n + 2.0 * d.cols), n * (1 + 1 + 28 + 20 + 1)};
}
work work_w2(const w2_data& d) {
  const double n = static_cast<double>(d.rows * d.cols);
  // softmax: max, sub, exp(16), sum, div = 20; layer_norm: mean, sub, square, mean, scale, gamma,
  // beta = 7 (per-row scalars not counted).
  return {4.0 * (2 * n + 2.0 * d.cols), n * 27};
}
work work_w3(const w3_data& d) {
  const auto& dim = w3_data::dim;
  const double B = static_cast<double>(d.batch);
  const double weights = static_cast<double>(w3_sum_kn) + dim[1] + dim[2] + dim[3];
  // Weights and biases read once, x read once, the result written once; h1 and h2 stay in cache.
  return {4.0 * (weights + B * dim[0] + B * dim[3]),
          2.0 * B * static_cast<double>(w3_sum_kn) + B * (dim[1] * 29.0 + dim[2] * 29.0 + dim[3]), true};
}

// ---- fusebox ------------------------------------------------------------------------------------

template <class T>
void copy_into(T& t, const floats& f) {
  std::memcpy(t.data(), f.data(), f.size() * sizeof(float));
}

/// fusebox eager and compiled on the same model and arguments (the tensors, moved into the state
/// the candidates share). Compiled calls run(out, ...): no allocation; eager calls keep their
/// result until the next call replaces it, as `y = f(x)` in a loop does.
template <class Model, class... A>
candidates fusebox_candidates(Model model, const std::string& what, const std::string& plan_name, unsigned threads,
                              A... args) {
  using eager_t = decltype(fb::eager(model, {}));
  using compiled_t = decltype(fb::compile(model, {}));
  using out_t = decltype(std::declval<compiled_t&>()(args...));
  struct state {
    std::tuple<A...> in;
    eager_t eager;
    compiled_t fast;
    out_t y_eager, y;
  };
  auto st = std::make_shared<state>(state{std::tuple<A...>(std::move(args)...), fb::eager(model, {.threads = threads}),
                                          fb::compile(model, {.threads = threads}), {}, {}});
  if (threads == 2 && !plan_name.empty()) {
    std::printf("# fusebox plan %s:\n", plan_name.c_str());
    std::istringstream plan(std::apply([&](const auto&... a) { return st->fast.describe(nullptr, a...); }, st->in));
    for (std::string line; std::getline(plan, line);) std::printf("#   %s\n", line.c_str());
  }
  const std::string thr = ", options.threads = " + std::to_string(threads);
  auto span = [](const out_t& t) { return std::span<const float>(t.data(), t.size()); };
  candidates cs;
  cs.push_back({"fusebox", "eager", what + thr, "", {},
                [st] { st->y_eager = std::apply([&](const auto&... a) { return st->eager(a...); }, st->in); },
                [st, span] { return span(st->y_eager); }, st});
  cs.push_back({"fusebox", "compiled", what + ", run(out, ...)" + thr, "", {},
                [st] { std::apply([&](const auto&... a) { st->fast.run(st->y, a...); }, st->in); },
                [st, span] { return span(st->y); }, st});
  return cs;
}

candidates fusebox_w1(const w1_data& d, unsigned threads) {
  constexpr std::size_t R = 4096, C = 4096;
  fb::tensor<float, fb::shape<R, C>> x;
  fb::tensor<float, fb::shape<C>> w, b;
  copy_into(x, d.x), copy_into(w, d.w), copy_into(b, d.b);
  auto model = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x); };
  return fusebox_candidates(model, "fb::gelu(x * w + b) * fb::sigmoid(x)", "W1c", threads, x, w, b);
}

candidates fusebox_w2(const w2_data& d, unsigned threads) {
  constexpr std::size_t R = 4096, C = 4096;
  fb::tensor<float, fb::shape<R, C>> x;
  fb::tensor<float, fb::shape<C>> g, b;
  copy_into(x, d.x), copy_into(g, d.gamma), copy_into(b, d.beta);
  auto model = [](auto x, auto g, auto b) { return fb::layer_norm(fb::softmax(x), g, b, 1e-5f); };
  return fusebox_candidates(model, "fb::layer_norm(fb::softmax(x), g, b, 1e-5f)", "W2c", threads, x, g, b);
}

template <std::size_t B>
candidates fusebox_w3(const w3_data& d, unsigned threads) {
  fb::tensor<float, fb::shape<B, 1024>> x;
  fb::tensor<float, fb::shape<1024, 4096>> w1;
  fb::tensor<float, fb::shape<4096, 4096>> w2;
  fb::tensor<float, fb::shape<4096, 1024>> w3;
  fb::tensor<float, fb::shape<4096, 1024>> w1t;
  fb::tensor<float, fb::shape<4096, 4096>> w2t;
  fb::tensor<float, fb::shape<1024, 4096>> w3t;
  fb::tensor<float, fb::shape<4096>> b1, b2;
  fb::tensor<float, fb::shape<1024>> b3;
  copy_into(x, d.x);
  copy_into(w1, d.w_kn[0]), copy_into(w2, d.w_kn[1]), copy_into(w3, d.w_kn[2]);
  copy_into(w1t, d.w_nk[0]), copy_into(w2t, d.w_nk[1]), copy_into(w3t, d.w_nk[2]);
  copy_into(b1, d.b[0]), copy_into(b2, d.b[1]), copy_into(b3, d.b[2]);
  auto mlp = [](auto x, auto w1, auto b1, auto w2, auto b2, auto w3, auto b3) {
    auto h1 = fb::gelu(fb::matmul(x, w1) + b1);
    auto h2 = fb::gelu(fb::matmul(h1, w2) + b2);
    return fb::matmul(h2, w3) + b3;
  };
  auto mlp_t = [](auto x, auto w1, auto b1, auto w2, auto b2, auto w3, auto b3) {
    auto h1 = fb::gelu(fb::matmul(x, fb::transpose(w1)) + b1);
    auto h2 = fb::gelu(fb::matmul(h1, fb::transpose(w2)) + b2);
    return fb::matmul(h2, fb::transpose(w3)) + b3;
  };
  const std::string name = "W3c_b" + std::to_string(B);
  candidates cs = fusebox_candidates(mlp, "W [K,N]: fb::matmul(x, w)", name + " W[K,N]", threads, x, w1, b1, w2, b2, w3, b3);
  for (auto& c : fusebox_candidates(mlp_t, "W [N,K]: fb::matmul(x, fb::transpose(w))", name + " W[N,K]", threads, x,
                                    w1t, b1, w2t, b2, w3t, b3))
    cs.push_back(std::move(c));
  return cs;
}

// ---- running and reporting ----------------------------------------------------------------------

interleave_config config_for(const cli& c) {
  interleave_config m;
  if (c.quick) m.warmup = 2, m.min_iters = 5, m.long_min_iters = 3, m.min_rounds = 2;
  return m;
}

/// --calls: each candidate's calls alone between callgrind's start and dump (a no-op when not
/// under callgrind), so that two builds of the same source compare in instructions, which do not
/// drift with the machine's speed as time does. Nothing is timed or written but one line each.
void count_calls(const cli& c, const std::string& workload, unsigned threads, const candidates& cs,
                 const std::vector<double>& err) {
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const std::string name = workload + " " + cs[i].system + " " + cs[i].mode + " " + cs[i].config;
    if (cs[i].prepare) cs[i].prepare();
#if FUSEBOX_BENCH_CALLGRIND
    CALLGRIND_START_INSTRUMENTATION;
    CALLGRIND_ZERO_STATS;
#endif
    for (int k = 0; k < c.calls; ++k) cs[i].call();
#if FUSEBOX_BENCH_CALLGRIND
    CALLGRIND_DUMP_STATS_AT(name.c_str());
    CALLGRIND_STOP_INSTRUMENTATION;
#endif
    std::printf("# counted %d calls: %s (threads %u, max_rel_err %.2g%s)\n", c.calls, name.c_str(), threads, err[i],
                err[i] >= 0 && !(err[i] <= check_tolerance) ? ", CHECK FAILED" : "");
  }
}

/// Checks every candidate's output, times all of them in interleaved rounds, writes the records.
void run_group(const cli& c, const limits& lim, const std::string& workload, const work& w,
               const std::vector<double>& ref, unsigned threads, const candidates& cs) {
  std::vector<double> err(cs.size(), -1);
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (cs[i].prepare) cs[i].prepare();
    cs[i].call();
    const auto out = cs[i].output();
    if (out.empty()) continue;
    err[i] = out.size() == ref.size() ? max_rel_err(out.data(), ref.data(), out.size()) : INFINITY;
  }
  if (c.calls > 0) {
    count_calls(c, workload, threads, cs, err);
    return;
  }
  std::vector<contender> con;
  for (const auto& k : cs) con.push_back({k.prepare, k.call});
  const std::vector<timing> t = measure_interleaved(con, config_for(c));

  const auto& bws = w.read_only ? lim.read_gbps : lim.copy_gbps;
  double floor_us = -1;
  if (bws.count(threads)) floor_us = std::max(floor_us, w.bytes / (bws.at(threads) * 1e3));
  if (lim.gflops.count(threads)) floor_us = std::max(floor_us, w.flops / (lim.gflops.at(threads) * 1e3));
  for (std::size_t i = 0; i < cs.size(); ++i) {
    record r{workload, cs[i].system, cs[i].mode, cs[i].config, cs[i].note};
    r.threads = threads;
    r.set(t[i]);
    r.floor_us = floor_us;
    r.bytes = w.bytes, r.flops = w.flops, r.traffic = w.read_only ? "read" : "read_write";
    r.gbps = w.bytes / (t[i].median_us * 1e3);
    r.gflops = w.flops / (t[i].median_us * 1e3);
    r.max_rel_err = err[i];
    if (err[i] >= 0 && !(err[i] <= check_tolerance))
      r.note += (r.note.empty() ? "" : "; ") + std::string("CHECK FAILED: output differs from the reference");
    put(r, c);
  }
}

// ---- the table ----------------------------------------------------------------------------------

bool is_peer(const record& r) {
  return (r.system == "eigen" || r.system == "libtorch" || r.system == "openblas") && r.mode == "eager" &&
         r.max_rel_err >= 0 && r.max_rel_err <= check_tolerance;
}
bool ok_result(const record& r) { return r.max_rel_err >= 0 && r.max_rel_err <= check_tolerance; }

/// The fastest checked record of a workload and thread count matching `pick`.
template <class P>
const record* best(const std::vector<record>& rs, const std::string& wl, unsigned t, P pick) {
  const record* b = nullptr;
  for (const auto& r : rs)
    if (r.workload == wl && r.threads == t && pick(r) && (!b || r.median_us < b->median_us)) b = &r;
  return b;
}

std::string ms(double us) { return us < 0 ? "-" : fmt("%.3f", us / 1e3); }

/// Several rounds of the suite: one record per configuration, the round whose median is the median
/// over rounds (the lower middle for an even count), with the range of the rounds' medians.
struct aggregated {
  std::vector<record> rs;
  std::vector<int> rounds;
  std::vector<double> lo_us, hi_us;
};
aggregated aggregate(const std::vector<record>& all) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const record*>> groups;
  for (const auto& r : all) {
    // Only this suite's records (they carry a round; build times pass through); the component
    // benchmarks' lines share the file but not the table.
    if (r.round < 0 && r.mode != "compile_time") continue;
    const std::string key = r.workload + '\n' + r.system + '\n' + r.mode + '\n' + r.config + '\n' + std::to_string(r.threads);
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(&r);
  }
  aggregated a;
  for (const auto& key : order) {
    auto v = groups[key];
    std::sort(v.begin(), v.end(), [](const record* x, const record* y) { return x->median_us < y->median_us; });
    a.rs.push_back(*v[(v.size() - 1) / 2]);
    a.rounds.push_back(static_cast<int>(v.size()));
    a.lo_us.push_back(v.front()->median_us);
    a.hi_us.push_back(v.back()->median_us);
  }
  return a;
}

void print_table(const std::vector<record>& all) {
  aggregated ag = aggregate(all);
  std::vector<record>& rs = ag.rs;
  int max_rounds = 0;  // runs of the suite (limits are measured twice per run: not counted)
  for (std::size_t i = 0; i < rs.size(); ++i)
    if (rs[i].system != "limit") max_rounds = std::max(max_rounds, ag.rounds[i]);
  // Floors from the best limits seen in any round: what the machine can do, not what it did
  // while other processes held it.
  limits top;
  for (const auto& r : all) {
    if (r.system != "limit" || r.round < 0) continue;
    auto up = [](std::map<unsigned, double>& m, unsigned t, double v) { m[t] = std::max(m[t], v); };
    if (r.workload == "stream_copy") up(top.copy_gbps, r.threads, r.gbps);
    if (r.workload == "stream_read") up(top.read_gbps, r.threads, r.gbps);
    if (r.workload == "sgemm_peak") up(top.gflops, r.threads, r.gflops);
  }
  for (auto& r : rs) {
    if (r.system == "limit" || r.bytes < 0) continue;
    const auto& bws = r.traffic == "read" ? top.read_gbps : top.copy_gbps;
    double f = -1;
    if (bws.count(r.threads)) f = std::max(f, r.bytes / (bws.at(r.threads) * 1e3));
    if (top.gflops.count(r.threads)) f = std::max(f, r.flops / (top.gflops.at(r.threads) * 1e3));
    if (f > 0) r.floor_us = f;
  }
  std::vector<std::string> workloads;
  std::set<unsigned> threads;
  for (const auto& r : rs)
    if (r.system != "limit" && r.mode != "compile_time") {
      if (std::find(workloads.begin(), workloads.end(), r.workload) == workloads.end()) workloads.push_back(r.workload);
      threads.insert(r.threads);
    }

  std::set<std::string> isas;
  for (const auto& r : all) isas.insert(r.isa);
  std::string isa_list;
  for (const auto& i : isas) isa_list += (isa_list.empty() ? "" : ", ") + i;
  std::printf("\nVector ISA of the programs measured: %s%s\n", isa_list.c_str(),
              isas.size() > 1 ? " (MIXED: a table holds for one ISA only)" : "");
  std::printf("\nLimits (measured in this run%s; the floors below use these)\n",
              max_rounds > 1 ? ", the best of the runs" : ", the best of the start and the end");
  table lt({"threads", "STREAM copy GB/s", "STREAM triad GB/s", "read-only GB/s", "sgemm 4096^3 GFLOP/s"});
  for (const unsigned t : threads) {
    double copy = 0, triad = 0, read = 0, peak = 0;
    for (const auto& r : all) {
      if (r.system != "limit" || r.threads != t || r.round < 0) continue;
      if (r.workload == "stream_copy") copy = std::max(copy, r.gbps);
      if (r.workload == "stream_triad") triad = std::max(triad, r.gbps);
      if (r.workload == "stream_read") read = std::max(read, r.gbps);
      if (r.workload == "sgemm_peak") peak = std::max(peak, r.gflops);
    }
    auto cell = [](double v) { return v > 0 ? fmt("%.1f", v) : std::string("-"); };
    lt.add({std::to_string(t), cell(copy), cell(triad), cell(read), cell(peak)});
  }
  lt.print();

  std::printf("\nWorkloads: median of timed calls (p10-p90 of the same calls)%s; x floor = median / floor; vs best "
              "peer = best peer's median / this median (fusebox rows)\n",
              max_rounds > 1 ? fmt(", the run with the median median of %d runs (range of the runs' medians)",
                                   max_rounds).c_str()
                             : "");
  std::vector<std::string> header{"workload", "thr", "system", "mode", "median ms", "p10-p90 ms"};
  if (max_rounds > 1) header.push_back("runs' range ms");
  for (const char* h : {"floor ms", "x floor", "GB/s", "GFLOP/s", "max_rel_err", "vs best peer", "config"})
    header.push_back(h);
  table t(header);
  bool first = true;
  for (const auto& wl : workloads)
    for (const unsigned th : threads) {
      std::vector<const record*> rows;
      for (const auto& r : rs)
        if (r.workload == wl && r.threads == th && r.system != "limit") rows.push_back(&r);
      if (rows.empty()) continue;
      std::stable_sort(rows.begin(), rows.end(), [](const record* a, const record* b) {
        auto rank = [](const record* r) { return r->system == "fusebox" ? 0 : 1; };
        return rank(a) != rank(b) ? rank(a) < rank(b) : a->median_us < b->median_us;
      });
      const record* bp = best(rs, wl, th, is_peer);
      if (!first) t.separator();
      first = false;
      for (const record* r : rows) {
        const bool wrong = r->max_rel_err > check_tolerance;
        const std::size_t i = static_cast<std::size_t>(r - rs.data());
        std::vector<std::string> row{wl, std::to_string(th), r->system, r->mode, ms(r->median_us),
                                     ms(r->p10_us) + "-" + ms(r->p90_us)};
        if (max_rounds > 1) row.push_back(ms(ag.lo_us[i]) + "-" + ms(ag.hi_us[i]));
        for (auto cell : {ms(r->floor_us), r->floor_us > 0 ? fmt("%.2f", r->median_us / r->floor_us) : "-",
                          fmt("%.1f", r->gbps), fmt("%.1f", r->gflops),
                          r->max_rel_err < 0 ? "unchecked" : fmt("%.1e", r->max_rel_err) + (wrong ? " WRONG" : ""),
                          r->system == "fusebox" && bp ? fmt("%.2fx", bp->median_us / r->median_us) : "", r->config})
          row.push_back(cell);
        t.add(row);
      }
    }
  t.print();

  for (const auto& r : rs)
    if (r.mode == "compile_time")
      std::printf("\nBuild time: %s (%s): %s%s%s%s%s\n", r.workload.c_str(), r.system.c_str(),
                  r.compile_s >= 0 ? fmt("%.2f s", r.compile_s).c_str() : "not measured", r.config.empty() ? "" : "; ",
                  r.config.c_str(), r.note.empty() ? "" : "; ", r.note.c_str());

  // The targets of the issue, at 2 threads.
  std::printf("\nTargets (2 threads; fusebox compiled, best layout, against the best checked peer run)\n");
  table tt({"target", "fusebox", "against", "ratio", "want", "verdict"});
  auto fusebox_best = [&](const std::string& wl) {
    return best(rs, wl, 2, [](const record& r) { return r.system == "fusebox" && r.mode == "compiled" && ok_result(r); });
  };
  auto vs = [&](const std::string& wl, const std::string& label, double want, auto pick) {
    const record* f = fusebox_best(wl);
    const record* p = best(rs, wl, 2, pick);
    if (!f || !p) {
      tt.add({wl + ": " + label, f ? ms(f->median_us) + " ms" : "missing", p ? ms(p->median_us) + " ms" : "missing", "-",
              fmt(">= %.2fx", want), "not measured"});
      return;
    }
    const double ratio = p->median_us / f->median_us;
    tt.add({wl + ": " + label, ms(f->median_us) + " ms", ms(p->median_us) + " ms (" + p->system + ")",
            fmt("%.2fx", ratio), fmt(">= %.2fx", want),
            ratio >= want ? "met" : fmt("MISSED by %.0f%%", 100.0 * (want / ratio - 1.0))});
  };
  auto eigen = [](const record& r) { return r.system == "eigen" && is_peer(r); };
  vs("W1c", "compiled vs Eigen's best", 1.25, eigen);
  vs("W2c", "compiled vs Eigen's best", 1.4, eigen);
  if (const record* f = fusebox_best("W3c_b1"); f && f->floor_us > 0) {
    const double x = f->median_us / f->floor_us;
    tt.add({"W3c_b1: compiled within 10% of the memory floor", ms(f->median_us) + " ms", ms(f->floor_us) + " ms (floor)",
            fmt("%.2fx floor", x), "<= 1.10x floor", x <= 1.10 ? "met" : fmt("MISSED by %.0f%%", 100.0 * (x / 1.10 - 1.0))});
  } else {
    tt.add({"W3c_b1: compiled within 10% of the memory floor", "missing", "-", "-", "<= 1.10x floor", "not measured"});
  }
  vs("W3c_b32", "compiled vs best of Eigen, OpenBLAS", 1.3,
     [](const record& r) { return (r.system == "eigen" || r.system == "openblas") && is_peer(r); });
  vs("W3c_b256", "compiled vs OpenBLAS sgemm + epilogue", 1.0,
     [](const record& r) { return r.system == "openblas" && is_peer(r); });
  tt.print();
}

}  // namespace
}  // namespace fusebox::bench

int main(int argc, char** argv) {
  using namespace fusebox::bench;
  const cli c = parse(argc, argv);
  if (!c.table.empty()) {
    print_table(read_jsonl(c.table));
    return 0;
  }

  limits lim;
  if (!c.limits.empty()) lim = limits_from(read_jsonl(c.limits));
  const bool measure_lim = c.systems.count("limit") > 0;
  if (measure_lim) measure_limits(c, lim);

  auto want = [&](const char* s) { return c.systems.count(s) > 0; };
#ifndef FUSEBOX_BENCH_HAVE_EIGEN
  if (want("eigen")) std::printf("# eigen: not found at configure time; skipped\n");
#else
  if (want("eigen")) std::printf("# eigen: %s\n", eigen_describe().c_str());
#endif
#ifndef FUSEBOX_BENCH_HAVE_TORCH
  if (want("libtorch")) std::printf("# libtorch: not found at configure time; skipped\n");
#else
  if (want("libtorch")) std::printf("# libtorch: %s\n", torch_describe().c_str());
#endif
#ifndef FUSEBOX_BENCH_HAVE_OPENBLAS
  if (want("openblas")) std::printf("# openblas: not found at configure time; skipped\n");
#else
  if (want("openblas")) std::printf("# openblas: %s\n", openblas_describe().c_str());
#endif
  std::fflush(stdout);

  const bool any_system = want("fusebox") || want("eigen") || want("libtorch") || want("openblas");
  for (const auto& wl : c.workloads) {
    if (!any_system) break;
    std::vector<double> ref;
    work w;
    w1_data d1;
    w2_data d2;
    w3_data d3;
    std::size_t batch = 0;
    if (wl == "W1c") {
      d1 = make_w1(), ref = reference_w1(d1), w = work_w1(d1);
    } else if (wl == "W2c") {
      d2 = make_w2(), ref = reference_w2(d2), w = work_w2(d2);
    } else if (wl.rfind("W3c_b", 0) == 0) {
      batch = std::stoul(wl.substr(5));
      if (batch != 1 && batch != 32 && batch != 256) {
        std::fprintf(stderr, "cpu_workloads: %s: W3c batches are 1, 32 and 256\n", wl.c_str());
        return 2;
      }
      d3 = make_w3(batch), ref = reference_w3(d3), w = work_w3(d3);
    } else {
      std::fprintf(stderr, "cpu_workloads: unknown workload %s\n", wl.c_str());
      return 2;
    }
    for (const unsigned t : c.threads) {
      candidates cs;
      auto add = [&](const char* system, auto&& f1, auto&& f2, auto&& f3) {
        if (!want(system)) return;
        try {
          candidates more = wl == "W1c" ? f1(d1, t) : wl == "W2c" ? f2(d2, t) : f3(d3, t);
          for (auto& k : more) cs.push_back(std::move(k));
        } catch (const std::exception& e) {
          std::printf("# %s %s threads=%u could not be set up: %s\n", system, wl.c_str(), t, e.what());
        }
      };
      auto none = [](const auto&, unsigned) { return candidates{}; };
      add("fusebox", fusebox_w1, fusebox_w2, [&](const w3_data& d, unsigned th) {
        return batch == 1 ? fusebox_w3<1>(d, th) : batch == 32 ? fusebox_w3<32>(d, th) : fusebox_w3<256>(d, th);
      });
#ifdef FUSEBOX_BENCH_HAVE_EIGEN
      add("eigen", eigen_w1, eigen_w2, eigen_w3);
#endif
#ifdef FUSEBOX_BENCH_HAVE_TORCH
      add("libtorch", torch_w1, torch_w2, torch_w3);
#endif
#ifdef FUSEBOX_BENCH_HAVE_OPENBLAS
      add("openblas", none, none, openblas_w3);
#endif
      (void)none;
      if (!cs.empty()) run_group(c, lim, wl, w, ref, t, cs);
    }
  }
  // The limits once more at the end: the table's floors take the best of both.
  if (measure_lim && any_system) measure_limits(c, lim);
  return 0;
}
