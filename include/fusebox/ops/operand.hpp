// ops/operand.hpp: what an op front end may take (concepts), the element type of a call, and the
// declarations of the capture helpers that ops/capture.hpp defines. Op headers include this, not
// capture.hpp, so a generated kernel can include an op family for its math alone; programs include
// <fusebox/fusebox.hpp>, which brings the definitions.
// Depends on: expr/node.hpp, core/tensor.hpp.
#pragma once

#include <source_location>
#include <type_traits>

#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/node.hpp"

namespace fusebox {

/// Anything an op accepts: an expression, a tensor, or a number.
template <class X>
concept operand = is_expr_v<X> || is_tensor_v<std::remove_cvref_t<X>> || std::is_arithmetic_v<std::remove_cvref_t<X>>;

/// An operand that fixes the element type (not a bare number).
template <class X>
concept array_operand = is_expr_v<X> || is_tensor_v<std::remove_cvref_t<X>>;

namespace detail {

template <class X>
struct element_of {
  using type = void;
};
template <class X>
  requires is_expr_v<X>
struct element_of<X> {
  using type = typename X::value_type;
};
template <class T, class S>
struct element_of<tensor<T, S>> {
  using type = T;
};

/// The element type of an op call: that of its first array operand.
template <class... X>
struct common_element;
template <class X, class... Rest>
struct common_element<X, Rest...> {
  using type = std::conditional_t<!std::is_void_v<typename element_of<std::remove_cvref_t<X>>::type>,
                                  typename element_of<std::remove_cvref_t<X>>::type,
                                  typename common_element<Rest...>::type>;
};
template <>
struct common_element<> {
  using type = void;
};

template <class T, class X>
auto as_expr(const X& x);
template <class E>
dims runtime_shape(const E& e);
template <class E>
auto finish(const E& e);
template <class Op, class... X>
auto make_pointwise(const std::source_location& loc, const X&... xs);

}  // namespace detail
}  // namespace fusebox
