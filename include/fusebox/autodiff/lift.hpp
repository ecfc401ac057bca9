// autodiff/lift.hpp: a captured loss with its payloads lifted to inputs.
//
// Lowering merges identical subtrees only when they hold no run-time payload (ir/graph.hpp): a
// scalar or a captured tensor makes every use of a value a copy of its expression. A backward pass
// uses each value two or three times (mul: g b and g a; matmul: g Bt and At g), and real losses use
// theirs several times (a residual, layer_norm's mean and centring, q k v of one normed input), so
// copies multiply: a pre-norm attention block with one eps and one scale is ~1300 copies. Lifting
// replaces each payload leaf (tensor_leaf, scalar_leaf) by an input leaf numbered after the call's
// arguments, as torch.compile lifts parameters and constants to graph inputs, so the joint graph
// is payload-free and the lowering's type merging makes every value one node.
//
// Numbering: a payload leaf is named by its place, the type of its parent node and its operand
// slot (a `slot<Parent, I>`), numbered in the post-order of the expression's distinct types. The
// copies of one value (one C++ object used several times) therefore share their inputs, which is
// what makes them merge. Type-identical parts built separately share them too, which is right
// only when they hold the same values: `collect_lifted` checks at every call that all leaves of a
// slot hold the same number (bit for bit) or view the same tensor, and throws otherwise
// (`pow(x, 2.0) + pow(x, 3.0)`: two slots' worth of structure with one slot's inputs).
//
// An opaque node (a user function, a graph break) has no derivative: a build error.
// The lifted loss is built from autodiff/sym.hpp's storage-free node types (it is only ever a type).
// Depends on: autodiff/{dag,sym}.hpp, expr/node.hpp, core/errors.hpp, meta/type_list.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include "fusebox/autodiff/dag.hpp"
#include "fusebox/autodiff/sym.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/expr/node.hpp"
#include "fusebox/meta/type_list.hpp"

namespace fusebox::autodiff {

namespace static_check {
template <class Node, bool Ok>
struct opaque_in_loss {
  static_assert(Ok, "fusebox::grad(f): the loss calls opaque() (a user function, the node above): its derivative "
                    "is unknown. Fix: write that part of the loss with fusebox ops");
  static constexpr bool value = Ok;
};
}  // namespace static_check

namespace detail {

template <class E>
inline constexpr bool is_payload_leaf_v = E::desc.kind == node_kind::tensor || E::desc.kind == node_kind::scalar;

/// Operand I of node P, where a payload leaf sits.
template <class P, std::size_t I>
struct slot {};

template <class P, class Seq = std::make_index_sequence<P::children::size>>
struct slots_of;
template <class P, std::size_t... I>
struct slots_of<P, std::index_sequence<I...>> {
  using type = typename concat<std::conditional_t<is_payload_leaf_v<meta::at_t<I, typename P::children>>,
                                                  meta::type_list<slot<P, I>>, meta::type_list<>>...>::type;
};
template <class Nodes>
struct all_slots;
template <class... N>
struct all_slots<meta::type_list<N...>> {
  using type = typename concat<typename slots_of<N>::type...>::type;
};

/// The payload slots of expression E, in the post-order of its distinct types.
template <class E>
using payload_slots = typename all_slots<post_order<E>>::type;

// ---- lifting, memoised per node type (every copy of a subtree lifts to the same type) ----

template <class E, class Slots, std::size_t Base>
struct lift;

template <class P, std::size_t I, class C, class Slots, std::size_t Base>
struct lift_operand {
  using type = typename lift<C, Slots, Base>::type;
};
template <class P, std::size_t I, class T, class S, class Slots, std::size_t Base>
struct lift_operand<P, I, tensor_leaf<T, S>, Slots, Base> {
  using type = input_leaf<Base + index_in<slot<P, I>>(Slots{}), T, S>;
};
template <class P, std::size_t I, class T, class Slots, std::size_t Base>
struct lift_operand<P, I, scalar_leaf<T>, Slots, Base> {
  using type = input_leaf<Base + index_in<slot<P, I>>(Slots{}), T, shape<>>;
};
template <class P, std::size_t I, class Slots, std::size_t Base>
using lifted_operand = typename lift_operand<P, I, meta::at_t<I, typename P::children>, Slots, Base>::type;

template <std::size_t I, class T, class S, bool FG, class Slots, std::size_t Base>
struct lift<input_leaf<I, T, S, FG>, Slots, Base> {
  using type = input_leaf<I, T, S>;
};
template <class P, class Seq, class Slots, std::size_t Base>
struct lift_pointwise;
template <class Op, class... A, std::size_t... I, class Slots, std::size_t Base>
struct lift_pointwise<pointwise<Op, A...>, std::index_sequence<I...>, Slots, Base> {
  using type = sym::pointwise<Op, lifted_operand<pointwise<Op, A...>, I, Slots, Base>...>;
};
template <class Op, class... A, class Slots, std::size_t Base>
struct lift<pointwise<Op, A...>, Slots, Base> {
  using type = typename lift_pointwise<pointwise<Op, A...>, std::index_sequence_for<A...>, Slots, Base>::type;
};
template <class Op, int Axis, bool Keep, class A, class Slots, std::size_t Base>
struct lift<reduction<Op, Axis, Keep, A>, Slots, Base> {
  using type = sym::reduction<Op, Axis, Keep, lifted_operand<reduction<Op, Axis, Keep, A>, 0, Slots, Base>>;
};
template <class V, class A, class Slots, std::size_t Base>
struct lift<view_node<V, A>, Slots, Base> {
  using type = sym::view_node<V, lifted_operand<view_node<V, A>, 0, Slots, Base>>;
};
template <class A, class B, class Slots, std::size_t Base>
struct lift<matmul_node<A, B>, Slots, Base> {
  using P = matmul_node<A, B>;
  using type = sym::matmul<lifted_operand<P, 0, Slots, Base>, lifted_operand<P, 1, Slots, Base>>;
};
template <class Q, class K, class V, bool Causal, class Slots, std::size_t Base>
struct lift<attention_node<Q, K, V, Causal>, Slots, Base> {
  using P = attention_node<Q, K, V, Causal>;
  using type = sym::attention<lifted_operand<P, 0, Slots, Base>, lifted_operand<P, 1, Slots, Base>,
                              lifted_operand<P, 2, Slots, Base>, Causal>;
};
template <class P, class Seq, class Slots, std::size_t Base>
struct lift_spatial;
template <class Op, class... A, std::size_t... I, class Slots, std::size_t Base>
struct lift_spatial<spatial_node<Op, A...>, std::index_sequence<I...>, Slots, Base> {
  using type = sym::spatial<Op, lifted_operand<spatial_node<Op, A...>, I, Slots, Base>...>;
};
template <class Op, class... A, class Slots, std::size_t Base>
struct lift<spatial_node<Op, A...>, Slots, Base> {
  using type = typename lift_spatial<spatial_node<Op, A...>, std::index_sequence_for<A...>, Slots, Base>::type;
};
template <class P, class Seq, class Slots, std::size_t Base>
struct lift_custom;
template <class Op, class... A, std::size_t... I, class Slots, std::size_t Base>
struct lift_custom<custom_node<Op, A...>, std::index_sequence<I...>, Slots, Base> {
  using type = sym::custom<Op, lifted_operand<custom_node<Op, A...>, I, Slots, Base>...>;
};
template <class Op, class... A, class Slots, std::size_t Base>
struct lift<custom_node<Op, A...>, Slots, Base> {
  using type = typename lift_custom<custom_node<Op, A...>, std::index_sequence_for<A...>, Slots, Base>::type;
};
template <class Op, class A, class Ids, class Slots, std::size_t Base>
struct lift<gather_node<Op, A, Ids>, Slots, Base> {
  using P = gather_node<Op, A, Ids>;
  using type = sym::gather<Op, lifted_operand<P, 0, Slots, Base>, lifted_operand<P, 1, Slots, Base>>;
};
template <class Fn, class A, class Out, class Slots, std::size_t Base>
struct lift<opaque_node<Fn, A, Out>, Slots, Base> {
  static_assert(static_check::opaque_in_loss<opaque_node<Fn, A, Out>, false>::value);
  using type = A;
};

template <class T>
bool same_payload(const strided<const T>& a, const strided<const T>& b) {
  return a.data == b.data && a.shape == b.shape && (a.shape.size() <= 1 || a.stride == b.stride);
}

}  // namespace detail

/// E with its payloads lifted to inputs numbered from `First`, by slot.
template <class E, std::size_t First>
using lifted_t = typename detail::lift<E, detail::payload_slots<E>, First>::type;

/// How many inputs lifting E adds (one per payload slot).
template <class E>
inline constexpr std::size_t payload_count = detail::payload_slots<E>::size;

/// Binds E's payloads to the lifted inputs: views[k] for slot k (a scalar is copied to scalars[k]
/// and viewed there as a rank-0 tensor; the caller keeps `scalars` alive). Every leaf of a slot
/// must hold what the first one holds; otherwise a fusebox::invalid_argument says so.
template <class Slots, class E, class T>
void collect_lifted(const E& e, strided<const T>* views, T* scalars, bool* bound) {
  if constexpr (E::has_payload && E::children::size > 0) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (([&] {
         const auto& c = e.template child<I>();
         using C = std::remove_cvref_t<decltype(c)>;
         if constexpr (detail::is_payload_leaf_v<C>) {
           constexpr std::size_t k = detail::index_in<detail::slot<E, I>>(Slots{});
           strided<const T> v{};
           T value{};
           if constexpr (C::desc.kind == node_kind::scalar) value = c.value;
           else v = c.view;
           if (!bound[k]) {
             bound[k] = true;
             if constexpr (C::desc.kind == node_kind::scalar) {
               scalars[k] = value;
               views[k] = strided<const T>{&scalars[k], dims{}, {}};
             } else {
               views[k] = v;
             }
           } else {
             const bool same = C::desc.kind == node_kind::scalar ? std::memcmp(&scalars[k], &value, sizeof(T)) == 0
                                                                 : detail::same_payload(views[k], v);
             if (!same)
               FUSEBOX_THROW(invalid_argument(
                   "fusebox::grad(f): two parts of the loss with the same structure hold different " +
                   std::string(C::desc.kind == node_kind::scalar ? "numbers" : "captured tensors") +
                   " (as in pow(x, 2.0) + pow(x, 3.0)); the static gradient path identifies values by their "
                   "structure. Fix: pass one of them as an argument (a number as a rank-0 fb::tensor), or "
                   "build the two parts differently"));
           }
         } else {
           collect_lifted<Slots>(c, views, scalars, bound);
         }
       }()),
       ...);
    }(std::make_index_sequence<E::children::size>{});
  }
}

}  // namespace fusebox::autodiff
