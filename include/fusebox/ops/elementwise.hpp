// ops/elementwise.hpp: elementwise ops. Each op is one struct: its name (reports, errors), its cost
// in flops per element (fusion heuristics, explain), its math as one generic `apply` that works on
// float, double and xsimd batches, and its `device` spelling: the same math as a CUDA expression
// in float over the operands x (unary) or a, b (binary; c, a, b for where), which the CUDA code
// generator wraps in a __device__ function. Front ends follow; operators are thin aliases.
//
// Comparisons give 1 or 0 in the operand type; `where(c, a, b)` picks a where c is non-zero.
// Special values (docs/architecture.md, "Numeric semantics"): C and IEEE 754 as PyTorch has them,
// the same in a SIMD lane, the scalar tail and the device spelling: comparisons with NaN are false
// except ne; where(NaN, a, b) is a; maximum/minimum propagate a NaN from either operand; pow is
// C's pow; sigmoid, silu, gelu and gelu_tanh take -inf to their limit (0, -0), never NaN.
//
// Derivatives (autodiff/rule.hpp) are at the end: each op's vector-Jacobian product as an
// expression type. Where a derivative is more than one product, it is an op of its own below
// (`tanh_backward(g, y)` and so on, as torch's aten has them): one node, no constants, so the
// backward stays small and fuses like any elementwise chain.
// Depends on: ops/operand.hpp, ops/math.hpp, backend/cpu/vmath.hpp, autodiff/rule.hpp.
#pragma once

#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/backend/cpu/vmath.hpp"
#include "fusebox/ops/math.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {
namespace ops {

// An op's device math is written once, as tokens: `device` is their text (the CUDA code generator
// pastes it into NVRTC units), and in a translation unit compiled by nvcc the same tokens are also
// `on_device`, a __device__ function the static path's kernel templates call
// (backend/cuda/static_kernels.cuh).
#if defined(__CUDACC__)
#define FUSEBOX_ON_DEVICE(params, ...) \
  static __device__ float on_device params { return __VA_ARGS__; }
#else
#define FUSEBOX_ON_DEVICE(params, ...)
#endif

#define FUSEBOX_UNARY_OP(op_name, cost, body, device_body) \
  struct op_name {                            \
    static constexpr const char* name = #op_name; \
    static constexpr const char* device = #device_body; \
    FUSEBOX_ON_DEVICE((float x), device_body)           \
    static constexpr int flops = cost;        \
    template <class V>                        \
    static V apply(const V& x) {              \
      return body;                            \
    }                                         \
  };
FUSEBOX_UNARY_OP(neg, 1, math::neg(x), -x)
FUSEBOX_UNARY_OP(abs, 1, math::abs(x), fabsf(x))
FUSEBOX_UNARY_OP(exp, 16, vmath::exp(x), expf(x))
FUSEBOX_UNARY_OP(log, 20, vmath::log(x), logf(x))
FUSEBOX_UNARY_OP(sqrt, 4, vmath::sqrt(x), sqrtf(x))
FUSEBOX_UNARY_OP(rsqrt, 6, vmath::rsqrt(x), rsqrtf(x))
FUSEBOX_UNARY_OP(tanh, 20, vmath::tanh(x), tanhf(x))
FUSEBOX_UNARY_OP(sigmoid, 20, vmath::sigmoid(x), 1.0f / (1.0f + expf(-x)))
FUSEBOX_UNARY_OP(relu, 1, math::maximum(x, V(0)), x < 0.0f ? 0.0f : x)
FUSEBOX_UNARY_OP(gelu, 28, vmath::gelu(x), x < -200.0f ? -0.0f : 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)))
FUSEBOX_UNARY_OP(gelu_tanh, 26, vmath::gelu_tanh(x),
                 x < -200.0f ? -0.0f : 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))))
FUSEBOX_UNARY_OP(silu, 22, vmath::silu(x), x < -200.0f ? -0.0f : x / (1.0f + expf(-x)))
#undef FUSEBOX_UNARY_OP

#define FUSEBOX_BINARY_OP(op_name, cost, body, device_body) \
  struct op_name {                             \
    static constexpr const char* name = #op_name; \
    static constexpr const char* device = #device_body; \
    FUSEBOX_ON_DEVICE((float a, float b), device_body)  \
    static constexpr int flops = cost;         \
    template <class V>                         \
    static V apply(const V& a, const V& b) {   \
      return body;                             \
    }                                          \
  };
FUSEBOX_BINARY_OP(add, 1, a + b, a + b)
FUSEBOX_BINARY_OP(sub, 1, a - b, a - b)
FUSEBOX_BINARY_OP(mul, 1, a * b, a * b)
FUSEBOX_BINARY_OP(div, 1, vmath::div(a, b), a / b)
FUSEBOX_BINARY_OP(pow, 40, math::pow(a, b), powf(a, b))
FUSEBOX_BINARY_OP(maximum, 1, math::maximum(a, b), b != b ? b : (a < b ? b : a))
FUSEBOX_BINARY_OP(minimum, 1, math::minimum(a, b), b != b ? b : (b < a ? b : a))
FUSEBOX_BINARY_OP(eq, 1, math::eq(a, b), a == b ? 1.0f : 0.0f)
FUSEBOX_BINARY_OP(ne, 1, math::ne(a, b), a != b ? 1.0f : 0.0f)
FUSEBOX_BINARY_OP(lt, 1, math::lt(a, b), a < b ? 1.0f : 0.0f)
FUSEBOX_BINARY_OP(le, 1, math::le(a, b), a <= b ? 1.0f : 0.0f)
FUSEBOX_BINARY_OP(gt, 1, math::gt(a, b), a > b ? 1.0f : 0.0f)
FUSEBOX_BINARY_OP(ge, 1, math::ge(a, b), a >= b ? 1.0f : 0.0f)
#undef FUSEBOX_BINARY_OP

struct where {
  static constexpr const char* name = "where";
  static constexpr const char* device = "c != 0.0f ? a : b";
  FUSEBOX_ON_DEVICE((float c, float a, float b), c != 0.0f ? a : b)
  static constexpr int flops = 1;
  template <class V>
  static V apply(const V& c, const V& a, const V& b) {
    return math::select(c, a, b);
  }
};

// ---- ops the derivatives are written with (g: the incoming gradient; y: the forward result) ----
// Operand names of the device spellings: x (one operand), a, b (two), c, a, b (three).

/// a, broadcast to the shape of a and b: b is read for its shape only.
struct expand_as {
  static constexpr const char* name = "expand_as";
  static constexpr const char* device = "a";
  FUSEBOX_ON_DEVICE((float a, float), a)
  static constexpr int flops = 0;
  template <class V>
  static V apply(const V& a, const V&) {
    return a;
  }
};
/// 0 in x's shape (the gradient of an argument the loss does not use).
struct zeros_like {
  static constexpr const char* name = "zeros_like";
  static constexpr const char* device = "0.0f";
  FUSEBOX_ON_DEVICE((float), 0.0f)
  static constexpr int flops = 0;
  template <class V>
  static V apply(const V&) {
    return V(0);
  }
};

#define FUSEBOX_BACKWARD_OP(op_name, cost, body, device_body) \
  struct op_name {                                          \
    static constexpr const char* name = #op_name;           \
    static constexpr const char* device = #device_body;     \
    FUSEBOX_ON_DEVICE((float a, float b), device_body)      \
    static constexpr int flops = cost;                      \
    template <class V>                                      \
    static V apply(const V& g, const V& v) {                \
      return body;                                          \
    }                                                       \
  };
// v is the forward result y, or the operand x where the derivative needs it.
// Special values as torch's derivatives have them: abs is g sgn(x) with sgn(+-0) = sgn(NaN) = 0 (so a
// NaN or inf g gives NaN there); sqrt is g / (2 y), not 0.5 g / y (equal bits on ordinary values,
// but 0.5 g underflows for a denormal g); relu is torch's threshold_backward, y <= 0 ? 0 : g, so a
// NaN y passes g. gelu, gelu_tanh and silu take x beyond +-200 (the derivative is already exactly 1,
// 0 or -0 in float there) to their limits, as their forward takes -inf to -0: never NaN for an
// infinite x (torch's formulas give NaN there: inf * 0), nor for gelu_tanh's |x| > 1.8e19.
FUSEBOX_BACKWARD_OP(abs_backward, 3,
                    math::select(math::gt(v, V(0)), g, math::select(math::lt(v, V(0)), math::neg(g), g * V(0))),
                    b > 0.0f ? a : (b < 0.0f ? -a : a * 0.0f))
FUSEBOX_BACKWARD_OP(sqrt_backward, 2, vmath::div(g, V(2) * v), a / (2.0f * b))
// rsqrt: -0.5 last, as 0.5 g underflows for a denormal g (then 0 inf = NaN at y = inf); scaling by a
// power of two is exact, so ordinary values keep their bits.
FUSEBOX_BACKWARD_OP(rsqrt_backward, 4, g * v * v * v * V(-0.5), a * b * b * b * -0.5f)
FUSEBOX_BACKWARD_OP(tanh_backward, 3, g * (V(1) - v * v), a * (1.0f - b * b))
FUSEBOX_BACKWARD_OP(sigmoid_backward, 3, g * v * (V(1) - v), a * b * (1.0f - b))
FUSEBOX_BACKWARD_OP(relu_backward, 1, math::select(math::le(v, V(0)), V(0), g), b <= 0.0f ? 0.0f : a)
// gelu'(x) = Phi(x) + x phi(x)
FUSEBOX_BACKWARD_OP(gelu_backward, 42,
                    g * math::select(math::lt(v, V(-200)), V(0), math::select(math::gt(v, V(200)), V(1),
                        V(0.5) * (V(1) + vmath::erf(v * V(0.70710678118654752440))) +
                        v * V(0.39894228040143267794) * vmath::exp(V(-0.5) * v * v))),
                    a * (b < -200.0f ? 0.0f : (b > 200.0f ? 1.0f :
                    0.5f * (1.0f + erff(b * 0.70710678118654752f)) + b * 0.39894228040143268f * expf(-0.5f * b * b))))
// gelu_tanh'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2), t = tanh(k (x + c x^3))
FUSEBOX_BACKWARD_OP(gelu_tanh_backward, 36,
                    g * [&] {
                      const V t = vmath::tanh(V(0.79788456080286535588) * (v + V(0.044715) * v * v * v));
                      return math::select(math::lt(v, V(-200)), V(0), math::select(math::gt(v, V(200)), V(1),
                             V(0.5) * (V(1) + t) + V(0.5) * v * (V(1) - t * t) * V(0.79788456080286535588) *
                                                       (V(1) + V(3 * 0.044715) * v * v)));
                    }(),
                    a * (b < -200.0f ? 0.0f : (b > 200.0f ? 1.0f :
                    0.5f * (1.0f + tanhf(0.79788456080286536f * (b + 0.044715f * b * b * b))) + 0.5f * b *
                    (1.0f - tanhf(0.79788456080286536f * (b + 0.044715f * b * b * b)) * tanhf(0.79788456080286536f *
                    (b + 0.044715f * b * b * b))) * 0.79788456080286536f * (1.0f + 0.134145f * b * b))))
// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x); on the device s = e^x / (1 + e^x) below 0, so that
// s stays a (denormal) number where e^-x overflows, as vmath::sigmoid does: inf * silu'(-100) is
// -inf on both (found on the H100 by ops.special_values).
FUSEBOX_BACKWARD_OP(silu_backward, 28,
                    g * [&] {
                      const V s = vmath::sigmoid(v);
                      return math::select(math::lt(v, V(-200)), V(-0.0), math::select(math::gt(v, V(200)), V(1),
                                                                                     s * (V(1) + v * (V(1) - s))));
                    }(), a * (b < -200.0f ? -0.0f : (b > 200.0f ? 1.0f :
                    (b < 0.0f ? expf(b) / (1.0f + expf(b)) : 1.0f / (1.0f + expf(-b))) *
                    (1.0f + b * (1.0f - (b < 0.0f ? expf(b) / (1.0f + expf(b)) : 1.0f / (1.0f + expf(-b))))))))
// where(c, a, b): the gradient goes to a where c is non-zero, to b elsewhere (v is c)
FUSEBOX_BACKWARD_OP(where_backward_true, 1, math::select(v, g, V(0)), b != 0.0f ? a : 0.0f)
FUSEBOX_BACKWARD_OP(where_backward_false, 1, math::select(v, V(0), g), b != 0.0f ? 0.0f : a)
#undef FUSEBOX_BACKWARD_OP

#define FUSEBOX_BACKWARD_OP3(op_name, cost, body, device_body) \
  struct op_name {                                           \
    static constexpr const char* name = #op_name;            \
    static constexpr const char* device = #device_body;      \
    FUSEBOX_ON_DEVICE((float c, float a, float b), device_body)\
    static constexpr int flops = cost;                       \
    template <class V>                                       \
    static V apply(const V& g, const V& a, const V& b) {     \
      return body;                                           \
    }                                                        \
  };
// d(a / b)/db = -g y / b, with a = y (the quotient) and b the divisor
FUSEBOX_BACKWARD_OP3(div_rhs_backward, 3, vmath::div(math::neg(g) * a, b), -c * a / b)
// d(a^b)/da = g b a^(b-1) (a, b: the operands); g 0 where b = 0, as torch masks it (b a^(b-1) would
// be 0 inf = NaN at a = 0)
FUSEBOX_BACKWARD_OP3(pow_base_backward, 43, math::select(math::eq(b, V(0)), g * V(0), g * b * math::pow(a, b - V(1))),
                     b == 0.0f ? c * 0.0f : c * b * powf(a, b - 1.0f))
// d(a^b)/db = g y log(a) (a: the result y, b: the base); 0 where the base is 0 and the exponent is
// >= 0 (torch's where: then y is +-0 or 1), not y log(0) = 0 (-inf) = NaN
FUSEBOX_BACKWARD_OP3(pow_exponent_backward, 25,
                     math::select(math::eq(b, V(0)) * math::le(math::abs(a), V(1)), V(0), g * a * vmath::log(b)),
                     b == 0.0f && fabsf(a) <= 1.0f ? 0.0f : c * a * logf(b))
// The gradient where a comparison of a and b holds, else 0: maximum, minimum (ties go to a, as in
// their forward), and the extremum reductions (select_eq: every position equal to the maximum).
FUSEBOX_BACKWARD_OP3(select_ge, 1, math::select(math::ge(a, b), g, V(0)), a >= b ? c : 0.0f)
FUSEBOX_BACKWARD_OP3(select_gt, 1, math::select(math::gt(a, b), g, V(0)), a > b ? c : 0.0f)
FUSEBOX_BACKWARD_OP3(select_le, 1, math::select(math::le(a, b), g, V(0)), a <= b ? c : 0.0f)
FUSEBOX_BACKWARD_OP3(select_lt, 1, math::select(math::lt(a, b), g, V(0)), a < b ? c : 0.0f)
FUSEBOX_BACKWARD_OP3(select_eq, 1, math::select(math::eq(a, b), g, V(0)), a == b ? c : 0.0f)
#undef FUSEBOX_BACKWARD_OP3

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

// ---- derivatives (autodiff/rule.hpp): G the incoming gradient, Y the forward node ----
namespace autodiff {
/// relu's gradient: G where relu's output Y is above 0. ops/pool.hpp specialises it for a G that
/// is a max pooling's backward (relu, then max pooling), to mask before the scatter.
template <class G, class Y>
struct relu_vjp {
  using type = pointwise<ops::relu_backward, G, Y>;
};
#define FUSEBOX_DERIVATIVE(op_name, ...)                  \
  template <>                                             \
  struct derivative<ops::op_name> {                       \
    template <std::size_t I, class G, class Y, class Ctx> \
    using vjp = __VA_ARGS__;                              \
  };
FUSEBOX_DERIVATIVE(neg, pointwise<ops::neg, G>)
FUSEBOX_DERIVATIVE(abs, pointwise<ops::abs_backward, G, operand<Y, 0>>)
FUSEBOX_DERIVATIVE(exp, pointwise<ops::mul, G, Y>)
FUSEBOX_DERIVATIVE(log, pointwise<ops::div, G, operand<Y, 0>>)
FUSEBOX_DERIVATIVE(sqrt, pointwise<ops::sqrt_backward, G, Y>)
FUSEBOX_DERIVATIVE(rsqrt, pointwise<ops::rsqrt_backward, G, Y>)
FUSEBOX_DERIVATIVE(tanh, pointwise<ops::tanh_backward, G, Y>)
FUSEBOX_DERIVATIVE(sigmoid, pointwise<ops::sigmoid_backward, G, Y>)
FUSEBOX_DERIVATIVE(relu, typename relu_vjp<G, Y>::type)  // from y: x may never be stored
FUSEBOX_DERIVATIVE(gelu, pointwise<ops::gelu_backward, G, operand<Y, 0>>)
FUSEBOX_DERIVATIVE(gelu_tanh, pointwise<ops::gelu_tanh_backward, G, operand<Y, 0>>)
FUSEBOX_DERIVATIVE(silu, pointwise<ops::silu_backward, G, operand<Y, 0>>)

FUSEBOX_DERIVATIVE(add, G)
FUSEBOX_DERIVATIVE(sub, std::conditional_t<I == 0, G, pointwise<ops::neg, G>>)
FUSEBOX_DERIVATIVE(mul, pointwise<ops::mul, G, operand<Y, 1 - I>>)
FUSEBOX_DERIVATIVE(div, std::conditional_t<I == 0, pointwise<ops::div, G, operand<Y, 1>>,
                                           pointwise<ops::div_rhs_backward, G, Y, operand<Y, 1>>>)
FUSEBOX_DERIVATIVE(pow, std::conditional_t<I == 0, pointwise<ops::pow_base_backward, G, operand<Y, 0>, operand<Y, 1>>,
                                           pointwise<ops::pow_exponent_backward, G, Y, operand<Y, 0>>>)
FUSEBOX_DERIVATIVE(maximum, pointwise<std::conditional_t<I == 0, ops::select_ge, ops::select_lt>, G, operand<Y, 0>,
                                      operand<Y, 1>>)
FUSEBOX_DERIVATIVE(minimum, pointwise<std::conditional_t<I == 0, ops::select_le, ops::select_gt>, G, operand<Y, 0>,
                                      operand<Y, 1>>)
// Comparisons are piecewise constant: no gradient flows through them.
FUSEBOX_DERIVATIVE(eq, no_grad)
FUSEBOX_DERIVATIVE(ne, no_grad)
FUSEBOX_DERIVATIVE(lt, no_grad)
FUSEBOX_DERIVATIVE(le, no_grad)
FUSEBOX_DERIVATIVE(gt, no_grad)
FUSEBOX_DERIVATIVE(ge, no_grad)
FUSEBOX_DERIVATIVE(where, std::conditional_t<I == 0, no_grad,
                                             pointwise<std::conditional_t<I == 1, ops::where_backward_true,
                                                                          ops::where_backward_false>,
                                                       G, operand<Y, 0>>>)
#undef FUSEBOX_DERIVATIVE
}  // namespace autodiff

}  // namespace fusebox
