// ab.hpp: ab(eager_fn, compiled_fn, inputs...), the A/B measurement every compile guide asks users
// to run: warm-up, steady-state median and spread of each side, the peak memory each side holds
// during one call, the largest difference between their outputs, and a verdict.
// Depends on: core/{tensor,storage}.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fusebox/core/storage.hpp"
#include "fusebox/core/tensor.hpp"

namespace fusebox {

struct ab_config {
  int warmup = 10;
  int min_iters = 50;
  double min_seconds = 0.5;  ///< keep timing until both this and min_iters are reached
  double tolerance = 1e-4;   ///< largest acceptable error (relative to the largest output magnitude)
};

struct ab_side {
  double median_us = 0, p10_us = 0, p90_us = 0;
  std::size_t peak_bytes = 0;  ///< fusebox buffers held at the peak of one call, beyond what was live before
  int iters = 0;
};

struct ab_result {
  ab_side eager, compiled;
  double speedup = 0;      ///< eager median / compiled median
  double max_rel_err = 0;  ///< max |a - b| / max |a| over every output element
  bool ok = false;
  std::string verdict;
  std::string table() const;
};

namespace detail {

template <class F, class... In>
ab_side measure(F& f, const ab_config& cfg, const In&... in) {
  ab_side s;
  for (int i = 0; i < cfg.warmup; ++i) (void)f(in...);
  memory().reset_peak();
  const std::size_t before = memory().live.load();
  { auto keep = f(in...); }
  s.peak_bytes = memory().peak.load() - before;
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  while (static_cast<int>(t.size()) < cfg.min_iters ||
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < cfg.min_seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = f(in...);
    const auto t1 = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (t.size() > 100000) break;
  }
  std::sort(t.begin(), t.end());
  s.iters = static_cast<int>(t.size());
  s.median_us = t[t.size() / 2];
  s.p10_us = t[t.size() / 10];
  s.p90_us = t[t.size() * 9 / 10];
  return s;
}

template <class A, class B>
void compare_outputs(const A& a, const B& b, double& max_diff, double& max_mag) {
  if constexpr (is_tensor_v<A>) {
    if (!(a.extents() == b.extents()))
      throw invalid_argument("ab(): the two sides return different shapes: " + to_string(a.extents()) + " and " +
                             to_string(b.extents()));
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double x = a.flat(i), y = b.flat(i);
      max_diff = std::max(max_diff, std::isnan(x) != std::isnan(y) ? INFINITY : std::fabs(x - y));
      max_mag = std::max(max_mag, std::fabs(x));
    }
  } else {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (compare_outputs(std::get<I>(a), std::get<I>(b), max_diff, max_mag), ...);
    }(std::make_index_sequence<std::tuple_size_v<A>>{});
  }
}

inline std::string mib(std::size_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  return buf;
}

}  // namespace detail

inline std::string ab_result::table() const {
  char buf[512];
  std::string s = "             median      p10 .. p90            peak memory   calls\n";
  std::snprintf(buf, sizeof buf, "  eager     %9.1f us  %9.1f .. %-9.1f  %12s  %6d\n", eager.median_us, eager.p10_us,
                eager.p90_us, detail::mib(eager.peak_bytes).c_str(), eager.iters);
  s += buf;
  std::snprintf(buf, sizeof buf, "  compiled  %9.1f us  %9.1f .. %-9.1f  %12s  %6d\n", compiled.median_us,
                compiled.p10_us, compiled.p90_us, detail::mib(compiled.peak_bytes).c_str(), compiled.iters);
  s += buf;
  return s + "  " + verdict + "\n";
}

/// Measures eager_fn and compiled_fn on the same inputs (each must return tensors).
template <class E, class C, class... In>
ab_result ab_with(const ab_config& cfg, E&& eager_fn, C&& compiled_fn, const In&... inputs) {
  ab_result r;
  double diff = 0, mag = 0;
  detail::compare_outputs(eager_fn(inputs...), compiled_fn(inputs...), diff, mag);
  r.max_rel_err = mag > 0 ? diff / mag : diff;
  r.eager = detail::measure(eager_fn, cfg, inputs...);
  r.compiled = detail::measure(compiled_fn, cfg, inputs...);
  r.speedup = r.eager.median_us / r.compiled.median_us;
  r.ok = r.max_rel_err <= cfg.tolerance;
  char buf[256];
  std::snprintf(buf, sizeof buf, "verdict: compiled is %.2fx %s than eager, peak memory %s vs %s, max rel error %.2e (%s)",
                r.speedup >= 1 ? r.speedup : 1 / r.speedup, r.speedup >= 1 ? "faster" : "SLOWER",
                detail::mib(r.compiled.peak_bytes).c_str(), detail::mib(r.eager.peak_bytes).c_str(), r.max_rel_err,
                r.ok ? "within tolerance" : "OVER TOLERANCE: check the model");
  r.verdict = buf;
  return r;
}

template <class E, class C, class... In>
ab_result ab(E&& eager_fn, C&& compiled_fn, const In&... inputs) {
  return ab_with(ab_config{}, eager_fn, compiled_fn, inputs...);
}

}  // namespace fusebox
