// ops/matmul.hpp: matrix product. [M, K] x [K, N], batched [B, M, K] x [B or 1, K, N], either side
// rank 2 (shared across the batch). Transposed operands are views (strides), never copies.
// Derivative at the end: dA = dC Bt, dB = At dC (a shared rank-2 operand's gradient is then
// summed over the batch by the reverse pass, as any broadcast operand's is).
// linear(x, w, b) is torch.nn.functional.linear: w in PyTorch's [out, in] layout, read through a
// transposed view by the same GEMM (nothing copied), the bias its epilogue.
// Depends on: ops/operand.hpp, ops/layout.hpp, ops/elementwise.hpp, autodiff/rule.hpp.
#pragma once

#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/layout.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {

template <array_operand A, array_operand B>
auto matmul(const A& a, const B& b, std::source_location loc = std::source_location::current()) {
  using T = typename detail::common_element<A>::type;
  using EA = decltype(detail::as_expr<T>(a));
  using EB = decltype(detail::as_expr<T>(b));
  matmul_node<EA, EB> e{{}, detail::as_expr<T>(a), detail::as_expr<T>(b)};
  if constexpr (!EA::desc.shape.is_static() || !EB::desc.shape.is_static()) {
    const dims sa = detail::runtime_shape(e.a), sb = detail::runtime_shape(e.b);
    const auto r = detail::matmul_shape(sa, sb);
    // An argument's extents are bound here, a computed operand's or a view's may be `dyn`: the
    // rule lets an unknown extent meet any, and the run-time path checks it against the call's
    // extents (ir/specialize.hpp, backend/cpu/generated_program.hpp's mm_sizes).
    if (!r.rank_ok || !r.inner_ok)
      FUSEBOX_THROW(shape_error("matmul: a is " + to_string(sa) + ", b is " + to_string(sb) +
                                    "; need [.., M, K] x [.., K, N] with matching K and batch extents equal or 1",
                                loc));
  }
  return detail::finish(e);
}

/// x Wᵀ, as torch.nn.functional.linear(x, w): w is [out, in] (how PyTorch's Linear stores its
/// weight, so checkpoints load without a transpose); the product reads it through a transposed
/// view, the same GEMM as matmul(x, w) with w stored [in, out].
template <array_operand X, array_operand W>
auto linear(const X& x, const W& w, std::source_location loc = std::source_location::current()) {
  return matmul(x, transpose(w), loc);
}

/// x Wᵀ + b, as torch.nn.functional.linear(x, w, b); the bias add is the GEMM's epilogue.
template <array_operand X, array_operand W, array_operand B>
auto linear(const X& x, const W& w, const B& b, std::source_location loc = std::source_location::current()) {
  return add(matmul(x, transpose(w), loc), b, loc);
}

// ---- derivative (autodiff/rule.hpp): G the incoming gradient, Y the matmul node ----
namespace autodiff {
template <class A, class B>
struct derivative<matmul_node<A, B>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = std::conditional_t<I == 0, matmul_node<exact<G, Y>, transposed<B>>, matmul_node<transposed<A>, exact<G, Y>>>;
};
}  // namespace autodiff

}  // namespace fusebox
