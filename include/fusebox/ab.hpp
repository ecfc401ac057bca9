// ab.hpp: ab(eager_fn, compiled_fn, inputs...), the A/B measurement every compile guide asks users
// to run: warm-up, steady-state median and spread of each side, the peak memory each side holds
// during one call, the largest difference between their outputs, and a verdict a program can act
// on: `r.use_compiled()`, and `r.apply(f)`, which disables the compiled function f (it then runs
// its model eagerly) when its compiled program is wrong or slower, and enables it otherwise.
//
// Special values (DESIGN.md: one numeric semantics on every path): an element that is NaN on both
// sides, or the same infinity on both sides, agrees and is counted in `nonfinite_both`; NaN or inf
// on one side only, or a different one (NaN and inf, +inf and -inf), is a mismatch: the error is
// then infinite and the result not ok. The relative error is taken over the elements finite on
// both sides, relative to the largest finite eager magnitude.
// Depends on: core/{tensor,storage}.hpp, options.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/storage.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/options.hpp"

namespace fusebox {

struct ab_config {
  int warmup = 10;
  int min_iters = 50;
  double min_seconds = 0.5;  ///< keep timing until both this and min_iters are reached
  double tolerance = 1e-4;   ///< largest acceptable error (relative to the largest output magnitude)
  /// The compiled side is kept (use_compiled(), apply()) only if it is at least this much faster
  /// than eager (eager median / compiled median); raise it to ask for a margin over timing noise.
  double min_speedup = 1.0;
};

struct ab_side {
  double median_us = 0, p10_us = 0, p90_us = 0;
  std::size_t peak_bytes = 0;  ///< fusebox buffers held at the peak of one call, beyond what was live before
  int iters = 0;
};

/// Which side a program should run, by ab()'s measurement.
enum class ab_choice { compiled, eager };

struct ab_result {
  ab_side eager, compiled;
  double speedup = 0;      ///< eager median / compiled median
  /// max |a - b| / max |a| over the elements finite on both sides (max |a| over finite eager
  /// values); infinite when a NaN or inf is on one side only.
  double max_rel_err = 0;
  std::size_t elements = 0;            ///< output elements compared
  std::size_t nonfinite_both = 0;      ///< NaN on both sides, or the same infinity: they agree
  std::size_t nonfinite_mismatch = 0;  ///< NaN or inf on one side only, or a different one
  std::string first_mismatch;          ///< "output 0 element 5: eager nan, compiled 1.5" (empty if none)
  bool ok = false;      ///< correct: within tolerance and every NaN and inf agrees
  bool faster = false;  ///< speedup >= ab_config::min_speedup
  ab_choice choice = ab_choice::eager;  ///< compiled if ok and faster, else eager
  std::string verdict;
  std::string table() const;

  bool use_compiled() const noexcept { return choice == ab_choice::compiled; }
  /// Acts on the verdict: disables the compiled function f (compiled::disable: it runs its model
  /// eagerly, like the global rollback but for f alone) when its compiled program is wrong or
  /// slower, enables it otherwise. Returns use_compiled().
  template <class F>
    requires requires(F& f) {
      f.disable();
      f.enable();
    }
  bool apply(F& f) const {
    if (use_compiled()) f.enable();
    else f.disable();
    return use_compiled();
  }
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

/// What compare_outputs accumulates over every output.
struct ab_diff {
  double max_diff = 0;  ///< over elements finite on both sides
  double max_mag = 0;   ///< max |eager| over finite eager elements
  std::size_t elements = 0, finite = 0, nonfinite_both = 0, mismatches = 0;
  std::size_t output = 0;  ///< index of the output being compared
  std::string first_mismatch;
};

template <class A, class B>
void compare_outputs(const A& a, const B& b, ab_diff& d) {
  if constexpr (is_tensor_v<A>) {
    if (!(a.extents() == b.extents()))
      FUSEBOX_THROW(invalid_argument("ab(): the two sides return different shapes: " + to_string(a.extents()) + " and " +
                                     to_string(b.extents())));
    for (std::size_t i = 0; i < a.size(); ++i) {
      const double x = a.flat(i), y = b.flat(i);
      ++d.elements;
      if (std::isfinite(x) && std::isfinite(y)) {
        ++d.finite;
        d.max_diff = std::max(d.max_diff, std::fabs(x - y));
        d.max_mag = std::max(d.max_mag, std::fabs(x));
      } else if ((std::isnan(x) && std::isnan(y)) || x == y) {  // NaN and NaN, or the same infinity
        ++d.nonfinite_both;
      } else {
        if (d.mismatches++ == 0) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "output %zu element %zu: eager %g, compiled %g", d.output, i, x, y);
          d.first_mismatch = buf;
        }
        if (std::isfinite(x)) d.max_mag = std::max(d.max_mag, std::fabs(x));
      }
    }
    ++d.output;
  } else {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (compare_outputs(std::get<I>(a), std::get<I>(b), d), ...);
    }(std::make_index_sequence<std::tuple_size_v<A>>{});
  }
}

inline std::string mib(std::size_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  return buf;
}

/// A compiled function (compiled<...>): ab() measures its compiled program even while it is
/// disabled, so a rolled-back function can be measured again.
template <class F>
concept switchable = requires(F& f) {
  { f.enabled() } -> std::convertible_to<bool>;
  f.enable();
  f.disable();
};

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
  // A disabled compiled function is enabled while it is measured, then left as it was.
  struct enabled_while_measured {
    std::remove_reference_t<C>& f;
    bool was = true;
    explicit enabled_while_measured(std::remove_reference_t<C>& g) : f(g) {
      if constexpr (detail::switchable<std::remove_reference_t<C>>) {
        was = f.enabled();
        f.enable();
      }
    }
    ~enabled_while_measured() {
      if constexpr (detail::switchable<std::remove_reference_t<C>>)
        if (!was) f.disable();
    }
  } scope(compiled_fn);

  ab_result r;
  detail::ab_diff d;
  detail::compare_outputs(eager_fn(inputs...), compiled_fn(inputs...), d);
  r.elements = d.elements;
  r.nonfinite_both = d.nonfinite_both;
  r.nonfinite_mismatch = d.mismatches;
  r.first_mismatch = d.first_mismatch;
  r.max_rel_err = d.mismatches ? std::numeric_limits<double>::infinity() : d.max_mag > 0 ? d.max_diff / d.max_mag : d.max_diff;
  r.eager = detail::measure(eager_fn, cfg, inputs...);
  r.compiled = detail::measure(compiled_fn, cfg, inputs...);
  r.speedup = r.eager.median_us / r.compiled.median_us;
  r.ok = d.mismatches == 0 && r.max_rel_err <= cfg.tolerance;
  r.faster = r.speedup >= cfg.min_speedup;
  r.choice = r.ok && r.faster ? ab_choice::compiled : ab_choice::eager;

  char buf[512];
  std::snprintf(buf, sizeof buf, "verdict: compiled is %.2fx %s than eager, peak memory %s vs %s, ",
                r.speedup >= 1 ? r.speedup : 1 / r.speedup, r.speedup >= 1 ? "faster" : "SLOWER",
                detail::mib(r.compiled.peak_bytes).c_str(), detail::mib(r.eager.peak_bytes).c_str());
  std::string v = buf;
  if (d.mismatches) {
    v += "max rel error inf (OVER TOLERANCE: " + std::to_string(d.mismatches) +
         " element(s) NaN or inf on one side only or differently; first: " + d.first_mismatch + ")";
  } else if (d.finite == 0 && d.elements > 0) {
    v += "max rel error n/a (no element is finite on both sides)";
  } else {
    std::snprintf(buf, sizeof buf, "max rel error %.2e (%s)", r.max_rel_err,
                  r.ok ? "within tolerance" : "OVER TOLERANCE: check the model");
    v += buf;
  }
  if (d.nonfinite_both)
    v += "; " + std::to_string(d.nonfinite_both) + " non-finite in both (NaN or inf at the same positions" +
         (d.finite == 0 ? ": every output element; check the inputs)" : ")");
  v += r.use_compiled() ? "; keep compiled"
                        : std::string("; roll back to eager (") + (r.ok ? "compiled is slower" : "compiled is wrong") +
                              "): r.apply(f) disables f";
  if (rollback_active())
    v += " [note: stance force_eager or FUSEBOX_DISABLE=1 is on, so the compiled side ran eagerly]";
  r.verdict = v;
  return r;
}

template <class E, class C, class... In>
ab_result ab(E&& eager_fn, C&& compiled_fn, const In&... inputs) {
  return ab_with(ab_config{}, eager_fn, compiled_fn, inputs...);
}

}  // namespace fusebox
