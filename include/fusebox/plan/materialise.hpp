// plan/materialise.hpp: pass `materialise`, which nodes get memory: outputs, nodes that always
// live in memory (leaves, views, nodes computed by a kernel of their own: ir/node_kinds.hpp),
// values read by another kernel, a view's input, and the operands of a kernel of its own.
// Runs before `epilogues`, which needs to know who reads what.
// Depends on: plan/planning.hpp.
#pragma once

#include <cstddef>

#include "fusebox/plan/planning.hpp"

namespace fusebox::plan {

template <std::size_t N>
constexpr void materialise(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  const auto& nodes = s.nodes;
  plan_t<N>& p = s.p;
  for (int i = 0; i < n; ++i) {
    bool m = p.is_output[i] || ir::always_in_memory(nodes[i].desc.kind);
    for (int c = 0; c < n && !m; ++c)
      if (s.consumers_of[i][c] && (p.group[c] < 0 || p.group[c] != p.group[i])) m = true;
    p.materialised[i] = m;
  }
  for (int i = 0; i < n; ++i)
    if (ir::reads_operands_from_memory(nodes[i].desc.kind))
      for (int k = 0; k < nodes[i].n_inputs; ++k) p.materialised[nodes[i].inputs[k]] = true;
}

/// After `materialise`: outputs and whatever another kernel reads have memory.
template <std::size_t N>
constexpr void check_materialise(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  for (int c = 0; c < n; ++c) {
    plan_check(!s.p.is_output[c] || s.p.materialised[c], "fusebox internal: after pass materialise: an output without memory");
    for (int k = 0; k < s.nodes[c].n_inputs; ++k) {
      const int in = s.nodes[c].inputs[k];
      plan_check(s.p.materialised[in] || (s.p.group[in] >= 0 && s.p.group[in] == s.p.group[c]),
                 "fusebox internal: after pass materialise: a node reads a value of another kernel that has no memory");
    }
  }
}

}  // namespace fusebox::plan
