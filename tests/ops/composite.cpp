// tests/ops/composite.cpp: the ops of include/fusebox/ops/composite.hpp, written as compositions of
// reductions and elementwise ops: softmax and log_softmax along either axis, and layer_norm (also on
// inputs whose variance is far above eps, around a large mean, and far below eps, as in W2: see
// BENCHMARKS.md), eager and compiled, against double-precision references computed here, element
// by element. Tolerances are stated at each test, in units of the element type's epsilon.
//
// Built once per element type, as tests/ops/elementwise.cpp (FUSEBOX_TEST_ELEMENT: float, double).
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

#ifndef FUSEBOX_TEST_ELEMENT
#define FUSEBOX_TEST_ELEMENT float
#endif
#define FBT_STR2(x) #x
#define FBT_STR(x) FBT_STR2(x)
#define FBT_TYPE " (" FBT_STR(FUSEBOX_TEST_ELEMENT) ")"

namespace fb = fusebox;
using T = FUSEBOX_TEST_ELEMENT;
using fbt::coord;
using fbt::tol;

namespace {

constexpr double eps = std::numeric_limits<T>::epsilon();

// ---- references for the composite ops, one row (or column) at a time ----

/// softmax / log_softmax of x along axis (rank 2), in double.
template <class X>
double softmax_ref(const X& x, const coord& o, std::size_t axis, bool log_form) {
  const std::size_t n = x.extents().extent[axis];
  coord i = o;
  double m = -INFINITY;
  for (std::size_t k = 0; k < n; ++k) {
    i[axis] = k;
    m = std::max(m, fbt::at(x, i, 2));
  }
  double s = 0;
  for (std::size_t k = 0; k < n; ++k) {
    i[axis] = k;
    s += std::exp(fbt::at(x, i, 2) - m);
  }
  const double v = fbt::at(x, o, 2) - m;
  return log_form ? v - std::log(s) : std::exp(v) / s;
}

/// layer_norm of the last dimension, biased variance, in double.
template <class X, class G, class B>
double layer_norm_ref(const X& x, const G& g, const B& b, double epsilon, const coord& o) {
  const std::size_t r = x.extents().rank, n = x.extents().extent[r - 1];
  coord i = o;
  double mean = 0;
  for (std::size_t k = 0; k < n; ++k) {
    i[r - 1] = k;
    mean += fbt::at(x, i, r);
  }
  mean /= static_cast<double>(n);
  double var = 0;
  for (std::size_t k = 0; k < n; ++k) {
    i[r - 1] = k;
    const double c = fbt::at(x, i, r) - mean;
    var += c * c;
  }
  var /= static_cast<double>(n);
  return (fbt::at(x, o, r) - mean) / std::sqrt(var + epsilon) * fbt::at(g, o, r) + fbt::at(b, o, r);
}

}  // namespace

TEST_CASE("softmax and log_softmax match a double reference along either axis" FBT_TYPE, "[ops][composite][softmax]") {
  // softmax: relative 8 eps per element (exp, a sum whose terms are all positive, one division) plus
  // an absolute 1e-3 eps for results far below 1; log_softmax: absolute 8 eps (1 + |result|).
  auto model = [](auto x) {
    return std::make_tuple(fb::softmax(x), fb::log_softmax(x), fb::softmax(x, fb::axis<0>),
                           fb::log_softmax(x, fb::axis<0>));
  };
  using S = std::conditional_t<std::is_same_v<T, float>, fb::shape<3, 17>, fb::shape<17, 19>>;
  fb::tensor<T, S> x;
  fbt::fill_signed(x, 11, 0.05, 4.0);
  auto check = [&](const auto& o, const auto& xs, const std::string& mode) {
    const tol sm{1e-3 * eps, 8 * eps};
    fbt::check_all(std::get<0>(o), [&](const coord& i) { return softmax_ref(xs, i, 1, false); }, sm, "softmax " + mode);
    fbt::check_all(std::get<2>(o), [&](const coord& i) { return softmax_ref(xs, i, 0, false); }, sm,
                   "softmax axis 0 " + mode);
    const tol lsm{8 * eps, 8 * eps};
    fbt::check_all(std::get<1>(o), [&](const coord& i) { return softmax_ref(xs, i, 1, true); }, lsm,
                   "log_softmax " + mode);
    fbt::check_all(std::get<3>(o), [&](const coord& i) { return softmax_ref(xs, i, 0, true); }, lsm,
                   "log_softmax axis 0 " + mode);
  };
  check(fb::compile(model)(x), x, "compiled");
  const auto xd = fbt::to_dyn(x);
  check(fb::eager(model)(xd), xd, "eager");
  // Rows sum to 1.
  const auto s = std::get<0>(fb::compile(model)(x));
  for (std::size_t r = 0; r < s.extent(0); ++r) {
    double total = 0;
    for (std::size_t c = 0; c < s.extent(1); ++c) total += s(r, c);
    CHECK(std::fabs(total - 1) < 32 * eps);
  }
}

TEST_CASE("layer_norm matches a double reference" FBT_TYPE, "[ops][composite][layer_norm]") {
  // Relative 16 eps + absolute 16 eps per element for well-scaled inputs; see each section for the
  // others. gamma and beta are random (not 1 and 0), so a swapped or ignored affine part fails.
  using S = std::conditional_t<std::is_same_v<T, float>, fb::shape<3, 1000>, fb::shape<17, 19>>;
  constexpr std::size_t n = S::extents[1];
  fb::tensor<T, S> x;
  fb::tensor<T, fb::shape<n>> gamma, beta;
  fbt::fill_uniform(gamma, 21, 0.5, 2.0);
  fbt::fill_signed(beta, 22, 0.05, 1.0);
  const double epsilon = 1e-5;
  auto model = [](auto x, auto g, auto b) { return fb::layer_norm(x, g, b, 1e-5); };
  auto check = [&](const std::string& what, tol t) {
    const auto c = fb::compile(model)(x, gamma, beta);
    const auto xd = fbt::to_dyn(x);
    const auto e = fb::eager(model)(xd, fbt::to_dyn(gamma), fbt::to_dyn(beta));
    auto ref = [&](const coord& i) { return layer_norm_ref(x, gamma, beta, epsilon, i); };
    fbt::check_all(c, ref, t, "layer_norm compiled, " + what);
    fbt::check_all(e, ref, t, "layer_norm eager, " + what);
  };
  SECTION("variance >> eps: uniform in +-[0.05, 3]") {
    fbt::fill_signed(x, 23, 0.05, 3.0);
    check("variance ~3", {16 * eps, 16 * eps});
  }
  SECTION("variance >> eps around a large mean: the centering must be two-pass") {
    // Uniform in [100, 101): a one-pass E[x^2] - E[x]^2 loses every digit of the variance (1/12)
    // in float. The rounding of the mean (100 n u) dominates the centered value's error: tolerance
    // 1e4 eps absolute.
    fbt::fill_uniform(x, 24, 100.0, 101.0);
    check("mean 100.5, variance 1/12", {1e4 * eps, 16 * eps});
  }
  SECTION("variance << eps: softmax rows (the W2 structure), eps dominates") {
    fb::tensor<T, S> raw;
    fbt::fill_signed(raw, 25, 0.05, 3.0);
    x = fb::compile([](auto r) { return fb::softmax(r); })(raw);
    check("softmax rows", {16 * eps, 16 * eps});
  }
}
