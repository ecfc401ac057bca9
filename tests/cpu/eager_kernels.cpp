// tests/cpu/eager_kernels.cpp: eager mode's shape-generic kernels (backend/cpu/eager_kernels.hpp),
// through the public ops on tensors: broadcasting along and across rows, strided (transposed)
// operands, numbers, rank 0, work large enough to be split over the pool, and reductions along
// every axis of a rank-3 tensor (keepdim or not, strided, NaN kept by max), every element against
// a double reference.
#include <fusebox/fusebox.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>

#include "../support/check.hpp"

namespace fb = fusebox;

namespace {

template <class Got, class Want>
void check_each(const Got& got, std::size_t n, Want want, double tol) {
  REQUIRE(got.size() == n);
  for (std::size_t i = 0; i < n; ++i) {
    const double w = want(i);
    INFO("element " << i << ": got " << got.flat(i) << ", want " << w);
    REQUIRE(std::fabs(static_cast<double>(got.flat(i)) - w) <= tol * (1.0 + std::fabs(w)));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("eager kernels: elementwise ops broadcast, strided, with numbers, rank 0 and split over the pool",
                   "[cpu][eager]", float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 2e-6 : 1e-13;
  fb::tensor<T, fb::shape<5, 37>> a;
  fb::tensor<T, fb::shape<37>> row;
  fb::tensor<T, fb::shape<5, 1>> col;
  fb::tensor<T, fb::shape<37, 5>> at;
  fbt::fill_signed(a, 1, 0.1, 2.0);
  fbt::fill_signed(row, 2, 0.1, 2.0);
  fbt::fill_signed(col, 3, 0.1, 2.0);
  fbt::fill_signed(at, 4, 0.1, 2.0);

  // Along the row (a vector load and a broadcast number per lane) and across rows (stride 0 in the row).
  const auto y1 = fb::add(a, row);
  check_each(y1, 5 * 37, [&](std::size_t i) { return double(a.flat(i)) + double(row.flat(i % 37)); }, tol);
  const auto y2 = fb::mul(a, col);
  check_each(y2, 5 * 37, [&](std::size_t i) { return double(a.flat(i)) * double(col.flat(i / 37)); }, tol);

  // A transposed operand: the row is strided, the scalar path.
  const auto t = at.transpose();  // [5, 37], strides {1, 5}
  const auto y3 = fb::sub(t, a);
  check_each(y3, 5 * 37, [&](std::size_t i) { return double(at.flat((i % 37) * 5 + i / 37)) - double(a.flat(i)); }, tol);

  // Three operands and a number: where(a > 0, a, 0.5).
  const auto y4 = fb::where(fb::gt(a, T(0)), a, T(0.5));
  check_each(y4, 5 * 37, [&](std::size_t i) { return a.flat(i) > 0 ? double(a.flat(i)) : 0.5; }, 0);

  // Large enough to be split over the pool (parallel_threshold elements and more).
  fb::tensor<T, fb::shape<300, 129>> big;
  fbt::fill_signed(big, 5, 0.1, 3.0);
  const auto y5 = fb::exp(big);
  check_each(y5, 300 * 129, [&](std::size_t i) { return std::exp(double(big.flat(i))); }, 4 * tol);

  // Rank 0: two means added.
  const auto m = fb::add(fb::mean(fb::mean(a)), fb::mean(fb::mean(at)));
  double sa = 0, st = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sa += a.flat(i), st += at.flat(i);
  check_each(m, 1, [&](std::size_t) { return sa / a.size() + st / at.size(); }, 10 * tol);
}

TEMPLATE_TEST_CASE("eager kernels: reductions along every axis, keepdim, strided input, NaN kept by max", "[cpu][eager]",
                   float, double) {
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  fb::tensor<T, fb::shape<3, 7, 19>> x;
  fbt::fill_signed(x, 11, 0.1, 2.0);
  auto at = [&](std::size_t i, std::size_t j, std::size_t k) { return double(x.flat((i * 7 + j) * 19 + k)); };

  const auto s0 = fb::sum(x, fb::axis<0>);  // [7, 19]
  check_each(s0, 7 * 19, [&](std::size_t o) { return at(0, o / 19, o % 19) + at(1, o / 19, o % 19) + at(2, o / 19, o % 19); }, tol);
  const auto m1 = fb::mean(x, fb::axis<1>, fb::keepdim);  // [3, 1, 19]
  CHECK(m1.extents() == fb::dims{3, {3, 1, 19}});
  check_each(m1, 3 * 19, [&](std::size_t o) {
    double s = 0;
    for (std::size_t j = 0; j < 7; ++j) s += at(o / 19, j, o % 19);
    return s / 7;
  }, tol);
  const auto mx = fb::max(x, fb::axis<2>);  // [3, 7]
  check_each(mx, 21, [&](std::size_t o) {
    double m = -INFINITY;
    for (std::size_t k = 0; k < 19; ++k) m = std::max(m, at(o / 7, o % 7, k));
    return m;
  }, 0);

  // A strided input: the last axis of a transposed view, then its first axis.
  const auto xt = x.template transpose<1, 2>();  // [3, 19, 7]
  const auto mn = fb::min(xt, fb::axis<2>);      // [3, 19]: min over j
  check_each(mn, 3 * 19, [&](std::size_t o) {
    double m = INFINITY;
    for (std::size_t j = 0; j < 7; ++j) m = std::min(m, at(o / 19, j, o % 19));
    return m;
  }, 0);
  const auto s1 = fb::sum(xt, fb::axis<1>);  // [3, 7]: sum over k, down a strided column
  check_each(s1, 21, [&](std::size_t o) {
    double s = 0;
    for (std::size_t k = 0; k < 19; ++k) s += at(o / 7, o % 7, k);
    return s;
  }, tol);

  // max keeps a NaN, along the row and across rows.
  x.flat((1 * 7 + 3) * 19 + 17) = std::numeric_limits<T>::quiet_NaN();
  const auto n2 = fb::max(x, fb::axis<2>);
  const auto n0 = fb::max(x, fb::axis<0>);
  for (std::size_t o = 0; o < 21; ++o) CHECK(std::isnan(double(n2.flat(o))) == (o == 1 * 7 + 3));
  for (std::size_t o = 0; o < 7 * 19; ++o) CHECK(std::isnan(double(n0.flat(o))) == (o == 3 * 19 + 17));
}

TEMPLATE_TEST_CASE("eager kernels: matmul, plain, batched against a matrix, transposed operand", "[cpu][eager]", float,
                   double) {
  using T = TestType;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  fb::tensor<T, fb::shape<3, 5, 37>> a;
  fb::tensor<T, fb::shape<37, 11>> b;
  fb::tensor<T, fb::shape<11, 37>> bt;
  fbt::fill_signed(a, 21, 0.1, 1.0);
  fbt::fill_signed(b, 22, 0.1, 1.0);
  fbt::fill_signed(bt, 23, 0.1, 1.0);
  auto dot = [&](std::size_t bi, std::size_t i, std::size_t j, auto rhs) {
    double s = 0;
    for (std::size_t k = 0; k < 37; ++k) s += double(a.flat((bi * 5 + i) * 37 + k)) * rhs(k, j);
    return s;
  };
  const auto y = fb::matmul(a, b);  // [3, 5, 11]
  check_each(y, 3 * 5 * 11, [&](std::size_t o) {
    return dot(o / 55, o / 11 % 5, o % 11, [&](std::size_t k, std::size_t j) { return double(b.flat(k * 11 + j)); });
  }, tol);
  const auto yt = fb::matmul(a, bt.transpose());  // the right operand strided {1, 37}
  check_each(yt, 3 * 5 * 11, [&](std::size_t o) {
    return dot(o / 55, o / 11 % 5, o % 11, [&](std::size_t k, std::size_t j) { return double(bt.flat(j * 37 + k)); });
  }, tol);
}
