// autodiff/rule.hpp: what an op's derivative is written with. Each differentiable op gives, next
// to its math in ops/, a specialisation of `derivative<Key>` whose member alias
//
//   template <std::size_t I, class G, class Y, class Ctx> using vjp = ...;
//
// is the vector-Jacobian product for operand I: an expression *type* of the incoming gradient G,
// the forward node Y (its output) and Y's operands (`operand<Y, K>`), built from the same node
// types the forward uses, so the backward goes through the one planner like the forward. `Ctx`
// gives rank-0 constants (`Ctx::template constant<Y>`, valued by the rule's
// `constant<T, Y>()`). A rule returns `no_grad` for an operand the op is constant in (comparisons,
// the condition of where).
//
// Shapes: G has a shape that broadcasts to Y's (it may be smaller: the gradient of a sum is not
// expanded until something needs it), and a rule's result broadcasts to its operand's shape or is
// larger; the reverse pass (autodiff/backward.hpp) sums it down to the operand's shape. A rule that
// needs G at exactly Y's shape (matmul, views) says so with `exact<G, Y>`.
//
// Keys: pointwise and reduction nodes by their op struct, views by their view struct, matmul by
// its node type. Expressions are named directly as node types here, never through the op front
// ends (those would evaluate eagerly when no input is symbolic); the reverse pass turns them into
// autodiff/sym.hpp's storage-free types before anything completes them, and G and Y are such types.
// Depends on: expr/node.hpp, meta/type_list.hpp.
#pragma once

#include <cstddef>
#include <type_traits>

#include "fusebox/expr/node.hpp"
#include "fusebox/meta/type_list.hpp"

namespace fusebox {
namespace ops {
// Defined in ops/elementwise.hpp and ops/layout.hpp; named here by the builders below.
struct expand_as;
template <class S>
struct reshape_view;
template <std::size_t A, std::size_t B>
struct transpose_view;
}  // namespace ops

namespace autodiff {

/// The derivative of the op `Key`. Not specialised: the op has no derivative, and grad() says so.
template <class Key>
struct derivative {
  using undefined = void;
};

/// A rule's answer for an operand that does not change the result (or has no gradient).
struct no_grad {};

/// Operand K of forward node Y.
template <class Y, std::size_t K>
using operand = meta::at_t<K, typename Y::children>;

namespace detail {
template <class E>
struct shape_holder {
  static constexpr dims value = E::desc.shape;
};
/// Y's shape with the reduced axis kept at extent 1 (the shape a reduction's gradient broadcasts from).
template <class Y>
struct keepdim_holder {
  static constexpr dims value = fusebox::detail::reduced_shape(operand<Y, 0>::desc.shape, Y::desc.axis, true);
};
template <class E>
inline constexpr bool is_view_v = E::desc.kind == node_kind::view;
}  // namespace detail

/// G at exactly the shape of Ref (G broadcasts to it): G itself, or G broadcast by `expand_as`,
/// which reads nothing of Ref but its shape.
template <class G, class Ref>
using exact = std::conditional_t<G::desc.shape == Ref::desc.shape, G, pointwise<ops::expand_as, G, Ref>>;

/// G in memory of its own, contiguous (a reshape needs it): a view is copied.
template <class G>
using contiguous = std::conditional_t<detail::is_view_v<G>, pointwise<ops::expand_as, G, G>, G>;

namespace detail {
/// The strides of E's elements as the planner lays them out: a node that is not a view is its
/// own contiguous buffer (as contiguous<> assumes); a view transforms its operand's strides.
/// `ok` is false where a reshape in the chain would not be a view (it throws when bound).
template <class E>
struct static_strides {
  static constexpr strides_t value = contiguous_strides(E::desc.shape);
  static constexpr bool ok = true;
};
template <class E>
  requires(E::desc.kind == node_kind::view)
struct static_strides<E> {
  using A = meta::at_t<0, typename E::children>;
  static constexpr auto compute() {
    struct result {
      strides_t s;
      bool ok;
    } r{static_strides<A>::value, static_strides<A>::ok};
    if (E::desc.view_a >= 0) {  // transpose
      const auto t = r.s[static_cast<std::size_t>(E::desc.view_a)];
      r.s[static_cast<std::size_t>(E::desc.view_a)] = r.s[static_cast<std::size_t>(E::desc.view_b)];
      r.s[static_cast<std::size_t>(E::desc.view_b)] = t;
    } else if (E::desc.axis < 0) {  // reshape (a slice keeps its operand's strides)
      strides_t out{};
      r.ok = r.ok && view_strides(A::desc.shape, r.s, E::desc.shape, out);
      r.s = out;
    }
    return r;
  }
  static constexpr strides_t value = compute().s;
  static constexpr bool ok = compute().ok;
};
template <class G, class S>
constexpr bool reshapes_in_place() {
  if constexpr (!is_view_v<G>) return true;
  else {
    strides_t out{};
    return static_strides<G>::ok && view_strides(G::desc.shape, static_strides<G>::value, dims_of(S{}), out);
  }
}
}  // namespace detail

/// G as something a reshape to S can view: G itself where its strides allow that reshape (a
/// gradient kernel's output read through slices, say), else a contiguous copy.
template <class G, class S>
using reshapable = std::conditional_t<detail::reshapes_in_place<G, S>(), G, contiguous<G>>;

/// Transpose of the last two dimensions (a view).
template <class X>
using transposed = view_node<ops::transpose_view<X::desc.shape.rank - 2, X::desc.shape.rank - 1>, X>;

namespace detail {
// G, the gradient of reduction Y, made to broadcast against Y's operand: with keepdim it already
// does; without, it does when all of its dimensions lie right of the reduced axis (it has not
// been expanded yet); otherwise it is brought to Y's shape and reshaped to keep the axis.
template <class G, class Y, bool Broadcasts = Y::desc.keepdim ||
                                              G::desc.shape.rank + Y::desc.axis + 1 <= operand<Y, 0>::desc.shape.rank>
struct unreduce {
  using type = G;
};
template <class G, class Y>
struct unreduce<G, Y, false> {
  using type = view_node<ops::reshape_view<shape_from_dims_t<keepdim_holder<Y>>>, contiguous<exact<G, Y>>>;
};
template <class Y, bool Keep = Y::desc.keepdim>
struct with_kept_axis {
  using type = Y;
};
template <class Y>
struct with_kept_axis<Y, false> {
  using type = view_node<ops::reshape_view<shape_from_dims_t<keepdim_holder<Y>>>, Y>;
};
}  // namespace detail

/// A gradient contribution C about to be summed down to the shape `Target::value` (an operand
/// that was broadcast, as a convolution's bias over N, H and W), restated by the op that made C
/// as something with the same sum that is cheaper to sum. Not specialised: C itself. ops/pool.hpp:
/// a max pooling's backward summed over whole planes is its incoming gradient summed.
template <class C, class Target>
struct restate_for_sum {
  using type = C;
};

/// The gradient G of reduction Y, in a shape that broadcasts against Y's operand.
template <class G, class Y>
using unreduce = typename detail::unreduce<G, Y>::type;

/// Reduction Y's output with the reduced axis kept (a view when Y dropped it).
template <class Y>
using with_kept_axis = typename detail::with_kept_axis<Y>::type;

}  // namespace autodiff
}  // namespace fusebox
