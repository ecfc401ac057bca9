// schedule/schedule.hpp: the decisions below the planner, made once per plan for one back end.
// The plan says what each kernel computes; the schedule says how a back end runs it: which
// dimensions of its space merge (schedule/merge_dims.hpp), how its work splits into tasks
// (schedule/tasks.hpp), how much of a matmul's epilogue the library call takes
// (schedule/library_epilogue.hpp), and, in a rows kernel with reduction passes, where each value
// lives between passes and whether a thread holds its row in registers (schedule/row_values.hpp).
// It is a constexpr function of the plan and the back end's
// capabilities (`backend_caps`): the static path makes it at build time, the run-time path once per
// specialisation, and the runners only carry it out.
// Depends on: plan/plan.hpp, ir/graph.hpp, schedule/{library_epilogue,merge_dims,row_values,tasks}.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/ir/graph.hpp"
#include "fusebox/plan/plan.hpp"
#include "fusebox/schedule/library_epilogue.hpp"
#include "fusebox/schedule/merge_dims.hpp"
#include "fusebox/schedule/row_values.hpp"
#include "fusebox/schedule/tasks.hpp"

namespace fusebox::schedule {

/// What a back end can do, as the schedule needs it.
struct backend_caps {
  /// Its generated row kernels take a space whose dimensions the runner merged at bind time.
  bool merged_rows = false;
  /// ... for elementwise kernels whose planned row is at most this long (a known extent). On the
  /// CPU the merge costs a little per row, so any row; a CUDA kernel over a merged space reads its
  /// extents from the arguments and divides by them per thread where literal extents were
  /// multiplications, which cost W1 (rows of thousands) 27% on the H100: there only rows short
  /// enough to limit the vector width (T2's [.., 4, 4]) merge.
  std::size_t merged_rows_up_to = static_cast<std::size_t>(-1);
  /// Its column reductions merge the dimensions after the reduced axis.
  bool merged_columns = false;
  library_epilogue_caps matmul_library{};
  /// Where rows kernels keep values between passes (schedule/row_values.hpp).
  row_caps rows{};
};

inline constexpr backend_caps cpu_caps{.merged_rows = true, .merged_columns = true, .rows = {.scratch = true}};
/// For float32 storage; the run-time path sets rows.element_bytes to its storage type's.
inline constexpr backend_caps cuda_caps{.merged_rows = true,
                                        .merged_rows_up_to = 32,
                                        .merged_columns = false,
                                        .matmul_library = {true, true, true, true},
                                        .rows = {.register_vectors = 8, .register_scalars = 32}};

struct kernel_schedule {
  /// Merge neighbouring dimensions of the kernel's space from this one on, where every operand
  /// walks them as one (-1: keep the space as planned).
  int merge_from = -1;
  /// A matmul: what its library call takes of the epilogue.
  library_epilogue library{};
  /// A rows kernel with passes: how a thread holds its share of the row.
  row_registers registers{};
};

template <std::size_t N>
struct schedule_t {
  std::array<kernel_schedule, N + 1> kernels{};
  /// Rows kernels with passes: where each member's value lives between passes.
  std::array<keep, N> keep_in{};
};

/// Whether rows kernel `kn` is elementwise: nothing computed per row (no reduction, no per-row
/// value), so every element is independent and its dimensions may merge.
template <std::size_t N>
constexpr bool elementwise_rows(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p, const plan::kernel& kn) {
  if (kn.kind != plan::kernel_kind::rows || kn.passes > 0) return false;
  for (std::size_t i = 0; i < N; ++i)
    if (p.group[i] == kn.group && (nodes[i].desc.kind == node_kind::reduce || p.row_constant[i])) return false;
  return true;
}

template <std::size_t N>
constexpr schedule_t<N> make_schedule(const std::array<ir::node, N>& nodes, const plan::plan_t<N>& p,
                                      const std::array<bool, N>& unit_inner, const backend_caps& caps) {
  schedule_t<N> s{};
  for (int k = 0; k < p.n_kernels; ++k) {
    const plan::kernel& kn = p.kernels[k];
    kernel_schedule& ks = s.kernels[k];
    switch (kn.kind) {
      case plan::kernel_kind::rows:
        if (kn.passes > 0) {
          ks.registers = registers_of(kn, caps.rows);
          keep_values(nodes, p, kn, ks.registers, caps.rows, s.keep_in);
        }
        if (caps.merged_rows && elementwise_rows(nodes, p, kn) &&
            (caps.merged_rows_up_to == static_cast<std::size_t>(-1) ||
             (is_known_extent(kn.space.back(0)) && kn.space.back(0) <= caps.merged_rows_up_to)))
          ks.merge_from = 0;
        break;
      case plan::kernel_kind::reduce_cols:
        if (caps.merged_columns) ks.merge_from = nodes[kn.node].desc.axis + 1;
        break;
      case plan::kernel_kind::matmul: ks.library = library_epilogue_of(nodes, p, kn, unit_inner, caps.matmul_library); break;
      default: break;
    }
  }
  return s;
}

}  // namespace fusebox::schedule
