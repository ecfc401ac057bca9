// plan/at_extents.hpp: a run-time plan at one call's extents. The run-time path plans once per
// specialisation, with symbolic extents where the guard allows any; each call then needs each
// kernel's index space at its own extents (both run-time runners), and the report needs the
// whole plan so (explain() on the run-time path: bytes and flops as numbers).
// Depends on: plan/plan.hpp, plan/arena.hpp, ir/graph.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/ir/graph.hpp"
#include "fusebox/plan/arena.hpp"
#include "fusebox/plan/plan.hpp"

namespace fusebox::plan {

/// The index space kernel kn runs over, at the call's node shapes `concrete`.
template <std::size_t N>
constexpr dims kernel_space(const plan_t<N>& p, const std::array<ir::node, N>& concrete, const kernel& kn) {
  if (kn.kind == kernel_kind::reduce_cols) return concrete[concrete[kn.node].inputs[0]].desc.shape;
  if (kn.kind == kernel_kind::matmul || kn.kind == kernel_kind::spatial) return concrete[kn.node].desc.shape;
  if (kn.kind == kernel_kind::rows) {
    for (std::size_t i = 0; i < N; ++i)
      if (p.group[i] == kn.group) {
        if (concrete[i].desc.kind == node_kind::reduce) return concrete[concrete[i].inputs[0]].desc.shape;
        if (!p.row_constant[i]) return concrete[i].desc.shape;
      }
    return kn.space;
  }
  return kn.node >= 0 ? concrete[kn.node].desc.shape : kn.space;
}

/// Plan p with every kernel's space and the arena at the call's node shapes `concrete`.
template <std::size_t N>
constexpr plan_t<N> at_extents(plan_t<N> p, const std::array<ir::node, N>& concrete, std::size_t elem_bytes) {
  for (int k = 0; k < p.n_kernels; ++k) p.kernels[k].space = kernel_space(p, concrete, p.kernels[k]);
  assign_arena(p, concrete, elem_bytes);
  return p;
}

}  // namespace fusebox::plan
