// plan/recompute.hpp: what the backward of a joint forward+backward graph keeps in memory and what
// it computes again, under an activation memory budget (options::activation_memory_budget, with
// the meaning of torch._functorch.config.activation_memory_budget).
//
// A forward value is *saved* when it is in memory (the planner materialised it) and a backward
// node in another kernel reads it, directly or through views: it lives from the forward kernel
// that writes it to the last backward kernel that reads it. The budget is a fraction of the
// saved bytes of the plan without recomputation (budget 1: that plan, unchanged).
//
// choose_recompute picks, greedily, forward values to compute again in the backward until the
// estimated saved bytes fit `budget` x the full figure, or nothing recomputable is left:
//   candidates   saved elementwise (pointwise) and reduction values. Matmul, attention, spatial,
//                pad and gather results are never recomputed (one GEMM or convolution again costs
//                more than the bytes are worth; torch's default partitioner bans them too).
//   closure      recomputing X reads X's operands in the backward: a leaf (argument) or a value
//                already saved costs nothing; an operand in memory for the forward only becomes
//                saved, unless it is itself elementwise or a reduction at least as large as X,
//                which is recomputed with X (an elementwise chain back to saved values).
//   order        the smallest recompute work (flops x elements of the closure) per byte freed
//                first, ties by node id: elementwise chains before reductions, cheap ops before
//                transcendental ones. A step that frees no byte is not taken.
// The order does not depend on the budget, so a smaller budget recomputes a superset (the
// saved bytes are monotone in the budget). The estimate assumes the planner keeps the other
// fusion decisions; the caller re-plans the rewritten graph and reports the real figures
// (saved_values on the new plan).
// Depends on: plan/planner.hpp, ir/graph.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/ir/graph.hpp"
#include "fusebox/plan/planner.hpp"

namespace fusebox::plan {

constexpr bool recomputable_kind(node_kind k) { return k == node_kind::pointwise || k == node_kind::reduce; }

template <std::size_t N>
struct saved_set {
  std::array<bool, N> saved{};
  std::size_t bytes = 0;  ///< each rounded to 64 as the arena does
  int count = 0;
};

namespace detail {
template <std::size_t N>
constexpr int view_source(const std::array<ir::node, N>& nodes, int i) {
  while (nodes[i].desc.kind == node_kind::view) i = nodes[i].inputs[0];
  return i;
}
constexpr std::size_t buffer_bytes(const ir::node& n, std::size_t elem_bytes) {
  return (n.desc.shape.size() * elem_bytes + 63) / 64 * 64;
}
}  // namespace detail

/// The saved forward values of a planned joint graph. `forward[i]`: node i belongs to the forward
/// (the loss's own graph); the others are the backward's.
template <std::size_t N>
constexpr saved_set<N> saved_values(const std::array<ir::node, N>& nodes, const plan_t<N>& p,
                                    const std::array<bool, N>& forward, std::size_t elem_bytes) {
  saved_set<N> s{};
  constexpr int n = static_cast<int>(N);
  for (int c = 0; c < n; ++c) {
    if (forward[c] || nodes[c].desc.kind == node_kind::view) continue;
    for (int q = 0; q < nodes[c].n_inputs; ++q) {
      const int src = detail::view_source(nodes, nodes[c].inputs[q]);
      const node_kind k = nodes[src].desc.kind;
      if (!forward[src] || s.saved[src] || ir::is_leaf_kind(k) || p.is_output[src] || !p.materialised[src]) continue;
      if (p.kernel_of[src] >= 0 && p.kernel_of[src] == p.kernel_of[c]) continue;  // one kernel: read inline
      s.saved[src] = true;
      s.bytes += detail::buffer_bytes(nodes[src], elem_bytes);
      ++s.count;
    }
  }
  return s;
}

template <std::size_t N>
struct recompute_choice {
  std::array<bool, N> recompute{};  ///< forward nodes the backward computes again
  int count = 0;
  std::size_t full_bytes = 0;       ///< saved bytes without recomputation
  std::size_t estimate_bytes = 0;   ///< saved bytes after it, as estimated here
};

/// The forward values to recompute so that the saved bytes fit `budget` (in [0, 1]) x the full
/// figure. Budget 1 (or more) recomputes nothing.
template <std::size_t N>
constexpr recompute_choice<N> choose_recompute(const std::array<ir::node, N>& nodes, const plan_t<N>& p,
                                               const std::array<bool, N>& forward, std::size_t elem_bytes,
                                               double budget) {
  constexpr int n = static_cast<int>(N);
  recompute_choice<N> r{};
  saved_set<N> s = saved_values(nodes, p, forward, elem_bytes);
  r.full_bytes = r.estimate_bytes = s.bytes;
  if (!(budget < 1.0)) return r;
  const double target = budget * static_cast<double>(s.bytes);
  std::array<bool, N> saved = s.saved;
  std::size_t current = s.bytes;
  while (static_cast<double>(current) > target) {
    int best = -1;
    double best_work = 0, best_freed = 0;
    std::array<bool, N> best_clone{}, best_new{};
    for (int x = 0; x < n; ++x) {
      if (!saved[x] || r.recompute[x] || !recomputable_kind(nodes[x].desc.kind)) continue;
      std::array<bool, N> clone{}, newly{};
      std::array<int, N> stack{};
      int top = 0;
      stack[top++] = x;
      clone[x] = true;
      while (top > 0) {
        const int y = stack[--top];
        for (int q = 0; q < nodes[y].n_inputs; ++q) {
          const int src = detail::view_source(nodes, nodes[y].inputs[q]);
          if (ir::is_leaf_kind(nodes[src].desc.kind) || r.recompute[src] || clone[src] || saved[src] || newly[src])
            continue;
          if (recomputable_kind(nodes[src].desc.kind) && nodes[src].desc.shape.size() >= nodes[y].desc.shape.size()) {
            clone[src] = true;
            stack[top++] = src;
          } else {
            newly[src] = true;
          }
        }
      }
      double freed = 0, work = 0;
      for (int i = 0; i < n; ++i) {
        if (clone[i]) {
          if (saved[i]) freed += static_cast<double>(detail::buffer_bytes(nodes[i], elem_bytes));
          const ir::node& nd = nodes[i];
          const double elems = static_cast<double>(
              nd.desc.kind == node_kind::reduce ? nodes[nd.inputs[0]].desc.shape.size() : nd.desc.shape.size());
          work += (nd.desc.flops > 0 ? nd.desc.flops : 1) * elems;
        }
        if (newly[i]) freed -= static_cast<double>(detail::buffer_bytes(nodes[i], elem_bytes));
      }
      if (freed <= 0) continue;
      if (best < 0 || work * best_freed < best_work * freed) {
        best = x;
        best_work = work;
        best_freed = freed;
        best_clone = clone;
        best_new = newly;
      }
    }
    if (best < 0) break;
    for (int i = 0; i < n; ++i) {
      if (best_clone[i]) {
        r.recompute[i] = true;
        saved[i] = false;
        ++r.count;
      }
      if (best_new[i]) saved[i] = true;
    }
    current -= static_cast<std::size_t>(best_freed);
  }
  r.estimate_bytes = current;
  return r;
}

}  // namespace fusebox::plan
