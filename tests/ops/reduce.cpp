// tests/ops/reduce.cpp: the reductions of include/fusebox/ops/reduce.hpp (sum, mean, max, min over
// every axis of rank-1, -2 and -3 tensors, with and without keepdim), eager and compiled, against
// double-precision references computed here. The ops built on them (softmax, log_softmax,
// layer_norm) are in tests/ops/composite.cpp.
//
// Tolerances. max and min are exact. A sum of n terms in any order is within (n - 1) u sum|x_i|
// of the exact sum (u = eps / 2, first order); the check allows n u sum|x_i| plus the final
// rounding, per output element, so it holds whatever order the kernel adds in (vector lanes, four
// accumulators, column blocks) and still catches a missing or doubled term. mean adds one rounding
// for the division.
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

enum class red { sum, mean, max, min };
constexpr const char* red_names[] = {"sum", "mean", "max", "min"};

/// sum, mean, max, min over axis A, then mean and max with keepdim: 6 outputs. (keepdim changes only
/// where the result is written, the same for every op; one op that finalises and one that compares
/// keep the build shorter than all eight.)
template <int A>
constexpr auto reduce_model = [](auto x) {
  return std::make_tuple(fb::sum(x, fb::axis<A>), fb::mean(x, fb::axis<A>), fb::max(x, fb::axis<A>),
                         fb::min(x, fb::axis<A>), fb::mean(x, fb::axis<A>, fb::keepdim),
                         fb::max(x, fb::axis<A>, fb::keepdim));
};
constexpr red model_ops[] = {red::sum, red::mean, red::max, red::min, red::mean, red::max};


/// Checks output `out` of reducing x over `axis` with op r (keepdim or not).
template <class X, class Out>
void check_reduction(const Out& out, const X& x, std::size_t axis, red r, bool keepdim, const std::string& what) {
  const fb::dims& in = x.extents();
  fb::dims want = in;
  if (keepdim) {
    want.extent[axis] = 1;
  } else {
    for (std::size_t d = axis; d + 1 < in.rank; ++d) want.extent[d] = in.extent[d + 1];
    want.extent[--want.rank] = 0;
  }
  const std::string w = std::string(red_names[static_cast<int>(r)]) + (keepdim ? " keepdim" : "") + " axis " +
                        std::to_string(axis) + " of " + fb::to_string(in) + ", " + what;
  INFO(w);
  REQUIRE(out.extents() == want);
  const std::size_t n = in.extent[axis];
  // The input coordinate of element k along the axis, for output coordinate o.
  auto input_at = [&](const coord& o, std::size_t k) {
    coord i{};
    for (std::size_t d = 0, od = 0; d < in.rank; ++d) {
      if (d == axis) {
        i[d] = k;
        if (keepdim) ++od;
      } else {
        i[d] = o[od++];
      }
    }
    return fbt::at(x, i, in.rank);
  };
  auto value = [&](const coord& o) {
    double s = 0, m = input_at(o, 0), lo = m;
    for (std::size_t k = 0; k < n; ++k) {
      const double v = input_at(o, k);
      s += v;
      m = std::max(m, v);
      lo = std::min(lo, v);
    }
    switch (r) {
      case red::sum: return s;
      case red::mean: return s / static_cast<double>(n);
      case red::max: return m;
      default: return lo;
    }
  };
  auto bound = [&](const coord& o) {
    if (r == red::max || r == red::min) return 0.0;
    double abs_sum = 0;
    for (std::size_t k = 0; k < n; ++k) abs_sum += std::fabs(input_at(o, k));
    const double b = (static_cast<double>(n) * eps / 2) * abs_sum + eps * std::fabs(value(o));
    return r == red::mean ? b / static_cast<double>(n) + eps * std::fabs(value(o)) : b;
  };
  fbt::check_bounded(out, value, bound, w);
}

template <int A, class Outs, class X>
void check_reduce_outputs(const Outs& o, const X& x, const std::string& what) {
  const std::size_t axis = A < 0 ? static_cast<std::size_t>(static_cast<int>(x.extents().rank) + A) : A;
  fbt::for_each_index<std::size(model_ops)>([&](auto k) {
    check_reduction(std::get<k>(o), x, axis, model_ops[k], k >= 4, what);
  });
}

/// Every op over axis A of a static-shape x: compiled, and (with_eager) eager on a dyn copy.
template <int A, class X>
void reduce_case(const X& x, bool with_eager = true) {
  check_reduce_outputs<A>(fb::compile(reduce_model<A>)(x), x, "compiled");
  if (with_eager) {
    const auto xd = fbt::to_dyn(x);
    check_reduce_outputs<A>(fb::eager(reduce_model<A>)(xd), xd, "eager");
  }
}

template <class S>
fb::tensor<T, S> signed_input(std::uint64_t seed) {
  fb::tensor<T, S> x;
  fbt::fill_signed(x, seed, 0.05, 3.0);
  return x;
}

}  // namespace

// Float vectors are 16 lanes with AVX-512, double 8: widths 17 and 19 give a vector body and a
// tail, 3 is all tail; an axis of extent 1 and rank-0 results (rank-1 input, no keepdim) included.
// Rank 3 runs compiled over its first two axes and eagerly over the middle one only (build time;
// the last axis of rank 3 is the row kernel of rank 2 with one more outer dimension).
TEST_CASE("sum, mean, max, min over every axis of rank 1, 2, 3" FBT_TYPE, "[ops][reduce]") {
  if constexpr (std::is_same_v<T, float>) {
    SECTION("rank 1 [1000]") { reduce_case<0>(signed_input<fb::shape<1000>>(1)); }
    SECTION("rank 2 [3, 17], axis 0") { reduce_case<0>(signed_input<fb::shape<3, 17>>(2)); }
    SECTION("rank 2 [3, 17], axis -1") { reduce_case<-1>(signed_input<fb::shape<3, 17>>(3)); }
    SECTION("rank 3 [2, 3, 17], axis 0") { reduce_case<0>(signed_input<fb::shape<2, 3, 17>>(4), false); }
    SECTION("rank 3 [2, 3, 17], axis 1") { reduce_case<1>(signed_input<fb::shape<2, 3, 17>>(5)); }
  } else {
    SECTION("rank 1 [17]") { reduce_case<0>(signed_input<fb::shape<17>>(1)); }
    SECTION("rank 2 [17, 19], axis 0") { reduce_case<0>(signed_input<fb::shape<17, 19>>(2)); }
    SECTION("rank 2 [17, 19], axis 1") { reduce_case<1>(signed_input<fb::shape<17, 19>>(3)); }
    SECTION("rank 3 [3, 1, 19], axis 0") { reduce_case<0>(signed_input<fb::shape<3, 1, 19>>(4), false); }
    SECTION("rank 3 [3, 1, 19], axis 1 (extent 1)") { reduce_case<1>(signed_input<fb::shape<3, 1, 19>>(5)); }
  }
}

namespace {
/// x * b with NumPy broadcasting, each product rounded to T once (as the compiled kernel's is).
template <class S, class SB>
fb::tensor<T, S> product(const fb::tensor<T, S>& x, const fb::tensor<T, SB>& b) {
  fb::tensor<T, S> p;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const coord c = fbt::unravel(i, p.extents());
    p.flat(i) = static_cast<T>(fbt::at(x, c, 4) * fbt::at(b, c, 4));
  }
  return p;
}
}  // namespace

// The column kernel walks its space as rows, merging the dimensions after the axis where every
// operand's strides allow: a broadcast over H and W merges them (b), one over W only does not
// (c), and x1's rows are of 1 (the evaluator reads an operand whose static last extent is 1 as
// constant along the row). [128, 4, 8, 8] summed over the batch is one block of 256 columns, so
// its output rows are shared between two threads.
TEST_CASE("a column reduction of a fused product, rank 4: merged rows, broadcasts, threads" FBT_TYPE,
          "[ops][reduce]") {
  const auto x = signed_input<fb::shape<128, 4, 8, 8>>(31);
  const auto x1 = signed_input<fb::shape<6, 3, 5, 1>>(32);
  const auto b = signed_input<fb::shape<4, 1, 1>>(33);
  const auto c = signed_input<fb::shape<1, 8, 1>>(34);
  const auto b3 = signed_input<fb::shape<3, 1, 1>>(35);
  auto model = [](auto u, auto u1, auto v, auto w, auto v3) {
    return std::make_tuple(fb::sum(u * v, fb::axis<0>), fb::sum(u * w, fb::axis<0>), fb::sum(u * v, fb::axis<1>),
                           fb::sum(u1 * v3, fb::axis<0>));
  };
  for (unsigned threads : {1u, 2u}) {
    const std::string what = "compiled, " + std::to_string(threads) + " thread(s)";
    const auto out = fb::compile(model, fb::options{.threads = threads})(x, x1, b, c, b3);
    check_reduction(std::get<0>(out), product(x, b), 0, red::sum, false, what + ", x * b");
    check_reduction(std::get<1>(out), product(x, c), 0, red::sum, false, what + ", x * c");
    check_reduction(std::get<2>(out), product(x, b), 1, red::sum, false, what + ", x * b");
    check_reduction(std::get<3>(out), product(x1, b3), 0, red::sum, false, what + ", x1 * b3");
  }
}

TEST_CASE("mean over a non-last axis divides by the extent once" FBT_TYPE, "[ops][reduce]") {
  // The smallest case: [3, 2], mean over axis 0. Exact in binary: (1 + 2 + 3) / 3 = 2.
  fb::tensor<T, fb::shape<3, 2>> x;
  x.assign({1, 10, 2, 20, 3, 30});
  auto model = [](auto x) { return fb::mean(x, fb::axis<0>); };
  const auto e = fb::eager(model)(x);
  const auto c = fb::compile(model)(x);
  CHECK(e(0) == 2);
  CHECK(e(1) == 20);
  CHECK(c(0) == 2);
  CHECK(c(1) == 20);
}

TEST_CASE("reductions on dyn extents, eager, for many sizes" FBT_TYPE, "[ops][reduce][dyn]") {
  // The eager instantiations above, run over sizes that put every tail length and row count
  // through the row kernel (last axis) and the column kernel (axis 0).
  for (std::size_t m : {1u, 2u, 3u, 17u, 100u})
    for (std::size_t n : {1u, 3u, 7u, 8u, 9u, 16u, 17u, 33u, 64u, 65u, 1000u}) {
      fb::tensor<T, fb::shape<fb::dyn, fb::dyn>> x(m, n);
      fbt::fill_signed(x, m * 1000 + n, 0.05, 3.0);
      const std::string w = "eager dyn [" + std::to_string(m) + ", " + std::to_string(n) + "]";
      check_reduce_outputs<0>(fb::eager(reduce_model<0>)(x), x, w);
      check_reduce_outputs<-1>(fb::eager(reduce_model<-1>)(x), x, w);
    }
}

TEST_CASE("a column reduction of a column reduction, compiled with a dyn extent (the run-time path)" FBT_TYPE,
          "[ops][reduce][dyn]") {
  // Two column kernels: the second reads the first's result as an ordinary operand. Its strides
  // once came from the first's reduced axis (zeroed), so it summed the first row only.
  auto model = [](auto t) { return fb::sum(fb::sum(t * T(2), fb::axis<0>) * T(3), fb::axis<0>); };
  fb::tensor<T, fb::shape<fb::dyn, 7, 5>> x(3);
  fbt::fill_signed(x, 77, 0.05, 3.0);
  const auto y = fb::compile(model)(x);
  REQUIRE(y.size() == 5);
  for (std::size_t j = 0; j < 5; ++j) {
    double r = 0, scale = 0;
    for (std::size_t a = 0; a < 3; ++a)
      for (std::size_t b = 0; b < 7; ++b) {
        r += 6.0 * static_cast<double>(x.flat((a * 7 + b) * 5 + j));
        scale += 6.0 * std::fabs(static_cast<double>(x.flat((a * 7 + b) * 5 + j)));
      }
    INFO("column " << j);
    CHECK(std::fabs(y.flat(j) - r) <= 32 * std::numeric_limits<T>::epsilon() * scale);
  }
}

TEST_CASE("a rank-0 reduction times a number, compiled with a dyn extent (the run-time path)" FBT_TYPE,
          "[ops][reduce][dyn]") {
  // The product is a kernel over a rank-0 space. The host code generator once looped over its
  // rows' coordinates from rank - 1 down, which for rank 0 wrapped around and never ended.
  auto model = [](auto t) { return fb::sum(t, fb::axis<0>) * T(3); };
  fb::tensor<T, fb::shape<fb::dyn>> x(7);
  fbt::fill_signed(x, 78, 0.05, 3.0);
  const auto y = fb::compile(model)(x);
  REQUIRE(y.size() == 1);
  double r = 0, scale = 0;
  for (std::size_t i = 0; i < 7; ++i) {
    r += 3.0 * static_cast<double>(x.flat(i));
    scale += 3.0 * std::fabs(static_cast<double>(x.flat(i)));
  }
  CHECK(std::fabs(y.flat(0) - r) <= 32 * std::numeric_limits<T>::epsilon() * scale);
}

TEST_CASE("sum of a long row keeps its error within the bound" FBT_TYPE, "[ops][reduce]") {
  // 17001 terms of one sign: every rounding counts in the same direction, the case a naive
  // sequential float sum loses the most on. Also split over column blocks for the column kernel.
  fb::tensor<T, fb::shape<2, 17001>> x;
  fbt::fill_uniform(x, 7, 0.5, 1.5);
  auto model = [](auto x) { return std::make_tuple(fb::sum(x), fb::mean(fb::transpose(x), fb::axis<0>)); };
  const auto o = fb::compile(model)(x);
  check_reduction(std::get<0>(o), x, 1, red::sum, false, "compiled, rows");
  check_reduction(std::get<1>(o), x.transpose(), 0, red::mean, false, "compiled, columns of a transposed view");
}
