// ops/layout.hpp: views: transpose, reshape, flatten, unflatten and slice. On a tensor they return a tensor view at
// once; in a captured model they are view nodes, which move no data (the planner makes sure their
// input is in memory, and the consumers read it through the new strides). A packed projection is
// the use that matters: `slice<1, 0, 768>(qkv)` then `reshape<[B, T, H, E]>` is the query heads of
// a [tokens, 3·768] product, read where the product wrote them, as torch's `split` + `view`.
// Derivatives at the end: the gradient of a view is the inverse view of the gradient; a slice has
// none yet (its gradient is a padded tensor, an op the library does not have).
// Depends on: ops/operand.hpp, autodiff/rule.hpp.
#pragma once

#include <source_location>
#include <string>
#include <utility>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/expr/grad_nodes.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {
namespace ops {

[[noreturn]] inline void throw_not_a_view(const dims& from, const dims& to) {
  FUSEBOX_THROW(invalid_argument("reshape in a compiled model: its input " + to_string(from) + " is a view whose strides cannot "
                                 "be read as " + to_string(to) + " (it would split or merge dimensions that are not "
                                 "contiguous with each other); reshape before the transpose or slice, or pass a "
                                 "contiguous tensor (tensor::clone())"));
}

[[noreturn]] inline void throw_slice_out_of_range(const dims& in, std::size_t axis, std::size_t begin, std::size_t end) {
  FUSEBOX_THROW(shape_error("slice<" + std::to_string(axis) + ", " + std::to_string(begin) + ", " + std::to_string(end) +
                                "> in a compiled model: the input is " + to_string(in) + ", dimension " + std::to_string(axis) +
                                " has " + std::to_string(in.extent[axis]) + " elements",
                            std::source_location{}));
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

/// The extents of d with dimensions [start, end] merged into one (torch.flatten's rule); the merged
/// extent is dyn when one of them is not a number.
constexpr dims flattened(const dims& d, std::size_t start, std::size_t end) {
  if (start == end) return d;  // nothing merged: a symbol stays itself
  dims out{};
  out.rank = d.rank - (end - start);
  std::size_t merged = 1;
  bool known = true;
  for (std::size_t i = 0; i < d.rank; ++i) {
    if (i < start) out.extent[i] = d.extent[i];
    else if (i > end) out.extent[i - (end - start)] = d.extent[i];
    else if (is_known_extent(d.extent[i])) merged *= d.extent[i];
    else known = false;
  }
  out.extent[start] = known ? merged : dyn;
  return out;
}

/// The inverse, for flatten's gradient: g's dimension `start` split back into the operand's
/// extents `to` (its static shape: a dyn one outside the split range comes from g, one inside is
/// inferred from the merged extent). False when the split is not determined (two unknowns inside
/// it, or a merged extent that is not a number) or does not fit.
constexpr bool unflattened(const dims& to, const dims& g, std::size_t start, dims& out) {
  if (g.rank == 0 || to.rank + 1 < g.rank || start >= g.rank) return false;
  const std::size_t n = to.rank + 1 - g.rank;  // dimensions the merged one holds
  out = to;
  for (std::size_t i = 0; i < start; ++i) out.extent[i] = g.extent[i];
  for (std::size_t i = start + n; i < to.rank; ++i) out.extent[i] = g.extent[i + 1 - n];
  std::size_t known = 1, unknown_at = max_rank;
  for (std::size_t i = start; i < start + n; ++i) {
    if (is_known_extent(to.extent[i])) known *= to.extent[i];
    else if (unknown_at != max_rank) return false;
    else unknown_at = i;
  }
  const std::size_t merged = g.extent[start];
  if (!is_known_extent(merged)) return unknown_at == max_rank;
  if (unknown_at == max_rank) return known == merged;
  if (known == 0 || merged % known != 0) return false;
  out.extent[unknown_at] = merged / known;
  return true;
}

[[noreturn]] inline void throw_flatten(const char* what, const dims& from, std::size_t start, const dims& to) {
  FUSEBOX_THROW(shape_error(std::string(what) + "<" + std::to_string(start) + ">: " + to_string(from) + " cannot be split into " +
                                to_string(to) + " (on the run-time path, give the dimensions flatten merges static extents, "
                                "but for one)",
                            std::source_location{}));
}

/// Dimensions Start..End merged into one (torch.flatten). A view: merging needs the merged
/// dimensions to be one strided run, which the planner's buffers always are (a view of a view
/// that is not is refused by name, as reshape's). `slice_start` carries Start for the run-time
/// path (ir/specialize.hpp), which recomputes the merged extent from the call's.
template <std::size_t Start, std::size_t End>
struct flatten_view {
  static constexpr const char* name = "flatten";
  static constexpr int swapped_a = -1, swapped_b = -1;
  static constexpr int sliced_axis = -1;
  static constexpr std::size_t slice_start = Start;
  static constexpr dims shape(dims d) { return flattened(d, Start, End); }
  template <class T>
  static strided<T> apply(strided<T> s) {
    const dims d = flattened(s.shape, Start, End);
    strides_t st{};
    if (!view_strides(s.shape, s.stride, d, st)) throw_not_a_view(s.shape, d);
    return strided<T>{s.data, d, st};
  }
};

/// flatten's inverse (its gradient): dimension Start split back into the extents of S, the
/// flattened operand's shape. Splitting a dimension is a view whatever its stride.
template <std::size_t Start, class S>
struct unflatten_view {
  static constexpr const char* name = "unflatten";
  static constexpr int swapped_a = -1, swapped_b = -1;
  static constexpr int sliced_axis = -1;
  static constexpr std::size_t slice_start = Start;
  static constexpr dims shape(dims g) {
    dims out{};
    return unflattened(dims_of(S{}), g, Start, out) ? out : dims_of(S{});
  }
  template <class T>
  static strided<T> apply(strided<T> s) {
    dims d{};
    if (!unflattened(dims_of(S{}), s.shape, Start, d)) throw_flatten("unflatten", s.shape, Start, dims_of(S{}));
    strides_t st{};
    if (!view_strides(s.shape, s.stride, d, st)) throw_not_a_view(s.shape, d);
    return strided<T>{s.data, d, st};
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

namespace detail {
template <class S, std::size_t Start, std::size_t End, class Seq = std::make_index_sequence<S::rank - (End - Start)>>
struct flattened_shape;
template <class S, std::size_t Start, std::size_t End, std::size_t... I>
struct flattened_shape<S, Start, End, std::index_sequence<I...>> {
  static constexpr dims d = ops::flattened(dims_of(S{}), Start, End);
  using type = shape<d.extent[I]...>;
};
}  // namespace detail

/// Dimensions Start..End (negative: from the end) merged into one, as torch.flatten(x, Start, End);
/// the default keeps dimension 0, as nn.Flatten does ([N, C, H, W] -> [N, C*H*W]; torch.flatten's
/// own default start is 0: flatten<0>(x)). A view wherever the strides allow it (always in a
/// model); a tensor whose merged dimensions are not one strided run is copied, as in torch. A dyn
/// extent among the merged ones makes the merged extent dyn; the gradient splits it back.
template <int Start = 1, int End = -1, array_operand X>
auto flatten(const X& x, std::source_location loc = std::source_location::current()) {
  using T = typename detail::common_element<X>::type;
  using E = decltype(detail::as_expr<T>(x));
  constexpr int r = static_cast<int>(E::desc.shape.rank);
  constexpr int s = Start < 0 ? r + Start : Start, e = End < 0 ? r + End : End;
  static_assert(r >= 1, "fusebox: flatten(x): x needs rank 1 or more");
  static_assert(0 <= s && s <= e && e < r,
                "fusebox: flatten<Start, End>(x): need 0 <= Start <= End < rank of x (negative values count from "
                "the end: End = -1 is the last dimension)");
  using S = typename detail::flattened_shape<shape_of_t<E>, s, e>::type;
  if constexpr (is_tensor_v<X>) {
    const dims d = ops::flattened(x.extents(), s, e);
    strides_t from{}, st{};
    for (std::size_t i = 0; i < x.extents().rank; ++i) from[i] = x.stride(i);
    if (view_strides(x.extents(), from, d, st)) return tensor<T, S>(x.owner(), const_cast<T*>(x.data()), d, st);
    tensor<T, S> out(d, loc);
    for (std::size_t i = 0; i < out.size(); ++i) out.data()[i] = x.flat(i);
    return out;
  } else {
    return view_node<ops::flatten_view<s, e>, X>{{}, x};
  }
}

namespace detail {
template <class S, std::size_t Start, class Sizes, class Seq = std::make_index_sequence<S::rank + Sizes::rank - 1>>
struct unflattened_shape;
template <class S, std::size_t Start, class Sizes, std::size_t... I>
struct unflattened_shape<S, Start, Sizes, std::index_sequence<I...>> {
  static constexpr std::size_t at(std::size_t i) {
    return i < Start ? S::extents[i] : i < Start + Sizes::rank ? Sizes::extents[i - Start] : S::extents[i + 1 - Sizes::rank];
  }
  using type = shape<at(I)...>;
};
template <class S, std::size_t Start, class Sizes, bool Ok>
struct unflatten_check {
  static_assert(Ok, "fusebox: unflatten<Start, Sizes>(x): x (S above) must have dimension Start, and Sizes (static "
                    "extents) must multiply to its extent there (a dyn extent is checked when the model runs)");
  static constexpr bool value = Ok;
};
}  // namespace detail

/// Dimension Start split into the static extents Sizes, as torch.unflatten(x, Start, Sizes):
/// [B, T, 768] -> unflatten<2, shape<12, 64>> -> [B, T, 12, 64]. A view whatever the strides (the
/// split dimension's own stride is kept), so a dyn extent elsewhere (a batch, a sequence length)
/// stays what it is: what reshape<S> cannot do, since its S is static. Its gradient is flatten.
template <std::size_t Start, class Sizes, array_operand X>
auto unflatten(const X& x) {
  using T = typename detail::common_element<X>::type;
  using E = decltype(detail::as_expr<T>(x));
  using S = shape_of_t<E>;
  static_assert(detail::unflatten_check<S, Start, Sizes,
                                        (Start < S::rank && Sizes::rank >= 1 && Sizes::is_static &&
                                         (S::extents[Start] == dyn || S::extents[Start] == Sizes::size))>::value);
  using R = typename detail::unflattened_shape<S, Start, Sizes>::type;
  if constexpr (is_tensor_v<X>) {
    dims d{};
    if (!ops::unflattened(dims_of(R{}), x.extents(), Start, d)) ops::throw_flatten("unflatten", x.extents(), Start, dims_of(R{}));
    strides_t from{}, st{};
    for (std::size_t i = 0; i < x.extents().rank; ++i) from[i] = x.stride(i);
    if (!view_strides(x.extents(), from, d, st)) ops::throw_not_a_view(x.extents(), d);
    return tensor<T, R>(x.owner(), const_cast<T*>(x.data()), d, st);
  } else {
    return view_node<ops::unflatten_view<Start, R>, X>{{}, x};
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
// flatten's gradient is G with the merged dimension split back (a view, whatever G's strides).
template <std::size_t Start, std::size_t End>
struct derivative<ops::flatten_view<Start, End>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = view_node<ops::unflatten_view<Start, shape_of_t<operand<Y, 0>>>, exact<G, Y>>;
};
// unflatten's gradient is G with the split dimensions merged back.
template <std::size_t Start, class S>
struct derivative<ops::unflatten_view<Start, S>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = view_node<ops::flatten_view<Start, Start + S::rank - shape_of_t<operand<Y, 0>>::rank>, exact<G, Y>>;
};
template <class S>
struct derivative<ops::reshape_view<S>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = view_node<ops::reshape_view<shape_of_t<operand<Y, 0>>>, reshapable<exact<G, Y>, shape_of_t<operand<Y, 0>>>>;
};
}  // namespace autodiff

}  // namespace fusebox
