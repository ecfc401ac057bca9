// ops/composite.hpp: ops written as compositions of the others. They have no kernel of their own:
// the planner fuses them (softmax is max, exp, sum and a divide over one row in cache; layer_norm
// is two row reductions and one output pass), and eager mode runs them op by op. One algebraic
// rewrite happens here, where both the static and the run-time paths see it: layer_norm of a row
// that exp(.) / sum(exp(.)) normalised (softmax) drops the division (see layer_norm).
// Depends on: ops/{elementwise,reduce}.hpp.
#pragma once

#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/reduce.hpp"

namespace fusebox {

/// exp(x - max) / sum(exp(x - max)) along axis A (default: last).
template <array_operand X, int A = -1>
auto softmax(const X& x, axis_t<A> ax = {}) {
  const auto e = exp(x - max(x, ax, keepdim));
  return e / sum(e, ax, keepdim);
}

/// (x - max) - log(sum(exp(x - max))) along axis A.
template <array_operand X, int A = -1>
auto log_softmax(const X& x, axis_t<A> ax = {}) {
  const auto shifted = x - max(x, ax, keepdim);
  return shifted - log(sum(exp(shifted), ax, keepdim));
}

namespace detail {
/// True for e / sum(e, last axis, keepdim) with e = exp(z) and the last extent known at build time:
/// softmax's expression, or the same written out. Only captured expressions have this type (eager
/// ops return tensors).
template <class X>
struct exp_over_row_sum : std::false_type {};
template <class Z, int Axis>
struct exp_over_row_sum<
    pointwise<ops::div, pointwise<ops::exp, Z>, reduction<ops::sum, Axis, true, pointwise<ops::exp, Z>>>> {
  static constexpr dims shape = pointwise<ops::exp, Z>::desc.shape;
  static constexpr bool value = static_cast<std::size_t>(Axis) + 1 == shape.rank && is_known_extent(shape.extent[Axis]);
};
}  // namespace detail

/// Normalises the last dimension: (x - mean) / sqrt(var + eps) * gamma + beta (biased variance,
/// as torch.nn.functional.layer_norm), with gamma and beta of the last dimension's extent.
template <array_operand X, array_operand G, array_operand B, class Eps>
auto layer_norm(const X& x, const G& gamma, const B& beta, Eps eps) {
  // centered rows and the term added to their variance; both forms below end the same way.
  const auto normalise = [&](const auto& centered, const auto& eps_term) {
    const auto var = mean(centered * centered, axis<-1>, keepdim);
    return centered * rsqrt(var + eps_term) * gamma + beta;
  };
  if constexpr (detail::exp_over_row_sum<X>::value) {
    // x = e / s, s = sum(e) > 0 (e > 0): mean(x) = mean(e) / s and var(x) = var(e) / s^2, so
    // (x - mean(x)) / sqrt(var(x) + eps) = (e - mean(e)) / sqrt(var(e) + eps s^2), and mean(e) =
    // s / n is known without a pass. One row pass and every per-element division fewer: W2c took
    // 0.93-0.96x the time on a Zen 3 and 0.78-0.84x on a Xeon (docs/benchmarks.md, run AX). Exact
    // in real arithmetic; the roundings differ.
    using T = typename X::value_type;
    const auto& e = x.template child<0>();
    const auto& s = x.template child<1>();
    const auto n = static_cast<T>(detail::exp_over_row_sum<X>::shape.extent[X::desc.shape.rank - 1]);
    return normalise(e - s / n, s * s * eps);
  } else {
    return normalise(x - mean(x, axis<-1>, keepdim), eps);
  }
}

}  // namespace fusebox
