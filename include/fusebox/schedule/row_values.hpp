// schedule/row_values.hpp: inside a rows kernel with reduction passes, where each member's value
// lives between passes, and whether a thread holds its share of the row in registers.
//
//   keep::scratch    a back end with a per-thread row scratch (the CPU) keeps what the planner's
//                    row_cache pass chose (plan::cache_slot: a costly member two passes need),
//                    written in its first pass and read back after, in the planner's slot.
//   keep::registers  a back end that holds rows in registers (CUDA, when the row length is known
//                    and a thread's share is a few vectors) keeps the pointwise input of every
//                    reduction that something else in the kernel also consumes (softmax's
//                    exp(x - max) feeds the sum and the division; layer_norm's quotient its mean
//                    and the centring): computed once per element instead of once per pass. W2's
//                    exp ran four times per element and its division three, about as much time as
//                    the kernel's memory traffic.
//   keep::none       recomputed where used.
// The register geometry: threads per row (a power of two from 32, about four vector chunks a
// thread), and four rows a block where a warp holds a row (no barrier, no shared memory to reduce:
// W4's layer_norm over [2048, 768]).
// Depends on: plan/plan.hpp, ir/graph.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "fusebox/ir/graph.hpp"
#include "fusebox/plan/plan.hpp"

namespace fusebox::schedule {

/// Where a rows kernel keeps a member's value for its later passes.
enum class keep : std::uint8_t { none, scratch, registers };

/// How a thread holds its share of a row (threads 0: the row is read from memory in each pass).
struct row_registers {
  unsigned threads = 0;         ///< threads per row
  unsigned rows_per_block = 1;  ///< rows a block takes at once (a warp each when > 1)
};

/// What the row decisions need of a back end.
struct row_caps {
  bool scratch = false;            ///< a per-thread row scratch (the planner's cache slots)
  std::size_t register_vectors = 0;  ///< the most vectors of a row a thread holds in registers (0: none)
  std::size_t register_scalars = 0;  ///< ... and scalars, where the vector entry is not taken
  std::size_t vector_bytes = 16;
  std::size_t element_bytes = 4;   ///< of the storage type
};

/// The register geometry of rows kernel `kn` (with passes) on a back end with caps `c`.
constexpr row_registers registers_of(const plan::kernel& kn, const row_caps& c) {
  row_registers r;
  const std::size_t w = kn.space.back(0);  // 1 for a rank-0 space
  if (c.register_vectors == 0 || !is_known_extent(w)) return r;
  const std::size_t vec = c.vector_bytes / c.element_bytes;
  const std::size_t chunks = (w + vec - 1) / vec;
  unsigned threads = 32;
  while (threads < 1024 && threads * 4 < chunks) threads *= 2;
  const std::size_t k_vec = (w + vec * threads - 1) / (vec * threads), k_scalar = (w + threads - 1) / threads;
  if (k_vec > c.register_vectors || k_scalar > c.register_scalars) return r;
  r.threads = threads;
  if (threads == 32) r.rows_per_block = 4;
  return r;
}

/// keep_in[i] for the members of rows kernel `kn` (see the header comment).
template <std::size_t N>
constexpr void keep_values(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p, const plan::kernel& kn,
                           const row_registers& regs, const row_caps& c, std::array<keep, N>& keep_in) {
  auto member = [&](int g) { return kn.group >= 0 && p.group[g] == kn.group; };
  if (regs.threads > 0) {
    for (std::size_t r = 0; r < N; ++r) {
      if (!member(static_cast<int>(r)) || nodes[r].desc.kind != node_kind::reduce) continue;
      const int in = nodes[r].inputs[0];
      if (!member(in) || nodes[in].desc.kind != node_kind::pointwise || p.row_constant[in]) continue;
      int consumers = 0;
      for (std::size_t h = 0; h < N; ++h)
        if (member(static_cast<int>(h)))
          for (int q = 0; q < nodes[h].n_inputs; ++q) consumers += nodes[h].inputs[q] == in;
      if (consumers > 1) keep_in[static_cast<std::size_t>(in)] = keep::registers;
    }
  } else if (c.scratch) {
    for (std::size_t i = 0; i < N; ++i)
      if (member(static_cast<int>(i)) && p.cache_slot[i] >= 0) keep_in[i] = keep::scratch;
  }
}

}  // namespace fusebox::schedule
