// autodiff/dag.hpp: an expression type seen as the DAG of its distinct node types (type-identical
// subtrees are one node, as the lowering merges them), and the small type-list tools the passes
// over it share. Folds and pack expansions rather than recursion over the graph, so a large model
// does not run out of template depth.
// Depends on: expr/node.hpp, meta/type_list.hpp.
#pragma once

#include <cstddef>
#include <type_traits>

#include "fusebox/expr/node.hpp"
#include "fusebox/meta/type_list.hpp"

namespace fusebox::autodiff {
namespace detail {

template <class L, class E, bool Seen = meta::contains<L, E>::value>
struct visit;
template <class L, class Children>
struct visit_all;
template <class L>
struct visit_all<L, meta::type_list<>> {
  using type = L;
};
template <class L, class C, class... Cs>
struct visit_all<L, meta::type_list<C, Cs...>> {
  using type = typename visit_all<typename visit<L, C>::type, meta::type_list<Cs...>>::type;
};
template <class L, class E>
struct visit<L, E, true> {
  using type = L;
};
template <class L, class E>
struct visit<L, E, false> {
  using type = typename meta::push_back<typename visit_all<L, typename E::children>::type, E>::type;
};

inline constexpr std::size_t npos = static_cast<std::size_t>(-1);

/// Position of E in the list (its last, where a graph's node types hold it twice), or npos.
/// Instantiated once per node of a program over all its nodes: flags from FUSEBOX_SAME_TYPE and a
/// loop, not a fold of std::is_same_v (the pairs' instantiations and the fold were ~10% of a GPT-2
/// block's gradient unit; docs/benchmarks.md, run AH).
template <class E, class... Ts>
constexpr std::size_t index_in(meta::type_list<Ts...>) {
  constexpr bool same[] = {FUSEBOX_SAME_TYPE(E, Ts)..., false};
  for (std::size_t i = sizeof...(Ts); i-- > 0;)
    if (same[i]) return i;
  return npos;
}

// Concatenation as a fold over an operator, not a recursion as long as the list of lists.
template <class L>
struct list_of {};
template <class... A, class... B>
list_of<meta::type_list<A..., B...>> operator+(list_of<meta::type_list<A...>>, list_of<meta::type_list<B...>>);
template <class L>
struct unwrap_list;
template <class L>
struct unwrap_list<list_of<L>> {
  using type = L;
};
template <class... Ls>
struct concat {
  using type = typename unwrap_list<decltype((list_of<meta::type_list<>>{} + ... + list_of<Ls>{}))>::type;
};

}  // namespace detail

/// The distinct node types of the expressions Roots, each once, operands before their users.
template <class... Roots>
using post_order = typename detail::visit_all<meta::type_list<>, meta::type_list<Roots...>>::type;

}  // namespace fusebox::autodiff
