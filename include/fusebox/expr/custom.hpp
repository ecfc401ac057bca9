// expr/custom.hpp: custom ops, node kinds defined in one header of their own.
//
// A custom op brings what the library's stages would otherwise each have to learn: its shape rule,
// a host kernel, a CUDA kernel and (in autodiff's usual way, `derivative<Op>`) its gradient. The
// node type is `custom_node<Op, Args...>` (like spatial_node<Op, Args...>); its desc points at
// `custom_kernels_of<Op>`, a table of plain functions, so every stage that does not know op types
// (the planner, the run-time path's specialisation and runners, the reports) handles all custom
// ops once, by `node_kind::custom` and `desc.custom`. Adding one (ops/cumsum.hpp is the example)
// touches that op's header and fusebox.hpp, nothing else.
//
// What Op gives (all static members):
//   name                 the op's name in reports and errors
//   flops                per output element, for reports
//   shape(in, n)         constexpr: the result's shape from the operands' (custom_shape_result; dyn
//                        extents stay dyn); ok = false when they do not fit
//   error(in, n)         why they do not fit, naming the op and the shapes
//   summary(in, n, out)  one line for explain() and profile spans ("cumsum along dimension 1 of [4, 9]")
//   run<T>(in, n, out, pool)   the host kernel (T float or double), operands and result strided
//   cuda_unit(in, n, out, storage)   CUDA source for NVRTC: a `struct fbc_args` and
//                        `__device__ void fbc_body(const fbc_args&)`; values are stored as `storage`
//                        (float, fb_bf16, fb_f16: convert with fb_to_float / fb_from_float<T>)
//   cuda_params(in, n, out, params)   writes the fbc_args of one launch into `params` (at most
//                        custom_params_capacity bytes) and returns the grid, block and size
// Custom ops run as a kernel of their own (not fused); the static CUDA path (nvcc) hands a call
// holding one to the run-time path, as it does for gathers.
// Depends on: expr/node.hpp, core/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>

#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/node.hpp"

namespace fusebox {
namespace cpu {
class thread_pool;
}

struct custom_shape_result {
  dims out{};
  bool ok = true;
};

/// An operand or the result of a custom op on the device: its address, extents and strides
/// (elements of the storage type).
struct custom_device_view {
  std::uint64_t address = 0;
  dims shape{};
  strides_t stride{};
};

/// One launch of a custom op's CUDA kernel: grid and block sizes and the parameter block's size
/// (grid 0: nothing to do).
struct custom_launch {
  unsigned grid = 0, block = 0;
  std::size_t bytes = 0;
};

inline constexpr std::size_t custom_params_capacity = 4096;

/// What the stages that do not know the op's type call (node_desc::custom points at one).
struct custom_kernels {
  custom_shape_result (*shape)(const dims* in, int n);
  std::string (*error)(const dims* in, int n);
  std::string (*summary)(const dims* in, int n, const dims& out);
  void (*run_f32)(const strided<float>* in, int n, const strided<float>& out, cpu::thread_pool& pool);
  void (*run_f64)(const strided<double>* in, int n, const strided<double>& out, cpu::thread_pool& pool);
  std::string (*cuda_unit)(const dims* in, int n, const dims& out, const char* storage);
  custom_launch (*cuda_params)(const custom_device_view* in, int n, const custom_device_view& out, void* params);
};

/// Op's table (its static members; see the header comment).
template <class Op>
inline constexpr custom_kernels custom_kernels_of{&Op::shape,
                                                  &Op::error,
                                                  &Op::summary,
                                                  &Op::template run<float>,
                                                  &Op::template run<double>,
                                                  &Op::cuda_unit,
                                                  &Op::cuda_params};

/// The host kernel of a custom node for element type T.
template <class T>
void run_custom(const custom_kernels& k, const strided<T>* in, int n, const strided<T>& out, cpu::thread_pool& pool) {
  if constexpr (std::is_same_v<T, float>) k.run_f32(in, n, out, pool);
  else k.run_f64(in, n, out, pool);
}

namespace static_check {
template <class Op, bool Ok, class... OperandShapes>
struct custom_shapes {
  static_assert(Ok, "fusebox: the operands' shapes do not fit this op (its name is Op's, the shapes are the "
                    "template arguments above)");
  static constexpr bool value = Ok;
};
}  // namespace static_check

/// A node of custom op Op (see the header comment).
template <class Op, class... Args>
struct custom_node : expr_base {
  static_assert(sizeof...(Args) >= 1, "fusebox: a custom op takes at least one operand");
  using children = meta::type_list<Args...>;
  using A0 = meta::at_t<0, children>;
  static constexpr dims in_shapes[] = {Args::desc.shape...};
  static constexpr custom_shape_result rule = Op::shape(in_shapes, static_cast<int>(sizeof...(Args)));
  static_assert(static_check::custom_shapes<Op, rule.ok, detail::shape_type_of<Args>...>::value);
  static_assert((std::is_same_v<typename A0::value_type, typename Args::value_type> && ...),
                "fusebox: a custom op's operands must hold the same element type");
  using value_type = typename A0::value_type;
  using op = Op;
  static constexpr node_desc desc = [] {
    node_desc d{node_kind::custom, Op::name, rule.out};
    d.flops = Op::flops;
    d.custom = &custom_kernels_of<Op>;
    return d;
  }();
  static constexpr bool has_payload = (Args::has_payload || ...);
  static constexpr bool symbolic = (Args::symbolic || ...);
  static constexpr bool fullgraph = (Args::fullgraph || ...);
  std::tuple<Args...> args;

  template <std::size_t I>
  const auto& child() const { return std::get<I>(args); }
};

}  // namespace fusebox
