// plan/arena.hpp: pass `arena`, offsets of the intermediate buffers by liveness over the kernel
// order, first fit; the arena's size is the result. It needs every extent: for static shapes it
// runs in make_plan, on the run-time path once per call's concrete sizes (backend/cpu/generated_program.hpp).
// Buffers: materialised nodes a kernel writes that are not outputs (those live in the caller's
// tensors), nor views, leaves or user functions' results, nor products written into their
// epilogue's buffer.
// Depends on: plan/plan.hpp, ir/graph.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/ir/graph.hpp"
#include "fusebox/plan/plan.hpp"
#include "fusebox/plan/planning.hpp"

namespace fusebox::plan {

namespace detail {

template <std::size_t N>
constexpr int alias_source(const std::array<ir::node, N>& nodes, int i) {
  while (ir::traits(nodes[i].desc.kind).alias) i = nodes[i].inputs[0];
  return i;
}

/// Per node: the last kernel that reads its memory (-1 if none). A node that may read an earlier
/// node's value (same_as) keeps that value's buffer as long as its own readers run; a copy kernel
/// (an output that is a view, e.g. a transposed weight's gradient) reads the view's source.
template <std::size_t N>
constexpr std::array<int, N> last_uses(const plan_t<N>& p, const std::array<ir::node, N>& nodes) {
  constexpr int n = static_cast<int>(N);
  std::array<int, N> last{};
  for (int i = 0; i < n; ++i) last[i] = -1;
  for (int i = 0; i < n; ++i) {
    const int ki = p.kernel_of[i];
    if (ki < 0) continue;
    for (int q = 0; q < nodes[i].n_inputs; ++q) {
      const int src = alias_source(nodes, nodes[i].inputs[q]);
      if (ki > last[src]) last[src] = ki;
    }
  }
  for (int i = n; i-- > 0;)
    if (p.same_as[i] >= 0 && last[i] > last[p.same_as[i]]) last[p.same_as[i]] = last[i];
  for (int ki = 0; ki < p.n_kernels; ++ki)
    if (p.kernels[ki].kind == kernel_kind::copy) {
      const int src = alias_source(nodes, p.kernels[ki].node);
      if (ki > last[src]) last[src] = ki;
    }
  return last;
}

template <std::size_t N>
constexpr bool arena_buffer(const plan_t<N>& p, const std::array<ir::node, N>& nodes, int i) {
  const int ki = p.kernel_of[i];
  if (ki < 0 || !p.materialised[i] || p.is_output[i]) return false;
  const ir::node_kind_traits& t = ir::traits(nodes[i].desc.kind);
  if (t.written_elsewhere) return false;
  return !(t.takes_epilogue && p.kernels[ki].node == i && p.kernels[ki].group >= 0);
}

}  // namespace detail

/// Sets offset[], arena_bytes and row_scratch_elems; `nodes` must have every extent known.
template <std::size_t N>
constexpr void assign_arena(plan_t<N>& p, const std::array<ir::node, N>& nodes, std::size_t elem_bytes) {
  constexpr int n = static_cast<int>(N);
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
  for (int i = 0; i < n; ++i) p.offset[i] = no_offset;
  const std::array<int, N> last_use = detail::last_uses(p, nodes);
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
      if (p.kernel_of[i] != ki || !detail::arena_buffer(p, nodes, i)) continue;
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

/// Pass `arena` in make_plan: assign_arena when every extent is known (static shapes).
template <std::size_t N>
constexpr void arena(planning<N>& s) {
  bool sizes_known = true;
  for (const ir::node& nd : s.nodes) sizes_known = sizes_known && nd.desc.shape.is_static();
  if (sizes_known) assign_arena(s.p, s.nodes, s.elem_bytes);
  else {
    s.p.row_scratch_elems = 0;
    s.p.arena_bytes = 0;
  }
}

/// After `arena`: two buffers that share bytes are never live at once.
template <std::size_t N>
constexpr void check_arena(planning<N>& s) {
  constexpr int n = static_cast<int>(N);
  const plan_t<N>& p = s.p;
  const std::array<int, N> last = detail::last_uses(p, s.nodes);
  auto bytes = [&](int i) { return (s.nodes[i].desc.shape.size() * s.elem_bytes + 63) / 64 * 64; };
  for (int i = 0; i < n; ++i) {
    if (p.offset[i] == no_offset) continue;
    plan_check(p.offset[i] + bytes(i) <= p.arena_bytes, "fusebox internal: after pass arena: a buffer ends past the arena");
    for (int j = i + 1; j < n; ++j) {
      if (p.offset[j] == no_offset) continue;
      const bool share = p.offset[i] < p.offset[j] + bytes(j) && p.offset[j] < p.offset[i] + bytes(i);
      const int bi = p.kernel_of[i], ei = last[i] < bi ? bi : last[i];
      const int bj = p.kernel_of[j], ej = last[j] < bj ? bj : last[j];
      plan_check(!share || ei < bj || ej < bi, "fusebox internal: after pass arena: two live buffers share bytes");
    }
  }
}

}  // namespace fusebox::plan
