// tests/autodiff/ops_elementwise.cpp: the derivative of every elementwise op of
// include/fusebox/ops/elementwise.hpp, through value_and_grad eager and compiled, against central
// finite differences in double precision, every element (tests/autodiff/check_grad.hpp).
//
// Each loss weighs the op's result with a random tensor r (an argument not differentiated), so
// every element's gradient is different and a rule that mixes elements up is caught. Inputs are
// fresh random values away from zero and from each other where an op has a kink (relu, abs,
// maximum, minimum, comparisons: |x| >= 0.2, |a - b| >= 0.1, far beyond h = 1e-6). Broadcast
// operands check that a gradient is summed back to its operand's shape.
#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "check_grad.hpp"

namespace fb = fusebox;
using fbt::check_grad;
using fbt::positive_tensor;
using fbt::signed_tensor;
using fbt::total;

namespace {
using S = fb::shape<3, 5>;
}

TEST_CASE("autodiff: unary elementwise derivatives match central differences") {
  const auto x = signed_tensor<S>(11), r = signed_tensor<S>(12);
  const auto p = positive_tensor<S>(13);
#define FBT_UNARY(fn, arg) \
  check_grad(#fn, [](const auto& a, const auto& w) { return total(fb::fn(a) * w); }, fb::wrt<0>, arg, r)
  FBT_UNARY(neg, x);
  FBT_UNARY(abs, x);
  FBT_UNARY(exp, x);
  FBT_UNARY(log, p);
  FBT_UNARY(sqrt, p);
  FBT_UNARY(rsqrt, p);
  FBT_UNARY(tanh, x);
  FBT_UNARY(sigmoid, x);
  FBT_UNARY(relu, x);
  FBT_UNARY(gelu, x);
  FBT_UNARY(gelu_tanh, x);
  FBT_UNARY(silu, x);
#undef FBT_UNARY
  check_grad("operator-", [](const auto& a, const auto& w) { return total(-a * w); }, fb::wrt<0>, x, r);
}

TEST_CASE("autodiff: binary elementwise derivatives match central differences, both operands") {
  const auto a = signed_tensor<S>(21), r = signed_tensor<S>(22);
  const auto d = signed_tensor<S>(23, 0.1, 1.0);
  fb::tensor<double, S> b;  // b = a + d: |a - b| >= 0.1, away from the kinks of max, min, comparisons
  for (std::size_t i = 0; i < b.size(); ++i) b.flat(i) = a.flat(i) + d.flat(i);
  const auto p = positive_tensor<S>(24), q = signed_tensor<S>(25, 0.2, 2.0);
#define FBT_BINARY(fn, x, y) \
  check_grad(#fn, [](const auto& u, const auto& v, const auto& w) { return total(fb::fn(u, v) * w); }, fb::wrt<0, 1>, x, y, r)
  FBT_BINARY(add, a, b);
  FBT_BINARY(sub, a, b);
  FBT_BINARY(mul, a, b);
  FBT_BINARY(div, a, b);
  FBT_BINARY(pow, p, q);
  FBT_BINARY(maximum, a, b);
  FBT_BINARY(minimum, a, b);
  FBT_BINARY(maximum, b, a);
  FBT_BINARY(minimum, b, a);
#undef FBT_BINARY
  check_grad("operators", [](const auto& u, const auto& v, const auto& w) { return total((u + v) * (u - v) / v * w); },
             fb::wrt<0, 1>, a, b, r);
}

TEST_CASE("autodiff: a value used more than once accumulates every use's gradient") {
  const auto x = signed_tensor<S>(31), r = signed_tensor<S>(32);
  check_grad("x * x", [](const auto& u, const auto& w) { return total(u * u * w); }, fb::wrt<0>, x, r);
  check_grad("exp(x) * x + tanh(x)",
             [](const auto& u, const auto& w) { return total((fb::exp(u) * u + fb::tanh(u)) * w); }, fb::wrt<0>, x, r);
}

TEST_CASE("autodiff: broadcast operands get their gradient summed to their own shape") {
  const auto m = signed_tensor<S>(41), r = signed_tensor<S>(42);
  const auto row = signed_tensor<fb::shape<5>>(43);
  const auto col = signed_tensor<fb::shape<3, 1>>(44);
  const auto top = signed_tensor<fb::shape<1, 5>>(45);
  const auto one = signed_tensor<fb::shape<>>(46);
  const auto cube = signed_tensor<fb::shape<2, 3, 5>>(47), r3 = signed_tensor<fb::shape<2, 3, 5>>(48);
  check_grad("[3,5] + [5]", [](const auto& u, const auto& v, const auto& w) { return total((u + v) * w); },
             fb::wrt<0, 1>, m, row, r);
  check_grad("[3,5] * [3,1]", [](const auto& u, const auto& v, const auto& w) { return total(u * v * w); },
             fb::wrt<0, 1>, m, col, r);
  check_grad("[1,5] - [3,1]", [](const auto& u, const auto& v, const auto& w) { return total((u - v) * w); },
             fb::wrt<0, 1>, top, col, r);
  check_grad("[3,5] / rank 0", [](const auto& u, const auto& v, const auto& w) { return total(u / v * w); },
             fb::wrt<0, 1>, m, one, r);
  check_grad("[2,3,5] * [5]", [](const auto& u, const auto& v, const auto& w) { return total(u * v * w); },
             fb::wrt<0, 1>, cube, row, r3);
  check_grad("max([1,5], [3,1])", [](const auto& u, const auto& v, const auto& w) { return total(fb::maximum(u, v) * w); },
             fb::wrt<0, 1>, top, col, r);
}

TEST_CASE("autodiff: numbers in the loss are constants (lifted to inputs, not differentiated)") {
  // A number is lifted to an input named by its place in the loss (autodiff/lift.hpp); the same
  // structure with different numbers is refused (tests/autodiff/grad.cpp).
  const auto x = signed_tensor<S>(51), r = signed_tensor<S>(52);
  const auto p = positive_tensor<S>(53);
  check_grad("x * 0.5 + exp(x) * 0.7", [](const auto& u, const auto& w) { return total((u * 0.5 + fb::exp(u) * 0.7) * w); },
             fb::wrt<0>, x, r);
  check_grad("one value used three times", [](const auto& u, const auto& w) {
    const auto h = fb::tanh(u * 0.5) * 1.5;  // its copies share their lifted numbers
    return total((h * h + h) * w);
  }, fb::wrt<0>, x, r);
  check_grad("3 - x / 0.7", [](const auto& u, const auto& w) { return total((3.0 - u / 0.7) * w); }, fb::wrt<0>, x, r);
  check_grad("pow(p, 2.5)", [](const auto& u, const auto& w) { return total(fb::pow(u, 2.5) * w); }, fb::wrt<0>, p, r);
  check_grad("pow(p, -1.5)", [](const auto& u, const auto& w) { return total(fb::pow(u, -1.5) * w); }, fb::wrt<0>, p, r);
}

TEST_CASE("autodiff: comparisons pass no gradient; where() routes it to the chosen operand") {
  const auto a = signed_tensor<S>(61), r = signed_tensor<S>(62), c = signed_tensor<S>(63);
  const auto d = signed_tensor<S>(64, 0.1, 1.0);
  fb::tensor<double, S> b;
  for (std::size_t i = 0; i < b.size(); ++i) b.flat(i) = a.flat(i) + d.flat(i);
  check_grad("where(c > 0, a, b)",
             [](const auto& k, const auto& u, const auto& v, const auto& w) { return total(fb::where(fb::gt(k, 0.0), u, v) * w); },
             fb::wrt<0, 1, 2>, c, a, b, r);
  check_grad("where(a < b, a * a, exp(b))",
             [](const auto& u, const auto& v, const auto& w) { return total(fb::where(fb::lt(u, v), u * u, fb::exp(v)) * w); },
             fb::wrt<0, 1>, a, b, r);
#define FBT_COMPARE(fn)                                                                                          \
  check_grad(#fn " * a", [](const auto& u, const auto& v, const auto& w) { return total(fb::fn(u, v) * u * w); }, \
             fb::wrt<0, 1>, a, b, r)
  FBT_COMPARE(eq);
  FBT_COMPARE(ne);
  FBT_COMPARE(lt);
  FBT_COMPARE(le);
  FBT_COMPARE(gt);
  FBT_COMPARE(ge);
#undef FBT_COMPARE
}
