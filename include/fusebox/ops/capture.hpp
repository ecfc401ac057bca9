// ops/capture.hpp: how an op call becomes a node. Every op front end goes through `make` here:
// operands become expression leaves (tensors by view, numbers as scalars in the element type of
// the other operands), shapes are checked (build error for static extents, shape_error naming the
// op, both shapes and the caller's line for dyn ones), and the node is either returned (when it
// reaches an input of a compiled call: capture) or evaluated at once (eager).
// The op headers see only the declarations in ops/operand.hpp, so that generated kernels can
// include an op family for its math without this machinery.
// Depends on: expr/node.hpp, ops/operand.hpp, backend/cpu/evaluate.hpp.
#pragma once

#include <source_location>
#include <string>
#include <type_traits>

#include "fusebox/backend/cpu/evaluate.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/expr/node.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {
namespace detail {

/// Operand → expression leaf (or the expression itself).
template <class T, class X>
auto as_expr(const X& x) {
  if constexpr (is_expr_v<X>) return x;
  else if constexpr (is_tensor_v<X>) return tensor_leaf<T, typename X::shape_type>{{}, x.view()};
  else return scalar_leaf<T>{{}, static_cast<T>(x)};
}

template <class E>
dims runtime_shape(const E& e) {
  if constexpr (E::desc.kind == node_kind::tensor) return e.view.shape;
  else if constexpr (E::desc.kind == node_kind::input) return e.bound.shape.rank || E::desc.shape.rank == 0 ? e.bound.shape : E::desc.shape;
  else return E::desc.shape;
}

inline std::string call_site(const std::source_location& loc) {
  return loc.line() ? std::string() : std::string(" (an operator; call the named function for the source line)");
}

/// make_pointwise's check of one operand's run-time shape against the broadcast of those before it
/// (`first`: none yet): not a template, so each op's instantiation keeps only the call (issue 22).
inline void broadcast_runtime(dims& acc, bool& first, const dims& s, const char* op, const std::source_location& loc) {
  const auto r = broadcast(acc, s);
  if (!first && !r.ok)
    FUSEBOX_THROW(shape_error(std::string(op) + ": shapes " + to_string(acc) + " and " + to_string(s) +
                                  " cannot broadcast (dimension -" + std::to_string(r.bad_dim + 1) + ")" + call_site(loc),
                              loc));
  acc = r.out;
  first = false;
}

/// Eager: evaluate now. Capture: return the node.
template <class E>
auto finish(const E& e) {
  if constexpr (E::symbolic) return e;
  else return evaluate(e, eager_runtime());
}

/// Builds a pointwise node of Op over operands xs (1 to 3).
template <class Op, class... X>
auto make_pointwise(const std::source_location& loc, const X&... xs) {
  using T = typename common_element<X...>::type;
  static_assert(!std::is_void_v<T>, "fusebox: an op needs at least one tensor or expression operand");
  using E = pointwise<Op, decltype(as_expr<T>(xs))...>;
  using L = meta::type_list<decltype(as_expr<T>(xs))...>;
  if constexpr (sizeof...(X) >= 2) {
    static_assert(detail::check_pair<Op, meta::at_t<0, L>, meta::at_t<1, L>>::value);
  }
  if constexpr (sizeof...(X) == 3) {
    static_assert(detail::check_pair<Op, meta::at_t<0, L>, meta::at_t<2, L>>::value);
    static_assert(detail::check_pair<Op, meta::at_t<1, L>, meta::at_t<2, L>>::value);
  }
  E e{{}, {as_expr<T>(xs)...}};
  if constexpr ((!decltype(as_expr<T>(xs))::desc.shape.is_static() || ...)) {
    // Run-time extents: the same broadcasting rule, checked on the actual shapes.
    dims acc{};
    bool first = true;
    std::apply([&](const auto&... leaf) { (broadcast_runtime(acc, first, runtime_shape(leaf), Op::name, loc), ...); },
               e.args);
  }
  return finish(e);
}

}  // namespace detail
}  // namespace fusebox
