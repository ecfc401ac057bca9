// ops/layout.hpp: views: transpose, reshape and slice. On a tensor they return a tensor view at
// once; in a captured model they are view nodes, which move no data (the planner makes sure their
// input is in memory, and the consumers read it through the new strides). A packed projection is
// the use that matters: `slice<1, 0, 768>(qkv)` then `reshape<[B, T, H, E]>` is the query heads of
// a [tokens, 3·768] product, read where the product wrote them, as torch's `split` + `view`.
// Derivatives at the end: the gradient of a view is the inverse view of the gradient; a slice has
// none yet (its gradient is a padded tensor, an op the library does not have).
// Depends on: ops/operand.hpp, autodiff/rule.hpp.
#pragma once

#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/expr/grad_nodes.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {
namespace ops {

[[noreturn]] inline void throw_not_a_view(const dims& from, const dims& to) {
  throw invalid_argument("reshape in a compiled model: its input " + to_string(from) + " is a view whose strides cannot "
                         "be read as " + to_string(to) + " (it would split or merge dimensions that are not "
                         "contiguous with each other); reshape before the transpose or slice, or pass a "
                         "contiguous tensor (tensor::clone())");
}

[[noreturn]] inline void throw_slice_out_of_range(const dims& in, std::size_t axis, std::size_t begin, std::size_t end) {
  throw shape_error("slice<" + std::to_string(axis) + ", " + std::to_string(begin) + ", " + std::to_string(end) +
                        "> in a compiled model: the input is " + to_string(in) + ", dimension " + std::to_string(axis) +
                        " has " + std::to_string(in.extent[axis]) + " elements",
                    std::source_location{});
}

/// Swaps dimensions A and B.
template <std::size_t A, std::size_t B>
struct transpose_view {
  static constexpr const char* name = "transpose";
  static constexpr int swapped_a = static_cast<int>(A), swapped_b = static_cast<int>(B);
  static constexpr int sliced_axis = -1;
  static constexpr std::size_t slice_start = 0;
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

/// Same elements in a new shape, viewed: the input's strides must allow it (view_strides, torch.view's
/// rule; the planner's buffers are contiguous, so only a view of a view can fail).
template <class S>
struct reshape_view {
  static constexpr const char* name = "reshape";
  static constexpr int swapped_a = -1, swapped_b = -1;
  static constexpr int sliced_axis = -1;
  static constexpr std::size_t slice_start = 0;
  static constexpr dims shape(dims) { return dims_of(S{}); }
  template <class T>
  static strided<T> apply(strided<T> s) {
    const dims d = dims_of(S{});
    strides_t st{};
    if (!view_strides(s.shape, s.stride, d, st)) throw_not_a_view(s.shape, d);
    return strided<T>{s.data, d, st};
  }
};

/// Elements [Begin, End) of dimension A, as tensor::slice<A, Begin, End>().
template <std::size_t A, std::size_t Begin, std::size_t End>
struct slice_view {
  static constexpr const char* name = "slice";
  static constexpr int swapped_a = -1, swapped_b = -1;
  static constexpr int sliced_axis = static_cast<int>(A);
  static constexpr std::size_t slice_start = Begin;
  static constexpr dims shape(dims d) {
    d.extent[A] = End - Begin;
    return d;
  }
  template <class T>
  static strided<T> apply(strided<T> s) {
    if (End > s.shape.extent[A]) throw_slice_out_of_range(s.shape, A, Begin, End);
    if (s.data) s.data += static_cast<std::ptrdiff_t>(Begin) * s.stride[A];
    s.shape.extent[A] = End - Begin;
    return s;
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

/// Elements [Begin, End) of dimension Axis, a view (as torch.narrow, or one part of torch.split).
/// Static bounds; a dyn extent of Axis is checked when the model runs.
template <std::size_t Axis, std::size_t Begin, std::size_t End, array_operand X>
auto slice(const X& x) {
  if constexpr (is_tensor_v<X>) {
    return x.template slice<Axis, Begin, End>();
  } else {
    using S = shape_of_t<X>;
    static_assert(Axis < S::rank, "fusebox: slice<Axis, Begin, End>(x): Axis must be a dimension of x");
    static_assert(static_check::slice_out_of_range<S, Axis, Begin, End,
                                                   Begin < End && (S::extents[Axis] == dyn || End <= S::extents[Axis])>::value);
    return view_node<ops::slice_view<Axis, Begin, End>, X>{{}, x};
  }
}

// ---- derivatives (autodiff/rule.hpp): G the incoming gradient, Y the view node ----
namespace autodiff {
namespace sym {
template <class A, class B>
struct matmul;
}
namespace detail {
// The gradient through transpose(w), in general a transposed view of G. When G is a rank-2 product
// P Q (w read as transpose(w) by a matmul: a Linear weight stored [out, in]), it is Q^T P^T
// instead: the same values written by one GEMM in w's own layout, where a view would be copied
// element by element into the [out, in] gradient afterwards.
template <std::size_t A, std::size_t B, class G>
struct transpose_vjp {
  using type = view_node<ops::transpose_view<A, B>, G>;
};
template <class P, class Q>
  requires(sym::matmul<P, Q>::desc.shape.rank == 2)
struct transpose_vjp<0, 1, sym::matmul<P, Q>> {
  using type = matmul_node<transposed<Q>, transposed<P>>;
};
}  // namespace detail
template <std::size_t A, std::size_t B>
struct derivative<ops::transpose_view<A, B>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = typename detail::transpose_vjp<A, B, exact<G, Y>>::type;
};
// A slice's gradient is G in a zero tensor of the operand's shape (expr/grad_nodes.hpp's pad_node).
// Slices of one tensor (q, k, v of a packed projection) get one gradient: the reverse pass adds
// their pads (autodiff/backward.hpp).
template <std::size_t A, std::size_t Begin, std::size_t End>
struct derivative<ops::slice_view<A, Begin, End>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = pad_node<A, Begin, operand<Y, 0>::desc.shape.extent[A], exact<G, Y>>;
};
template <class S>
struct derivative<ops::reshape_view<S>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = view_node<ops::reshape_view<shape_of_t<operand<Y, 0>>>, reshapable<exact<G, Y>, shape_of_t<operand<Y, 0>>>>;
};
}  // namespace autodiff

}  // namespace fusebox
