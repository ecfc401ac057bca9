// plan/group.hpp: pass `group`, fusion groups by union-find over the fused nodes (pointwise and
// reduce) along producer→consumer edges, when the merged group keeps one index space and stays
// convex (no path leaves the group and comes back: that would be a cycle between kernels).
// Edge rules:
//   pointwise → pointwise          same shape
//   pointwise → reduce             the reduce's input (producer fusion)
//   reduce(last axis, keepdim) → pointwise of the reduce's input shape, or of its per-row shape
//                                  (consumer fusion: softmax, layer_norm)
//   pointwise → reduce(other axis) producer fusion only
// A `rows` group (one with a last-axis reduce) reduces each row in passes while it stays in cache.
// A node marked `recompute` (a forward value the backward computes again, under an activation
// memory budget: plan/recompute.hpp) never merges with a producer.
// Writes plan.group and plan.row_constant, and the group kinds and spaces later passes read.
// Depends on: plan/planning.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/plan/planning.hpp"

namespace fusebox::plan {

namespace detail {

// Is the union of the groups of a and b convex: no node outside reachable from it that also reaches it?
// Reach is over kernels, not nodes: reaching one member of another group reaches all of it (it
// runs as one kernel). Node reach alone misses a cycle through two groups that each hold
// unconnected parts: A -> x -> B and B -> y -> A with no path from B's x-side to its y-side (a
// forward and a backward fused side by side, as a gradient's joint graph has them).
template <std::size_t N>
constexpr bool convex_union(planning<N>& s, int ga, int gb) {
  constexpr int n = static_cast<int>(N);
  const auto& nodes = s.nodes;
  std::array<bool, N> in{}, from{}, to{};
  for (int i = 0; i < n; ++i) in[i] = s.fused(i) && (s.find(i) == ga || s.find(i) == gb);
  auto close_groups = [&](std::array<bool, N>& reach) {
    std::array<bool, N> hit{};  // by group root
    for (int i = 0; i < n; ++i)
      if (reach[i] && !in[i] && s.fused(i)) hit[s.find(i)] = true;
    bool grew = false;
    for (int j = 0; j < n; ++j)
      if (!reach[j] && !in[j] && s.fused(j) && hit[s.find(j)]) reach[j] = grew = true;
    return grew;
  };
  // Forward reach from the group, in topological (id) order, until no group adds members.
  do {
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < nodes[i].n_inputs; ++k) {
        const int p = nodes[i].inputs[k];
        if (in[p] || from[p]) from[i] = true;
      }
  } while (close_groups(from));
  // Backward reach to the group, in reverse order, likewise.
  do {
    for (int c = n - 1; c >= 0; --c)
      if (in[c] || to[c])
        for (int k = 0; k < nodes[c].n_inputs; ++k) to[nodes[c].inputs[k]] = true;
  } while (close_groups(to));
  for (int i = 0; i < n; ++i)
    if (!in[i] && from[i] && to[i]) return false;
  return true;
}

template <std::size_t N>
constexpr void try_merge(planning<N>& s, int p, int c) {
  const ir::node& np = s.nodes[p];
  const ir::node& nc = s.nodes[c];
  const int gp = s.find(p), gc = s.find(c);
  if (gp == gc) return;
  // A value recomputed for the backward joins its consumers' kernel, not its producers' (which
  // run in the forward: computed there, it would be stored for the backward again).
  if (nc.desc.recompute && !np.desc.recompute) return;
  // Edge rules.
  if (np.desc.kind == node_kind::reduce) {
    if (nc.desc.kind != node_kind::pointwise || !is_last_axis_reduce(np) || !np.desc.keepdim) return;
    const dims in = s.input_shape(p);
    if (!(nc.desc.shape == in || nc.desc.shape == row_constant_shape(in))) return;
  } else if (nc.desc.kind == node_kind::pointwise) {
    if (!(np.desc.shape == nc.desc.shape) && s.kind[gp] != group_kind::rows) return;
  }
  // Group rules.
  const group_kind kp = s.kind[gp], kc = s.kind[gc];
  if (kp == group_kind::columns) return;  // a column reduction never takes consumers
  group_kind kind_out = group_kind::pointwise;
  dims space_out{};
  if (kc == group_kind::columns) {
    if (kp != group_kind::pointwise || !(s.space[gp] == s.space[gc])) return;
    kind_out = group_kind::columns;
    space_out = s.space[gc];
  } else if (kp == group_kind::rows && kc == group_kind::rows) {
    if (!(s.space[gp] == s.space[gc])) return;
    kind_out = group_kind::rows;
    space_out = s.space[gp];
  } else if (kp == group_kind::rows || kc == group_kind::rows) {
    const dims r = kp == group_kind::rows ? s.space[gp] : s.space[gc];
    const dims t = kp == group_kind::rows ? s.space[gc] : s.space[gp];
    if (!(t == r || t == row_constant_shape(r))) return;
    kind_out = group_kind::rows;
    space_out = r;
  } else {
    if (!(s.space[gp] == s.space[gc])) return;
    space_out = s.space[gp];
  }
  if (!convex_union(s, gp, gc)) return;
  s.parent[gp] = gc;
  s.kind[gc] = kind_out;
  s.space[gc] = space_out;
}

}  // namespace detail

template <std::size_t N>
constexpr void group(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  const auto& nodes = s.nodes;
  for (int i = 0; i < n; ++i) {
    s.parent[i] = i;
    const ir::node& nd = nodes[i];
    if (nd.desc.kind == node_kind::reduce) {
      s.kind[i] = is_last_axis_reduce(nd) ? group_kind::rows : group_kind::columns;
      s.space[i] = nodes[nd.inputs[0]].desc.shape;
    } else {
      s.kind[i] = group_kind::pointwise;
      s.space[i] = nd.desc.shape;
    }
    for (int k = 0; k < nd.n_inputs; ++k) s.consumers_of[nd.inputs[k]][i] = true;
  }
  for (int c = 0; c < n; ++c) {
    if (!s.fused(c)) continue;
    for (int k = 0; k < nodes[c].n_inputs; ++k) {
      const int pr = nodes[c].inputs[k];
      if (s.fused(pr)) detail::try_merge(s, pr, c);
    }
  }
  for (int i = 0; i < n; ++i) s.p.group[i] = s.fused(i) ? s.find(i) : -1;
  for (int i = 0; i < n; ++i) {
    const int g = s.p.group[i];
    s.p.row_constant[i] = g >= 0 && s.kind[g] == group_kind::rows && nodes[i].desc.kind == node_kind::pointwise &&
                          nodes[i].desc.shape == row_constant_shape(s.space[g]) && !(s.space[g] == nodes[i].desc.shape);
  }
}

/// After `group`: every fused node is in a group whose root is a member; a group's members all
/// run over its space (or, in a rows group, its per-row shape); a columns group has one reduce.
template <std::size_t N>
constexpr void check_group(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  for (int i = 0; i < n; ++i) {
    const int g = s.p.group[i];
    plan_check((g >= 0) == s.fused(i), "fusebox internal: after pass group: a fused node outside a group, or a group member that is not fused");
    if (g < 0) continue;
    plan_check(s.p.group[g] == g, "fusebox internal: after pass group: a group's root is not its member");
    const dims own = s.nodes[i].desc.kind == node_kind::reduce ? s.input_shape(i) : s.nodes[i].desc.shape;
    plan_check(own == s.space[g] || (s.kind[g] == group_kind::rows && (s.nodes[i].desc.kind == node_kind::reduce ||
                                                                       own == row_constant_shape(s.space[g]))) ||
                   (s.kind[g] == group_kind::columns && s.nodes[i].desc.kind == node_kind::reduce),
               "fusebox internal: after pass group: a member does not run over its group's space");
  }
  for (int g = 0; g < n; ++g) {
    if (s.p.group[g] != g || s.kind[g] != group_kind::columns) continue;
    int reduces = 0;
    for (int i = 0; i < n; ++i) reduces += s.p.group[i] == g && s.nodes[i].desc.kind == node_kind::reduce;
    plan_check(reduces == 1, "fusebox internal: after pass group: a column group without exactly one reduction");
  }
}

}  // namespace fusebox::plan
