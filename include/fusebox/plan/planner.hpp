// plan/planner.hpp: the one planner. Decides fusion groups, the kernel order, what each kernel keeps
// in a per-row scratch, and the arena offsets of every intermediate buffer.
//
// It is ordinary constexpr code over an array of IR nodes: for static shapes it runs while the
// model's translation unit is compiled (one constexpr object per expression type); for dynamic
// shapes the same functions run at run time. There is no second scheduler.
//
// Passes, in order (make_plan):
//   1. group      union-find over pointwise and reduce nodes along producer→consumer edges, when
//                 the merged group keeps one index space and stays convex (no path leaves the
//                 group and comes back: that would be a cycle between kernels). Rules:
//                   pointwise → pointwise          same shape
//                   pointwise → reduce             the reduce's input (producer fusion)
//                   reduce(last axis, keepdim) → pointwise of the reduce's input shape, or of its
//                                                  per-row shape (consumer fusion: softmax, layer_norm)
//                   pointwise → reduce(other axis) producer fusion only
//                 A group with a last-axis reduce is a row group: each row is reduced in passes
//                 while it stays in cache.
//                 A node marked `recompute` (a forward value the backward computes again, under
//                 an activation memory budget: plan/recompute.hpp) never merges with a producer.
//   2. epilogue   a pure pointwise group with one output, over exactly the shape of a matmul (or a
//                 spatial node: conv2d, pooling) whose only consumers are in that group, becomes
//                 its epilogue.
//   3. materialise a node gets memory when it is an output or read by another kernel.
//   4. order      kernels in dependency order (Kahn's algorithm, smallest node id first).
//   5. twins      (static path) nodes of one expression type that hold payloads are linked
//                 (ir::node::twin) and are one value when the call's payloads are equal, which
//                 only the call can tell (ir/value_numbers.hpp). A kernel whose every product has
//                 a twin written by an earlier kernel is `skippable`; a row-group member whose
//                 twin is in the same group reads it (`same_as`), and steps 6 and 7 plan for
//                 that. The runner checks the numbers per call and, where they differ, runs the
//                 kernel and computes every member itself (cpu/executor.hpp).
//   6. row cache  inside a row group, a costly node needed by two or more passes is stored in a
//                 per-thread row scratch the first time and read back later.
//   7. arena      liveness over the kernel order (a node's `same_as` lives as long as the node's
//                 readers); first-fit offsets; the arena size is the result.
// Depends on: ir/{graph,value_numbers}.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/ir/graph.hpp"
#include "fusebox/ir/value_numbers.hpp"

namespace fusebox::plan {

enum class kernel_kind : std::uint8_t { rows, reduce_cols, matmul, opaque, copy, attention, spatial, pad, gather };

constexpr const char* name(kernel_kind k) {
  constexpr const char* names[] = {"rows",      "reduce_cols", "matmul", "opaque", "copy",
                                   "attention", "spatial",     "pad",    "gather"};
  return names[static_cast<int>(k)];
}

inline constexpr std::size_t no_offset = static_cast<std::size_t>(-1);

struct kernel {
  kernel_kind kind = kernel_kind::rows;
  int group = -1;     ///< rows / reduce_cols: the group; matmul, spatial: the epilogue group or -1
  int node = -1;      ///< matmul, reduce_cols, opaque, copy, attention, spatial: the node it computes
  dims space{};       ///< the index space its loops run over
  int passes = 0;     ///< rows: number of reduction passes before the output pass
  int cached = 0;     ///< rows: nodes kept in the row scratch
  bool twins = false;      ///< rows: members read an earlier member's value when the call numbers them
                           ///< equal (same_as); the row cache is planned for that case
  bool skippable = false;  ///< everything it writes is an earlier kernel's value when the call
                           ///< numbers them equal (same_as): the call then skips it
};

/// A kernel over a rank-0 space (one element: a loss, a reduction to a scalar times a constant) as
/// both code generators render it: over [1], which is also how the runners launch it (one row).
constexpr kernel at_least_rank1(kernel k) {
  if (k.space.rank == 0) k.space = dims{1, {1}};
  return k;
}

template <std::size_t N>
struct plan_t {
  std::array<int, N> group{};          ///< -1 for nodes outside any group
  std::array<bool, N> materialised{};  ///< has memory (leaf, buffer, output, view of such)
  std::array<bool, N> is_output{};
  std::array<bool, N> row_constant{};  ///< member of a row group with per-row shape
  std::array<int, N> pass{};           ///< reduce members: their pass; cached nodes: first pass
  std::array<int, N> cache_slot{};     ///< -1 unless kept in the row scratch
  std::array<int, N> kernel_of{};      ///< the kernel that computes the node, or -1
  /// With value twins (make_plan's `twins`): the first node of this node's type, whose value this
  /// node reads instead of computing its own when the call's value numbers say they are equal
  /// (ir/value_numbers.hpp): a twin inside its first's row group, or a product of a skippable
  /// kernel. -1 for every other node.
  std::array<int, N> same_as{};
  std::array<std::size_t, N> offset{};  ///< arena offset in bytes, or no_offset
  std::array<kernel, N + 1> kernels{};
  int n_kernels = 0;
  std::size_t arena_bytes = 0;
  std::size_t row_scratch_elems = 0;  ///< per thread: the largest (cached rows x row length)
};

namespace detail {

constexpr dims row_constant_shape(dims s) {
  if (s.rank > 0) s.extent[s.rank - 1] = 1;
  return s;
}

constexpr bool is_last_axis_reduce(const ir::node& n) {
  return n.desc.kind == node_kind::reduce &&
         static_cast<std::size_t>(n.desc.axis) + 1 == n.desc.shape.rank + (n.desc.keepdim ? 0 : 1);
}

template <std::size_t N>
struct grouping {
  const std::array<ir::node, N>& nodes;
  std::array<int, N> parent{};
  // per group root:
  std::array<int, N> kind{};  // 0 pure pointwise, 1 row group, 2 column-reduce group
  std::array<dims, N> space{};
  std::array<std::array<bool, N>, N> consumers_of{};  // consumers_of[p][c]

  constexpr int find(int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
  constexpr const dims& input_shape(int reduce_id) const { return nodes[nodes[reduce_id].inputs[0]].desc.shape; }

  constexpr bool groupable(int i) const {
    return nodes[i].desc.kind == node_kind::pointwise || nodes[i].desc.kind == node_kind::reduce;
  }

  // Is the union of the groups of a and b convex: no node outside reachable from it that also reaches it?
  // Reach is over kernels, not nodes: reaching one member of another group reaches all of it (it
  // runs as one kernel). Node reach alone misses a cycle through two groups that each hold
  // unconnected parts: A -> x -> B and B -> y -> A with no path from B's x-side to its y-side (a
  // forward and a backward fused side by side, as a gradient's joint graph has them).
  constexpr bool convex_union(int ga, int gb) {
    constexpr int n = static_cast<int>(N);
    std::array<bool, N> in{}, from{}, to{};
    for (int i = 0; i < n; ++i) in[i] = groupable(i) && (find(i) == ga || find(i) == gb);
    auto close_groups = [&](std::array<bool, N>& reach) {
      std::array<bool, N> hit{};  // by group root
      for (int i = 0; i < n; ++i)
        if (reach[i] && !in[i] && groupable(i)) hit[find(i)] = true;
      bool grew = false;
      for (int j = 0; j < n; ++j)
        if (!reach[j] && !in[j] && groupable(j) && hit[find(j)]) reach[j] = grew = true;
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

  constexpr void try_merge(int p, int c) {
    const ir::node& np = nodes[p];
    const ir::node& nc = nodes[c];
    const int gp = find(p), gc = find(c);
    if (gp == gc) return;
    // A value recomputed for the backward joins its consumers' kernel, not its producers' (which
    // run in the forward: computed there, it would be stored for the backward again).
    if (nc.desc.recompute && !np.desc.recompute) return;
    // Edge rules.
    if (np.desc.kind == node_kind::reduce) {
      if (nc.desc.kind != node_kind::pointwise || !is_last_axis_reduce(np) || !np.desc.keepdim) return;
      const dims s = input_shape(p);
      if (!(nc.desc.shape == s || nc.desc.shape == row_constant_shape(s))) return;
    } else if (nc.desc.kind == node_kind::pointwise) {
      if (!(np.desc.shape == nc.desc.shape) && kind[gp] != 1) return;
    }
    // Group rules.
    const int kp = kind[gp], kc = kind[gc];
    if (kp == 2) return;  // a column reduction never takes consumers
    int kind_out = 0;
    dims space_out{};
    if (kc == 2) {
      if (kp != 0 || !(space[gp] == space[gc])) return;
      kind_out = 2;
      space_out = space[gc];
    } else if (kp == 1 && kc == 1) {
      if (!(space[gp] == space[gc])) return;
      kind_out = 1;
      space_out = space[gp];
    } else if (kp == 1 || kc == 1) {
      const dims s = kp == 1 ? space[gp] : space[gc];
      const dims t = kp == 1 ? space[gc] : space[gp];
      if (!(t == s || t == row_constant_shape(s))) return;
      kind_out = 1;
      space_out = s;
    } else {
      if (!(space[gp] == space[gc])) return;
      space_out = space[gp];
    }
    if (!convex_union(gp, gc)) return;
    parent[gp] = gc;
    kind[gc] = kind_out;
    space[gc] = space_out;
  }
};

}  // namespace detail

/// Arena offsets by liveness over the kernel order, first fit; sets offset[] and arena_bytes.
/// Buffers: materialised nodes computed by a kernel that are not outputs (outputs live in the
/// caller's tensors), views, leaves or opaque results, and not matmuls or spatial nodes fused into an epilogue
/// (they write into the epilogue's buffer). `nodes` must have every extent known.
template <std::size_t N>
constexpr void assign_arena(plan_t<N>& p, const std::array<ir::node, N>& nodes, std::size_t elem_bytes) {
  constexpr int n = static_cast<int>(N);
  auto source = [&](int i) {
    while (nodes[i].desc.kind == node_kind::view) i = nodes[i].inputs[0];
    return i;
  };
  p.arena_bytes = 0;
  p.row_scratch_elems = 0;
  for (int ki = 0; ki < p.n_kernels; ++ki) {
    const kernel& k = p.kernels[ki];
    if (k.kind != kernel_kind::rows) continue;
    dims space = k.space;
    for (int i = 0; i < n; ++i)  // the space as the (now known) node shapes say
      if (p.group[i] == k.group) {
        if (nodes[i].desc.kind == node_kind::reduce) space = nodes[nodes[i].inputs[0]].desc.shape;
        else if (!p.row_constant[i] && nodes[i].desc.shape.rank == space.rank) space = nodes[i].desc.shape;
        break;
      }
    const std::size_t elems = static_cast<std::size_t>(k.cached) * space.back(0);
    if (elems > p.row_scratch_elems) p.row_scratch_elems = elems;
  }
  std::array<int, N> last_use{};
  for (int i = 0; i < n; ++i) {
    last_use[i] = -1;
    p.offset[i] = no_offset;
  }
  for (int i = 0; i < n; ++i) {
    const int ki = p.kernel_of[i] >= 0 ? p.kernel_of[i] : -1;
    if (ki < 0) continue;
    for (int q = 0; q < nodes[i].n_inputs; ++q) {
      const int src = source(nodes[i].inputs[q]);
      if (ki > last_use[src]) last_use[src] = ki;
    }
  }
  // A node that may read an earlier node's value (same_as) keeps that value's buffer as long as
  // its own readers run.
  for (int i = n; i-- > 0;)
    if (p.same_as[i] >= 0 && last_use[i] > last_use[p.same_as[i]]) last_use[p.same_as[i]] = last_use[i];
  // A copy kernel (an output that is a view, e.g. a transposed weight's gradient) reads the
  // view's source: keep that buffer until the copy ran, or a later kernel may reuse its bytes.
  for (int ki = 0; ki < p.n_kernels; ++ki)
    if (p.kernels[ki].kind == kernel_kind::copy) {
      const int src = source(p.kernels[ki].node);
      if (ki > last_use[src]) last_use[src] = ki;
    }
  struct block {
    std::size_t begin, end;
    int free_after;
  };
  std::array<block, N> live{};
  int n_live = 0;
  for (int ki = 0; ki < p.n_kernels; ++ki) {
    // Free what no kernel from here on reads.
    for (int b = 0; b < n_live;)
      if (live[b].free_after < ki) live[b] = live[--n_live];
      else ++b;
    for (int i = 0; i < n; ++i) {
      if (p.kernel_of[i] != ki || !p.materialised[i] || p.is_output[i]) continue;
      const node_kind kind = nodes[i].desc.kind;
      if (kind == node_kind::opaque || kind == node_kind::view || ir::is_leaf_kind(kind)) continue;
      if ((kind == node_kind::matmul || kind == node_kind::spatial) &&
          (p.kernels[ki].kind == kernel_kind::matmul || p.kernels[ki].kind == kernel_kind::spatial) &&
          p.kernels[ki].group >= 0)
        continue;
      const std::size_t bytes = (nodes[i].desc.shape.size() * elem_bytes + 63) / 64 * 64;
      // First fit: the lowest offset whose range overlaps no live block.
      std::size_t at = 0;
      for (bool moved = true; moved;) {
        moved = false;
        for (int b = 0; b < n_live; ++b)
          if (at < live[b].end && live[b].begin < at + bytes) {
            at = live[b].end;
            moved = true;
          }
      }
      p.offset[i] = at;
      live[n_live++] = block{at, at + bytes, last_use[i] < ki ? ki : last_use[i]};
      if (at + bytes > p.arena_bytes) p.arena_bytes = at + bytes;
    }
  }
}

/// The whole planner: nodes in, plan out. `outputs` are the model's results; `elem_bytes` the size of
/// one element. `twins`: plan for nodes of one type holding one value (ir::node::twin) being
/// computed once, which the runner checks per call (value twins, step 5); the run-time path has
/// merged them before planning and passes false.
template <std::size_t N, std::size_t R>
constexpr plan_t<N> make_plan(const std::array<ir::node, N>& nodes, const std::array<int, R>& outputs,
                              std::size_t elem_bytes, bool twins = false) {
  plan_t<N> p{};
  constexpr int n = static_cast<int>(N);
  for (int i = 0; i < n; ++i) p.same_as[i] = -1;

  // ---- 1. group ----
  detail::grouping<N> g{nodes};
  for (int i = 0; i < n; ++i) {
    g.parent[i] = i;
    const ir::node& nd = nodes[i];
    if (nd.desc.kind == node_kind::reduce) {
      g.kind[i] = detail::is_last_axis_reduce(nd) ? 1 : 2;
      g.space[i] = nodes[nd.inputs[0]].desc.shape;
    } else {
      g.kind[i] = 0;
      g.space[i] = nd.desc.shape;
    }
    for (int k = 0; k < nd.n_inputs; ++k) g.consumers_of[nd.inputs[k]][i] = true;
  }
  for (int o : outputs) p.is_output[o] = true;
  for (int c = 0; c < n; ++c) {
    if (!g.groupable(c)) continue;
    for (int k = 0; k < nodes[c].n_inputs; ++k) {
      const int pr = nodes[c].inputs[k];
      if (g.groupable(pr)) g.try_merge(pr, c);
    }
  }
  for (int i = 0; i < n; ++i) p.group[i] = g.groupable(i) ? g.find(i) : -1;

  // ---- 3. materialise (before the epilogue test, which needs to know who reads what) ----
  for (int i = 0; i < n; ++i) {
    const node_kind k = nodes[i].desc.kind;
    bool m = p.is_output[i] || ir::is_leaf_kind(k) || k == node_kind::matmul || k == node_kind::view ||
             k == node_kind::opaque || k == node_kind::attention || k == node_kind::spatial || k == node_kind::pad ||
             k == node_kind::gather;
    for (int c = 0; c < n && !m; ++c)
      if (g.consumers_of[i][c] && (p.group[c] < 0 || p.group[c] != p.group[i])) m = true;
    p.materialised[i] = m;
    p.cache_slot[i] = -1;
    p.kernel_of[i] = -1;
    p.offset[i] = no_offset;
  }
  // A view reads its input's memory.
  for (int i = 0; i < n; ++i)
    if (nodes[i].desc.kind == node_kind::view) p.materialised[nodes[i].inputs[0]] = true;
  // Matmul, attention, spatial and opaque operands must be in memory.
  for (int i = 0; i < n; ++i)
    if (nodes[i].desc.kind == node_kind::matmul || nodes[i].desc.kind == node_kind::opaque ||
        nodes[i].desc.kind == node_kind::attention || nodes[i].desc.kind == node_kind::spatial ||
        nodes[i].desc.kind == node_kind::pad || nodes[i].desc.kind == node_kind::gather)
      for (int k = 0; k < nodes[i].n_inputs; ++k) p.materialised[nodes[i].inputs[k]] = true;

  for (int i = 0; i < n; ++i)
    if (p.group[i] >= 0 && g.kind[p.group[i]] == 1)
      p.row_constant[i] = nodes[i].desc.kind == node_kind::pointwise &&
                          nodes[i].desc.shape == detail::row_constant_shape(g.space[p.group[i]]) &&
                          !(g.space[p.group[i]] == nodes[i].desc.shape);

  // ---- 2. epilogues: group id -> matmul node ----
  std::array<int, N> epilogue_of_group{};
  std::array<int, N> epilogue_for_matmul{};
  for (int i = 0; i < n; ++i) epilogue_of_group[i] = epilogue_for_matmul[i] = -1;
  for (int m = 0; m < n; ++m) {
    // Spatial kernels call the epilogue on finished output rows as gemm does (cpu/spatial.hpp).
    if ((nodes[m].desc.kind != node_kind::matmul && nodes[m].desc.kind != node_kind::spatial) || p.is_output[m]) continue;
    int grp = -2;
    for (int c = 0; c < n; ++c) {
      if (!g.consumers_of[m][c]) continue;
      const int gc = p.group[c];
      if (gc < 0 || (grp != -2 && grp != gc)) grp = -1;
      else if (grp == -2) grp = gc;
    }
    if (grp < 0 || g.kind[grp] != 0 || !(g.space[grp] == nodes[m].desc.shape) || epilogue_of_group[grp] >= 0) continue;
    // A product the group also reads through a twin (`h + relu(h)`, h = x·W with W captured)
    // stays a kernel of its own: as an epilogue it would not keep its value, and the twin would
    // be a second product instead of a skipped one (step 5).
    bool twin_in_group = false;
    for (int t = 0; twins && t < n && !twin_in_group; ++t)
      if (t != m && ir::first_twin(nodes, t) == ir::first_twin(nodes, m))
        for (int c = 0; c < n && !twin_in_group; ++c) twin_in_group = g.consumers_of[t][c] && p.group[c] == grp;
    if (twin_in_group) continue;
    int outs = 0;
    for (int i = 0; i < n; ++i) outs += p.group[i] == grp && p.materialised[i];
    if (outs != 1) continue;
    epilogue_of_group[grp] = m;
    epilogue_for_matmul[m] = grp;
  }

  // ---- 4. kernels in dependency order ----
  // A unit of work is a group root (rows / reduce_cols / epilogue-fused matmul) or a lone node.
  std::array<int, N> unit{};  // unit id per node: group root, matmul id for epilogue groups, or itself
  for (int i = 0; i < n; ++i) {
    unit[i] = -1;
    const node_kind k = nodes[i].desc.kind;
    if (p.group[i] >= 0) unit[i] = epilogue_of_group[p.group[i]] >= 0 ? epilogue_of_group[p.group[i]] : p.group[i];
    else if (k == node_kind::matmul || k == node_kind::opaque || k == node_kind::attention || k == node_kind::spatial ||
             k == node_kind::pad || k == node_kind::gather)
      unit[i] = i;
  }
  // Views and leaves need no kernel; a view's readers depend on what the view looks at.
  auto source = [&](int i) {
    while (nodes[i].desc.kind == node_kind::view) i = nodes[i].inputs[0];
    return i;
  };
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
          const int src = source(nodes[i].inputs[k]);
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
          throw invalid_argument("fusebox internal: the planner's kernels depend on each other in a cycle");
      break;
    }
    scheduled[pick] = true;
    kernel k{};
    const node_kind nk = nodes[pick].desc.kind;
    if (nk == node_kind::matmul || nk == node_kind::spatial) {
      k.kind = nk == node_kind::matmul ? kernel_kind::matmul : kernel_kind::spatial;
      k.node = pick;
      k.group = epilogue_for_matmul[pick];
      k.space = nodes[pick].desc.shape;
    } else if (nk == node_kind::opaque || nk == node_kind::attention || nk == node_kind::pad || nk == node_kind::gather) {
      k.kind = nk == node_kind::opaque ? kernel_kind::opaque
               : nk == node_kind::pad  ? kernel_kind::pad
               : nk == node_kind::gather ? kernel_kind::gather
                                         : kernel_kind::attention;
      k.node = pick;
      k.space = nodes[pick].desc.shape;
    } else if (g.kind[pick] == 2) {
      k.kind = kernel_kind::reduce_cols;
      k.group = pick;
      for (int i = 0; i < n; ++i)
        if (p.group[i] == pick && nodes[i].desc.kind == node_kind::reduce) k.node = i;
      k.space = g.space[pick];
    } else {
      k.kind = kernel_kind::rows;
      k.group = pick;
      k.space = g.space[pick];
    }
    for (int i = 0; i < n; ++i)
      if (unit[i] == pick) p.kernel_of[i] = p.n_kernels;
    p.kernels[p.n_kernels++] = k;
  }
  // Outputs that no kernel writes (a leaf, a view, an opaque result) are copied.
  for (int o : outputs) {
    const node_kind k = nodes[o].desc.kind;
    if (ir::is_leaf_kind(k) || k == node_kind::view || k == node_kind::opaque) {
      kernel c{};
      c.kind = kernel_kind::copy;
      c.node = o;
      c.space = nodes[o].desc.shape;
      p.kernels[p.n_kernels++] = c;
    }
  }

  // ---- 5. value twins: kernels whose every product is an earlier kernel's value ----
  // A kernel whose every product (a materialised node it writes: not an output, which must be
  // written, nor a matmul writing into its epilogue) has a twin first computed by an earlier
  // kernel that keeps it in memory of its own is skipped by a call whose value numbers say they
  // are equal: its products then point at the earlier values (a captured weight's product used
  // twice, an opaque() result that softmax copies four times).
  auto first_of = [&](int i) { return twins ? ir::first_twin(nodes, i) : i; };
  auto own_value = [&](int f) {  // f's memory holds f's value for the rest of the call
    const node_kind fk = nodes[f].desc.kind;
    if (!p.materialised[f] || p.kernel_of[f] < 0 || ir::is_leaf_kind(fk) || fk == node_kind::view) return false;
    const kernel& kf = p.kernels[p.kernel_of[f]];
    return !((fk == node_kind::matmul || fk == node_kind::spatial) && kf.node == f && kf.group >= 0);
  };
  for (int ki = 0; twins && ki < p.n_kernels; ++ki) {
    kernel& k = p.kernels[ki];
    if (k.kind == kernel_kind::copy) continue;
    bool all = true;
    int products = 0;
    for (int i = 0; i < n && all; ++i) {
      if (p.kernel_of[i] != ki || !own_value(i)) continue;
      const int f = first_of(i);
      all = !p.is_output[i] && f != i && p.kernel_of[f] >= 0 && p.kernel_of[f] < ki && own_value(f);
      ++products;
    }
    k.skippable = all && products > 0;
    if (!k.skippable) continue;
    for (int i = 0; i < n; ++i)
      if (p.kernel_of[i] == ki && own_value(i)) p.same_as[i] = first_of(i);
  }

  // ---- 6. passes and the row cache (and twins inside a row group) ----
  for (int ki = 0; ki < p.n_kernels; ++ki) {
    kernel& k = p.kernels[ki];
    if (k.kind != kernel_kind::rows) continue;
    int passes = 0;
    for (int i = 0; i < n; ++i)
      if (p.group[i] == k.group && nodes[i].desc.kind == node_kind::reduce) p.pass[i] = passes++;
    k.passes = passes;
    // A member whose type's first occurrence is in this group too reads that value when the call
    // numbers them equal; the cache below is planned for that case (a call where they differ
    // computes every member inline and uses no scratch: cpu/executor.hpp). layer_norm's output,
    // which softmax copies into each of its passes, is one value computed in the first.
    auto group_twin = [&](int i) {
      const int f = first_of(i);
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
    for (int i = 0; i < n; ++i) {
      if (p.group[i] != k.group || nodes[i].desc.kind != node_kind::pointwise || p.row_constant[i]) continue;
      cost[i] = nodes[i].desc.flops;
      for (int q = 0; q < nodes[i].n_inputs; ++q) {
        const int in = nodes[i].inputs[q];
        if (p.group[in] == k.group && !p.materialised[in]) cost[i] += cost[in];
      }
    }
    for (int i = n - 1; i >= 0; --i) {
      if (p.group[i] != k.group || nodes[i].desc.kind != node_kind::pointwise || p.row_constant[i]) continue;
      unsigned u = (p.materialised[i] ? (1u << passes) : 0u) | twin_uses[i];
      for (int c = 0; c < n; ++c) {
        if (!g.consumers_of[i][c] || p.group[c] != k.group || is_twin(c)) continue;  // a twin reads its first
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
      if (p.group[i] != k.group || nodes[i].desc.kind != node_kind::pointwise || p.row_constant[i]) continue;
      cost[i] = nodes[i].desc.flops;
      for (int q = 0; q < nodes[i].n_inputs; ++q) {
        const int in = nodes[i].inputs[q];
        if (p.group[in] == k.group && !p.materialised[in] && p.cache_slot[in] < 0) cost[i] += cost[in];
      }
      if (is_twin(i)) cost[i] = cost[p.same_as[i]];
      if (p.cache_slot[i] >= 0) p.cache_slot[i] = cost[i] >= 8 ? k.cached++ : -1;
    }
  }

  // ---- 7. arena (once every size is known; the run-time path calls it per concrete size) ----
  bool sizes_known = true;
  for (int i = 0; i < n; ++i) sizes_known = sizes_known && nodes[i].desc.shape.is_static();
  if (sizes_known) assign_arena(p, nodes, elem_bytes);
  else {
    p.row_scratch_elems = 0;
    p.arena_bytes = 0;
  }
  return p;
}

}  // namespace fusebox::plan
