// plan/row_cache.hpp: pass `row_cache`, inside each rows kernel: the reduction passes in order,
// twins that read an earlier member's value (same_as), and the per-row scratch. A costly member
// (>= 8 flops of inline work, a division counting 8) needed by two or more passes is written to a
// per-thread row scratch in its first pass and read back later (`cache_slot`). A call where twins
// differ computes every member inline and uses no scratch (backend/cpu/executor.hpp).
// Depends on: plan/planning.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "fusebox/plan/planning.hpp"

namespace fusebox::plan {

/// What computing a member inline once more costs, in the ops' own unit (`flops`: an add 1, exp
/// 16): its flops, but a division counts 8. A vector divide issues once every 3-3.5 cycles on Zen 4
/// (0.10 ns a float at AVX2 and at AVX-512 alike) where fmas issue two a cycle, and every other
/// op's figure already counts its instructions. softmax's quotient e / s, read by the three passes
/// of a layer_norm after it, was recomputed in each of them (docs/benchmarks.md, run AO).
constexpr int inline_cost(const node_desc& d) {
  return std::string_view(d.name) == "div" ? 8 : d.flops;
}

template <std::size_t N>
constexpr void row_cache(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  const auto& nodes = s.nodes;
  plan_t<N>& p = s.p;
  for (int ki = 0; ki < p.n_kernels; ++ki) {
    kernel& k = p.kernels[ki];
    if (k.kind != kernel_kind::rows) continue;
    int passes = 0;
    for (int i = 0; i < n; ++i)
      if (p.group[i] == k.group && nodes[i].desc.kind == node_kind::reduce) p.pass[i] = passes++;
    k.passes = passes;
    // A member whose type's first occurrence is in this group too reads that value when the call
    // numbers them equal; the cache below is planned for that case. layer_norm's output, which
    // softmax copies into each of its passes, is one value computed in the first.
    auto group_twin = [&](int i) {
      const int f = s.first_of(i);
      return f != i && p.group[f] == k.group && p.same_as[i] < 0 ? f : -1;
    };
    for (int i = 0; i < n; ++i)
      if (p.group[i] == k.group && group_twin(i) >= 0) {
        p.same_as[i] = group_twin(i);
        k.twins = true;
      }
    if (passes == 0) continue;
    auto is_twin = [&](int i) { return k.twins && p.same_as[i] >= 0 && p.group[p.same_as[i]] == k.group; };
    // uses[i]: bit set of passes that need node i computed inline; twin_uses[f]: those of f's
    // twins, which read f.
    std::array<unsigned, N> uses{};
    std::array<unsigned, N> twin_uses{};
    std::array<int, N> cost{};
    auto inline_member = [&](int i) {
      return p.group[i] == k.group && nodes[i].desc.kind == node_kind::pointwise && !p.row_constant[i];
    };
    for (int i = 0; i < n; ++i) {
      if (!inline_member(i)) continue;
      cost[i] = inline_cost(nodes[i].desc);
      for (int q = 0; q < nodes[i].n_inputs; ++q) {
        const int in = nodes[i].inputs[q];
        if (p.group[in] == k.group && !p.materialised[in]) cost[i] += cost[in];
      }
    }
    for (int i = n - 1; i >= 0; --i) {
      if (!inline_member(i)) continue;
      unsigned u = (p.materialised[i] ? (1u << passes) : 0u) | twin_uses[i];
      for (int c = 0; c < n; ++c) {
        if (!s.consumers_of[i][c] || p.group[c] != k.group || is_twin(c)) continue;  // a twin reads its first
        if (nodes[c].desc.kind == node_kind::reduce) u |= 1u << p.pass[c];
        else if (p.cache_slot[c] >= 0) u |= 1u << p.pass[c];
        else u |= uses[c];
      }
      if (is_twin(i)) {
        twin_uses[p.same_as[i]] |= u;
        p.pass[i] = passes;
        continue;
      }
      uses[i] = u;
      int first = 0;
      while (!(u >> first & 1u) && first < passes) ++first;
      p.pass[i] = first;
      const bool several = (u & (u - 1)) != 0;
      if (several && cost[i] >= 8 && !p.materialised[i]) p.cache_slot[i] = k.cached++;
    }
    // Second look, in topological order: with the decisions above, a cached node whose own work is
    // cheap once its inputs come from scratch (e.g. `e / s` over a cached `e`) is cheaper to
    // recompute than to store and reload. Uncaching never moves a node's first pass later, so
    // every scratch read still follows its write.
    k.cached = 0;
    for (int i = 0; i < n; ++i) {
      if (!inline_member(i)) continue;
      cost[i] = inline_cost(nodes[i].desc);
      for (int q = 0; q < nodes[i].n_inputs; ++q) {
        const int in = nodes[i].inputs[q];
        if (p.group[in] == k.group && !p.materialised[in] && p.cache_slot[in] < 0) cost[i] += cost[in];
      }
      if (is_twin(i)) cost[i] = cost[p.same_as[i]];
      if (p.cache_slot[i] >= 0) p.cache_slot[i] = cost[i] >= 8 ? k.cached++ : -1;
    }
  }
}

/// After `row_cache`: a member computed inline reads cached values only from earlier passes or
/// its own; cache slots are numbered 0..cached-1 within each kernel.
template <std::size_t N>
constexpr void check_row_cache(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  const plan_t<N>& p = s.p;
  for (int ki = 0; ki < p.n_kernels; ++ki) {
    const kernel& k = p.kernels[ki];
    if (k.kind != kernel_kind::rows) continue;
    std::array<bool, N> slot_used{};
    for (int i = 0; i < n; ++i) {
      if (p.group[i] != k.group || p.cache_slot[i] < 0) continue;
      plan_check(p.cache_slot[i] < k.cached && !slot_used[p.cache_slot[i]],
                 "fusebox internal: after pass row_cache: cache slots are not numbered 0..cached-1");
      slot_used[p.cache_slot[i]] = true;
      for (int c = 0; c < n; ++c)
        if (s.consumers_of[i][c] && p.group[c] == k.group && !p.row_constant[c] && p.same_as[c] < 0)
          plan_check(p.pass[c] >= p.pass[i], "fusebox internal: after pass row_cache: a cached value is read before its pass");
    }
  }
}

}  // namespace fusebox::plan
