// autodiff/eager.hpp: runs payload-free expressions op by op: the eager mode of grad(), and the
// baseline its compiled form is compared against (as eager() is for compile()).
//
// Each distinct node (post_order of the roots) is evaluated once, as a one-node program through
// backend/cpu/evaluate.hpp with its operands as tensor leaves, so every intermediate is materialised, as
// a PyTorch eager backward does. Views take no copy. A value is released after its last reader,
// so the peak is what torch's autograd would hold, not the sum of all intermediates.
// Input leaves read the call's bound inputs (the table a compiled call binds too).
// Evaluates autodiff/sym.hpp's node types (each rebuilt as a library node over tensor leaves).
// Depends on: autodiff/{dag,sym}.hpp, backend/cpu/evaluate.hpp, core/tensor.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <tuple>
#include <utility>

#include "fusebox/autodiff/dag.hpp"
#include "fusebox/autodiff/sym.hpp"
#include "fusebox/backend/cpu/evaluate.hpp"
#include "fusebox/core/tensor.hpp"

namespace fusebox::autodiff {
namespace detail {

template <class T, class E>
using value_of = tensor<T, shape_of_t<E>>;

template <class T, class E>
using leaf_of = tensor_leaf<T, shape_of_t<E>>;

template <class T, class N, class Values, class Nodes>
struct eager_node;

template <class T, std::size_t I, class S, class Values, class Nodes>
struct eager_node<T, input_leaf<I, T, S>, Values, Nodes> {
  template <class Inputs>
  static tensor<T, S> run(const Values&, const Inputs& inputs) {
    const strided<const T>& v = inputs.views[I];
    return tensor<T, S>(storage_ptr{}, const_cast<T*>(v.data), v.shape, v.stride);
  }
};

/// Node I's value, a direct base of node_values.
template <std::size_t I, class V>
struct value_slot {
  V value;
};
/// Each node's value (empty until evaluated, and again once its last reader has run), found by the
/// node's position. Not a std::tuple: std::get<I> on a tuple of N converts through I nested bases,
/// and GCC's -Wsequence-point (in -Wall) compares every pair of those conversions, ~I^3 work for
/// each index a program reads: half of a GPT-2 block's gradient unit (issue 22, docs/benchmarks.md).
/// Here each value is one base away.
template <class Seq, class... V>
struct node_values;
template <std::size_t... I, class... V>
struct node_values<std::index_sequence<I...>, V...> : value_slot<I, V>... {};

template <std::size_t I, class V>
V& node_value(value_slot<I, V>& s) {
  return s.value;
}
template <std::size_t I, class V>
const V& node_value(const value_slot<I, V>& s) {
  return s.value;
}

template <class T, class E, class Values, class Nodes>
const value_of<T, E>& operand_value(const Values& values) {
  return *node_value<index_in<E>(Nodes{})>(values);
}

template <class T, class Op, class... A, class Values, class Nodes>
struct eager_node<T, sym::pointwise<Op, A...>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const pointwise<Op, leaf_of<T, A>...> e{{}, {leaf_of<T, A>{{}, operand_value<T, A, Values, Nodes>(values).view()}...}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, class Op, int Axis, bool Keep, class A, class Values, class Nodes>
struct eager_node<T, sym::reduction<Op, Axis, Keep, A>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const reduction<Op, Axis, Keep, leaf_of<T, A>> e{{}, {{}, operand_value<T, A, Values, Nodes>(values).view()}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, class A, class B, class Values, class Nodes>
struct eager_node<T, sym::matmul<A, B>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const matmul_node<leaf_of<T, A>, leaf_of<T, B>> e{{},
                                                      {{}, operand_value<T, A, Values, Nodes>(values).view()},
                                                      {{}, operand_value<T, B, Values, Nodes>(values).view()}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, class Q, class K, class V, bool Causal, class Values, class Nodes>
struct eager_node<T, sym::attention<Q, K, V, Causal>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const attention_node<leaf_of<T, Q>, leaf_of<T, K>, leaf_of<T, V>, Causal> e{
        {},
        {{}, operand_value<T, Q, Values, Nodes>(values).view()},
        {{}, operand_value<T, K, Values, Nodes>(values).view()},
        {{}, operand_value<T, V, Values, Nodes>(values).view()}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, int Part, bool Causal, class Q, class K, class V, class O, class G, class Values, class Nodes>
struct eager_node<T, sym::attention_backward<Part, Causal, Q, K, V, O, G>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const attention_backward_node<Part, Causal, leaf_of<T, Q>, leaf_of<T, K>, leaf_of<T, V>, leaf_of<T, O>,
                                  leaf_of<T, G>>
        e{{},
          {{}, operand_value<T, Q, Values, Nodes>(values).view()},
          {{}, operand_value<T, K, Values, Nodes>(values).view()},
          {{}, operand_value<T, V, Values, Nodes>(values).view()},
          {{}, operand_value<T, O, Values, Nodes>(values).view()},
          {{}, operand_value<T, G, Values, Nodes>(values).view()}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, std::size_t Axis, std::size_t Begin, std::size_t Total, class... G, class Values, class Nodes>
struct eager_node<T, sym::pad<Axis, Begin, Total, G...>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const pad_node<Axis, Begin, Total, leaf_of<T, G>...> e{
        {}, {leaf_of<T, G>{{}, operand_value<T, G, Values, Nodes>(values).view()}...}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, class Op, class... A, class Values, class Nodes>
struct eager_node<T, sym::spatial<Op, A...>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const spatial_node<Op, leaf_of<T, A>...> e{{}, {leaf_of<T, A>{{}, operand_value<T, A, Values, Nodes>(values).view()}...}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, class Op, class... A, class Values, class Nodes>
struct eager_node<T, sym::custom<Op, A...>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const custom_node<Op, leaf_of<T, A>...> e{{}, {leaf_of<T, A>{{}, operand_value<T, A, Values, Nodes>(values).view()}...}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, class Op, class A, class Ids, class Values, class Nodes>
struct eager_node<T, sym::gather<Op, A, Ids>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const gather_node<Op, leaf_of<T, A>, leaf_of<T, Ids>> e{{},
                                                            {{}, operand_value<T, A, Values, Nodes>(values).view()},
                                                            {{}, operand_value<T, Ids, Values, Nodes>(values).view()}};
    return evaluate(e, fusebox::detail::eager_runtime());
  }
};
template <class T, class V, class A, class Values, class Nodes>
struct eager_node<T, sym::view_node<V, A>, Values, Nodes> {
  template <class Inputs>
  static auto run(const Values& values, const Inputs&) {
    const auto& in = operand_value<T, A, Values, Nodes>(values);
    const strided<const T> s = V::apply(in.view());
    return value_of<T, sym::view_node<V, A>>(in.owner(), const_cast<T*>(s.data), s.shape, s.stride);
  }
};

template <class T, class Nodes>
struct values_of;
template <class T, class... N>
struct values_of<T, meta::type_list<N...>> {
  using type = node_values<std::index_sequence_for<N...>, std::optional<value_of<T, N>>...>;
};

/// For each node, the position of its last reader (roots: never released).
template <class Nodes, class... Roots>
constexpr auto last_uses() {
  constexpr std::size_t n = Nodes::size;
  std::array<std::size_t, n> last{};
  for (std::size_t i = 0; i < n; ++i) last[i] = i;
  [&]<class... N>(meta::type_list<N...>) {
    std::size_t c = 0;
    (([&] {
       [&]<class... K>(meta::type_list<K...>) {
         ((last[index_in<K>(Nodes{})] = c), ...);
       }(typename N::children{});
       ++c;
     }()),
     ...);
  }(Nodes{});
  ((last[index_in<Roots>(Nodes{})] = n), ...);
  return last;
}

}  // namespace detail

/// Evaluates the payload-free expressions Roots op by op; `inputs.views[i]` is input i.
/// Returns one new contiguous tensor per root.
template <class T, class... Roots, class Inputs>
std::tuple<tensor<T, shape_of_t<Roots>>...> evaluate_op_by_op(const Inputs& inputs) {
  using nodes = post_order<Roots...>;
  using values_t = typename detail::values_of<T, nodes>::type;
  static constexpr auto last = detail::last_uses<nodes, Roots...>();
  values_t values;
  [&]<class... N>(meta::type_list<N...>) {
    std::size_t j = 0;
    (([&] {
       detail::node_value<detail::index_in<N>(nodes{})>(values).emplace(
           detail::eager_node<T, N, values_t, nodes>::run(values, inputs));
       // Release what nothing after node j reads.
       [&]<class... M>(meta::type_list<M...>) {
         ((last[detail::index_in<M>(nodes{})] == j ? detail::node_value<detail::index_in<M>(nodes{})>(values).reset()
                                                   : void()),
          ...);
       }(typename N::children{});
       ++j;
     }()),
     ...);
  }(nodes{});
  // Results: a root that is a leaf or a view, or a root that appeared before, is copied (no result
  // shares memory with an argument or with another result).
  return [&]<std::size_t... R>(std::index_sequence<R...>) {
    using roots = meta::type_list<Roots...>;
    constexpr std::array<std::size_t, sizeof...(Roots)> at{detail::index_in<Roots>(nodes{})...};
    auto take = [&]<std::size_t Q>(std::integral_constant<std::size_t, Q>) {
      const auto& v = *detail::node_value<at[Q]>(values);
      bool repeated = false;
      for (std::size_t q = 0; q < Q; ++q) repeated = repeated || at[q] == at[Q];
      using out_t = tensor<T, shape_of_t<meta::at_t<Q, roots>>>;
      constexpr bool view = meta::at_t<Q, roots>::desc.kind == node_kind::view;
      return (v.owner() && v.contiguous() && !repeated && !view) ? out_t(v) : out_t(v.clone());
    };
    return std::tuple<tensor<T, shape_of_t<Roots>>...>{take(std::integral_constant<std::size_t, R>{})...};
  }(std::index_sequence_for<Roots...>{});
}

}  // namespace fusebox::autodiff
