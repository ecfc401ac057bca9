// nn/loss.hpp: the training losses, as compositions of fusebox ops (so they capture, differentiate
// and fuse like the rest of a model), and one_hot() to feed cross_entropy from class labels.
//
//   cross_entropy(logits, target)  logits [N, C], target [N, C] class probabilities (one-hot rows,
//                                  or smoothed ones): mean over rows of -sum(target * log_softmax).
//                                  The log-softmax is inside the loss, as in torch's
//                                  F.cross_entropy, and the planner fuses max, exp, sum, log and the
//                                  target's product into one row kernel (its backward too).
//   mse_loss(pred, target)         mean over every element of (pred - target)^2 (reduction='mean').
//   one_hot<C>(labels, loc)        host: int labels in [0, C) as a [N, C] tensor of 0 and 1.
//
// Why a one-hot target and not class indices: picking logits[i, label[i]] is a gather, and fusebox
// has no gather op (an index operand would be a new node kind for the planner, both code
// generators and the autodiff). One-hot rows express the same loss with ops that exist; the cost
// is N x C floats per batch (5 KiB for Fashion-MNIST's 128 x 10) and one multiply-add per logit,
// inside the kernel that already reads every logit.
// Depends on: core/tensor.hpp, ops/{elementwise,reduce,composite}.hpp, expr/static_checks.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/ops/composite.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/reduce.hpp"

namespace fusebox::nn {

namespace static_check {
template <class LogitsShape, class TargetShape, bool Ok>
struct cross_entropy_shapes {
  static_assert(Ok, "fusebox::nn::cross_entropy(logits, target): logits are [N, C] and target is [N, C] class "
                    "probabilities (shapes above). Fix: for int labels, pass nn::one_hot<C>(labels) as the target");
  static constexpr bool value = Ok;
};
template <class PredShape, class TargetShape, bool Ok>
struct mse_shapes {
  static_assert(Ok, "fusebox::nn::mse_loss(pred, target): pred and target must have the same shape (above)");
  static constexpr bool value = Ok;
};
}  // namespace static_check

namespace detail {
template <class E>
constexpr dims shape_dims() {
  if constexpr (is_tensor_v<std::remove_cvref_t<E>>) return dims_of(typename std::remove_cvref_t<E>::shape_type{});
  else return std::remove_cvref_t<E>::desc.shape;
}
template <class E>
struct shape_t_of {
  using type = shape_of_t<E>;
};
template <class T, class S>
struct shape_t_of<tensor<T, S>> {
  using type = S;
};
template <class E>
using shape_t = typename shape_t_of<std::remove_cvref_t<E>>::type;

/// The operands' shapes as far as capture knows them. A computed operand's dyn extents stay unknown
/// there (only an argument's are bound), and meet any extent: the call's extents are checked by
/// the run-time path.
template <class A, class B>
void check_same_shape(const A& a, const B& b, const char* op, const std::source_location& loc) {
  const dims sa = fusebox::detail::runtime_shape(fusebox::detail::as_expr<typename fusebox::detail::common_element<A>::type>(a));
  const dims sb = fusebox::detail::runtime_shape(fusebox::detail::as_expr<typename fusebox::detail::common_element<B>::type>(b));
  bool same = sa.rank == sb.rank;
  for (std::size_t d = 0; same && d < sa.rank; ++d) same = fusebox::detail::same_extent(sa.extent[d], sb.extent[d]);
  if (!same)
    FUSEBOX_THROW(shape_error(std::string(op) + ": the first operand is " + to_string(sa) + ", the target " + to_string(sb) +
                                  "; they must have the same shape",
                              loc));
}

/// Mean over every dimension: a rank-0 result.
template <class E>
auto mean_all(const E& e) {
  if constexpr (shape_dims<E>().rank == 0) return e;
  else return mean_all(fusebox::mean(e));
}
}  // namespace detail

/// Mean over the rows of -sum_c target[n, c] * log_softmax(logits)[n, c]; logits and target [N, C].
template <array_operand L, array_operand T>
auto cross_entropy(const L& logits, const T& target, std::source_location loc = std::source_location::current()) {
  constexpr dims sl = detail::shape_dims<L>(), st = detail::shape_dims<T>();
  constexpr bool ok = sl.rank == 2 && st.rank == 2 && sl == st;
  static_assert(static_check::cross_entropy_shapes<detail::shape_t<L>, detail::shape_t<T>,
                                                   ok || !sl.is_static() || !st.is_static()>::value);
  if constexpr (!sl.is_static() || !st.is_static()) detail::check_same_shape(logits, target, "cross_entropy", loc);
  return fusebox::mean(fusebox::neg(fusebox::sum(target * log_softmax(logits), axis<-1>, loc), loc), axis<-1>, loc);
}

/// mean((pred - target)^2) over every element.
template <array_operand P, array_operand T>
auto mse_loss(const P& pred, const T& target, std::source_location loc = std::source_location::current()) {
  constexpr dims sp = detail::shape_dims<P>(), st = detail::shape_dims<T>();
  static_assert(static_check::mse_shapes<detail::shape_t<P>, detail::shape_t<T>,
                                         sp == st || !sp.is_static() || !st.is_static()>::value);
  if constexpr (!sp.is_static() || !st.is_static()) detail::check_same_shape(pred, target, "mse_loss", loc);
  const auto e = fusebox::sub(pred, target, loc);
  return detail::mean_all(e * e);
}

/// Int labels in [0, Classes) as one-hot rows: tensor<T, shape<N, Classes>> with N = labels.size()
/// (N static: the batch size of a compiled step). A label out of range is an error naming it.
template <std::size_t Classes, std::size_t N, class T = float, class Label>
tensor<T, shape<N, Classes>> one_hot(std::span<const Label> labels,
                                     std::source_location loc = std::source_location::current()) {
  if (labels.size() != N)
    FUSEBOX_THROW(shape_error("one_hot<" + std::to_string(Classes) + ", " + std::to_string(N) + ">: " +
                                  std::to_string(labels.size()) + " labels for a batch of " + std::to_string(N),
                              loc));
  tensor<T, shape<N, Classes>> out;
  out.fill(T(0));
  for (std::size_t i = 0; i < N; ++i) {
    const auto c = labels[i];
    if (c < 0 || static_cast<std::size_t>(c) >= Classes)
      FUSEBOX_THROW(invalid_argument("fusebox::nn::one_hot<" + std::to_string(Classes) + ">: label " + std::to_string(i) +
                                     " is " + std::to_string(static_cast<long long>(c)) + ", outside [0, " +
                                     std::to_string(Classes) + ") (at " + where(loc) + ")"));
    out(i, static_cast<std::size_t>(c)) = T(1);
  }
  return out;
}

}  // namespace fusebox::nn
