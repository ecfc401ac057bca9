// autodiff/backward.hpp: the reverse pass, at the type level. Given a lifted loss (payload-free:
// autodiff/lift.hpp), it builds the gradient of the loss with respect to chosen input leaves as
// expression types, from the ops' own derivative rules (autodiff/rule.hpp, written in ops/).
//
// The forward is a tree of types; identical payload-free subtrees are one value (the lowering
// merges them), so the pass works on the DAG of distinct node types: `post_order<Root>` lists
// them, each once, operands first. The gradient of node N is the sum, over every edge from N into
// a consumer C (operand slot I of C), of C's rule for operand I applied to C's gradient, summed
// down to N's shape where N was broadcast (`sum_to`). The loss's own gradient is the seed, a
// rank-0 input bound to 1. Only nodes between the loss and the chosen leaves are visited: a
// gradient is asked for from a leaf upwards, so operands that need none (targets, constants)
// never get one.
//
// Because the result refers to forward nodes by their types, the lowering of the joint roots
// (loss, gradients...) merges them with the forward: one graph, planned once, where the backward
// reuses forward values (saved) or fuses next to them.
//
// Constants a rule needs (mean's 1 / n) are rank-0 inputs too, one slot per forward node
// (`context::constant<Y>`), valued by the rule's `constant<T, Y>(shape_of)` when the call is bound:
// `shape_of.template operator()<E>()` is the call's extents of node type E, so a constant that
// depends on a `dyn` extent is right for every call.
// Gradients are built from autodiff/sym.hpp's storage-free node types (rules' results are converted).
// Depends on: autodiff/{dag,rule,sym}.hpp, ops/elementwise.hpp, ops/reduce.hpp, expr/node.hpp, meta/.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

#include "fusebox/autodiff/dag.hpp"
#include "fusebox/autodiff/rule.hpp"
#include "fusebox/autodiff/sym.hpp"
#include "fusebox/expr/node.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/meta/type_list.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/reduce.hpp"

namespace fusebox::autodiff {

namespace static_check {
template <class Node, bool Ok>
struct no_derivative {
  static_assert(Ok, "fusebox::grad(f): the loss uses an op that has no derivative rule (the node above; "
                    "autodiff::derivative<Op> is not specialised for its op). Fix: write a derivative for the op "
                    "next to it in ops/ (autodiff/rule.hpp says how), or express the loss with other ops");
  static constexpr bool value = Ok;
};
}  // namespace static_check

namespace detail {

inline constexpr std::size_t ir_max_inputs = static_cast<std::size_t>(ir::max_inputs);  // a node's operands

// ---- edges into a node ----

template <class C, std::size_t I>
struct edge {};

template <class N, class C, class Seq = std::make_index_sequence<C::children::size>>
struct edges_in;
template <class N, class C, std::size_t... I>
struct edges_in<N, C, std::index_sequence<I...>> {
  using type = typename concat<std::conditional_t<std::is_same_v<N, meta::at_t<I, typename C::children>>,
                                                  meta::type_list<edge<C, I>>, meta::type_list<>>...>::type;
};

template <class N, class Nodes>
struct consumers;
template <class N, class... Cs>
struct consumers<N, meta::type_list<Cs...>> {
  using type = typename concat<typename edges_in<N, Cs>::type...>::type;
};

// ---- which derivative a node uses ----

template <class N>
struct rule_key {
  using type = N;  // matmul: keyed by the node type
};
template <class N>
  requires requires { typename N::op; }
struct rule_key<N> {
  using type = typename N::op;
};
template <class N>
  requires requires { typename N::view; }
struct rule_key<N> {
  using type = typename N::view;
};
template <class A, class B>
struct rule_key<sym::matmul<A, B>> {
  using type = matmul_node<A, B>;  // named, never completed
};
template <class Q, class K, class V, bool Causal>
struct rule_key<sym::attention<Q, K, V, Causal>> {
  using type = attention_node<Q, K, V, Causal>;
};

template <class Key>
concept has_rule = !requires { typename derivative<Key>::undefined; };

// ---- summing a contribution down to its operand's shape ----

// -1: done; otherwise 2 * axis + keepdim of the next sum. Extra leading dimensions go first (summed
// away), then each dimension where the contribution is wider than the target's extent 1.
constexpr int next_sum(const dims& c, const dims& t) {
  if (c.rank > t.rank) return 0;
  for (std::size_t d = 0; d < c.rank; ++d)
    if (c.extent[d] != 1 && t.extent[d] == 1) return static_cast<int>(2 * d + 1);
  return -1;
}

template <class C, class Target, int Step = next_sum(C::desc.shape, Target::value)>
struct sum_to {
  using type = typename sum_to<sym::reduction<ops::sum, Step / 2, (Step % 2) == 1, C>, Target>::type;
};
template <class C, class Target>
struct sum_to<C, Target, -1> {
  using type = C;
};

// ---- accumulation ----

template <class A, class B>
struct add_grads {
  using type = sym::pointwise<ops::add, A, B>;
};
template <class A>
struct add_grads<A, no_grad> {
  using type = A;
};
template <class B>
struct add_grads<no_grad, B> {
  using type = B;
};
template <>
struct add_grads<no_grad, no_grad> {
  using type = no_grad;
};
// The pads of adjacent slices (a slice's gradient: ops/layout.hpp) are one pad of both operands,
// side by side: q | k | v sliced from one projection get one [.., 3C] gradient, written by one
// kernel, instead of three zero-filled tensors and a sum.
template <std::size_t A, std::size_t B1, std::size_t T, class... G1, std::size_t B2, class... G2>
  requires(sizeof...(G1) + sizeof...(G2) <= ir_max_inputs && sym::pad<A, B1, T, G1...>::end == B2)
struct add_grads<sym::pad<A, B1, T, G1...>, sym::pad<A, B2, T, G2...>> {
  using type = sym::pad<A, B1, T, G1..., G2...>;
};
template <std::size_t A, std::size_t B1, std::size_t T, class... G1, std::size_t B2, class... G2>
  requires(sizeof...(G1) + sizeof...(G2) <= ir_max_inputs && sym::pad<A, B2, T, G2...>::end == B1)
struct add_grads<sym::pad<A, B1, T, G1...>, sym::pad<A, B2, T, G2...>> {
  using type = sym::pad<A, B2, T, G2..., G1...>;
};

template <class Tape, class N, bool IsRoot = std::is_same_v<N, typename Tape::root>>
struct grad_of;

// C's rule for operand I at gradient G (no rule is asked for when C has no gradient).
template <class Tape, class C, std::size_t I, class G>
struct apply_rule {
  using key = typename rule_key<C>::type;
  static_assert(static_check::no_derivative<C, has_rule<key>>::value);
  using type = to_sym_t<typename derivative<key>::template vjp<I, G, C, typename Tape::ctx>>;
};
template <class Tape, class C, std::size_t I>
struct apply_rule<Tape, C, I, no_grad> {
  using type = no_grad;
};

template <class R, class N>
struct reduce_to {
  static_assert(broadcast(R::desc.shape, N::desc.shape).ok &&
                    broadcast(R::desc.shape, N::desc.shape).out.rank >= N::desc.shape.rank,
                "fusebox internal: a derivative rule returned a shape that does not broadcast to its operand");
  using type = typename sum_to<typename restate_for_sum<R, shape_holder<N>>::type, shape_holder<N>>::type;
};
template <class N>
struct reduce_to<no_grad, N> {
  using type = no_grad;
};

template <class Tape, class Edge, class N>
struct contribution;
template <class Tape, class C, std::size_t I, class N>
struct contribution<Tape, edge<C, I>, N> {
  using type = typename reduce_to<typename apply_rule<Tape, C, I, typename grad_of<Tape, C>::type>::type, N>::type;
};

template <class Tape, class N, class Edges>
struct accumulate;
template <class Tape, class N>
struct accumulate<Tape, N, meta::type_list<>> {
  using type = no_grad;
};
template <class Tape, class N, class E, class... Es>
struct accumulate<Tape, N, meta::type_list<E, Es...>> {
  using type = typename add_grads<typename accumulate<Tape, N, meta::type_list<Es...>>::type,
                                  typename contribution<Tape, E, N>::type>::type;
};

/// The gradient of the loss with respect to node N (no_grad when none flows into it), in a
/// shape that broadcasts to N's.
template <class Tape, class N>
struct grad_of<Tape, N, true> {
  using type = typename Tape::seed;
};
template <class Tape, class N>
struct grad_of<Tape, N, false> {
  using type = typename accumulate<Tape, N, typename consumers<N, typename Tape::nodes>::type>::type;
};

template <class G, class Leaf>
struct finish_gradient {
  using type = to_sym_t<exact<G, Leaf>>;
};
template <class Leaf>
struct finish_gradient<no_grad, Leaf> {
  using type = sym::pointwise<ops::zeros_like, Leaf>;
};

}  // namespace detail

/// What a rule can ask of the pass: rank-0 constants, one slot per forward node.
template <class T, class Nodes, std::size_t Base>
struct context {
  using value_type = T;
  template <class Y>
  using constant = input_leaf<Base + detail::index_in<Y>(Nodes{}), T, shape<>>;
};

/// The reverse pass over a lifted loss `Root` whose inputs 0 .. ConstBase-1 are the call's
/// arguments and lifted payloads. Inputs from ConstBase on: one constant slot per forward node,
/// then the seed (1).
template <class Root, std::size_t ConstBase>
struct tape {
  using root = Root;
  using value_type = typename Root::value_type;
  using nodes = post_order<Root>;
  using ctx = context<value_type, nodes, ConstBase>;
  static constexpr std::size_t const_base = ConstBase;
  static constexpr std::size_t seed_index = ConstBase + nodes::size;
  using seed = input_leaf<seed_index, value_type, shape<>>;
  /// Inputs the joint graph may read: arguments, payloads, constants, seed.
  static constexpr std::size_t inputs = seed_index + 1;

  /// d loss / d Leaf at exactly Leaf's shape (zeros when the loss does not depend on it).
  template <class Leaf>
  using gradient = typename detail::finish_gradient<typename detail::grad_of<tape, Leaf>::type, Leaf>::type;

  /// Writes each constant a rule asked for (and the seed) to values[i] for input i. `shape_of`:
  /// `shape_of.template operator()<E>()` gives the call's extents of node type E.
  template <class V, class ShapeOf>
  static void constants(V* values, const ShapeOf& shape_of) {
    values[seed_index] = V(1);
    [&]<class... N>(meta::type_list<N...>) {
      std::size_t i = 0;
      (([&] {
         using key = typename detail::rule_key<N>::type;
         if constexpr (requires { derivative<key>::template constant<V, N>(shape_of); })
           values[const_base + i] = derivative<key>::template constant<V, N>(shape_of);
         ++i;
       }()),
       ...);
    }(nodes{});
  }
  /// The extents of a node type when every one is static.
  struct static_shapes {
    template <class E>
    constexpr dims operator()() const {
      return E::desc.shape;
    }
  };
};

}  // namespace fusebox::autodiff
