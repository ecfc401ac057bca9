// jit/kernel_abi.hpp: the calling convention between the host and generated kernels. Plain data
// only: a generated shared object and the host agree on nothing else.
//
// Node numbers inside a generated kernel are local (0, 1, ... in the order the kernel first uses
// them), so identical kernels from different places in a model have identical source, and one
// compiled object serves them all (the regional compilation of DESIGN.md).
// Depends on: the standard library only.
#pragma once

#include <cstddef>

namespace fusebox::jit {

inline constexpr std::size_t abi_max_rank = 6;

struct kernel_args {
  void* const* ptr;              ///< per local node: address of element 0 (materialised nodes)
  const std::ptrdiff_t* stride;  ///< per local node: abi_max_rank strides in the kernel's index space (0 where broadcast)
  const std::size_t* space;      ///< extents of the kernel's index space
  const double* scalar;          ///< per local node: the value of a scalar operand
  std::byte* scratch;            ///< row scratch of worker 0; worker w at scratch + w * scratch_stride
  std::size_t scratch_stride;
  std::size_t rank;              ///< dimensions of the index space (fewer than planned where the host merged them)
  bool stream;                   ///< rows kernels: write outputs past the caches (schedule::streams_output)
};

/// The offset of local node l's element at (row, column 0) of a kernel whose space the host
/// merged at bind time (schedule/merge_dims.hpp): rows are the dimensions before the last, walked
/// with the call's extents and strides.
inline std::ptrdiff_t row_offset(const kernel_args* a, std::size_t l, std::size_t row) {
  std::ptrdiff_t o = 0;
  for (std::size_t d = a->rank - 1; d-- > 0;) {
    o += static_cast<std::ptrdiff_t>(row % a->space[d]) * a->stride[l * abi_max_rank + d];
    row /= a->space[d];
  }
  return o;
}

/// rows kernels: rows [r0, r1), columns [c0, c1).
using rows_fn = void (*)(const kernel_args*, std::size_t r0, std::size_t r1, std::size_t c0, std::size_t c1,
                         unsigned worker);
/// column reductions: output rows [o0, o1), columns [c0, c1) (the task split of
/// schedule/tasks.hpp's split_columns).
using cols_fn = void (*)(const kernel_args*, std::size_t o0, std::size_t o1, std::size_t c0, std::size_t c1);
/// matmul epilogues: columns [j0, j0 + n) of output row `row` (batch * M + i).
using epilogue_fn = void (*)(const kernel_args*, std::size_t row, std::size_t j0, std::size_t n);

/// The one exported symbol of every generated object.
inline constexpr const char* kernel_symbol = "fusebox_kernel";

}  // namespace fusebox::jit
