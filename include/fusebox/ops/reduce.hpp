// ops/reduce.hpp: reductions over one axis: sum, mean, max, min, with or without keepdim.
// Each op gives its identity, combine, horizontal (over a batch's lanes) and finalize; the
// executor accumulates rows with four accumulators, so the order is fixed by the row length alone.
// max and min propagate NaN (torch.amax): a row holding a NaN reduces to NaN on every path, as
// combine is ops::maximum / ops::minimum. Which of +0 and -0 a row of tied zeros gives depends on
// the order of the combines (as in PyTorch), so it may differ between the CPU and the GPU.
// Derivatives at the end (autodiff/rule.hpp): sum and mean give the gradient back to every element
// of the row, max and min to every element equal to the result (the arg-max positions; a tie
// gives each tied element the whole gradient).
// Depends on: ops/operand.hpp, ops/math.hpp, ops/elementwise.hpp (the derivatives' ops),
// autodiff/rule.hpp.
#pragma once

#include <limits>
#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/math.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {

/// Axis tag: `fb::axis<-1>` is the last dimension.
template <int A>
struct axis_t {
  static constexpr int value = A;
};
template <int A>
inline constexpr axis_t<A> axis{};

struct keepdim_t {};
/// Keep the reduced dimension with extent 1 (so the result broadcasts against the input).
inline constexpr keepdim_t keepdim{};

namespace ops {

// A reduction's device math, written once as tokens: `device` is their text (member functions
// identity, combine and finalize that the CUDA code generator pastes into NVRTC units); in a
// translation unit compiled by nvcc the same members also form `on_device`, for the static path's
// kernel templates (backend/cuda/static_kernels.cuh).
#if defined(__CUDACC__)
#define FUSEBOX_DEVICE_MEMBERS(...)                    \
  static constexpr const char* device = #__VA_ARGS__; \
  struct on_device {                                  \
    __VA_ARGS__                                       \
  };
#else
#define FUSEBOX_DEVICE_MEMBERS(...) static constexpr const char* device = #__VA_ARGS__;
#endif

/// Folds the lanes of a batch left to right (xsimd 8 has no reduce_max/reduce_min).
template <class B, class F>
auto lanes_fold(const B& b, F f) {
  alignas(64) typename B::value_type lanes[B::size];
  b.store_aligned(lanes);
  auto r = lanes[0];
  for (std::size_t i = 1; i < B::size; ++i) r = f(r, lanes[i]);
  return r;
}

struct sum {
  static constexpr const char* name = "sum";
  FUSEBOX_DEVICE_MEMBERS(
      static __device__ float identity() { return 0.0f; }
      static __device__ float combine(float a, float b) { return a + b; }
      static __device__ float finalize(float x, unsigned long long) { return x; })
  static constexpr int flops = 1;
  template <class V> static V identity() { return V(0); }
  template <class V> static V combine(const V& a, const V& b) { return a + b; }
  template <class B> static auto horizontal(const B& b) { return xsimd::hadd(b); }
  template <class T> static T finalize(T acc, std::size_t) { return acc; }
};
struct mean : sum {
  static constexpr const char* name = "mean";
  FUSEBOX_DEVICE_MEMBERS(
      static __device__ float identity() { return 0.0f; }
      static __device__ float combine(float a, float b) { return a + b; }
      static __device__ float finalize(float x, unsigned long long n) { return x / static_cast<float>(n); })
  template <class T> static T finalize(T acc, std::size_t n) { return acc / static_cast<T>(n); }
};
struct max {
  static constexpr const char* name = "max";
  FUSEBOX_DEVICE_MEMBERS(
      static __device__ float identity() { return -__int_as_float(0x7f800000); }
      static __device__ float combine(float a, float b) { return b != b ? b : (a < b ? b : a); }
      static __device__ float finalize(float x, unsigned long long) { return x; })
  static constexpr int flops = 1;
  template <class V> static V identity() { return V(-std::numeric_limits<typename cpu::element_type<V>::type>::infinity()); }
  template <class V> static V combine(const V& a, const V& b) { return math::maximum(a, b); }
  template <class B> static auto horizontal(const B& b) { return lanes_fold(b, [](auto x, auto y) { return math::maximum(x, y); }); }
  template <class T> static T finalize(T acc, std::size_t) { return acc; }
};
struct min {
  static constexpr const char* name = "min";
  FUSEBOX_DEVICE_MEMBERS(
      static __device__ float identity() { return __int_as_float(0x7f800000); }
      static __device__ float combine(float a, float b) { return b != b ? b : (b < a ? b : a); }
      static __device__ float finalize(float x, unsigned long long) { return x; })
  static constexpr int flops = 1;
  template <class V> static V identity() { return V(std::numeric_limits<typename cpu::element_type<V>::type>::infinity()); }
  template <class V> static V combine(const V& a, const V& b) { return math::minimum(a, b); }
  template <class B> static auto horizontal(const B& b) { return lanes_fold(b, [](auto x, auto y) { return math::minimum(x, y); }); }
  template <class T> static T finalize(T acc, std::size_t) { return acc; }
};
}  // namespace ops

namespace detail {
template <class Op, int A, bool Keep, class X>
auto make_reduce(const X& x, const std::source_location& loc) {
  using T = typename common_element<X>::type;
  using Arg = decltype(as_expr<T>(x));
  constexpr std::size_t rank = Arg::desc.shape.rank;
  constexpr int axis_n = A < 0 ? static_cast<int>(rank) + A : A;
  static_assert(static_check::bad_axis<Op, shape_of_t<Arg>, A, (axis_n >= 0 && axis_n < static_cast<int>(rank))>::value);
  if constexpr (axis_n >= 0 && axis_n < static_cast<int>(rank)) {
    const Arg arg = as_expr<T>(x);
    if (runtime_shape(arg).size() == 0 && runtime_shape(arg).is_static())
      FUSEBOX_THROW(shape_error(std::string(Op::name) + ": cannot reduce an empty tensor " + to_string(runtime_shape(arg)), loc));
    return finish(reduction<Op, axis_n, Keep, Arg>{{}, arg});
  }
}
}  // namespace detail

#define FUSEBOX_REDUCE_FN(fn)                                                                           \
  template <array_operand X, int A = -1>                                                                \
  auto fn(const X& x, axis_t<A> = {}, std::source_location loc = std::source_location::current()) {     \
    return detail::make_reduce<ops::fn, A, false>(x, loc);                                              \
  }                                                                                                     \
  template <array_operand X, int A>                                                                     \
  auto fn(const X& x, axis_t<A>, keepdim_t, std::source_location loc = std::source_location::current()) { \
    return detail::make_reduce<ops::fn, A, true>(x, loc);                                               \
  }
FUSEBOX_REDUCE_FN(sum)
FUSEBOX_REDUCE_FN(mean)
FUSEBOX_REDUCE_FN(max)
FUSEBOX_REDUCE_FN(min)
#undef FUSEBOX_REDUCE_FN

// ---- derivatives (autodiff/rule.hpp): G the incoming gradient, Y the reduction node ----
namespace autodiff {
template <>
struct derivative<ops::sum> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = unreduce<G, Y>;
};
template <>
struct derivative<ops::mean> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = pointwise<ops::mul, unreduce<G, Y>, typename Ctx::template constant<Y>>;
  /// The value of Ctx::constant<Y>: 1 / (the reduced extent in this call).
  template <class T, class Y, class ShapeOf>
  static constexpr T constant(const ShapeOf& shape_of) {
    return T(1) / static_cast<T>(shape_of.template operator()<operand<Y, 0>>().extent[Y::desc.axis]);
  }
};
template <>
struct derivative<ops::max> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = pointwise<ops::select_eq, unreduce<G, Y>, operand<Y, 0>, with_kept_axis<Y>>;
};
template <>
struct derivative<ops::min> : derivative<ops::max> {};
}  // namespace autodiff

}  // namespace fusebox
