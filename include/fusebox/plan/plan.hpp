// plan/plan.hpp: what the planner decides, as plain data: fusion groups, which node has memory,
// the kernels in order, what a row kernel keeps in its per-row scratch, and the arena offsets.
// Written by the passes (plan/planner.hpp lists them), read by the schedule and the back ends.
// Depends on: core/shape.hpp, ir/node_kinds.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/core/shape.hpp"
#include "fusebox/ir/node_kinds.hpp"

namespace fusebox::plan {

using ir::kernel_kind;
using ir::name;

/// What a fusion group computes: elementwise over one space, row by row with last-axis
/// reductions (softmax, layer_norm), or a reduction along another axis (column sums).
enum class group_kind : std::uint8_t { pointwise, rows, columns };

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

}  // namespace fusebox::plan
