// ir/graph.hpp: lowering an expression type to the graph IR, a constexpr array of plain nodes.
//
// Node ids are a post-order of the expression tree, so they are already a topological order.
// Identical subtrees merge into one node (the same `e` used by `e / sum(e)` is computed once) when
// they hold no run-time payload; a subtree that holds a scalar, a captured tensor or a user
// function stays one node per occurrence, because two occurrences of one type may hold different
// values (`x * 0.5 + x * 0.7`). `payload_slot` numbers the payload nodes in the same post-order,
// and `collect_payloads` walks an expression object in that order at run time to find them.
// A node that holds a payload links to the earlier occurrences of its type (`twin`), so that the
// call can find which of them are one value (ir/value_numbers.hpp).
//
// `graph<Roots...>::node_types` maps a node id back to its expression type, for the kernels.
// Depends on: expr/node.hpp, ir/node_kinds.hpp, meta/type_list.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

#include "fusebox/expr/node.hpp"
#include "fusebox/ir/node_kinds.hpp"
#include "fusebox/meta/type_list.hpp"

namespace fusebox::ir {

inline constexpr int max_inputs = 5;  // attention_backward reads q, k, v, o and the gradient
/// The most expression copies one graph may lower (graph<...>::expanded_size). The planner is
/// constexpr and superlinear in the node count: at ~600 copies (3 residual blocks with captured
/// weights, static shapes) GCC 12 stops at its default constexpr operation limit, at ~2400 (4
/// blocks) it first needs 9 GB and minutes. 512 is above any single block of the reference
/// models. GCC's own cost for such types also grows with the tree, so past ~5 blocks the compiler
/// is slow before this check runs: the remedy in the message (compile the repeated block) is the
/// one that scales.
inline constexpr std::size_t max_expanded_nodes = 512;

struct node {
  node_desc desc{};
  int inputs[max_inputs] = {-1, -1, -1, -1, -1};
  int n_inputs = 0;
  int payload_slot = -1;      ///< tensor, scalar and opaque nodes: index into the call's payload table
  const void* type = nullptr;  ///< meta::type_tag of the expression type
  bool mergeable = false;
  /// A node that holds a payload: the last earlier node of the same expression type, or -1.
  /// Following `twin` visits every earlier occurrence of the type, which are the same value as
  /// this one exactly when their payloads are equal: only the call can tell (ir/value_numbers.hpp).
  int twin = -1;
};

namespace detail {

// ---- type level: the node types in id order ----

template <class E, class All, class Seen, bool Merge = !E::has_payload && meta::contains<Seen, E>::value>
struct collect;

template <class Children, class All, class Seen>
struct collect_children;
template <class All, class Seen>
struct collect_children<meta::type_list<>, All, Seen> {
  using all = All;
  using seen = Seen;
};
template <class C, class... Cs, class All, class Seen>
struct collect_children<meta::type_list<C, Cs...>, All, Seen> {
  using first = collect<C, All, Seen>;
  using rest = collect_children<meta::type_list<Cs...>, typename first::all, typename first::seen>;
  using all = typename rest::all;
  using seen = typename rest::seen;
};

template <class E, class All, class Seen>
struct collect<E, All, Seen, true> {  // merged with an earlier identical subtree
  using all = All;
  using seen = Seen;
};
template <class E, class All, class Seen>
struct collect<E, All, Seen, false> {
  using kids = collect_children<typename E::children, All, Seen>;
  using all = typename meta::push_back<typename kids::all, E>::type;
  using seen = std::conditional_t<E::has_payload, typename kids::seen,
                                  typename meta::push_back<typename kids::seen, E>::type>;
};

// ---- the size of the lowering, before doing it ----

// Nodes the lowering visits: a payload-free subtree merges (it costs one visit however often it
// is used), a subtree that holds a payload is visited once per use. Computed once per distinct
// type, so it is cheap even where the lowering would not be: a value used k times is k copies of
// its expression, and a residual stack `h = h + f(layer_norm(h) ...)` of L blocks with captured
// weights has about 4^L of them.
template <class E>
struct expanded_nodes;
template <class... C>
constexpr std::size_t expanded_children(meta::type_list<C...>) {
  return (std::size_t{0} + ... + expanded_nodes<C>::value);
}
template <class E>
struct expanded_nodes {
  static constexpr std::size_t value = E::has_payload ? 1 + expanded_children(typename E::children{}) : 1;
};

/// Stands in for the lowering of a graph over the limit, so that the static_assert below is the
/// one error instead of a compiler that runs out of memory.
struct over_limit {
  using all = meta::type_list<>;
};

// ---- value level: the nodes ----

template <std::size_t N>
struct builder {
  std::array<node, N> nodes{};
  int count = 0;
  int payloads = 0;
};

/// The position of E's first occurrence in All (node_types), or -1. Merging finds an earlier node
/// by type this way, not by comparing type_tag addresses: GCC does not take `&tag<A> == &tag<B>`
/// as a constant expression under -fsanitize=undefined, so such a comparison here stopped every
/// fusebox program from building with UBSan.
template <class E, class... All>
constexpr int first_index(meta::type_list<All...>) {
  // Flags and a loop, not a fold of std::is_same_v: as autodiff's index_in (dag.hpp).
  constexpr bool same[] = {FUSEBOX_SAME_TYPE(E, All)..., false};
  for (int i = 0; i < static_cast<int>(sizeof...(All)); ++i)
    if (same[i]) return i;
  return -1;
}

/// The position of E's last occurrence in All before position `end`, or -1 (a payload node's
/// twin: ids are positions in All, since lower_into walks the tree as `collect` did).
template <class E, class... All>
constexpr int last_index_before(meta::type_list<All...>, int end) {
  constexpr bool same[] = {FUSEBOX_SAME_TYPE(E, All)..., false};
  int found = -1;
  for (int i = 0; i < end && i < static_cast<int>(sizeof...(All)); ++i)
    if (same[i]) found = i;
  return found;
}

template <class E, class All, std::size_t N>
constexpr int lower_into(builder<N>& b) {
  if constexpr (!E::has_payload) {
    // lower_into walks the tree as `collect` did, so a payload-free type seen before has the id
    // of its first occurrence in All.
    constexpr int first = first_index<E>(All{});
    if (first >= 0 && first < b.count) return first;
  }
  node n{};
  n.desc = E::desc;
  n.type = &meta::type_tag<E>;
  n.mergeable = !E::has_payload;
  [&]<class... C>(meta::type_list<C...>) {
    ((n.inputs[n.n_inputs++] = lower_into<C, All>(b)), ...);
  }(typename E::children{});
  if constexpr (E::has_payload) n.twin = last_index_before<E>(All{}, b.count);
  if constexpr (is_payload_kind(E::desc.kind)) n.payload_slot = b.payloads++;
  b.nodes[b.count] = n;
  return b.count++;
}

}  // namespace detail

/// The graph of one or more root expressions (several roots: a model returning a tuple).
template <class... Roots>
struct graph {
  /// Copies of expressions the lowering visits (see detail::expanded_nodes).
  static constexpr std::size_t expanded_size = (std::size_t{0} + ... + detail::expanded_nodes<Roots>::value);
  static_assert(expanded_size <= max_expanded_nodes,
                "fusebox: this model's expression has more node copies than max_expanded_nodes (512): a value "
                "that holds captured tensors or scalars and is used k times is k copies of its expression, so "
                "a stack of L residual blocks with captured weights grows as 4^L. Compile the repeated block as "
                "its own function with its weights as arguments (regional compilation: one compile serves "
                "every layer), or pass the weights as arguments of the compiled model.");
  using node_types = typename std::conditional_t<
      (expanded_size <= max_expanded_nodes),
      detail::collect_children<meta::type_list<Roots...>, meta::type_list<>, meta::type_list<>>,
      detail::over_limit>::all;
  static constexpr std::size_t size = node_types::size;

 private:
  struct lowered {
    std::array<node, size> nodes;
    std::array<int, sizeof...(Roots)> outputs;
    int payloads;
    int count;  ///< nodes the lowering wrote (the check below; a type_tag address compared with nullptr
                ///< is not a constant expression under -fsanitize=undefined's null checks)
  };
  static constexpr lowered lower() {
    detail::builder<size> b;
    std::array<int, sizeof...(Roots)> outs{};
    if constexpr (expanded_size <= max_expanded_nodes) {
      int k = 0;
      ((outs[k++] = detail::lower_into<Roots, node_types>(b)), ...);
    }
    return {b.nodes, outs, b.payloads, b.count};
  }
  static constexpr lowered result = lower();
  static_assert(result.count == static_cast<int>(size), "fusebox internal: lowering and node_types disagree");

 public:
  static constexpr std::array<node, size> nodes = result.nodes;
  static constexpr std::array<int, sizeof...(Roots)> outputs = result.outputs;
  static constexpr int payloads = result.payloads;

  template <int Id>
  using type_of = meta::at_t<static_cast<std::size_t>(Id), node_types>;
};

/// Records the address of every payload node of `e`, in the order the lowering numbered them.
template <class E>
void collect_payloads(const E& e, const void** slots, int& k) {
  if constexpr (E::has_payload) {
    for_each_child(e, [&](const auto& c) { collect_payloads(c, slots, k); });
    // An opaque node's payload is read through opaque_base where its function's type is unknown.
    if constexpr (E::desc.kind == node_kind::opaque) slots[k++] = static_cast<const opaque_base*>(&e);
    else if constexpr (is_payload_kind(E::desc.kind)) slots[k++] = &e;
  }
}

}  // namespace fusebox::ir
