// ops/layout.hpp: views: transpose and reshape. On a tensor they return a tensor view at once; in a
// captured model they are view nodes, which move no data (the planner makes sure their input is
// in memory, and the consumers read it through the new strides).
// Derivatives at the end: the gradient of a view is the inverse view of the gradient.
// Depends on: ops/operand.hpp, autodiff/rule.hpp.
#pragma once

#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {
namespace ops {

/// Swaps dimensions A and B.
template <std::size_t A, std::size_t B>
struct transpose_view {
  static constexpr const char* name = "transpose";
  static constexpr int swapped_a = static_cast<int>(A), swapped_b = static_cast<int>(B);
  static constexpr dims shape(dims d) {
    std::swap(d.extent[A], d.extent[B]);
    return d;
  }
  template <class T>
  static strided<T> apply(strided<T> s) {
    std::swap(s.shape.extent[A], s.shape.extent[B]);
    std::swap(s.stride[A], s.stride[B]);
    return s;
  }
};

/// Same elements in a new shape; the input must be contiguous (the planner's buffers are).
template <class S>
struct reshape_view {
  static constexpr const char* name = "reshape";
  static constexpr int swapped_a = -1, swapped_b = -1;
  static constexpr dims shape(dims) { return dims_of(S{}); }
  template <class T>
  static strided<T> apply(strided<T> s) {
    if (!s.contiguous())
      throw invalid_argument("reshape in a compiled model: the input " + to_string(s.shape) +
                             " is not contiguous; pass a contiguous tensor (tensor::clone())");
    const dims d = dims_of(S{});
    return strided<T>{s.data, d, contiguous_strides(d)};
  }
};

}  // namespace ops

/// Swaps the last two dimensions (or A and B).
template <std::size_t A = static_cast<std::size_t>(-1), std::size_t B = static_cast<std::size_t>(-1), array_operand X>
auto transpose(const X& x) {
  using T = typename detail::common_element<X>::type;
  using E = decltype(detail::as_expr<T>(x));
  constexpr std::size_t r = E::desc.shape.rank;
  static_assert(r >= 2, "fusebox: transpose(x) needs rank 2 or more");
  constexpr std::size_t a = A == static_cast<std::size_t>(-1) ? r - 2 : A;
  constexpr std::size_t b = B == static_cast<std::size_t>(-1) ? r - 1 : B;
  static_assert(a < r && b < r, "fusebox: transpose<A, B>(x): A and B must be dimensions of x");
  if constexpr (is_tensor_v<X>) return x.template transpose<a, b>();
  else return view_node<ops::transpose_view<a, b>, E>{{}, x};
}

/// Same elements in shape S (as torch.reshape; dyn dimensions are not inferred in a model).
template <class S, array_operand X>
auto reshape(const X& x, std::source_location loc = std::source_location::current()) {
  if constexpr (is_tensor_v<X>) {
    return x.template reshape<S>(loc);
  } else {
    static_assert(static_check::reshape_size_mismatch<shape_of_t<X>, S, shape_of_t<X>::size == S::size>::value);
    static_assert(S::is_static, "fusebox: reshape<S>(x) in a model needs a static shape S");
    return view_node<ops::reshape_view<S>, X>{{}, x};
  }
}

// ---- derivatives (autodiff/rule.hpp): G the incoming gradient, Y the view node ----
namespace autodiff {
template <std::size_t A, std::size_t B>
struct derivative<ops::transpose_view<A, B>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = view_node<ops::transpose_view<A, B>, exact<G, Y>>;
};
template <class S>
struct derivative<ops::reshape_view<S>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = view_node<ops::reshape_view<shape_of_t<operand<Y, 0>>>, contiguous<exact<G, Y>>>;
};
}  // namespace autodiff

}  // namespace fusebox
