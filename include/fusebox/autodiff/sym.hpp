// autodiff/sym.hpp: node types without storage, for the graphs autodiff builds as types only.
//
// A captured expression's node types hold their operands by value (a pointwise node a std::tuple
// of them), so a type is as large as its expression *tree*. A backward reads each gradient two or
// three times, so its trees grow exponentially with depth while its DAG of distinct types stays
// small; and GCC 12 lays out (and checks the empty subobjects of) every class by walking its
// subobject tree: a gradient of 8 tanh-times-self layers took 60 s and 11 GB just to complete its
// types, a pre-norm attention block's ran out of memory. The joint graph (the lifted loss and its
// gradients) is never an object: it is lowered and planned from its types and bound from a table
// of views. So it is built from the types here, which carry the same static facts as the nodes of
// expr/node.hpp (desc, children, op or view, value_type, the flags) and no data: completing one
// costs the same however large the tree below it.
//
// Each one's `desc` is the library node's own, computed over stand-ins of its operands (leaves
// with the operands' descs), so the shape rules are not written twice.
// `to_sym<E>` turns a library expression type into these (the rules in ops/ are written with the
// library's names: naming a template-id does not complete it, so this conversion is cheap too).
// Depends on: expr/node.hpp, meta/type_list.hpp.
#pragma once

#include <cstddef>

#include "fusebox/expr/custom.hpp"
#include "fusebox/expr/gather.hpp"
#include "fusebox/expr/grad_nodes.hpp"
#include "fusebox/expr/node.hpp"
#include "fusebox/expr/spatial.hpp"
#include "fusebox/meta/type_list.hpp"

namespace fusebox::autodiff {

namespace detail {
/// A leaf with E's static facts: what a library node is instantiated over to compute its desc.
template <class E>
struct stand_in : expr_base {
  using value_type = typename E::value_type;
  using children = meta::type_list<>;
  static constexpr node_desc desc = E::desc;
  static constexpr bool has_payload = false, symbolic = E::symbolic, fullgraph = E::fullgraph;
};
}  // namespace detail

namespace sym {

template <class Op, class... A>
struct pointwise : expr_base {
  using value_type = typename meta::at_t<0, meta::type_list<A...>>::value_type;
  using children = meta::type_list<A...>;
  using op = Op;
  static constexpr node_desc desc = fusebox::pointwise<Op, detail::stand_in<A>...>::desc;
  static constexpr bool has_payload = (A::has_payload || ...);
  static constexpr bool symbolic = (A::symbolic || ...), fullgraph = (A::fullgraph || ...);
};

template <class Op, int Axis, bool Keep, class A>
struct reduction : expr_base {
  using value_type = typename A::value_type;
  using children = meta::type_list<A>;
  using op = Op;
  static constexpr node_desc desc = fusebox::reduction<Op, Axis, Keep, detail::stand_in<A>>::desc;
  static constexpr bool has_payload = A::has_payload, symbolic = A::symbolic, fullgraph = A::fullgraph;
};

template <class A, class B>
struct matmul : expr_base {
  using value_type = typename A::value_type;
  using children = meta::type_list<A, B>;
  static constexpr node_desc desc = fusebox::matmul_node<detail::stand_in<A>, detail::stand_in<B>>::desc;
  static constexpr bool has_payload = A::has_payload || B::has_payload;
  static constexpr bool symbolic = A::symbolic || B::symbolic, fullgraph = A::fullgraph || B::fullgraph;
};

template <class V, class A>
struct view_node : expr_base {
  using value_type = typename A::value_type;
  using children = meta::type_list<A>;
  using view = V;
  static constexpr node_desc desc = fusebox::view_node<V, detail::stand_in<A>>::desc;
  static constexpr bool has_payload = A::has_payload, symbolic = A::symbolic, fullgraph = A::fullgraph;
};

template <class Q, class K, class V, bool Causal>
struct attention : expr_base {
  using value_type = typename Q::value_type;
  using children = meta::type_list<Q, K, V>;
  static constexpr bool causal = Causal;
  static constexpr node_desc desc =
      fusebox::attention_node<detail::stand_in<Q>, detail::stand_in<K>, detail::stand_in<V>, Causal>::desc;
  static constexpr bool has_payload = Q::has_payload || K::has_payload || V::has_payload;
  static constexpr bool symbolic = Q::symbolic || K::symbolic || V::symbolic;
  static constexpr bool fullgraph = Q::fullgraph || K::fullgraph || V::fullgraph;
};

template <class Op, class... A>
struct spatial : expr_base {
  using value_type = typename meta::at_t<0, meta::type_list<A...>>::value_type;
  using children = meta::type_list<A...>;
  using op = Op;
  static constexpr node_desc desc = fusebox::spatial_node<Op, detail::stand_in<A>...>::desc;
  static constexpr bool has_payload = (A::has_payload || ...);
  static constexpr bool symbolic = (A::symbolic || ...), fullgraph = (A::fullgraph || ...);
};

template <class Op, class... A>
struct custom : expr_base {
  using value_type = typename meta::at_t<0, meta::type_list<A...>>::value_type;
  using children = meta::type_list<A...>;
  using op = Op;
  static constexpr node_desc desc = fusebox::custom_node<Op, detail::stand_in<A>...>::desc;
  static constexpr bool has_payload = (A::has_payload || ...);
  static constexpr bool symbolic = (A::symbolic || ...), fullgraph = (A::fullgraph || ...);
};

template <class Op, class A, class Ids>
struct gather : expr_base {
  using value_type = typename A::value_type;
  using children = meta::type_list<A, Ids>;
  using op = Op;
  static constexpr node_desc desc = fusebox::gather_node<Op, detail::stand_in<A>, detail::stand_in<Ids>>::desc;
  static constexpr bool has_payload = A::has_payload || Ids::has_payload;
  static constexpr bool symbolic = A::symbolic || Ids::symbolic, fullgraph = A::fullgraph || Ids::fullgraph;
};

template <int Part, bool Causal, class Q, class K, class V, class O, class G>
struct attention_backward : expr_base {
  using value_type = typename Q::value_type;
  using children = meta::type_list<Q, K, V, O, G>;
  static constexpr bool causal = Causal;
  static constexpr node_desc desc =
      fusebox::attention_backward_node<Part, Causal, detail::stand_in<Q>, detail::stand_in<K>, detail::stand_in<V>,
                                       detail::stand_in<O>, detail::stand_in<G>>::desc;
  static constexpr bool has_payload = false;
  static constexpr bool symbolic = Q::symbolic || K::symbolic || V::symbolic || O::symbolic || G::symbolic;
  static constexpr bool fullgraph = Q::fullgraph || K::fullgraph || V::fullgraph || O::fullgraph || G::fullgraph;
};

template <std::size_t Axis, std::size_t Begin, std::size_t Total, class... G>
struct pad : expr_base {
  using value_type = typename meta::at_t<0, meta::type_list<G...>>::value_type;
  using children = meta::type_list<G...>;
  static constexpr node_desc desc = fusebox::pad_node<Axis, Begin, Total, detail::stand_in<G>...>::desc;
  static constexpr std::size_t end = fusebox::pad_node<Axis, Begin, Total, detail::stand_in<G>...>::end;
  static constexpr bool has_payload = (G::has_payload || ...);
  static constexpr bool symbolic = (G::symbolic || ...), fullgraph = (G::fullgraph || ...);
};

}  // namespace sym

namespace detail {
template <class E>
struct to_sym {
  using type = E;  // leaves, and types that are already sym nodes
};
template <class Op, class... A>
struct to_sym<fusebox::pointwise<Op, A...>> {
  using type = sym::pointwise<Op, typename to_sym<A>::type...>;
};
template <class Op, int Axis, bool Keep, class A>
struct to_sym<fusebox::reduction<Op, Axis, Keep, A>> {
  using type = sym::reduction<Op, Axis, Keep, typename to_sym<A>::type>;
};
template <class A, class B>
struct to_sym<matmul_node<A, B>> {
  using type = sym::matmul<typename to_sym<A>::type, typename to_sym<B>::type>;
};
template <class V, class A>
struct to_sym<fusebox::view_node<V, A>> {
  using type = sym::view_node<V, typename to_sym<A>::type>;
};
template <class Op, class... A>
struct to_sym<spatial_node<Op, A...>> {
  using type = sym::spatial<Op, typename to_sym<A>::type...>;
};
template <class Op, class... A>
struct to_sym<custom_node<Op, A...>> {
  using type = sym::custom<Op, typename to_sym<A>::type...>;
};
template <class Op, class A, class Ids>
struct to_sym<gather_node<Op, A, Ids>> {
  using type = sym::gather<Op, typename to_sym<A>::type, typename to_sym<Ids>::type>;
};
template <class Q, class K, class V, bool Causal>
struct to_sym<attention_node<Q, K, V, Causal>> {
  using type = sym::attention<typename to_sym<Q>::type, typename to_sym<K>::type, typename to_sym<V>::type, Causal>;
};
template <int Part, bool Causal, class Q, class K, class V, class O, class G>
struct to_sym<attention_backward_node<Part, Causal, Q, K, V, O, G>> {
  using type = sym::attention_backward<Part, Causal, typename to_sym<Q>::type, typename to_sym<K>::type,
                                       typename to_sym<V>::type, typename to_sym<O>::type, typename to_sym<G>::type>;
};
template <std::size_t Axis, std::size_t Begin, std::size_t Total, class... G>
struct to_sym<pad_node<Axis, Begin, Total, G...>> {
  using type = sym::pad<Axis, Begin, Total, typename to_sym<G>::type...>;
};
}  // namespace detail

/// E (library node types, or sym ones) as sym node types.
template <class E>
using to_sym_t = typename detail::to_sym<E>::type;

}  // namespace fusebox::autodiff
