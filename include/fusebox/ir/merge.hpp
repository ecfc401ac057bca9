// ir/merge.hpp: value numbering for the run-time path. The build-time lowering (ir/graph.hpp)
// merges identical subtrees only when they hold no payload, because two occurrences of one type
// may hold different scalars (`x * 0.5 + x * 0.7`). Most repeated subtrees do hold one: a
// composite copies its operand (softmax uses its input four times, layer_norm three), and the
// operand carries the model's scalars (`q·kᵀ * 0.125 + mask`), so without this each copy is
// computed again: W4's attention ran its projections three times and its score product four.
//
// At run time the values are known. `payload_classes` numbers a call's payload values (equal
// scalars by bits, captured tensors by address, shape and strides, user functions by capture:
// ir::same_payload, the equality the static path uses too),
// the guard keeps those numbers (a specialisation is valid only while the same values are equal),
// and `merge_duplicates` rewrites the graph so that a node equal to an earlier one (same type,
// same inputs after merging, same payload class) is computed once: its consumers read the
// earlier node, and it becomes an unused leaf like the padding. Node ids do not move, so frames,
// payload slots and plans keep indexing the same array.
// Depends on: core/tensor.hpp, expr/node.hpp, ir/{graph,value_numbers}.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstring>
#include <vector>

#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/node.hpp"
#include "fusebox/ir/graph.hpp"
#include "fusebox/ir/value_numbers.hpp"

namespace fusebox::jit {

/// Per node: for a payload node, the id of the first payload node of the same type holding an
/// equal value (itself if none); -1 for other nodes. `payload` is the call's payload table and
/// `loc` its bound memory (a captured tensor's view is bound there by cpu::bind_inputs).
template <class T, std::size_t N>
std::vector<int> payload_classes(const std::array<ir::node, N>& nodes, const void* const* payload,
                                 const strided<T>* loc) {
  std::vector<int> cls(N, -1);
  auto equal = [&](std::size_t i, std::size_t j) { return ir::same_payload(nodes, i, j, payload, loc); };
  std::vector<std::size_t> seen;  // payload nodes that start a class
  for (std::size_t i = 0; i < N; ++i) {
    if (nodes[i].payload_slot < 0 || !ir::is_payload_kind(nodes[i].desc.kind)) continue;
    cls[i] = static_cast<int>(i);
    for (std::size_t j : seen)
      if (equal(i, j)) {
        cls[i] = static_cast<int>(j);
        break;
      }
    if (cls[i] == static_cast<int>(i)) seen.push_back(i);
  }
  return cls;
}

/// The graph with every node that repeats an earlier one turned into an unused leaf and its
/// consumers pointed at the earlier one. `classes` from payload_classes (per node id; shorter
/// than the array where it is padded). Roots are never merged away: each root is bound to its
/// own output.
template <std::size_t N, std::size_t R>
std::array<ir::node, N> merge_duplicates(std::array<ir::node, N> nodes, const std::vector<int>& classes,
                                         const std::array<int, R>& roots) {
  std::array<int, N> rep{};
  for (std::size_t i = 0; i < N; ++i) rep[i] = static_cast<int>(i);
  auto is_root = [&](std::size_t i) {
    for (int r : roots)
      if (r == static_cast<int>(i)) return true;
    return false;
  };
  auto same = [&](std::size_t i, std::size_t j) {
    const ir::node &a = nodes[i], &b = nodes[j];
    if (a.type == nullptr || a.type != b.type || a.n_inputs != b.n_inputs) return false;
    if (a.desc.kind == node_kind::input) return false;  // inputs merge at lowering
    for (int k = 0; k < a.n_inputs; ++k)
      if (a.inputs[k] != b.inputs[k]) return false;
    if (ir::is_payload_kind(a.desc.kind)) return i < classes.size() && classes[i] >= 0 && classes[i] == classes[j];
    return true;
  };
  for (std::size_t i = 0; i < N; ++i) {
    ir::node& n = nodes[i];
    for (int k = 0; k < n.n_inputs; ++k) n.inputs[k] = rep[static_cast<std::size_t>(n.inputs[k])];
    if (is_root(i)) continue;
    for (std::size_t j = 0; j < i; ++j) {
      if (rep[j] != static_cast<int>(j) || !same(i, j)) continue;
      rep[i] = static_cast<int>(j);
      n = ir::node{};
      n.desc.kind = node_kind::scalar;
      n.desc.name = "unused";
      break;
    }
  }
  return nodes;
}

}  // namespace fusebox::jit
