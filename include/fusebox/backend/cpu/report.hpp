// backend/cpu/report.hpp: a static CPU program's plan in words (plan/report.hpp's report of its
// constexpr plan, with the vector width, threads, arena and workspace), and its kernels' names for
// the profiler's spans.
// Depends on: backend/cpu/{executor,spatial}.hpp, plan/report.hpp.
#pragma once

#include <span>
#include <string>

#include "fusebox/backend/cpu/executor.hpp"
#include "fusebox/backend/cpu/spatial.hpp"
#include "fusebox/plan/report.hpp"

namespace fusebox::cpu {

/// The fused ops of kernel k of program P, as explain() lists them and the profiler names the
/// kernel's span: "mul, add, gelu", "matmul + epilogue(add, relu)", "conv2d + epilogue(add)".
template <class P>
std::string kernel_ops(int k) {
  return plan::kernel_ops(P::nodes, P::plan, k);
}

/// How kernel `kn` convolves, where it does ("" otherwise): by Winograd where the shapes qualify and
/// it is on (max_autotune may time im2col + gemm faster and take it), by im2col + gemm elsewhere.
/// For explain(): the static path's plan and the run-time path's plan at one call's extents.
template <class T>
std::string conv_algorithm(std::span<const ir::node> nodes, const plan::kernel& kn) {
  if (kn.kind != plan::kernel_kind::spatial) return "";
  const ir::node& n = nodes[kn.node];
  const window& w = n.desc.win;
  if (w.op != spatial_op::conv2d && w.op != spatial_op::conv2d_input_grad && w.op != spatial_op::conv2d_weight_grad)
    return "";
  const dims b = n.n_inputs == 2 ? nodes[n.inputs[1]].desc.shape : dims{};
  const dims& a = nodes[n.inputs[0]].desc.shape;
  if (!(conv_winograd() && winograd_applies<T>(w, a, b, n.desc.shape))) return "im2col + gemm; ";
  const bool lanes = w.op == spatial_op::conv2d &&
                     winograd::few_tiles<T>(winograd::tiled_of(detail::conv_geometry_of(w, a, b, n.desc.shape)));
  return std::string("Winograd F(4x4, 5x5)") + (lanes ? ", channels in the vector lanes (few tiles)" : "") +
         " (max_autotune times im2col + gemm against it); ";
}

/// Kernel-by-kernel description of program P run with `threads` threads (static shapes).
template <class P>
std::string describe(unsigned threads) {
  using T = typename P::value_type;
  const std::string how = "vector width " + std::to_string(P::VS) + " x " + name(dtype_of<T>()) + "; threads " +
                          std::to_string(threads);
  // The schedule's merge is made at bind time, from the call's strides (schedule/merge_dims.hpp).
  auto how_k = [&](int k) {
    const int from = P::sched.kernels[k].merge_from;
    return conv_algorithm<T>(P::nodes, P::plan.kernels[k]) + how +
           (from < 0 ? std::string() : "; dimensions from " + std::to_string(from) + " merged per call");
  };
  return plan::describe_kernels(P::nodes, P::plan, sizeof(T), how_k) +
         "  arena: " + plan::detail::human_bytes(static_cast<double>(P::arena_bytes)) + " (constexpr), workspace: " +
         plan::detail::human_bytes(static_cast<double>(P::workspace_bytes(threads))) + " for " +
         std::to_string(threads) + " thread(s)\n";
}

}  // namespace fusebox::cpu
