// plan/order.hpp: pass `order`, the kernels in dependency order (Kahn's algorithm, smallest unit
// first). A unit of work is a group root (a rows or reduce_cols kernel), a product with its
// epilogue group, or a node with a kernel of its own; views and leaves need none. Outputs that no
// kernel writes (a leaf, a view, a user function's result) get a copy kernel at the end.
// Depends on: plan/planning.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/core/errors.hpp"
#include "fusebox/plan/planning.hpp"

namespace fusebox::plan {

template <std::size_t N, std::size_t R>
constexpr void order(planning<N>& s, const std::array<int, R>& outputs) {
  constexpr int n = static_cast<int>(N);
  const auto& nodes = s.nodes;
  plan_t<N>& p = s.p;
  std::array<int, N> unit{};  // per node: its group root, the product for an epilogue group, itself, or -1
  for (int i = 0; i < n; ++i) {
    unit[i] = -1;
    if (p.group[i] >= 0) unit[i] = s.epilogue_of_group[p.group[i]] >= 0 ? s.epilogue_of_group[p.group[i]] : p.group[i];
    else if (ir::traits(nodes[i].desc.kind).own_kernel) unit[i] = i;
  }
  std::array<bool, N> scheduled{};
  std::array<bool, N> is_unit{};
  for (int i = 0; i < n; ++i)
    if (unit[i] >= 0) is_unit[unit[i]] = true;
  while (true) {
    int pick = -1;
    for (int u = 0; u < n && pick < 0; ++u) {
      if (!is_unit[u] || scheduled[u]) continue;
      bool ready = true;
      for (int i = 0; i < n && ready; ++i) {
        if (unit[i] != u) continue;
        for (int k = 0; k < nodes[i].n_inputs && ready; ++k) {
          const int src = s.source(nodes[i].inputs[k]);
          if (unit[src] >= 0 && unit[src] != u && !scheduled[unit[src]]) ready = false;
        }
      }
      if (ready) pick = u;
    }
    if (pick < 0) {
      // Every unit must be scheduled; one left over means the units depend on each other in a
      // cycle, and a plan without it would compute garbage. (A throw in constant evaluation is a
      // build error.)
      for (int u = 0; u < n; ++u)
        if (is_unit[u] && !scheduled[u])
          FUSEBOX_THROW(invalid_argument("fusebox internal: the planner's kernels depend on each other in a cycle"));
      break;
    }
    scheduled[pick] = true;
    kernel k{};
    const ir::node_kind_traits& t = ir::traits(nodes[pick].desc.kind);
    if (t.own_kernel) {
      k.kind = t.kernel;
      k.node = pick;
      k.group = t.takes_epilogue ? s.epilogue_for_product[pick] : -1;
      k.space = nodes[pick].desc.shape;
    } else if (s.kind[pick] == group_kind::columns) {
      k.kind = kernel_kind::reduce_cols;
      k.group = pick;
      for (int i = 0; i < n; ++i)
        if (p.group[i] == pick && nodes[i].desc.kind == node_kind::reduce) k.node = i;
      k.space = s.space[pick];
    } else {
      k.kind = kernel_kind::rows;
      k.group = pick;
      k.space = s.space[pick];
    }
    for (int i = 0; i < n; ++i)
      if (unit[i] == pick) p.kernel_of[i] = p.n_kernels;
    p.kernels[p.n_kernels++] = k;
  }
  for (int o : outputs)
    if (ir::traits(nodes[o].desc.kind).written_elsewhere) {
      kernel c{};
      c.kind = kernel_kind::copy;
      c.node = o;
      c.space = nodes[o].desc.shape;
      p.kernels[p.n_kernels++] = c;
    }
}

/// After `order`: every kernel's inputs come from memory bound by the call or written by an
/// earlier kernel (or from its own group).
template <std::size_t N>
constexpr void check_order(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  for (int i = 0; i < n; ++i) {
    const int ki = s.p.kernel_of[i];
    if (ki < 0) continue;
    for (int k = 0; k < s.nodes[i].n_inputs; ++k) {
      const int src = s.source(s.nodes[i].inputs[k]);
      plan_check(s.p.kernel_of[src] <= ki, "fusebox internal: after pass order: a kernel reads a value computed later");
    }
  }
}

}  // namespace fusebox::plan
