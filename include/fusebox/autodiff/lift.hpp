// autodiff/lift.hpp: a captured loss with its payloads lifted to inputs.
//
// Lowering merges identical subtrees only when they hold no run-time payload (ir/graph.hpp): a
// scalar or a captured tensor makes every use of a value a copy of its expression. A backward pass
// uses each gradient two or three times (mul: g b and g a; matmul: g Bt and At g), so one payload
// in the forward would make the backward grow exponentially with depth. Lifting first replaces
// each payload leaf (tensor_leaf, scalar_leaf) by an input leaf numbered after the call's
// arguments, as torch.compile lifts parameters and constants to graph inputs: the whole joint
// graph is then payload-free, every value is one node however often it is used, and the payloads'
// values are bound like arguments (`collect_lifted` finds them in the same left-to-right order).
//
// Leaves that are type-identical but distinct occurrences get distinct numbers (`x * 0.5 + x * 0.7`
// stays right). An opaque node (a user function, a graph break) has no derivative: a build error.
// Depends on: expr/node.hpp, meta/type_list.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

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

/// `type`: E with payload leaves replaced by input leaves numbered from K; `next`: the next number.
template <class E, std::size_t K>
struct lift;

template <std::size_t K, class Done, class... Rest>
struct lift_args {
  using type = Done;
  static constexpr std::size_t next = K;
};
template <std::size_t K, class... Done, class A, class... Rest>
struct lift_args<K, meta::type_list<Done...>, A, Rest...>
    : lift_args<lift<A, K>::next, meta::type_list<Done..., typename lift<A, K>::type>, Rest...> {};

template <std::size_t I, class T, class S, bool FG, std::size_t K>
struct lift<input_leaf<I, T, S, FG>, K> {
  using type = input_leaf<I, T, S>;
  static constexpr std::size_t next = K;
};
template <class T, class S, std::size_t K>
struct lift<tensor_leaf<T, S>, K> {
  using type = input_leaf<K, T, S>;
  static constexpr std::size_t next = K + 1;
};
template <class T, std::size_t K>
struct lift<scalar_leaf<T>, K> {
  using type = input_leaf<K, T, shape<>>;
  static constexpr std::size_t next = K + 1;
};

template <class Op, class List>
struct rebuild_pointwise;
template <class Op, class... A>
struct rebuild_pointwise<Op, meta::type_list<A...>> {
  using type = pointwise<Op, A...>;
};
template <class Op, class... A, std::size_t K>
struct lift<pointwise<Op, A...>, K> {
  using args = lift_args<K, meta::type_list<>, A...>;
  using type = typename rebuild_pointwise<Op, typename args::type>::type;
  static constexpr std::size_t next = args::next;
};
template <class Op, int Axis, bool Keep, class A, std::size_t K>
struct lift<reduction<Op, Axis, Keep, A>, K> {
  using type = reduction<Op, Axis, Keep, typename lift<A, K>::type>;
  static constexpr std::size_t next = lift<A, K>::next;
};
template <class V, class A, std::size_t K>
struct lift<view_node<V, A>, K> {
  using type = view_node<V, typename lift<A, K>::type>;
  static constexpr std::size_t next = lift<A, K>::next;
};
template <class A, class B, std::size_t K>
struct lift<matmul_node<A, B>, K> {
  using type = matmul_node<typename lift<A, K>::type, typename lift<B, lift<A, K>::next>::type>;
  static constexpr std::size_t next = lift<B, lift<A, K>::next>::next;
};
template <class Q, class Kt, class V, bool Causal, std::size_t K>
struct lift<attention_node<Q, Kt, V, Causal>, K> {
  using q = lift<Q, K>;
  using k = lift<Kt, q::next>;
  using v = lift<V, k::next>;
  using type = attention_node<typename q::type, typename k::type, typename v::type, Causal>;
  static constexpr std::size_t next = v::next;
};
template <class Fn, class A, class Out, std::size_t K>
struct lift<opaque_node<Fn, A, Out>, K> {
  static_assert(static_check::opaque_in_loss<opaque_node<Fn, A, Out>, false>::value);
  using type = A;
  static constexpr std::size_t next = K;
};

}  // namespace detail

/// E with its payloads lifted to inputs numbered from `First`.
template <class E, std::size_t First>
using lifted_t = typename detail::lift<E, First>::type;

/// How many payload leaves E holds (each occurrence counts).
template <class E>
inline constexpr std::size_t payload_count = detail::lift<E, 0>::next;

/// Views of E's payloads in lifting order: views[k] for the k-th payload leaf. A scalar's value is
/// copied to scalars[k] and viewed there as a rank-0 tensor (the caller keeps `scalars` alive).
template <class E, class T>
void collect_lifted(const E& e, strided<const T>* views, T* scalars, std::size_t& k) {
  if constexpr (E::desc.kind == node_kind::tensor) {
    views[k++] = e.view;
  } else if constexpr (E::desc.kind == node_kind::scalar) {
    scalars[k] = e.value;
    views[k] = strided<const T>{&scalars[k], dims{}, {}};
    ++k;
  } else if constexpr (E::has_payload) {
    for_each_child(e, [&](const auto& c) { collect_lifted(c, views, scalars, k); });
  }
}

}  // namespace fusebox::autodiff
