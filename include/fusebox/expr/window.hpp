// expr/window.hpp: the parameters of a windowed NCHW op (conv2d, pooling and their gradient ops),
// as a plain value in every node's desc. The run-time path and the host executor see only the
// graph IR, never the op types, so what a kernel needs beyond its operands' shapes (which op,
// window, stride, padding, the input extents a gradient op produces) must travel in the desc.
// Depends on: nothing.
#pragma once

#include <cstdint>

namespace fusebox {

/// Which windowed op a node of kind `spatial` is (expr/spatial.hpp has the shape rules,
/// backend/cpu/spatial.hpp the kernels).
enum class spatial_op : std::uint8_t {
  none,
  conv2d,              ///< (x [N,C,H,W], w [O,C,KH,KW]) -> [N,O,OH,OW]
  conv2d_input_grad,   ///< (g [N,O,OH,OW], w [O,C,KH,KW]) -> dx [N,C,ih,iw]: a transposed convolution
  conv2d_weight_grad,  ///< (g [N,O,OH,OW], x [N,C,H,W]) -> dw [O,C,kh,kw]
  max_pool2d,          ///< (x [N,C,H,W]) -> [N,C,OH,OW]
  max_pool2d_backward, ///< (g [N,C,OH,OW], x [N,C,H,W]) -> dx: g routed to each window's first maximum
  avg_pool2d,          ///< (x [N,C,H,W]) -> [N,C,OH,OW]
  avg_pool2d_backward, ///< (g [N,C,OH,OW]) -> dx [N,C,ih,iw]
};

constexpr const char* name(spatial_op op) {
  constexpr const char* names[] = {"none",       "conv2d",              "conv2d_input_grad",
                                   "conv2d_weight_grad", "max_pool2d", "max_pool2d_backward",
                                   "avg_pool2d", "avg_pool2d_backward"};
  return names[static_cast<int>(op)];
}

/// Window parameters. Pooling and the weight gradient carry their window (kh, kw); conv2d and
/// its input gradient read it from the weight. The gradient ops whose result is an input's
/// gradient carry that input's height and width (ih, iw): with stride > 1 several input sizes
/// give one output size, so the gradient's shape cannot be derived from g alone.
struct window {
  spatial_op op = spatial_op::none;
  int kh = 0, kw = 0;
  int sh = 1, sw = 1;
  int ph = 0, pw = 0;
  int ih = 0, iw = 0;
};

}  // namespace fusebox
