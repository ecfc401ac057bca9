// schedule/merge_dims.hpp: merging neighbouring dimensions of a kernel's index space that every
// operand walks as one (stride[d] == stride[d + 1] * extent[d + 1]): fewer, longer rows for the
// same elements, where the addressing is paid per row. T2's relu mask over [128, 64, 4, 4] was
// 32768 rows of 4 (~180-220 µs) and is one row cut into column blocks (~45 µs); its bias sums over
// [128, 32, 24, 24] are 4096 rows of 576 instead of 98304 rows of 24.
//
// Which kernels merge, and from which dimension, is the schedule's decision (`merge_from`, made
// once per plan); the merge itself needs the call's strides, so every runner calls `merge_dims`
// at bind time. An operand constant along a dimension has stride 0 there (an extent of 1 too), so
// a broadcast operand merges only along what it is constant over, and stays constant along the
// merged row.
// Depends on: core/shape.hpp.
#pragma once

#include <cstddef>

#include "fusebox/core/shape.hpp"

namespace fusebox::schedule {

/// Merges dimensions of `space` from `first` on, in place, with each operand's strides:
/// `stride_of(q)` is operand q's stride array over `space` (q < operands).
template <class StrideOf>
constexpr void merge_dims(std::size_t first, dims& space, int operands, StrideOf&& stride_of) {
  if (space.rank < 2) return;
  for (std::size_t d = space.rank - 1; d-- > first;) {
    bool joint = true;
    for (int q = 0; q < operands && joint; ++q) {
      const std::ptrdiff_t* s = stride_of(q);
      joint = s[d] == s[d + 1] * static_cast<std::ptrdiff_t>(space.extent[d + 1]);
    }
    if (!joint) continue;
    space.extent[d] *= space.extent[d + 1];
    for (int q = 0; q < operands; ++q) {
      std::ptrdiff_t* s = stride_of(q);
      s[d] = s[d + 1];
      for (std::size_t e = d + 1; e + 1 < space.rank; ++e) s[e] = s[e + 1];
    }
    for (std::size_t e = d + 1; e + 1 < space.rank; ++e) space.extent[e] = space.extent[e + 1];
    --space.rank;
  }
}

}  // namespace fusebox::schedule
