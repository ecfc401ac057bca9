// bench/harness.hpp: what every fusebox benchmark measures with. Timing (warm-up, then the median
// and p10/p90 of timed calls), the machine's limits measured in the same run (STREAM-style copy
// and triad with a given thread count), and the output BENCHMARKS.md asks for: one JSON object per
// measurement on its own line, then a table.
//
// Depends on the C++20 standard library only, so peers (Eigen, libtorch, OpenBLAS) can be
// measured from translation units that never include fusebox.
#pragma once

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace fusebox::bench {

// ---- memory ---------------------------------------------------------------------------------

/// A 64-byte-aligned float array: the same alignment fusebox tensors get, so no system is
/// measured on better-aligned data than another.
class floats {
 public:
  floats() = default;
  explicit floats(std::size_t n) : n_(n) {
    const std::size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    p_.reset(static_cast<float*>(std::aligned_alloc(64, bytes ? bytes : 64)));
    if (!p_) throw std::bad_alloc();
  }
  float* data() noexcept { return p_.get(); }
  const float* data() const noexcept { return p_.get(); }
  std::size_t size() const noexcept { return n_; }
  float& operator[](std::size_t i) noexcept { return p_[i]; }
  float operator[](std::size_t i) const noexcept { return p_[i]; }

 private:
  struct release {
    void operator()(float* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<float[], release> p_;
  std::size_t n_ = 0;
};

/// Uniform values in [lo, hi) from a seed (splitmix64; the same stream as fusebox::tensor's).
inline void fill_uniform(float* p, std::size_t n, std::uint64_t seed, float lo, float hi) {
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = static_cast<float>(lo + (hi - lo) * (static_cast<double>(z >> 11) * 0x1.0p-53));
  }
}

/// max |y - ref| / max |ref|: the error measure of fusebox::ab, on flat arrays.
inline double max_rel_err(const float* y, const double* ref, std::size_t n) {
  double diff = 0, mag = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(y[i]) - ref[i]);
    diff = std::max(diff, std::isnan(d) ? INFINITY : d);
    mag = std::max(mag, std::fabs(ref[i]));
  }
  return mag > 0 ? diff / mag : diff;
}

// ---- timing ---------------------------------------------------------------------------------

struct timing {
  double median_us = 0, p10_us = 0, p90_us = 0, min_us = 0;
  int warmup = 0, iters = 0;
};

/// BENCHMARKS.md: at least 10 warm-up calls, at least 50 timed ones for short work. Work whose
/// call takes longer than `long_call_s` is timed at least `long_min_iters` times instead.
/// `max_seconds` only matters for pathologically slow calls (seconds each): it cuts the warm-up
/// and timing short, and the record says how many calls were made.
struct measure_config {
  int warmup = 10;
  int min_iters = 50;
  double min_seconds = 0.5;
  double long_call_s = 0.02;
  int long_min_iters = 20;
  double max_seconds = 20;
};

using bench_clock = std::chrono::steady_clock;
inline double seconds_since(bench_clock::time_point t0) {
  return std::chrono::duration<double>(bench_clock::now() - t0).count();
}

/// Median, p10, p90 and minimum of per-call times in microseconds (at least one).
inline timing summarise(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  timing t;
  t.iters = static_cast<int>(us.size());
  t.median_us = us.size() % 2 ? us[us.size() / 2] : 0.5 * (us[us.size() / 2 - 1] + us[us.size() / 2]);
  t.p10_us = us[us.size() / 10];
  t.p90_us = us[std::min(us.size() - 1, us.size() * 9 / 10)];
  t.min_us = us.front();
  return t;
}

template <class F>
timing measure(F&& fn, const measure_config& cfg = {}) {
  timing r;
  const auto start = bench_clock::now();
  double last = 0;
  for (int i = 0; i < cfg.warmup; ++i) {
    const auto t0 = bench_clock::now();
    fn();
    last = seconds_since(t0);
    ++r.warmup;
    if (seconds_since(start) > cfg.max_seconds / 2 && r.warmup >= 2) break;
  }
  const bool long_work = last > cfg.long_call_s;
  const int want = long_work ? cfg.long_min_iters : cfg.min_iters;
  std::vector<double> t;
  const auto timed = bench_clock::now();
  while (static_cast<int>(t.size()) < want || seconds_since(timed) < cfg.min_seconds) {
    const auto t0 = bench_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(bench_clock::now() - t0).count());
    if (seconds_since(start) > cfg.max_seconds && t.size() >= 3) break;
    if (t.size() >= 100000) break;
  }
  const int warmed = r.warmup;
  r = summarise(std::move(t));
  r.warmup = warmed;
  return r;
}

/// W3's parameters (BENCHMARKS.md: Linear 1024->4096, 4096->4096, 4096->1024 with biases), one
/// seed and range per tensor, so every benchmark (CPU, GPU, warm start) sees the same weights.
template <class W1, class B1, class W2, class B2, class W3, class B3>
void fill_w3_weights(W1& w1, B1& b1, W2& w2, B2& b2, W3& w3, B3& b3) {
  w1.fill_random(11, -0.03f, 0.03f);
  b1.fill_random(12);
  w2.fill_random(13, -0.015f, 0.015f);
  b2.fill_random(14);
  w3.fill_random(15, -0.015f, 0.015f);
  b3.fill_random(16);
}

/// Runs this binary with `args` (a fresh process: warm-start measurements); returns its first
/// line of output (empty on failure).
inline std::string run_child(const char* self, const std::string& args) {
  const std::string cmd = std::string("'") + self + "' " + args;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  char line[512] = {};
  const bool got = p && std::fgets(line, sizeof line, p);
  if (p) ::pclose(p);
  std::string s = got ? line : "";
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

/// Several contenders timed in interleaved rounds, so that load from other processes on a shared
/// machine falls on all of them alike. Each contender first gets `warmup` calls; then each round
/// gives every contender, in turn, `prepare()` (untimed: thread settings), one untimed call (its
/// caches and threads warm again after the others ran) and a burst of timed calls sized to about
/// `burst_seconds`. Rounds continue until every contender has at least `min_iters` timed calls
/// (`long_min_iters` for calls longer than `long_call_s`) and `min_rounds` rounds have run.
struct contender {
  std::function<void()> prepare;  ///< may be empty
  std::function<void()> call;
};
struct interleave_config {
  int warmup = 10;
  int min_iters = 50;
  double long_call_s = 0.02;
  int long_min_iters = 20;
  int min_rounds = 5;
  double burst_seconds = 0.1;
  double max_seconds = 600;  ///< a safety stop for pathologically slow contenders
};

inline std::vector<timing> measure_interleaved(const std::vector<contender>& cs, const interleave_config& cfg = {}) {
  const std::size_t n = cs.size();
  std::vector<std::vector<double>> t(n);
  std::vector<double> call_s(n, 0);
  std::vector<int> warm(n, 0), want(n, 0), burst(n, 1);
  const auto start = bench_clock::now();
  for (std::size_t i = 0; i < n; ++i) {
    if (cs[i].prepare) cs[i].prepare();
    for (int w = 0; w < cfg.warmup; ++w) {
      const auto t0 = bench_clock::now();
      cs[i].call();
      call_s[i] = seconds_since(t0);
      ++warm[i];
    }
    want[i] = call_s[i] > cfg.long_call_s ? cfg.long_min_iters : cfg.min_iters;
    burst[i] = std::clamp(static_cast<int>(cfg.burst_seconds / std::max(call_s[i], 1e-9)), 1, 1000);
    burst[i] = std::min(burst[i], std::max(1, (want[i] + cfg.min_rounds - 1) / cfg.min_rounds));
  }
  for (int round = 0;; ++round) {
    bool done = round >= cfg.min_rounds;
    for (std::size_t i = 0; i < n; ++i) done = done && static_cast<int>(t[i].size()) >= want[i];
    if (done || seconds_since(start) > cfg.max_seconds) break;
    for (std::size_t i = 0; i < n; ++i) {
      if (cs[i].prepare) cs[i].prepare();
      cs[i].call();
      for (int k = 0; k < burst[i]; ++k) {
        const auto t0 = bench_clock::now();
        cs[i].call();
        t[i].push_back(std::chrono::duration<double, std::micro>(bench_clock::now() - t0).count());
      }
    }
  }
  std::vector<timing> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    auto& v = t[i];
    std::sort(v.begin(), v.end());
    timing& r = out[i];
    r.warmup = warm[i];
    r.iters = static_cast<int>(v.size());
    if (v.empty()) continue;
    r.median_us = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    r.p10_us = v[v.size() / 10];
    r.p90_us = v[std::min(v.size() - 1, v.size() * 9 / 10)];
    r.min_us = v.front();
  }
  return out;
}

// ---- limits: STREAM-style bandwidth ---------------------------------------------------------

struct stream_result {
  double copy_gbps = 0, triad_gbps = 0;  // best rep, bytes as STREAM counts them (no write-allocate)
  double read_gbps = 0;                  // a read-only pass (sum), for read-only workloads
  timing copy, triad, read;
  std::size_t array_bytes = 0;
};

namespace detail {
// Plain loops with ordinary (cached) stores, as fusebox's kernels write; GCC would otherwise turn
// the copy into a memcpy call, whose non-temporal stores measure something else.
#if defined(__GNUC__) && !defined(__clang__)
#define FUSEBOX_BENCH_PLAIN_LOOP __attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
#else
#define FUSEBOX_BENCH_PLAIN_LOOP __attribute__((noinline))
#endif
FUSEBOX_BENCH_PLAIN_LOOP inline void stream_copy(float* __restrict c, const float* __restrict a, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) c[i] = a[i];
}
FUSEBOX_BENCH_PLAIN_LOOP inline void stream_triad(float* __restrict a, const float* __restrict b,
                                                  const float* __restrict c, float s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}
/// Sum of a[0, n): vector loads (GCC/Clang vector extension), four accumulators, so the loop is
/// bound by the loads rather than by the latency of the adds.
FUSEBOX_BENCH_PLAIN_LOOP inline float stream_read(const float* a, std::size_t n) {
  typedef float v8 __attribute__((vector_size(32)));
  v8 acc[4] = {};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int q = 0; q < 4; ++q) {
      v8 v;
      std::memcpy(&v, a + i + 8 * q, sizeof v);
      acc[q] += v;
    }
  float s = 0;
  for (int q = 0; q < 4; ++q)
    for (int l = 0; l < 8; ++l) s += acc[q][l];
  for (; i < n; ++i) s += a[i];
  return s;
}
#undef FUSEBOX_BENCH_PLAIN_LOOP
}  // namespace detail

/// STREAM copy (c = a) and triad (a = b + s*c), and a read-only sum of a, over three arrays of `array_bytes` each, split in
/// contiguous blocks over `threads` std::threads that first-touch their own block. Each rep is
/// timed from a barrier before to a barrier after; the best rep gives the bandwidth (STREAM's
/// convention), the median goes into the timing.
inline stream_result stream(unsigned threads, std::size_t array_bytes = std::size_t{256} << 20, int reps = 12) {
  threads = std::max(1u, threads);
  const std::size_t n = array_bytes / sizeof(float);
  floats a(n), b(n), c(n);
  std::vector<double> copy_us, triad_us, read_us;
  std::vector<float> sums(threads);
  bench_clock::time_point t0;
  auto mark = [&]() noexcept { t0 = bench_clock::now(); };
  std::barrier<> sync(static_cast<std::ptrdiff_t>(threads));
  auto worker = [&](unsigned w) {
    const std::size_t lo = n * w / threads, hi = n * (w + 1) / threads;
    for (std::size_t i = lo; i < hi; ++i) a[i] = 1.0f, b[i] = 2.0f, c[i] = 0.0f;
    for (int r = 0; r < reps; ++r) {
      sync.arrive_and_wait();
      if (w == 0) mark();
      sync.arrive_and_wait();
      detail::stream_copy(c.data() + lo, a.data() + lo, hi - lo);
      sync.arrive_and_wait();
      if (w == 0) {
        copy_us.push_back(std::chrono::duration<double, std::micro>(bench_clock::now() - t0).count());
        mark();
      }
      sync.arrive_and_wait();
      detail::stream_triad(a.data() + lo, b.data() + lo, c.data() + lo, 3.0f, hi - lo);
      sync.arrive_and_wait();
      if (w == 0) {
        triad_us.push_back(std::chrono::duration<double, std::micro>(bench_clock::now() - t0).count());
        mark();
      }
      sync.arrive_and_wait();
      sums[w] += detail::stream_read(a.data() + lo, hi - lo);
      sync.arrive_and_wait();
      if (w == 0) read_us.push_back(std::chrono::duration<double, std::micro>(bench_clock::now() - t0).count());
    }
  };
  std::vector<std::thread> pool;
  for (unsigned w = 1; w < threads; ++w) pool.emplace_back(worker, w);
  worker(0);
  for (auto& t : pool) t.join();
  auto summarise = [&](std::vector<double> v) {
    v.erase(v.begin());  // the first rep is the warm-up
    std::sort(v.begin(), v.end());
    timing t;
    t.warmup = 1;
    t.iters = static_cast<int>(v.size());
    t.median_us = v[v.size() / 2];
    t.p10_us = v[v.size() / 10];
    t.p90_us = v[v.size() * 9 / 10];
    t.min_us = v.front();
    return t;
  };
  stream_result r;
  r.array_bytes = n * sizeof(float);
  r.copy = summarise(copy_us);
  r.triad = summarise(triad_us);
  r.read = summarise(read_us);
  r.copy_gbps = 2.0 * static_cast<double>(r.array_bytes) / (r.copy.min_us * 1e3);
  r.triad_gbps = 3.0 * static_cast<double>(r.array_bytes) / (r.triad.min_us * 1e3);
  r.read_gbps = static_cast<double>(r.array_bytes) / (r.read.min_us * 1e3);
  if (sums[0] == 12345.0f) std::fputs("", stderr);  // keeps the sums (and the reads) alive
  return r;
}

// ---- records: JSON lines and the table ------------------------------------------------------

/// The vector ISA this program was compiled for (-march), which every CPU figure holds only for:
/// the widest the compiler's predefined macros name.
constexpr const char* build_isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2+fma";
#elif defined(__AVX2__)
  return "avx2";
#elif defined(__AVX__)
  return "avx";
#elif defined(__aarch64__)
  return "neon64";
#elif defined(__SSE2__)
  return "sse2";
#else
  return "scalar";
#endif
}

/// One measurement, with the fields of BENCHMARKS.md. Negative numbers mean "does not apply" and
/// are left out of the JSON.
struct record {
  std::string workload, system, mode;
  std::string config;  ///< how this system was set up for this number (layout, threading, library)
  std::string note;
  unsigned threads = 1;
  int round = -1;  ///< which repetition of the whole suite (run_all runs it several times)
  double median_us = -1, p10_us = -1, p90_us = -1, floor_us = -1;
  double gbps = -1, gflops = -1, max_rel_err = -1, compile_s = -1;
  double bytes = -1, flops = -1;  ///< the work a floor is computed from
  std::string traffic;            ///< "read" (all bytes are reads) or "read_write"
  std::string isa = build_isa();  ///< the ISA of the program that measured it
  int warmup = -1, iters = -1;

  void set(const timing& t) {
    median_us = t.median_us, p10_us = t.p10_us, p90_us = t.p90_us;
    warmup = t.warmup, iters = t.iters;
  }
};

namespace detail {
inline std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\', o += ch;
    else if (static_cast<unsigned char>(ch) < 0x20) o += ' ';
    else o += ch;
  }
  return o + '"';
}
inline std::string json_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
}  // namespace detail

inline std::string to_json(const record& r) {
  std::string s = "{\"workload\":" + detail::json_string(r.workload) + ",\"system\":" + detail::json_string(r.system) +
                  ",\"mode\":" + detail::json_string(r.mode) + ",\"threads\":" + std::to_string(r.threads);
  auto num = [&](const char* k, double v) {
    if (v >= 0) s += std::string(",\"") + k + "\":" + detail::json_number(v);
  };
  num("median_us", r.median_us);
  num("p10_us", r.p10_us);
  num("p90_us", r.p90_us);
  num("floor_us", r.floor_us);
  num("gbps", r.gbps);
  num("gflops", r.gflops);
  num("max_rel_err", r.max_rel_err);
  num("compile_s", r.compile_s);
  num("warmup", r.warmup);
  num("iters", r.iters);
  num("round", r.round);
  num("bytes", r.bytes);
  num("flops", r.flops);
  if (!r.traffic.empty()) s += ",\"traffic\":" + detail::json_string(r.traffic);
  if (!r.config.empty()) s += ",\"config\":" + detail::json_string(r.config);
  if (!r.note.empty()) s += ",\"note\":" + detail::json_string(r.note);
  s += ",\"isa\":" + detail::json_string(r.isa);
  return s + "}";
}

/// Reads back what to_json wrote (flat objects of strings and numbers; other lines are skipped).
inline bool from_json(const std::string& line, record& r) {
  std::size_t i = line.find('{');
  if (i == std::string::npos) return false;
  std::map<std::string, std::string> kv;
  auto skip = [&] {
    while (i < line.size() && (line[i] == ' ' || line[i] == ',' || line[i] == '{' || line[i] == '}')) ++i;
  };
  auto str = [&] {
    std::string o;
    for (++i; i < line.size() && line[i] != '"'; ++i) {
      if (line[i] == '\\' && i + 1 < line.size()) ++i;
      o += line[i];
    }
    ++i;
    return o;
  };
  for (skip(); i < line.size() && line[i] == '"'; skip()) {
    const std::string k = str();
    while (i < line.size() && (line[i] == ':' || line[i] == ' ')) ++i;
    if (i < line.size() && line[i] == '"') {
      kv[k] = str();
    } else {
      const std::size_t e = line.find_first_of(",}", i);
      kv[k] = line.substr(i, e - i);
      i = e;
    }
  }
  if (!kv.count("workload") || !kv.count("system")) return false;
  auto num = [&](const char* k) { return kv.count(k) ? std::atof(kv[k].c_str()) : -1.0; };
  r = record{};
  r.workload = kv["workload"], r.system = kv["system"], r.mode = kv["mode"];
  r.config = kv["config"], r.note = kv["note"];
  r.threads = kv.count("threads") ? static_cast<unsigned>(std::atoi(kv["threads"].c_str())) : 0;
  r.median_us = num("median_us"), r.p10_us = num("p10_us"), r.p90_us = num("p90_us");
  r.floor_us = num("floor_us"), r.gbps = num("gbps"), r.gflops = num("gflops");
  r.max_rel_err = num("max_rel_err"), r.compile_s = num("compile_s");
  r.warmup = static_cast<int>(num("warmup")), r.iters = static_cast<int>(num("iters"));
  r.round = static_cast<int>(num("round"));
  r.bytes = num("bytes"), r.flops = num("flops"), r.traffic = kv["traffic"];
  r.isa = kv.count("isa") ? kv["isa"] : "unrecorded";
  return true;
}

inline std::vector<record> read_jsonl(const std::string& path) {
  std::vector<record> out;
  std::ifstream in(path);
  std::string line;
  record r;
  while (std::getline(in, line))
    if (from_json(line, r)) out.push_back(r);
  return out;
}

/// Prints a record's JSON line on stdout and appends it to `path` (when not empty).
inline void emit(const record& r, const std::string& path) {
  const std::string line = to_json(r);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (!path.empty()) {
    if (FILE* f = std::fopen(path.c_str(), "a")) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fclose(f);
    }
  }
}

/// A plain text table: column widths from the contents, numbers right-aligned.
class table {
 public:
  explicit table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void separator() { rows_.emplace_back(); }
  void print(std::FILE* out = stdout) const {
    std::vector<std::size_t> w;
    for (const auto& r : rows_)
      for (std::size_t c = 0; c < r.size(); ++c) {
        if (w.size() <= c) w.push_back(0);
        w[c] = std::max(w[c], r[c].size());
      }
    std::size_t total = 0;
    for (auto x : w) total += x + 2;
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      const auto& r = rows_[i];
      if (r.empty()) {
        std::fprintf(out, "%s\n", std::string(total, '-').c_str());
        continue;
      }
      std::string line;
      for (std::size_t c = 0; c < r.size(); ++c) {
        const bool numeric = !r[c].empty() && (std::isdigit(static_cast<unsigned char>(r[c][0])) || r[c][0] == '-') &&
                             i > 0;
        const std::string pad(w[c] - r[c].size(), ' ');
        line += numeric ? pad + r[c] : r[c] + pad;
        line += "  ";
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      std::fprintf(out, "%s\n", line.c_str());
      if (i == 0) std::fprintf(out, "%s\n", std::string(total, '=').c_str());
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

/// printf into a std::string, for table cells.
template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

}  // namespace fusebox::bench
