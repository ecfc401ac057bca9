// tests/support/check.hpp: what the op and compile tests share: seeded inputs that avoid zero, a
// broadcasting element reader for double-precision references, and element-by-element checks that
// report the first mismatch (coord, value, reference) instead of one CHECK per element.
// Depends on: fusebox/core, Catch2.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>

#include <catch2/catch.hpp>

#include <fusebox/core/tensor.hpp>

namespace fbt {

namespace fb = fusebox;

using coord = std::array<std::size_t, fb::max_rank>;

/// Row-major multi-coord of flat element i of extents d.
inline coord unravel(std::size_t i, const fb::dims& d) {
  coord idx{};
  for (std::size_t k = d.rank; k-- > 0;) {
    idx[k] = i % d.extent[k];
    i /= d.extent[k];
  }
  return idx;
}

/// "[1, 16]" for messages.
inline std::string to_string(const coord& idx, std::size_t rank) {
  std::string s = "[";
  for (std::size_t k = 0; k < rank; ++k) s += (k ? ", " : "") + std::to_string(idx[k]);
  return s + "]";
}

/// Element of t at the multi-coord idx of a result of rank out_rank, NumPy broadcasting: t's
/// dimensions line up from the right, and extent-1 dimensions repeat. Read through t's strides.
template <class T, class S>
double at(const fb::tensor<T, S>& t, const coord& idx, std::size_t out_rank) {
  const fb::dims& d = t.extents();
  std::ptrdiff_t off = 0;
  for (std::size_t k = 0; k < d.rank; ++k) {
    const std::size_t ok = k + out_rank - d.rank;
    const std::size_t i = d.extent[k] == 1 ? 0 : idx[ok];
    off += static_cast<std::ptrdiff_t>(i) * t.stride(k);
  }
  return static_cast<double>(t.data()[off]);
}

/// splitmix64: the tests' own seeded generator (independent of the library's).
struct rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

/// Uniform magnitudes in [lo, hi] with a random sign: never zero, never tiny, reproducible.
template <class T, class S>
void fill_signed(fb::tensor<T, S>& t, std::uint64_t seed, double lo, double hi) {
  rng g{seed};
  for (std::size_t i = 0; i < t.size(); ++i) {
    const double m = lo + (hi - lo) * g.uniform();
    t.flat(i) = static_cast<T>(g.next() & 1 ? m : -m);
  }
}

/// Uniform in [lo, hi) (lo > 0 keeps log/sqrt/rsqrt/pow in their domain).
template <class T, class S>
void fill_uniform(fb::tensor<T, S>& t, std::uint64_t seed, double lo, double hi) {
  t.fill_random(seed, static_cast<T>(lo), static_cast<T>(hi));
}

/// The same values in a tensor whose every extent is dyn (eager ops on it run the run-time-extent
/// path, and one instantiation serves every size).
template <class T, std::size_t... E>
auto to_dyn(const fb::tensor<T, fb::shape<E...>>& t) {
  fb::tensor<T, fb::shape<(static_cast<void>(E), fb::dyn)...>> d(t.extents());
  for (std::size_t i = 0; i < t.size(); ++i) d.flat(i) = t.flat(i);
  return d;
}

/// The same values in double, every extent dyn: the model run eagerly on these is the reference
/// for whole-model tests (tests/compile/).
template <class S>
auto to_double_dyn(const fb::tensor<float, S>& t) {
  using D = typename decltype(to_dyn(t))::shape_type;
  fb::tensor<double, D> r(t.extents());
  for (std::size_t i = 0; i < t.size(); ++i) r.flat(i) = t.flat(i);
  return r;
}

/// Norm-wise difference: max |a - b| / max |b| (b is the reference), for whole-model results where
/// cancellation makes element-wise relative error meaningless.
template <class A, class B>
double rel_diff(const A& a, const B& reference) {
  REQUIRE(a.extents() == reference.extents());
  double diff = 0, mag = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a.flat(i)), y = static_cast<double>(reference.flat(i));
    diff = std::max(diff, std::isnan(x) != std::isnan(y) ? INFINITY : std::fabs(x - y));
    mag = std::max(mag, std::fabs(y));
  }
  return mag > 0 ? diff / mag : diff;
}

/// A tolerance: |got - ref| <= abs + rel * |ref|. {0, 0} means bitwise equal to the reference
/// rounded to T (for operations that are correctly rounded, e.g. + - * / sqrt).
struct tol {
  double abs = 0, rel = 0;
};

/// Tolerances for one op in float and in double.
struct tol2 {
  tol f, d;
  template <class T>
  tol get() const {
    return std::is_same_v<T, float> ? f : d;
  }
};

inline constexpr tol exact{0, 0};

/// A reference: the double-precision value expected at a multi-index.
using reference = std::function<double(const coord&)>;

namespace detail {
/// Element i of the row-major enumeration of a strided view.
template <class T>
T flat_at(const fb::strided<const T>& v, std::size_t i) {
  std::ptrdiff_t off = 0;
  for (std::size_t k = v.shape.rank; k-- > 0;) {
    off += static_cast<std::ptrdiff_t>(i % v.shape.extent[k]) * v.stride[k];
    i /= v.shape.extent[k];
  }
  return v.data[off];
}
inline std::string tol_text(tol t) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "abs %.3g, rel %.3g", t.abs, t.rel);
  return buf;
}
template <class T>
using bits_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

/// The body of check_all, instantiated once per element type (keeps test builds short). With
/// `bound`, the reference also gives each element's own absolute tolerance (t is then unused).
template <class T>
void check_view(const fb::strided<const T>& got, const reference& ref, tol t, const std::string& what,
                const reference* bound = nullptr) {
  const fb::dims& d = got.shape;
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const coord idx = unravel(i, d);
    const double r = ref(idx);
    const T g = flat_at(got, i);
    bool ok;
    if (bound) {
      const double err = std::fabs(static_cast<double>(g) - r);
      ok = err <= (*bound)(idx) && !std::isnan(g);
    } else if (t.abs == 0 && t.rel == 0) {
      const T rt = static_cast<T>(r);
      ok = std::bit_cast<bits_t<T>>(g) == std::bit_cast<bits_t<T>>(rt) || (std::isnan(g) && std::isnan(rt));
    } else {
      const double err = std::fabs(static_cast<double>(g) - r);
      ok = err <= t.abs + t.rel * std::fabs(r) && std::isnan(g) == std::isnan(r);
    }
    if (!ok && bad++ == 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, " got %.17g, reference %.17g (diff %.3g)", static_cast<double>(g), r,
                    std::fabs(static_cast<double>(g) - r));
      first = to_string(idx, d.rank) + buf;
    }
  }
  INFO(what << " " << fb::to_string(d) << ": " << bad << " of " << got.size() << " elements out of tolerance ("
            << (bound ? std::string("per-element bound") : tol_text(t))
            << "); first at " << first);
  CHECK(bad == 0);
}

template <class T>
void identical_views(const fb::strided<const T>& a, const fb::strided<const T>& b, const std::string& what) {
  INFO(what);
  REQUIRE(a.shape == b.shape);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const T x = flat_at(a, i), y = flat_at(b, i);
    const bool same = std::bit_cast<bits_t<T>>(x) == std::bit_cast<bits_t<T>>(y) || (std::isnan(x) && std::isnan(y));
    if (!same && bad++ == 0) first = i;
  }
  INFO(bad << " of " << a.size() << " elements differ; first at flat index " << first << ": "
           << (bad ? flat_at(a, first) : T(0)) << " vs " << (bad ? flat_at(b, first) : T(0)));
  CHECK(bad == 0);
}
}  // namespace detail

/// Checks every element of `got` against ref(idx), reporting how many fail and the first failure.
template <class T, class S>
void check_all(const fb::tensor<T, S>& got, const reference& ref, tol t, const std::string& what) {
  detail::check_view<T>(got.view(), ref, t, what);
}

/// Checks every element of `got` against ref(idx) with a per-element absolute bound(idx) (for
/// reductions, whose rounding error scales with the sum of magnitudes along the reduced axis).
template <class T, class S>
void check_bounded(const fb::tensor<T, S>& got, const reference& ref, const reference& bound, const std::string& what) {
  detail::check_view<T>(got.view(), ref, {}, what, &bound);
}

/// Same extents and the same bits in every element (NaN payloads aside).
template <class T, class S1, class S2>
void check_identical(const fb::tensor<T, S1>& a, const fb::tensor<T, S2>& b, const std::string& what) {
  detail::identical_views<T>(a.view(), b.view(), what);
}

/// Calls f(std::integral_constant<std::size_t, I>{}) for I in [0, N).
template <std::size_t N, class F>
void for_each_index(F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::integral_constant<std::size_t, I>{}), ...); }(
      std::make_index_sequence<N>{});
}

}  // namespace fbt
