// tests/ops/elementwise.cpp: every elementwise op of include/fusebox/ops/elementwise.hpp, in float and
// double, eager and compiled, against a naive double-precision reference computed here, element by
// element. Shapes have odd widths (1, 3, 17, 1000, 17001) so every vector body, scalar tail and the
// column-split path of wide rows are hit; broadcasting covers [M,N] with [N], [M,1], a rank-0 tensor
// and numbers, [1,N] with [M,1], rank 1 with rank 3, and three-way where().
//
// Tolerances: + - * / max min neg abs relu sqrt, comparisons and where are correctly rounded, so
// the result must equal the double reference rounded to T, bit for bit. The transcendental ops go
// through fusebox::vmath (max measured errors there: float 2.8e-7 relative, tanh 1.2e-7 absolute;
// double 1.6e-15): float is checked to 1e-6 relative + 1e-7 absolute, double to 1e-14 + 1e-15.
// pow goes through xsimd/std::pow: float 2e-6, double 1e-13.
//
// Eager and compiled must also agree bit for bit: the same op body runs on the same lanes.
//
// Build time grows with every (op, type, shape) kernel instantiated, so this file is built once
// per element type: FUSEBOX_TEST_ELEMENT is float (the default) or double (tests/CMakeLists.txt
// builds both). Compiled checks use static shapes; eager checks run on dyn extents, where one
// instantiation per op serves every width (1 to 1000 below), so each vector body and each tail
// length is hit.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"
#include "../support/private_cache.hpp"

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
using fbt::tol2;

namespace {

constexpr tol2 exact2{fbt::exact, fbt::exact};
constexpr tol2 transcendental{{1e-7, 1e-6}, {1e-15, 1e-14}};
constexpr tol2 pow_tol{{1e-7, 2e-6}, {1e-15, 1e-13}};

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// ---- unary ops: one model with one output per op; x signed in [0.05, 3], p in [0.05, 5] ----

auto unary_model = [](auto x, auto p) {
  return std::make_tuple(fb::neg(x), fb::abs(x), fb::exp(x), fb::log(p), fb::sqrt(p), fb::rsqrt(p), fb::tanh(x),
                         fb::sigmoid(x), fb::relu(x), fb::gelu(x), fb::gelu_tanh(x), fb::silu(x));
};

struct unary_ref {
  const char* name;
  bool on_p;  // reads p (positive) instead of x
  double (*f)(double);
  tol2 t;
};
const unary_ref unary_refs[] = {
    {"neg", false, [](double x) { return -x; }, exact2},
    {"abs", false, [](double x) { return std::fabs(x); }, exact2},
    {"exp", false, [](double x) { return std::exp(x); }, transcendental},
    {"log", true, [](double x) { return std::log(x); }, transcendental},
    {"sqrt", true, [](double x) { return std::sqrt(x); }, exact2},
    {"rsqrt", true, [](double x) { return 1 / std::sqrt(x); }, transcendental},
    {"tanh", false, [](double x) { return std::tanh(x); }, transcendental},
    {"sigmoid", false, sigmoid_ref, transcendental},
    {"relu", false, [](double x) { return x > 0 ? x : 0.0; }, exact2},
    {"gelu", false, gelu_ref, transcendental},
    {"gelu_tanh", false, gelu_tanh_ref, transcendental},
    {"silu", false, [](double x) { return x * sigmoid_ref(x); }, transcendental},
};

template <class T, class Outs, class X, class P>
void check_unary_outputs(const Outs& outs, const X& x, const P& p, const std::string& mode) {
  constexpr std::size_t n = std::tuple_size_v<Outs>;
  static_assert(n == std::size(unary_refs));
  fbt::for_each_index<n>([&](auto k) {
    const unary_ref& r = unary_refs[k];
    const std::size_t rank = std::get<k>(outs).extents().rank;
    fbt::check_all(
        std::get<k>(outs), [&](const coord& i) { return r.f(fbt::at(r.on_p ? p : x, i, rank)); }, r.t.template get<T>(),
        std::string(r.name) + " (" + mode + ")");
  });
}

template <class T, class Shape>
void unary_case(std::uint64_t seed) {
  fb::tensor<T, Shape> x, p;
  fbt::fill_signed(x, seed, 0.05, 3.0);
  fbt::fill_uniform(p, seed + 1, 0.05, 5.0);
  // Eager runs on dyn copies: one instantiation per op serves every shape (compile time), and the
  // same values go through both paths.
  const auto e = fb::eager(unary_model)(fbt::to_dyn(x), fbt::to_dyn(p));
  const auto c = fb::compile(unary_model)(x, p);
  check_unary_outputs<T>(e, x, p, "eager");
  check_unary_outputs<T>(c, x, p, "compiled");
  fbt::for_each_index<std::tuple_size_v<decltype(e)>>([&](auto k) {
    fbt::check_identical(std::get<k>(e), std::get<k>(c), std::string("eager == compiled, ") + unary_refs[k].name);
  });
}

// ---- binary ops, same shapes: b equals a at every third element (ties for eq, le, max...) ----

auto binary_model = [](auto a, auto b, auto p) {
  return std::make_tuple(fb::add(a, b), fb::sub(a, b), fb::mul(a, b), fb::div(a, b), fb::pow(p, b),
                         fb::maximum(a, b), fb::minimum(a, b), fb::eq(a, b), fb::ne(a, b), fb::lt(a, b), fb::le(a, b),
                         fb::gt(a, b), fb::ge(a, b));
};

struct binary_ref {
  const char* name;
  bool pow_base_p;  // the first operand is p (positive), not a
  double (*f)(double, double);
  tol2 t;
};
// Operands of + - * / are rounded to T before the double operation, so the double result rounded to
// T is the correctly rounded T result (double has more than 2 * 24 + 2 bits).
const binary_ref binary_refs[] = {
    {"add", false, [](double a, double b) { return a + b; }, exact2},
    {"sub", false, [](double a, double b) { return a - b; }, exact2},
    {"mul", false, [](double a, double b) { return a * b; }, exact2},
    {"div", false, [](double a, double b) { return a / b; }, exact2},
    {"pow", true, [](double a, double b) { return std::pow(a, b); }, pow_tol},
    {"maximum", false, [](double a, double b) { return a < b ? b : a; }, exact2},
    {"minimum", false, [](double a, double b) { return b < a ? b : a; }, exact2},
    {"eq", false, [](double a, double b) { return a == b ? 1.0 : 0.0; }, exact2},
    {"ne", false, [](double a, double b) { return a != b ? 1.0 : 0.0; }, exact2},
    {"lt", false, [](double a, double b) { return a < b ? 1.0 : 0.0; }, exact2},
    {"le", false, [](double a, double b) { return a <= b ? 1.0 : 0.0; }, exact2},
    {"gt", false, [](double a, double b) { return a > b ? 1.0 : 0.0; }, exact2},
    {"ge", false, [](double a, double b) { return a >= b ? 1.0 : 0.0; }, exact2},
};

template <class T, class Outs, class A, class B, class P>
void check_binary_outputs(const Outs& outs, const A& a, const B& b, const P& p, const std::string& mode) {
  constexpr std::size_t n = std::tuple_size_v<Outs>;
  static_assert(n == std::size(binary_refs));
  fbt::for_each_index<n>([&](auto k) {
    const binary_ref& r = binary_refs[k];
    const std::size_t rank = std::get<k>(outs).extents().rank;
    fbt::check_all(
        std::get<k>(outs),
        [&](const coord& i) { return r.f(fbt::at(r.pow_base_p ? p : a, i, rank), fbt::at(b, i, rank)); },
        r.t.template get<T>(), std::string(r.name) + " (" + mode + ")");
  });
}

template <class T, class Shape>
void binary_case(std::uint64_t seed) {
  fb::tensor<T, Shape> a, b, p;
  fbt::fill_signed(a, seed, 0.05, 3.0);
  fbt::fill_signed(b, seed + 1, 0.05, 3.0);
  fbt::fill_uniform(p, seed + 2, 0.05, 5.0);
  for (std::size_t i = 0; i < b.size(); i += 3) b.flat(i) = a.flat(i);
  const auto e = fb::eager(binary_model)(fbt::to_dyn(a), fbt::to_dyn(b), fbt::to_dyn(p));
  const auto c = fb::compile(binary_model)(a, b, p);
  check_binary_outputs<T>(e, a, b, p, "eager");
  check_binary_outputs<T>(c, a, b, p, "compiled");
  fbt::for_each_index<std::tuple_size_v<decltype(e)>>([&](auto k) {
    fbt::check_identical(std::get<k>(e), std::get<k>(c), std::string("eager == compiled, ") + binary_refs[k].name);
  });
  // The comparisons were not vacuous: ties and both orders occur.
  std::size_t ties = 0, less = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ties += a.flat(i) == b.flat(i);
    less += a.flat(i) < b.flat(i);
  }
  CHECK(ties > 0);
  if (a.size() > 2) CHECK(less > 0);
}

// ---- broadcasting: the rule is the same for every op, so a small menu: sub (operand order
// matters), and where(lt(a, b), a, b) (three operands, each broadcast) ----

auto broadcast_model = [](auto a, auto b) { return std::make_tuple(a - b, fb::where(fb::lt(a, b), a, b)); };

template <class T, class SA, class SB>
void broadcast_case(std::uint64_t seed, const std::string& what) {
  fb::tensor<T, SA> a;
  fb::tensor<T, SB> b;
  fbt::fill_signed(a, seed, 0.05, 3.0);
  fbt::fill_signed(b, seed + 1, 0.05, 3.0);
  auto check = [&](const auto& outs, const std::string& mode) {
    const std::size_t rank = std::get<0>(outs).extents().rank;
    auto A = [&](const coord& i) { return fbt::at(a, i, rank); };
    auto B = [&](const coord& i) { return fbt::at(b, i, rank); };
    const std::string w = what + " (" + mode + ")";
    fbt::check_all(std::get<0>(outs), [&](const coord& i) { return A(i) - B(i); }, fbt::exact, "a - b, " + w);
    fbt::check_all(std::get<1>(outs), [&](const coord& i) { return A(i) < B(i) ? A(i) : B(i); }, fbt::exact,
                   "where(a < b, a, b), " + w);
  };
  const auto c = fb::compile(broadcast_model)(a, b);
  check(c, "compiled");
  const auto e = fb::eager(broadcast_model)(a, b);
  check(e, "eager");
  fb::dims want = fb::broadcast(a.extents(), b.extents()).out;
  CHECK(std::get<0>(c).extents() == want);
  CHECK(std::get<0>(e).extents() == want);
}

}  // namespace

// Float vectors are 16 lanes with AVX-512 (8 with AVX2), double 8 (4): widths 17 and 19 give a
// vector body and a tail in both.
TEST_CASE("unary ops match a double reference, eager and compiled" FBT_TYPE, "[ops][elementwise]") {
  if constexpr (std::is_same_v<T, float>) unary_case<T, fb::shape<3, 17>>(12);
  else unary_case<T, fb::shape<17, 19>>(13);
}

TEST_CASE("binary ops match a double reference, eager and compiled" FBT_TYPE, "[ops][elementwise]") {
  if constexpr (std::is_same_v<T, float>) binary_case<T, fb::shape<3, 17>>(22);
  else binary_case<T, fb::shape<17, 19>>(23);
}

TEST_CASE("eager ops on dyn extents match the reference for every width" FBT_TYPE,
          "[ops][elementwise][dyn]") {
  // The same instantiations as the eager half of the cases above, so this costs no build time.
  for (std::size_t n : {1u, 2u, 3u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 33u, 100u, 1000u}) {
    fb::tensor<T, fb::shape<fb::dyn, fb::dyn>> x(2, n), p(2, n), b(2, n);
    fbt::fill_signed(x, 60 + n, 0.05, 3.0);
    fbt::fill_uniform(p, 70 + n, 0.05, 5.0);
    fbt::fill_signed(b, 80 + n, 0.05, 3.0);
    for (std::size_t i = 0; i < b.size(); i += 3) b.flat(i) = x.flat(i);
    check_unary_outputs<T>(fb::eager(unary_model)(x, p), x, p, "eager dyn, width " + std::to_string(n));
    check_binary_outputs<T>(fb::eager(binary_model)(x, b, p), x, b, p, "eager dyn, width " + std::to_string(n));
  }
}

TEST_CASE("operators + - * / and unary - are the named ops" FBT_TYPE, "[ops][elementwise]") {
  // Each operator is its own node here: a model returning both add(a, b) and a + b would return one
  // node twice (identical subtrees merge), which is tested in tests/compile/composite.cpp.
  auto model = [](auto a, auto b) { return std::make_tuple(a + b, a - b, a * b, a / b, -a); };
  fb::tensor<T, fb::shape<3, 17>> a, b;
  fbt::fill_signed(a, 26, 0.05, 3.0);
  fbt::fill_signed(b, 27, 0.05, 3.0);
  auto check = [&](const auto& o, const std::string& mode) {
    auto A = [&](const coord& i) { return fbt::at(a, i, 2); };
    auto B = [&](const coord& i) { return fbt::at(b, i, 2); };
    fbt::check_all(std::get<0>(o), [&](const coord& i) { return A(i) + B(i); }, fbt::exact, "a + b " + mode);
    fbt::check_all(std::get<1>(o), [&](const coord& i) { return A(i) - B(i); }, fbt::exact, "a - b " + mode);
    fbt::check_all(std::get<2>(o), [&](const coord& i) { return A(i) * B(i); }, fbt::exact, "a * b " + mode);
    fbt::check_all(std::get<3>(o), [&](const coord& i) { return A(i) / B(i); }, fbt::exact, "a / b " + mode);
    fbt::check_all(std::get<4>(o), [&](const coord& i) { return -A(i); }, fbt::exact, "-a " + mode);
  };
  check(fb::eager(model)(fbt::to_dyn(a), fbt::to_dyn(b)), "eager");
  check(fb::compile(model)(a, b), "compiled");
}

TEST_CASE("rows wider than a task are split into column blocks" FBT_TYPE, "[ops][elementwise]") {
  // 17001 columns: more than one task's worth of elements per row, so a pure elementwise kernel
  // splits each row; 17001 = 16384 + 617 leaves a vector tail in the second block.
  fb::tensor<T, fb::shape<2, 17001>> x, p;
  fbt::fill_signed(x, 16, 0.05, 3.0);
  fbt::fill_uniform(p, 17, 0.05, 5.0);
  auto model = [](auto x, auto p) { return std::make_tuple(fb::exp(x), x / p - x); };
  for (unsigned threads : {1u, 2u}) {
    INFO("threads " << threads);
    const auto c = fb::compile(model, {.threads = threads})(x, p);
    fbt::check_all(std::get<0>(c), [&](const coord& i) { return std::exp(fbt::at(x, i, 2)); },
                   transcendental.get<T>(), "exp");
    fbt::check_all(
        std::get<1>(c), [&](const coord& i) { return static_cast<T>(fbt::at(x, i, 2) / fbt::at(p, i, 2)) - fbt::at(x, i, 2); },
        fbt::exact, "x / p - x");
  }
}

// An output of 32 MiB or more (schedule::streams_output) is written with non-temporal stores and a
// fence, by the static program and by the run-time path's generated kernels alike. 2048 rows of
// 4097 are 33.6 MB of floats: both kernels below stream (an elementwise one, and softmax, whose
// output pass follows its reductions). 4097 columns leave a scalar tail, and only every 8th (AVX2)
// or 16th (AVX-512) row starts on the vector alignment: the others take the ordinary stores that
// store_stream_v falls back to. Two worker threads write; the caller reads every element after the
// call returns, which is what the fence is for.
TEST_CASE("outputs larger than the last-level cache are streamed past it, every element right" FBT_TYPE,
          "[ops][elementwise][stream]") {
  fbt::use_private_cache("fusebox-stream-");
  constexpr std::size_t R = 2048, C = 4097;
  static_assert(fb::schedule::streams_output(R * C * sizeof(float)));
  fb::tensor<T, fb::shape<R, C>> x;
  fb::tensor<T, fb::shape<C>> w;
  fbt::fill_signed(x, 71, 0.05, 3.0);
  fbt::fill_uniform(w, 72, 0.5, 2.0);
  std::vector<double> soft(R * C);
  for (std::size_t r = 0; r < R; ++r) {
    double m = -1e300, s = 0;
    for (std::size_t c = 0; c < C; ++c) m = std::max(m, static_cast<double>(x(r, c)));
    for (std::size_t c = 0; c < C; ++c) s += soft[r * C + c] = std::exp(static_cast<double>(x(r, c)) - m);
    for (std::size_t c = 0; c < C; ++c) soft[r * C + c] /= s;
  }
  auto quotient = [](auto x, auto w) { return x / w - x; };
  auto model = [&](auto x, auto w) { return std::make_tuple(quotient(x, w), fb::softmax(x)); };
  auto check_quotient = [&](const auto& out, const char* path) {
    fbt::check_all(
        out, [&](const coord& i) { return static_cast<double>(static_cast<T>(x(i[0], i[1]) / w(i[1])) - x(i[0], i[1])); },
        fbt::exact, std::string(path) + ": x / w - x");
  };
  const auto s = fb::compile(model, {.threads = 2})(x, w);
  check_quotient(std::get<0>(s), "static");
  fbt::check_all(std::get<1>(s), [&](const coord& i) { return soft[i[0] * C + i[1]]; }, transcendental.get<T>(),
                 "static: softmax(x)");
  // The generated kernels share one output pass (backend/cpu/codegen.hpp): one kernel shows it.
  check_quotient(fb::compile(quotient, {.dynamic = fb::dynamic::always, .threads = 2})(fbt::to_dyn(x), fbt::to_dyn(w)),
                 "JIT");
}

// A pure elementwise kernel walks its space as rows, merging dimensions where every operand's
// strides allow: [64, 4, 4, 4] times [4, 1, 1] is rows of 16 merged from H and W (the bias-like
// operand is constant over both), and with [4, 1] (constant over W only) H and W stay apart;
// in [5, 3, 1] times [3, 1] both are read as constant along the row of 1. A transposed operand
// keeps every dimension apart.
TEST_CASE("elementwise rank-4 kernels merge dimensions only where every operand allows" FBT_TYPE,
          "[ops][elementwise][broadcast]") {
  fb::tensor<T, fb::shape<64, 4, 4, 4>> x;
  fb::tensor<T, fb::shape<4, 1, 1>> b;
  fb::tensor<T, fb::shape<4, 1>> c;
  fb::tensor<T, fb::shape<5, 3, 1>> y;
  fb::tensor<T, fb::shape<3, 1>> d;
  fb::tensor<T, fb::shape<6, 5>> m;
  fbt::fill_signed(x, 61, 0.05, 3.0);
  fbt::fill_signed(b, 62, 0.05, 3.0);
  fbt::fill_signed(c, 63, 0.05, 3.0);
  fbt::fill_signed(y, 64, 0.05, 3.0);
  fbt::fill_signed(d, 65, 0.05, 3.0);
  fbt::fill_signed(m, 66, 0.05, 3.0);
  auto model = [](auto u, auto v, auto w, auto s, auto e, auto q) {
    return std::make_tuple(u * v, u * w, s * e, fb::transpose(q) + T(1));
  };
  for (unsigned threads : {1u, 2u}) {
    INFO("threads " << threads);
    const auto r = fb::compile(model, {.threads = threads})(x, b, c, y, d, m);
    auto product = [](const auto& p, const auto& q, std::size_t rank) {
      return [&p, &q, rank](const coord& i) { return static_cast<double>(static_cast<T>(fbt::at(p, i, rank) * fbt::at(q, i, rank))); };
    };
    fbt::check_all(std::get<0>(r), product(x, b, 4), fbt::exact, "x * [4, 1, 1]");
    fbt::check_all(std::get<1>(r), product(x, c, 4), fbt::exact, "x * [4, 1]");
    fbt::check_all(std::get<2>(r), product(y, d, 3), fbt::exact, "[5, 3, 1] * [3, 1]");
    fbt::check_all(
        std::get<3>(r), [&](const coord& i) { return static_cast<double>(static_cast<T>(m(i[1], i[0]) + T(1))); },
        fbt::exact, "transpose(m) + 1");
  }
}

TEST_CASE("broadcasting follows NumPy rules" FBT_TYPE, "[ops][elementwise][broadcast]") {
  if constexpr (std::is_same_v<T, float>) {
    broadcast_case<T, fb::shape<3, 17>, fb::shape<17>>(31, "[3,17] with [17]");
    broadcast_case<T, fb::shape<3, 17>, fb::shape<3, 1>>(32, "[3,17] with [3,1]");
    broadcast_case<T, fb::shape<17>, fb::shape<2, 3, 17>>(34, "[17] with [2,3,17]");
    broadcast_case<T, fb::shape<3, 17>, fb::shape<>>(37, "[3,17] with a rank-0 tensor");
  } else {
    broadcast_case<T, fb::shape<1, 17>, fb::shape<3, 1>>(33, "[1,17] with [3,1] -> [3,17]");
    broadcast_case<T, fb::shape<2, 3, 1>, fb::shape<1000>>(35, "[2,3,1] with [1000] -> [2,3,1000]");
    broadcast_case<T, fb::shape<17, 3>, fb::shape<1, 1>>(36, "[17,3] with [1,1]");
  }
}

TEST_CASE("broadcasting on dyn extents, eager" FBT_TYPE, "[ops][elementwise][broadcast][dyn]") {
  // [M, N] with [N] and with [M, 1], and [1, N] with [M, 1], for several M and N, through one
  // instantiation per rank pair.
  for (std::size_t m : {1u, 3u, 17u})
    for (std::size_t n : {1u, 3u, 17u, 100u}) {
      fb::tensor<T, fb::shape<fb::dyn, fb::dyn>> a(m, n), col(m, 1), row1(1, n);
      fb::tensor<T, fb::shape<fb::dyn>> row(n);
      fbt::fill_signed(a, m * 100 + n, 0.05, 3.0);
      fbt::fill_signed(col, m * 100 + n + 1, 0.05, 3.0);
      fbt::fill_signed(row, m * 100 + n + 2, 0.05, 3.0);
      fbt::fill_signed(row1, m * 100 + n + 3, 0.05, 3.0);
      const std::string w = "m " + std::to_string(m) + ", n " + std::to_string(n);
      const auto r1 = fb::eager(broadcast_model)(a, row);
      fbt::check_all(std::get<0>(r1), [&](const coord& i) { return fbt::at(a, i, 2) - fbt::at(row, i, 2); },
                     fbt::exact, "[m,n] - [n], " + w);
      const auto r2 = fb::eager(broadcast_model)(a, col);
      fbt::check_all(std::get<1>(r2), [&](const coord& i) { return std::min(fbt::at(a, i, 2), fbt::at(col, i, 2)); },
                     fbt::exact, "where(a < b, a, b), [m,n] with [m,1], " + w);
      const auto r3 = fb::eager(broadcast_model)(row1, col);
      REQUIRE(std::get<0>(r3).extents() == fb::dims{2, {m, n}});
      fbt::check_all(std::get<0>(r3), [&](const coord& i) { return fbt::at(row1, i, 2) - fbt::at(col, i, 2); },
                     fbt::exact, "[1,n] - [m,1], " + w);
    }
}

TEST_CASE("numbers are operands on either side" FBT_TYPE, "[ops][elementwise][broadcast]") {
  // a * 0.5 and a * 0.75 have the same expression type and different values: the graph must keep
  // them apart (payload slots), not merge them as identical subtrees.
  auto model = [](auto a) {
    return std::make_tuple(a + 2.5, 2.5 - a, 1.0 / a, fb::where(fb::gt(a, 0.0), a, -1.0), a * 0.5 + a * 0.75);
  };
  fb::tensor<T, fb::shape<3, 17>> a;
  fbt::fill_signed(a, 41, 0.05, 3.0);
  auto check = [&](const auto& o, const std::string& mode) {
    auto A = [&](const coord& i) { return fbt::at(a, i, 2); };
    fbt::check_all(std::get<0>(o), [&](const coord& i) { return A(i) + 2.5; }, fbt::exact, "a + 2.5 " + mode);
    fbt::check_all(std::get<1>(o), [&](const coord& i) { return 2.5 - A(i); }, fbt::exact, "2.5 - a " + mode);
    fbt::check_all(std::get<2>(o), [&](const coord& i) { return 1.0 / A(i); }, fbt::exact, "1 / a " + mode);
    fbt::check_all(std::get<3>(o), [&](const coord& i) { return A(i) > 0 ? A(i) : -1.0; }, fbt::exact,
                   "where(a > 0, a, -1) " + mode);
    // a * 0.5 and a * 0.75 are exact in T (0.75 a needs two more bits; |a| <= 3 keeps it exact
    // unless a has a full mantissa) so allow the one rounding of each product and of the sum.
    fbt::check_all(std::get<4>(o), [&](const coord& i) { return A(i) * 1.25; },
                   {0, 3 * std::numeric_limits<T>::epsilon()}, "a * 0.5 + a * 0.75 " + mode);
  };
  check(fb::eager(model)(a), "eager");
  check(fb::compile(model)(a), "compiled");
}

TEST_CASE("where picks by any non-zero condition, broadcast over three operands" FBT_TYPE,
          "[ops][elementwise]") {
  // c holds exact zeros (every fourth element) and negative and positive values.
  fb::tensor<T, fb::shape<17, 1>> c;
  fb::tensor<T, fb::shape<3>> a;
  fb::tensor<T, fb::shape<17, 3>> b;
  fbt::fill_signed(c, 51, 0.05, 3.0);
  for (std::size_t i = 0; i < c.size(); i += 4) c.flat(i) = 0;
  fbt::fill_signed(a, 52, 0.05, 3.0);
  fbt::fill_signed(b, 53, 0.05, 3.0);
  auto model = [](auto c, auto a, auto b) { return std::make_tuple(fb::where(c, a, b), fb::where(c, 7.0, b)); };
  auto check = [&](const auto& o, const std::string& mode) {
    REQUIRE(std::get<0>(o).extents() == fb::dims{2, {17, 3}});
    auto pick = [&](const coord& i, double x) { return fbt::at(c, i, 2) != 0 ? x : fbt::at(b, i, 2); };
    fbt::check_all(std::get<0>(o), [&](const coord& i) { return pick(i, fbt::at(a, i, 2)); }, fbt::exact,
                   "where(c[17,1], a[3], b[17,3]) " + mode);
    fbt::check_all(std::get<1>(o), [&](const coord& i) { return pick(i, 7.0); }, fbt::exact,
                   "where(c, 7, b) " + mode);
  };
  check(fb::eager(model)(c, a, b), "eager");
  check(fb::compile(model)(c, a, b), "compiled");
}

TEST_CASE("the checker itself can fail" FBT_TYPE, "[ops][elementwise][meta]") {
  // Guards against a checker that passes everything: exp against a reference off by 5 tolerances
  // must fail at every element.
  fb::tensor<T, fb::shape<3, 17>> x;
  fbt::fill_signed(x, 91, 0.05, 3.0);
  const auto y = fb::compile([](auto x) { return fb::exp(x); })(x);
  const tol t = transcendental.get<T>();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double wrong = std::exp(static_cast<double>(x.flat(i))) * (1 + 5 * t.rel) + 5 * t.abs;
    bad += std::fabs(y.flat(i) - wrong) > t.abs + t.rel * std::fabs(wrong);
  }
  CHECK(bad == y.size());
}
