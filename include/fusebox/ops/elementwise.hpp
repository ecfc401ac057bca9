// ops/elementwise.hpp: elementwise ops. Each op is one struct: its name (reports, errors), its cost
// in flops per element (fusion heuristics, explain), its math as one generic `apply` that works on
// float, double and xsimd batches, and its `device` spelling: the same math as a CUDA expression
// in float over the operands x (unary) or a, b (binary; c, a, b for where), which the CUDA code
// generator wraps in a __device__ function. Front ends follow; operators are thin aliases.
//
// Comparisons give 1 or 0 in the operand type; `where(c, a, b)` picks a where c is non-zero.
// Depends on: ops/operand.hpp, ops/math.hpp, cpu/vmath.hpp.
#pragma once

#include <source_location>

#include "fusebox/cpu/vmath.hpp"
#include "fusebox/ops/operand.hpp"
#include "fusebox/ops/math.hpp"

namespace fusebox {
namespace ops {

#define FUSEBOX_UNARY_OP(op_name, cost, body, device_body) \
  struct op_name {                            \
    static constexpr const char* name = #op_name; \
    static constexpr const char* device = device_body; \
    static constexpr int flops = cost;        \
    template <class V>                        \
    static V apply(const V& x) {              \
      return body;                            \
    }                                         \
  };
FUSEBOX_UNARY_OP(neg, 1, -x, "-x")
FUSEBOX_UNARY_OP(abs, 1, math::abs(x), "fabsf(x)")
FUSEBOX_UNARY_OP(exp, 16, vmath::exp(x), "expf(x)")
FUSEBOX_UNARY_OP(log, 20, vmath::log(x), "logf(x)")
FUSEBOX_UNARY_OP(sqrt, 4, vmath::sqrt(x), "sqrtf(x)")
FUSEBOX_UNARY_OP(rsqrt, 6, vmath::rsqrt(x), "rsqrtf(x)")
FUSEBOX_UNARY_OP(tanh, 20, vmath::tanh(x), "tanhf(x)")
FUSEBOX_UNARY_OP(sigmoid, 20, vmath::sigmoid(x), "1.0f / (1.0f + expf(-x))")
FUSEBOX_UNARY_OP(relu, 1, math::maximum(x, V(0)), "x < 0.0f ? 0.0f : x")
FUSEBOX_UNARY_OP(gelu, 28, vmath::gelu(x), "0.5f * x * (1.0f + erff(x * 0.70710678118654752f))")
FUSEBOX_UNARY_OP(gelu_tanh, 26, vmath::gelu_tanh(x), "0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)))")
FUSEBOX_UNARY_OP(silu, 22, vmath::silu(x), "x / (1.0f + expf(-x))")
#undef FUSEBOX_UNARY_OP

#define FUSEBOX_BINARY_OP(op_name, cost, body, device_body) \
  struct op_name {                             \
    static constexpr const char* name = #op_name; \
    static constexpr const char* device = device_body; \
    static constexpr int flops = cost;         \
    template <class V>                         \
    static V apply(const V& a, const V& b) {   \
      return body;                             \
    }                                          \
  };
FUSEBOX_BINARY_OP(add, 1, a + b, "a + b")
FUSEBOX_BINARY_OP(sub, 1, a - b, "a - b")
FUSEBOX_BINARY_OP(mul, 1, a * b, "a * b")
FUSEBOX_BINARY_OP(div, 1, a / b, "a / b")
FUSEBOX_BINARY_OP(pow, 40, math::pow(a, b), "powf(a, b)")
FUSEBOX_BINARY_OP(maximum, 1, math::maximum(a, b), "a < b ? b : a")
FUSEBOX_BINARY_OP(minimum, 1, math::minimum(a, b), "b < a ? b : a")
FUSEBOX_BINARY_OP(eq, 1, math::eq(a, b), "a == b ? 1.0f : 0.0f")
FUSEBOX_BINARY_OP(ne, 1, math::ne(a, b), "a != b ? 1.0f : 0.0f")
FUSEBOX_BINARY_OP(lt, 1, math::lt(a, b), "a < b ? 1.0f : 0.0f")
FUSEBOX_BINARY_OP(le, 1, math::le(a, b), "a <= b ? 1.0f : 0.0f")
FUSEBOX_BINARY_OP(gt, 1, math::gt(a, b), "a > b ? 1.0f : 0.0f")
FUSEBOX_BINARY_OP(ge, 1, math::ge(a, b), "a >= b ? 1.0f : 0.0f")
#undef FUSEBOX_BINARY_OP

struct where {
  static constexpr const char* name = "where";
  static constexpr const char* device = "c != 0.0f ? a : b";
  static constexpr int flops = 1;
  template <class V>
  static V apply(const V& c, const V& a, const V& b) {
    return math::select(c, a, b);
  }
};

}  // namespace ops

// ---- front ends ----

#define FUSEBOX_UNARY_FN(fn)                                                                     \
  template <operand X>                                                                           \
    requires array_operand<X>                                                                    \
  auto fn(const X& x, std::source_location loc = std::source_location::current()) {              \
    return detail::make_pointwise<ops::fn>(loc, x);                                              \
  }
FUSEBOX_UNARY_FN(neg)
FUSEBOX_UNARY_FN(abs)
FUSEBOX_UNARY_FN(exp)
FUSEBOX_UNARY_FN(log)
FUSEBOX_UNARY_FN(sqrt)
FUSEBOX_UNARY_FN(rsqrt)
FUSEBOX_UNARY_FN(tanh)
FUSEBOX_UNARY_FN(sigmoid)
FUSEBOX_UNARY_FN(relu)
FUSEBOX_UNARY_FN(gelu)
FUSEBOX_UNARY_FN(gelu_tanh)
FUSEBOX_UNARY_FN(silu)
#undef FUSEBOX_UNARY_FN

#define FUSEBOX_BINARY_FN(fn)                                                                    \
  template <operand A, operand B>                                                                \
    requires(array_operand<A> || array_operand<B>)                                               \
  auto fn(const A& a, const B& b, std::source_location loc = std::source_location::current()) {  \
    return detail::make_pointwise<ops::fn>(loc, a, b);                                           \
  }
FUSEBOX_BINARY_FN(add)
FUSEBOX_BINARY_FN(sub)
FUSEBOX_BINARY_FN(mul)
FUSEBOX_BINARY_FN(div)
FUSEBOX_BINARY_FN(pow)
FUSEBOX_BINARY_FN(maximum)
FUSEBOX_BINARY_FN(minimum)
FUSEBOX_BINARY_FN(eq)
FUSEBOX_BINARY_FN(ne)
FUSEBOX_BINARY_FN(lt)
FUSEBOX_BINARY_FN(le)
FUSEBOX_BINARY_FN(gt)
FUSEBOX_BINARY_FN(ge)
#undef FUSEBOX_BINARY_FN

/// c ? a : b elementwise (c non-zero picks a), broadcast over all three.
template <operand C, operand A, operand B>
  requires(array_operand<C> || array_operand<A> || array_operand<B>)
auto where(const C& c, const A& a, const B& b, std::source_location loc = std::source_location::current()) {
  return detail::make_pointwise<ops::where>(loc, c, a, b);
}

// Operators: aliases of the named functions (which also know the caller's line).
template <operand A, operand B>
  requires(array_operand<A> || array_operand<B>)
auto operator+(const A& a, const B& b) { return detail::make_pointwise<ops::add>(std::source_location{}, a, b); }
template <operand A, operand B>
  requires(array_operand<A> || array_operand<B>)
auto operator-(const A& a, const B& b) { return detail::make_pointwise<ops::sub>(std::source_location{}, a, b); }
template <operand A, operand B>
  requires(array_operand<A> || array_operand<B>)
auto operator*(const A& a, const B& b) { return detail::make_pointwise<ops::mul>(std::source_location{}, a, b); }
template <operand A, operand B>
  requires(array_operand<A> || array_operand<B>)
auto operator/(const A& a, const B& b) { return detail::make_pointwise<ops::div>(std::source_location{}, a, b); }
template <array_operand X>
auto operator-(const X& x) { return detail::make_pointwise<ops::neg>(std::source_location{}, x); }

}  // namespace fusebox
