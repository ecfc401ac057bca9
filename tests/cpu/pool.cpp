// Tests for include/fusebox/backend/cpu/pool.hpp's max_pool2d backward (backend/cpu/max_pool_2x2.hpp's vector
// kernels for 2x2 windows at stride 2, the row-pass path taken otherwise without padding, and the
// per-window path with padding) and its max and avg forward (the same paths),
// through backend/cpu/spatial.hpp's run_spatial, against a naive double reference on fresh random inputs,
// every element: ties (inputs drawn from 5 values, so the first maximum in row-major order must
// win), overlapping windows (kernel 3, stride 2: a gradient element gets several contributions),
// NaNs (they win their windows, the later of two in one window), odd sizes (rows and columns no
// window reaches), strided x and g.
#include <fusebox/backend/cpu/spatial.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

namespace cpu = fusebox::cpu;
using fusebox::dims;
using fusebox::spatial_op;
using fusebox::strided;
using fusebox::window;

struct pool_case {
  std::size_t n, c, h, w;
  int k, s, p;
  bool strided_operands;
  bool strided_g_only = false;  // the backward's g strided, x contiguous: the row passes, not the 2x2 kernels
  std::size_t oh() const { return (h + 2 * p - k) / s + 1; }
  std::size_t ow() const { return (w + 2 * p - k) / s + 1; }
};

template <class T>
void check_max_backward(const pool_case& q, std::uint64_t seed) {
  INFO("N " << q.n << " C " << q.c << " H " << q.h << " W " << q.w << " kernel " << q.k << " stride " << q.s
            << " padding " << q.p << (q.strided_operands ? " (strided)" : ""));
  std::mt19937_64 rng(seed);
  const std::size_t OH = q.oh(), OW = q.ow(), spread = q.strided_operands ? 2 : 1;
  const std::size_t g_spread = q.strided_operands || q.strided_g_only ? 2 : 1;
  // x with few distinct values (ties), two NaNs one row apart (often in one window: the later
  // one wins); g in +-[0.25, 1].
  std::vector<T> xs(q.n * q.c * q.h * q.w * spread), gs(q.n * q.c * OH * OW * g_spread);
  for (auto& v : xs) v = T(int(rng() % 5) - 2);
  xs[(xs.size() / 3) / spread * spread] = std::numeric_limits<T>::quiet_NaN();
  xs[(xs.size() / 3) / spread * spread + q.w * spread] = std::numeric_limits<T>::quiet_NaN();
  std::uniform_real_distribution<double> mag(0.25, 1.0);
  for (auto& v : gs) v = T(rng() & 1 ? mag(rng) : -mag(rng));
  const dims xd{4, {q.n, q.c, q.h, q.w}}, gd{4, {q.n, q.c, OH, OW}};
  strided<T> x{xs.data(), xd, fusebox::contiguous_strides(xd)}, g{gs.data(), gd, fusebox::contiguous_strides(gd)};
  for (std::size_t d = 0; d < 4; ++d) {
    x.stride[d] *= std::ptrdiff_t(spread);
    g.stride[d] *= std::ptrdiff_t(g_spread);
  }
  auto X = [&](std::size_t n, std::size_t c, long i, long j) {
    return xs[(((n * q.c + c) * q.h + std::size_t(i)) * q.w + std::size_t(j)) * spread];
  };

  std::vector<double> want(xd.size(), 0.0);
  for (std::size_t n = 0; n < q.n; ++n)
    for (std::size_t c = 0; c < q.c; ++c)
      for (std::size_t i = 0; i < OH; ++i)
        for (std::size_t j = 0; j < OW; ++j) {
          double m = -std::numeric_limits<double>::infinity();
          long at = -1;
          for (int u = 0; u < q.k; ++u)
            for (int v = 0; v < q.k; ++v) {
              const long r = long(i) * q.s - q.p + u, col = long(j) * q.s - q.p + v;
              if (r < 0 || col < 0 || r >= long(q.h) || col >= long(q.w)) continue;
              const double e = X(n, c, r, col);
              if (at < 0) at = r * long(q.w) + col;  // a window of -inf keeps its first element
              if (e > m || std::isnan(e)) {
                m = e;
                at = r * long(q.w) + col;
              }
            }
          want[(n * q.c + c) * q.h * q.w + std::size_t(at)] += double(gs[(((n * q.c + c) * OH + i) * OW + j) * g_spread]);
        }

  for (unsigned threads : {1u, 2u}) {
    cpu::thread_pool pool(threads);
    const window win{spatial_op::max_pool2d_backward, q.k, q.k, q.s, q.s, q.p, q.p, int(q.h), int(q.w)};
    std::vector<T> out(xd.size(), std::numeric_limits<T>::quiet_NaN());
    strided<T> o{out.data(), xd, fusebox::contiguous_strides(xd)};
    std::vector<int> seen(xd.size(), 0);
    cpu::run_spatial(win, g, x, o, pool, {}, [&](std::size_t row, std::size_t j0, std::size_t cnt) {
      for (std::size_t j = j0; j < j0 + cnt; ++j) ++seen[row * q.w + j];
    });
    std::size_t bad = 0, miscovered = 0;
    for (std::size_t e = 0; e < out.size(); ++e) {
      // At most ceil(k / s)^2 float additions of values <= 1: 4 * eps * (number of terms) covers them.
      if (!(std::abs(double(out[e]) - want[e]) <= 36 * std::numeric_limits<T>::epsilon())) {
        if (bad < 5) UNSCOPED_INFO("element " << e << ": got " << out[e] << ", want " << want[e]);
        ++bad;
      }
      miscovered += seen[e] != 1;
    }
    INFO(threads << " threads");
    CHECK(bad == 0);
    CHECK(miscovered == 0);
  }
}

// The 2x2 stride-2 cases with x's rows and g's contiguous run backend/cpu/max_pool_2x2.hpp's kernels (with
// AVX2, float: 12 outputs a row are an 8-lane and a 4-lane range, 17 an 8-lane range and a scalar
// tail, 4 a 4-lane range; double's vectors have half the lanes).
const pool_case cases[] = {
    {3, 4, 24, 24, 2, 2, 0, false},        // T2's first pooling
    {2, 3, 9, 7, 2, 2, 0, false},          // a row and a column no window reaches
    {2, 3, 21, 35, 2, 2, 0, false},        // the same, with whole vectors and a tail
    {2, 5, 8, 8, 2, 2, 0, false},          // T2's second
    {2, 5, 8, 8, 2, 2, 0, true},           // strided operands: the row passes
    {3, 2, 24, 24, 2, 2, 0, false, true},  // g strided, x contiguous: the row passes
    {2, 3, 11, 9, 3, 2, 0, false},         // overlapping windows, odd sizes
    {2, 3, 10, 7, 3, 2, 1, false},         // padding: the per-window path
};

}  // namespace

TEST_CASE("cpu max_pool2d backward against a double reference, every element", "[cpu][pool]") {
  std::uint64_t seed = 5;
  for (const auto& q : cases) {
    check_max_backward<float>(q, seed += 7);
    check_max_backward<double>(q, seed += 7);
  }
}

/// max_pool2d and avg_pool2d forward of case q against double references, every element.
template <class T>
void check_forward(const pool_case& q, bool is_max, std::uint64_t seed) {
  INFO((is_max ? "max" : "avg") << " N " << q.n << " C " << q.c << " H " << q.h << " W " << q.w << " kernel " << q.k
                                << " stride " << q.s << " padding " << q.p << (q.strided_operands ? " (strided)" : ""));
  std::mt19937_64 rng(seed);
  const std::size_t OH = q.oh(), OW = q.ow(), spread = q.strided_operands ? 2 : 1;
  std::vector<T> xs(q.n * q.c * q.h * q.w * spread);
  for (auto& v : xs) v = T(int(rng() % 5) - 2) + T(0.25) * T(rng() % 3);
  if (is_max) xs[(xs.size() / 3) / spread * spread] = std::numeric_limits<T>::quiet_NaN();
  const dims xd{4, {q.n, q.c, q.h, q.w}}, yd{4, {q.n, q.c, OH, OW}};
  strided<T> x{xs.data(), xd, fusebox::contiguous_strides(xd)};
  for (std::size_t d = 0; d < 4; ++d) x.stride[d] *= std::ptrdiff_t(spread);
  for (unsigned threads : {1u, 2u}) {
    cpu::thread_pool pool(threads);
    const window win{is_max ? spatial_op::max_pool2d : spatial_op::avg_pool2d, q.k, q.k, q.s, q.s, q.p, q.p};
    std::vector<T> out(yd.size(), T(12345));
    strided<T> y{out.data(), yd, fusebox::contiguous_strides(yd)};
    std::vector<int> seen(yd.size(), 0);
    cpu::run_spatial(win, x, strided<T>{}, y, pool, {}, [&](std::size_t row, std::size_t j0, std::size_t cnt) {
      for (std::size_t j = j0; j < j0 + cnt; ++j) ++seen[row * OW + j];
    });
    std::size_t bad = 0, miscovered = 0;
    for (std::size_t n = 0; n < q.n; ++n)
      for (std::size_t c = 0; c < q.c; ++c)
        for (std::size_t i = 0; i < OH; ++i)
          for (std::size_t j = 0; j < OW; ++j) {
            double m = -std::numeric_limits<double>::infinity(), sum = 0;
            for (int u = 0; u < q.k; ++u)
              for (int v = 0; v < q.k; ++v) {
                const long r = long(i) * q.s - q.p + u, col = long(j) * q.s - q.p + v;
                if (r < 0 || col < 0 || r >= long(q.h) || col >= long(q.w)) continue;
                const double e = xs[(((n * q.c + c) * q.h + std::size_t(r)) * q.w + std::size_t(col)) * spread];
                if (e > m || std::isnan(e)) m = e;
                sum += e;
              }
            const double want = is_max ? m : sum / (q.k * q.k);
            const std::size_t e = ((n * q.c + c) * OH + i) * OW + j;
            const double got = out[e];
            const bool ok = std::isnan(want) ? std::isnan(got) : std::abs(got - want) <= 16 * std::numeric_limits<T>::epsilon();
            if (!ok && bad++ < 5) UNSCOPED_INFO("element " << e << ": got " << got << ", want " << want);
            miscovered += seen[e] != 1;
          }
    INFO(threads << " threads");
    CHECK(bad == 0);
    CHECK(miscovered == 0);
  }
}

TEST_CASE("cpu max_pool2d and avg_pool2d forward against double references, every element", "[cpu][pool]") {
  std::uint64_t seed = 905;
  for (const auto& q : cases)
    for (bool is_max : {true, false}) {
      check_forward<float>(q, is_max, seed += 7);
      check_forward<double>(q, is_max, seed += 7);
    }
}
