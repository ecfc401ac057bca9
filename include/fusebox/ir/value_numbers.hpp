// ir/value_numbers.hpp: which nodes of a lowered graph are one value in this call.
//
// The lowering merges identical subtrees that hold no payload; occurrences of one type that do
// hold one (a scalar, a captured tensor, a user function) stay separate nodes, linked by `twin`,
// because two of them may hold different values (`x * 0.5 + x * 0.7`). Most are copies of one
// value, though: a composite copies its operand (softmax four times, layer_norm three) and a
// user reads one result twice. The call knows the payloads, so it numbers the values:
//
//   same_payload   two payload nodes of one type hold the same value: scalars by bits, captured
//                  tensors by address, shape and strides, user functions by capture (opaque_base:
//                  copies of one opaque() call are one call; two calls are two).
//   number_values  vn[i] = the first node with i's value: a payload node of the same type and
//                  payload, or an interior node of the same type whose inputs have equal numbers.
//
// The static path plans as if twins were one value and asks vn per call whether they are
// (backend/cpu/executor.hpp); the run-time path rewrites its graph with the same equality
// (ir/merge.hpp). Allocation-free: the static path's calls allocate nothing after the first.
// Depends on: core/tensor.hpp, expr/node.hpp, ir/graph.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstring>

#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/node.hpp"
#include "fusebox/ir/graph.hpp"

namespace fusebox::ir {

/// Payload nodes i and j (of one type) hold the same value. `payload` is the call's payload
/// table; `loc` its bound memory (captured tensors' views are bound there).
template <class T, std::size_t N>
bool same_payload(const std::array<node, N>& nodes, std::size_t i, std::size_t j, const void* const* payload,
                  const strided<T>* loc) {
  const node &a = nodes[i], &b = nodes[j];
  if (a.type != b.type) return false;
  switch (a.desc.kind) {
    case node_kind::scalar:
      return std::memcmp(&static_cast<const scalar_leaf<T>*>(payload[a.payload_slot])->value,
                         &static_cast<const scalar_leaf<T>*>(payload[b.payload_slot])->value, sizeof(T)) == 0;
    case node_kind::opaque:
      return static_cast<const opaque_base*>(payload[a.payload_slot])->capture_id ==
             static_cast<const opaque_base*>(payload[b.payload_slot])->capture_id;
    case node_kind::tensor: {
      const strided<T>&va = loc[i], &vb = loc[j];  // the same memory, read the same way
      if (va.data != vb.data || !(va.shape == vb.shape)) return false;
      for (std::size_t d = 0; d < va.shape.rank; ++d)
        if (va.stride[d] != vb.stride[d]) return false;
      return true;
    }
    default: return true;  // an interior node: its inputs decide
  }
}

/// vn[i]: the lowest id holding node i's value in this call (i itself if no earlier one does).
/// Nodes without a twin are their own number; a node with twins takes the number of the first
/// earlier occurrence with an equal payload and inputs of equal numbers.
template <class T, std::size_t N>
void number_values(const std::array<node, N>& nodes, const void* const* payload, const strided<T>* loc,
                   std::array<int, N>& vn) {
  for (std::size_t i = 0; i < N; ++i) {
    vn[i] = static_cast<int>(i);
    for (int c = nodes[i].twin; c >= 0; c = nodes[c].twin) {
      const auto j = static_cast<std::size_t>(c);
      bool same = same_payload(nodes, i, j, payload, loc);
      for (int k = 0; k < nodes[i].n_inputs && same; ++k) same = vn[nodes[i].inputs[k]] == vn[nodes[j].inputs[k]];
      if (same) {
        vn[i] = vn[j];
        break;
      }
    }
  }
}

/// The first occurrence of node i's type (i itself when it has no twin).
template <std::size_t N>
constexpr int first_twin(const std::array<node, N>& nodes, int i) {
  while (nodes[i].twin >= 0) i = nodes[i].twin;
  return i;
}

}  // namespace fusebox::ir
