// backend/cpu/addressing.hpp: where a node's elements are in a kernel's index space. Shared by the static
// executor and the host side of generated kernels, so both address memory the same way.
// Depends on: core/tensor.hpp.
#pragma once

#include <cstddef>

#include "fusebox/core/tensor.hpp"

namespace fusebox::cpu {

/// Strides of `m` in the index space `space`: dimensions line up from the right (NumPy), and a
/// dimension of extent 1 (broadcast) gets stride 0.
template <class T>
void space_strides(const strided<T>& m, const dims& space, std::ptrdiff_t* out) {
  const std::size_t r = space.rank, rn = m.shape.rank;
  for (std::size_t d = 0; d < r; ++d) {
    out[d] = 0;
    if (d + rn >= r) {
      const std::size_t nd = d + rn - r;
      out[d] = m.shape.extent[nd] == 1 ? 0 : m.stride[nd];
    }
  }
}

/// Strides of a reduction's output in its input's index space: the reduced axis gets stride 0,
/// and without keepdim the output's dimensions line up from the left, skipping that axis.
template <class T>
void reduced_space_strides(const strided<T>& out, const dims& space, std::size_t axis, bool keepdim,
                           std::ptrdiff_t* res) {
  for (std::size_t d = 0, od = 0; d < space.rank; ++d) {
    if (d == axis) {
      res[d] = 0;
      if (keepdim) ++od;
    } else {
      res[d] = out.shape.extent[od] == 1 ? 0 : out.stride[od];
      ++od;
    }
  }
}

/// Product of all extents but the last: the number of rows of a space.
constexpr std::size_t outer_size(const dims& s) {
  std::size_t r = 1;
  for (std::size_t d = 0; d + 1 < s.rank; ++d) r *= s.extent[d];
  return r;
}

/// Copies src into dst element by element (any strides, same extents).
template <class T>
void strided_copy(const strided<T>& src, const strided<T>& dst) {
  const std::size_t n = src.size(), r = src.shape.rank;
  for (std::size_t e = 0; e < n; ++e) {
    std::ptrdiff_t so = 0, d_o = 0;
    std::size_t rest = e;
    for (std::size_t d = r; d-- > 0;) {
      const std::size_t c = rest % src.shape.extent[d];
      rest /= src.shape.extent[d];
      so += static_cast<std::ptrdiff_t>(c) * src.stride[d];
      d_o += static_cast<std::ptrdiff_t>(c) * dst.stride[d];
    }
    dst.data[d_o] = src.data[so];
  }
}

}  // namespace fusebox::cpu
