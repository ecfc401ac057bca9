// plan/twins.hpp: pass `twins` (static path). Nodes of one expression type that hold payloads are
// linked (ir::node::twin) and are one value when the call's payloads are equal, which only the
// call can tell (ir/value_numbers.hpp). A kernel whose every product (a materialised node it
// writes: not an output, which must be written, nor a product written into its epilogue) has a
// twin first computed by an earlier kernel that keeps it in memory of its own is `skippable`: a
// call whose value numbers say they are equal skips it, and its products point at the earlier
// values (a captured weight's product used twice, an opaque() result that softmax copies four
// times). Twins inside one row group are planned by `row_cache`. The run-time path has merged
// twins before planning (ir/merge.hpp) and skips this pass.
// Depends on: plan/planning.hpp.
#pragma once

#include <cstddef>

#include "fusebox/plan/planning.hpp"

namespace fusebox::plan {

template <std::size_t N>
constexpr void twins(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  plan_t<N>& p = s.p;
  if (!s.twins) return;
  for (int ki = 0; ki < p.n_kernels; ++ki) {
    kernel& k = p.kernels[ki];
    if (k.kind == kernel_kind::copy) continue;
    bool all = true;
    int products = 0;
    for (int i = 0; i < n && all; ++i) {
      if (p.kernel_of[i] != ki || !s.own_value(i)) continue;
      const int f = s.first_of(i);
      all = !p.is_output[i] && f != i && p.kernel_of[f] >= 0 && p.kernel_of[f] < ki && s.own_value(f);
      ++products;
    }
    k.skippable = all && products > 0;
    if (!k.skippable) continue;
    for (int i = 0; i < n; ++i)
      if (p.kernel_of[i] == ki && s.own_value(i)) p.same_as[i] = s.first_of(i);
  }
}

/// After `twins`: a node reads only the value of an earlier node of its type.
template <std::size_t N>
constexpr void check_twins(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  for (int i = 0; i < n; ++i) {
    const int f = s.p.same_as[i];
    plan_check(f < 0 || (f < i && s.nodes[f].type == s.nodes[i].type),
               "fusebox internal: after pass twins: a node reads a value that is not an earlier twin");
  }
}

}  // namespace fusebox::plan
