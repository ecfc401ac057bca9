// backend/cuda/custom_kernels.hpp: a custom op's CUDA unit (expr/custom.hpp) on the run-time path.
// The op writes its parameter block and body; this file wraps them into a unit of the three entry
// points every NVRTC unit has (the op's one body behind all three), and launches it with the
// parameter block the op fills for each call's addresses and extents.
// Depends on: expr/custom.hpp, backend/cuda/codegen.hpp (rendered_cuda_kernel, storage names),
// backend/cuda/module.hpp (launch), ir/graph.hpp.
#pragma once

#include <cstdint>
#include <string>

#include "fusebox/backend/cuda/codegen.hpp"
#include "fusebox/backend/cuda/module.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/expr/custom.hpp"
#include "fusebox/ir/graph.hpp"

namespace fusebox::jit {

/// The unit of custom node n, whose operands have the extents `in` at this specialisation.
inline rendered_cuda_kernel render_cuda_custom(const ir::node& n, const dims* in, dtype storage) {
  rendered_cuda_kernel r;
  r.kind = plan::kernel_kind::custom;
  r.summary = n.desc.custom->summary(in, n.n_inputs, n.desc.shape);
  r.source = n.desc.custom->cuda_unit(in, n.n_inputs, n.desc.shape, cuda_storage_name(storage));
  r.source += R"(
extern "C" __global__ void fusebox_kernel(fbc_args a) { fbc_body(a); }
extern "C" __global__ void fusebox_kernel_w(fbc_args a) { fbc_body(a); }
extern "C" __global__ void fusebox_kernel_v1(fbc_args a) { fbc_body(a); }
)";
  return r;
}

/// Queues custom node n (unit rk, entry fn) on `on`: operands `in`, result `out` in device memory.
template <class T>
void launch_custom(const rendered_cuda_kernel& rk, cuda::CUfunction fn, const ir::node& n, const strided<T>* in,
                   const strided<T>& out, cuda::CUstream on) {
  auto view = [](const strided<T>& x) {
    return custom_device_view{reinterpret_cast<std::uint64_t>(x.data), x.shape, x.stride};
  };
  custom_device_view v[ir::max_inputs];
  for (int q = 0; q < n.n_inputs; ++q) v[q] = view(in[q]);
  alignas(16) unsigned char params[custom_params_capacity];
  const custom_launch l = n.desc.custom->cuda_params(v, n.n_inputs, view(out), params);
  if (l.bytes > custom_params_capacity)
    FUSEBOX_THROW(invalid_argument(std::string("fusebox internal: custom op ") + n.desc.name + " wrote " +
                                   std::to_string(l.bytes) + " bytes of parameters; the most is " +
                                   std::to_string(custom_params_capacity)));
  if (l.grid == 0) return;
  void* args[] = {params};
  cuda::dim3 grid, block;
  grid.x = l.grid;
  block.x = l.block;
  cuda::launch(fn, grid, block, 0, on, args, rk.summary);
}

}  // namespace fusebox::jit
