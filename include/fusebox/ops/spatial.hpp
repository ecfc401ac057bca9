// ops/spatial.hpp: the front-end step shared by conv2d and pooling (ops/conv.hpp, ops/pool.hpp):
// operands to expression leaves, a spatial_node of Op, and, where an extent is dyn, the shape
// rule checked on the actual shapes with a shape_error naming the op, the shapes and the
// caller's line. (Static shapes are checked by the node type itself: a build error.)
// Depends on: expr/spatial.hpp, ops/operand.hpp.
#pragma once

#include <source_location>

#include "fusebox/expr/spatial.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox::detail {

template <class Op, class... X>
auto make_spatial(const std::source_location& loc, const X&... xs) {
  using T = typename common_element<X...>::type;
  spatial_node<Op, decltype(as_expr<T>(xs))...> e{{}, {as_expr<T>(xs)...}};
  if constexpr ((!decltype(as_expr<T>(xs))::desc.shape.is_static() || ...)) {
    const dims shapes[] = {runtime_shape(std::get<0>(e.args)), runtime_shape(std::get<sizeof...(X) - 1>(e.args))};
    const dims b = sizeof...(X) == 2 ? shapes[1] : dims{};
    const auto r = spatial_shape(Op::params, shapes[0], b);
    if (r.error != spatial_ok) throw shape_error(spatial_error_text(Op::params, shapes[0], b, r.error), loc);
  }
  return finish(e);
}

}  // namespace fusebox::detail
