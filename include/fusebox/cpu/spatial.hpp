// cpu/spatial.hpp: runs a spatial node (conv2d, pooling, their gradients) from its IR desc. Both
// executors call this: the static one (cpu/executor.hpp) and the run-time path's host side
// (jit/program.hpp), which knows nodes only by their desc, so the choice of kernel is a switch on
// `desc.win.op` here, in one place; the kernels are in cpu/conv.hpp and cpu/pool.hpp.
// Depends on: cpu/conv.hpp, cpu/pool.hpp, expr/window.hpp.
#pragma once

#include <cstddef>
#include <span>

#include "fusebox/cpu/conv.hpp"
#include "fusebox/cpu/pool.hpp"
#include "fusebox/expr/window.hpp"

namespace fusebox::cpu {

/// Workspace bytes of a spatial node with operand shapes a, b (b: rank 0 for one operand) and
/// output shape out, on `threads` threads.
template <class T>
constexpr std::size_t spatial_workspace_bytes(const window& win, const dims& a, const dims& b, const dims& out, unsigned threads) {
  switch (win.op) {
    case spatial_op::conv2d: return conv_workspace_bytes<T>(win.op, win, a, b, out, threads);
    case spatial_op::conv2d_input_grad: return conv_workspace_bytes<T>(win.op, win, out, b, a, threads);
    case spatial_op::conv2d_weight_grad: return conv_workspace_bytes<T>(win.op, win, b, out, a, threads);
    default: return 0;  // pooling needs none
  }
}

/// out = the op of `win` over a (and b), then epilogue(row, j0, n) on each finished row run of out.
template <class T, class Epilogue>
void run_spatial(const window& win, const strided<T>& a, const strided<T>& b, const strided<T>& out, thread_pool& pool,
                 std::span<std::byte> ws, Epilogue&& epilogue) {
  switch (win.op) {
    case spatial_op::conv2d: conv2d_forward(win, a, b, out, pool, ws, epilogue); break;
    case spatial_op::conv2d_input_grad: conv2d_input_grad(win, a, b, out, pool, ws, epilogue); break;
    case spatial_op::conv2d_weight_grad: conv2d_weight_grad(win, a, b, out, pool, ws, epilogue); break;
    case spatial_op::max_pool2d:
    case spatial_op::avg_pool2d: pool2d_forward(win, a, out, pool, epilogue); break;
    case spatial_op::max_pool2d_backward:
    case spatial_op::avg_pool2d_backward: pool2d_backward(win, a, b, out, pool, epilogue); break;
    default: throw invalid_argument("fusebox internal: a spatial node without an op");
  }
}

}  // namespace fusebox::cpu
