// plan/planning.hpp: the planner's working state, shared by its passes: the nodes, the plan being
// written, and the facts one pass leaves for the next (group kinds and spaces, who consumes whom,
// which group is which product's epilogue). A pass reads and writes only this.
// Depends on: ir/{graph,value_numbers}.hpp, plan/plan.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/core/errors.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/ir/value_numbers.hpp"
#include "fusebox/plan/plan.hpp"

namespace fusebox::plan {

constexpr dims row_constant_shape(dims s) {
  if (s.rank > 0) s.extent[s.rank - 1] = 1;
  return s;
}

constexpr bool is_last_axis_reduce(const ir::node& n) {
  return n.desc.kind == node_kind::reduce &&
         static_cast<std::size_t>(n.desc.axis) + 1 == n.desc.shape.rank + (n.desc.keepdim ? 0 : 1);
}

template <std::size_t N>
struct planning {
  const std::array<ir::node, N>& nodes;
  plan_t<N> p{};
  bool twins = false;  ///< plan for payload twins being one value (make_plan's `twins`)
  std::size_t elem_bytes = 0;

  // From `group`: union-find parents, and per group root its kind and index space.
  std::array<int, N> parent{};
  std::array<group_kind, N> kind{};
  std::array<dims, N> space{};
  std::array<std::array<bool, N>, N> consumers_of{};  ///< consumers_of[p][c]: c reads p
  // From `epilogues`: group root -> the product it is the epilogue of, and back; -1 if none.
  std::array<int, N> epilogue_of_group{};
  std::array<int, N> epilogue_for_product{};

  static constexpr int n = static_cast<int>(N);

  constexpr int find(int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  constexpr bool fused(int i) const { return ir::traits(nodes[i].desc.kind).fused; }
  constexpr const dims& input_shape(int reduce_id) const { return nodes[nodes[reduce_id].inputs[0]].desc.shape; }
  /// The node whose memory a view ultimately looks at (itself for any other node).
  constexpr int source(int i) const {
    while (ir::traits(nodes[i].desc.kind).alias) i = nodes[i].inputs[0];
    return i;
  }
  /// f's memory holds f's own value for the rest of the call: computed by a kernel into memory
  /// of its own (not a leaf or a view, nor a product written into its epilogue's buffer).
  constexpr bool own_value(int f) const {
    const auto& t = ir::traits(nodes[f].desc.kind);
    if (!p.materialised[f] || p.kernel_of[f] < 0 || t.leaf || t.alias) return false;
    const kernel& kf = p.kernels[p.kernel_of[f]];
    return !(t.takes_epilogue && kf.node == f && kf.group >= 0);
  }
  /// The first node of i's type that holds i's value when the call numbers payloads equal (i
  /// itself unless planning for twins).
  constexpr int first_of(int i) const { return twins ? ir::first_twin(nodes, i) : i; }
};

/// A pass's check found the plan inconsistent: a planner bug, named by the pass. In constant
/// evaluation (static shapes) the throw is a build error.
constexpr void plan_check(bool ok, const char* what) {
  if (!ok) FUSEBOX_THROW(invalid_argument(what));
}

}  // namespace fusebox::plan
