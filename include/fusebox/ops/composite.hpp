// ops/composite.hpp: ops written as compositions of the others. They have no kernel of their own:
// the planner fuses them (softmax is max, exp, sum and a divide over one row in cache; layer_norm
// is two row reductions and one output pass), and eager mode runs them op by op.
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

/// Normalises the last dimension: (x - mean) / sqrt(var + eps) * gamma + beta (biased variance,
/// as torch.nn.functional.layer_norm), with gamma and beta of the last dimension's extent.
template <array_operand X, array_operand G, array_operand B, class Eps>
auto layer_norm(const X& x, const G& gamma, const B& beta, Eps eps) {
  const auto centered = x - mean(x, axis<-1>, keepdim);
  const auto var = mean(centered * centered, axis<-1>, keepdim);
  return centered * rsqrt(var + eps) * gamma + beta;
}

}  // namespace fusebox
