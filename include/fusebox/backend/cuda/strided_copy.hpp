// backend/cuda/strided_copy.hpp: a copy between two device views of one shape, whatever their
// strides: a result that is a view of a kernel's output (a slice of attention's packed dk|dv, say)
// copied into the caller's contiguous tensor. Contiguous pairs take one cuMemcpy; others one NVRTC
// kernel, compiled once per process, that moves elements of 2, 4 or 8 bytes as such (a thread per
// element, grid-stride).
// Depends on: backend/cuda/{memory,module,nvrtc,driver}.hpp, core/{linkage,tensor}.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fusebox/backend/cuda/driver.hpp"
#include "fusebox/backend/cuda/memory.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/backend/cuda/nvrtc.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/linkage.hpp"
#include "fusebox/core/tensor.hpp"

namespace fusebox::cuda {

/// The kernel's parameter block; the source below declares the same layout.
struct strided_copy_args {
  std::uint64_t src = 0, dst = 0;
  long long shape[max_rank] = {}, src_stride[max_rank] = {}, dst_stride[max_rank] = {};
  long long total = 0;
  int rank = 0;
  int element_bytes = 4;
};

FUSEBOX_RUNTIME_API std::string strided_copy_source();

/// Queues a copy of `shape` elements of `element_bytes` each from src (strides `src_stride`, in
/// elements) to dst (`dst_stride`) on `on`.
FUSEBOX_RUNTIME_API void strided_copy_async(CUdeviceptr dst, const strides_t& dst_stride, CUdeviceptr src,
                                            const strides_t& src_stride, const dims& shape, std::size_t element_bytes,
                                            CUstream on);

// Definitions: compiled here, or once in the FUSEBOX_IMPLEMENTATION unit (core/linkage.hpp).
#if FUSEBOX_RUNTIME_BODIES
FUSEBOX_RUNTIME_API std::string strided_copy_source() {
  const std::string mr = std::to_string(max_rank);
  return "struct fb_copy_args {\n  unsigned long long src, dst;\n  long long shape[" + mr + "], src_stride[" + mr +
         "], dst_stride[" + mr + "];\n  long long total;\n  int rank;\n  int element_bytes;\n};\n" + R"(
template <class U>
__device__ void fb_copy(const fb_copy_args& a) {
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < a.total; t += (long long)gridDim.x * blockDim.x) {
    long long rest = t, s = 0, d = 0;
    for (int k = a.rank - 1; k >= 0; --k) {
      const long long c = rest % a.shape[k];
      rest /= a.shape[k];
      s += c * a.src_stride[k];
      d += c * a.dst_stride[k];
    }
    reinterpret_cast<U*>(a.dst)[d] = reinterpret_cast<const U*>(a.src)[s];
  }
}
extern "C" __global__ void fusebox_strided_copy(fb_copy_args a) {
  if (a.element_bytes == 2) fb_copy<unsigned short>(a);
  else if (a.element_bytes == 8) fb_copy<unsigned long long>(a);
  else fb_copy<unsigned int>(a);
}
)";
}

FUSEBOX_RUNTIME_API void strided_copy_async(CUdeviceptr dst, const strides_t& dst_stride, CUdeviceptr src,
                                            const strides_t& src_stride, const dims& shape, std::size_t element_bytes,
                                            CUstream on) {
  if (element_bytes != 2 && element_bytes != 4 && element_bytes != 8)
    FUSEBOX_THROW(invalid_argument("fusebox internal: strided copy of " + std::to_string(element_bytes) + "-byte elements"));
  strided_copy_args a;
  a.src = src;
  a.dst = dst;
  a.rank = static_cast<int>(shape.rank);
  a.total = static_cast<long long>(shape.size());
  a.element_bytes = static_cast<int>(element_bytes);
  for (std::size_t d = 0; d < shape.rank; ++d) {
    a.shape[d] = static_cast<long long>(shape.extent[d]);
    a.src_stride[d] = src_stride[d];
    a.dst_stride[d] = dst_stride[d];
  }
  if (a.total == 0) return;
  // One module per process (and device: fusebox uses one device per process).
  static const module m = [] {
    const auto r = nvrtc_compile(strided_copy_source(), "fusebox_strided_copy.cu", current_device().arch, {});
    return module(r.cubin, "fusebox_strided_copy");
  }();
  static const CUfunction fn = m.function("fusebox_strided_copy");
  void* args[] = {&a};
  dim3 grid, block;
  block.x = 256;
  grid.x = static_cast<unsigned>(std::clamp<long long>((a.total + 255) / 256, 1, 1 << 20));
  launch(fn, grid, block, 0, on, args, "strided copy " + to_string(shape));
}
#endif

}  // namespace fusebox::cuda
