// plan/epilogues.hpp: pass `epilogues`. A pure pointwise group with one output, over exactly the
// shape of a product (a node whose kind takes an epilogue: matmul, and spatial nodes such as
// conv2d and pooling, which call it on finished output rows as gemm does) whose only consumers
// are in that group, becomes the product's epilogue: the product's kernel evaluates it on finished
// rows of the result, in place.
// Depends on: plan/planning.hpp.
#pragma once

#include <cstddef>

#include "fusebox/plan/planning.hpp"

namespace fusebox::plan {

template <std::size_t N>
constexpr void epilogues(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  const auto& nodes = s.nodes;
  plan_t<N>& p = s.p;
  for (int i = 0; i < n; ++i) s.epilogue_of_group[i] = s.epilogue_for_product[i] = -1;
  for (int m = 0; m < n; ++m) {
    if (!ir::traits(nodes[m].desc.kind).takes_epilogue || p.is_output[m]) continue;
    int grp = -2;
    for (int c = 0; c < n; ++c) {
      if (!s.consumers_of[m][c]) continue;
      const int gc = p.group[c];
      if (gc < 0 || (grp != -2 && grp != gc)) grp = -1;
      else if (grp == -2) grp = gc;
    }
    if (grp < 0 || s.kind[grp] != group_kind::pointwise || !(s.space[grp] == nodes[m].desc.shape) ||
        s.epilogue_of_group[grp] >= 0)
      continue;
    // A product the group also reads through a twin (`h + relu(h)`, h = x·W with W captured)
    // stays a kernel of its own: as an epilogue it would not keep its value, and the twin would
    // be a second product instead of a skipped one (pass `twins`).
    bool twin_in_group = false;
    for (int t = 0; s.twins && t < n && !twin_in_group; ++t)
      if (t != m && ir::first_twin(nodes, t) == ir::first_twin(nodes, m))
        for (int c = 0; c < n && !twin_in_group; ++c) twin_in_group = s.consumers_of[t][c] && p.group[c] == grp;
    if (twin_in_group) continue;
    int outs = 0;
    for (int i = 0; i < n; ++i) outs += p.group[i] == grp && p.materialised[i];
    if (outs != 1) continue;
    s.epilogue_of_group[grp] = m;
    s.epilogue_for_product[m] = grp;
  }
}

/// After `epilogues`: each epilogue group is pointwise over its product's shape, writes one
/// materialised member, and is the only reader of the product.
template <std::size_t N>
constexpr void check_epilogues(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  for (int g = 0; g < n; ++g) {
    const int m = s.epilogue_of_group[g];
    if (m < 0) continue;
    plan_check(s.epilogue_for_product[m] == g && s.kind[g] == group_kind::pointwise && s.space[g] == s.nodes[m].desc.shape,
               "fusebox internal: after pass epilogues: an epilogue group does not match its product");
    for (int c = 0; c < n; ++c)
      plan_check(!s.consumers_of[m][c] || s.p.group[c] == g,
                 "fusebox internal: after pass epilogues: a product fused into an epilogue is read outside it");
  }
}

}  // namespace fusebox::plan
