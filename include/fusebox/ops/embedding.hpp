// ops/embedding.hpp: embedding(weight, ids), torch.nn.functional.embedding: a row gather.
//
//   auto y = embedding(w, ids);   // w [V, D], ids [...] -> [..., D], y[i, :] = w[ids[i], :]
//
// Ids are numbers in the weight's element type (float or double tensors holding exact integers),
// not an integer tensor: fusebox's IR has one element type per program (docs/architecture.md,
// "Embedding"). Float ids are exact below 2^24 (GPT-2's 50257 rows are far below). Each id must be
// an integer in [0, V): checked once per call on the host, before anything is written. Where the
// call's ids are visible to the front end (eager operands, and the arguments of a compiled call or
// a compiled gradient on the host) the error also names the caller's line; the kernels check again
// (backend/cpu/gather.hpp) for ids computed inside the model, naming the op, the id, V and the shapes.
// Derivative: with respect to the weight a scatter-add (embedding_backward: deterministic, see
// backend/cpu/gather.hpp); the ids have none (grad() refuses them by name). No padding_idx, max_norm,
// scale_grad_by_freq or sparse gradients.
// Depends on: expr/gather.hpp, ops/operand.hpp, autodiff/rule.hpp, backend/cpu/gather.hpp (the id check),
// backend/cpu/evaluate.hpp (the capture context: whether the call's tensors are device memory).
#pragma once

#include <cstddef>
#include <source_location>
#include <string>
#include <vector>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/backend/cpu/evaluate.hpp"
#include "fusebox/backend/cpu/gather.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/expr/gather.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {
namespace ops {

/// The forward op (node variant 0).
struct embedding_op {
  static constexpr const char* name = "embedding";
  static constexpr int variant = 0;
  static constexpr std::size_t rows = 0;
};

/// dL/dw of embedding: g [..., D] and ids [...] scattered into [Rows, D] (node variant 1).
template <std::size_t Rows>
struct embedding_backward_op {
  static constexpr const char* name = "embedding_backward";
  static constexpr int variant = 1;
  static constexpr std::size_t rows = Rows;
};

}  // namespace ops

namespace detail {
/// Checks the call's ids where their values are on the host now (eager tensors, arguments of a
/// compiled host call), naming the caller's line.
template <class E>
void check_embedding_ids(const E& ids, const dims& weight, const std::source_location& loc) {
  using T = typename E::value_type;
  strided<T> v{};
  if constexpr (E::desc.kind == node_kind::tensor) {
    v = strided<T>{const_cast<T*>(ids.view.data), ids.view.shape, ids.view.stride};
  } else if constexpr (E::desc.kind == node_kind::input) {
    const capture_context* c = current_capture();
    if (!ids.bound.data || (c && c->device)) return;  // no values, or device memory
    v = strided<T>{const_cast<T*>(ids.bound.data), ids.bound.shape, ids.bound.stride};
  } else {
    return;
  }
  if (!is_known_extent(weight.extent[0])) return;
  std::vector<std::uint32_t> scratch;
  cpu::read_ids(v, weight.extent[0], weight, "embedding", scratch, &loc);
}
}  // namespace detail

/// torch.nn.functional.embedding(ids, weight): rows of w [V, D] picked by ids [...], -> [..., D].
/// (Arguments in fusebox's order: the table first, as gather(table, index).)
template <array_operand W, array_operand Ids>
auto embedding(const W& w, const Ids& ids, std::source_location loc = std::source_location::current()) {
  using T = typename detail::common_element<W>::type;
  using EW = decltype(detail::as_expr<T>(w));
  using EI = decltype(detail::as_expr<typename detail::common_element<Ids>::type>(ids));
  gather_node<ops::embedding_op, EW, EI> e{{}, detail::as_expr<T>(w), detail::as_expr<typename EI::value_type>(ids)};
  const dims sw = detail::runtime_shape(e.a);
  if constexpr (!EW::desc.shape.is_static() || !EI::desc.shape.is_static()) {
    const dims si = detail::runtime_shape(e.ids);
    if (!detail::gather_shape(0, 0, sw, si).ok) FUSEBOX_THROW(shape_error(detail::gather_error_text(0, sw, si), loc));
  }
  detail::check_embedding_ids(e.ids, sw, loc);
  return detail::finish(e);
}

// ---- derivative (autodiff/rule.hpp): G the incoming gradient, Y the embedding node ----
namespace autodiff {
namespace detail {
template <std::size_t I, class G, class Y>
struct embedding_vjp {
  static_assert(I == 0, "fusebox::grad: embedding(weight, ids): the ids have no gradient (they are indices, as in "
                        "torch); leave them out of wrt<>, and do not compute ids from a differentiated argument");
  using type = gather_node<ops::embedding_backward_op<operand<Y, 0>::desc.shape.extent[0]>, exact<G, Y>, operand<Y, 1>>;
};
}  // namespace detail

template <>
struct derivative<ops::embedding_op> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = typename detail::embedding_vjp<I, G, Y>::type;
};
}  // namespace autodiff

}  // namespace fusebox
