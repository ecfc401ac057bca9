// ops/pool.hpp: 2-d max and average pooling over NCHW, torch's max_pool2d / avg_pool2d.
//
//   auto y = max_pool2d<Kernel, Stride = Kernel, Padding = 0>(x);   // x [N,C,H,W] -> [N,C,OH,OW]
//   auto y = avg_pool2d<Kernel, Stride = Kernel, Padding = 0>(x);
//   OH = (H + 2 * Padding - Kernel) / Stride + 1 (floor: torch's ceil_mode=False); Padding <= Kernel / 2.
//
// max_pool2d pads with -infinity (padding never wins) and propagates NaN (a NaN in a window is its
// maximum, as in torch). avg_pool2d divides by Kernel * Kernel whether or not the window covers
// padding (torch's default count_include_pad=True).
// Kernels: cpu/pool.hpp, a task per block of (batch, channel) planes.
// Derivatives at the end, each an op of its own: max_pool2d_backward(g, x) gives each output's
// gradient to the first maximum of its window in row-major order (torch's CPU rule for ties: a
// later equal value does not replace the maximum; gradients of overlapping windows add up), and
// avg_pool2d_backward(g) spreads g / (Kernel * Kernel) over each window.
// Depends on: ops/spatial.hpp, autodiff/rule.hpp.
#pragma once

#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/ops/spatial.hpp"

namespace fusebox {
namespace ops {

template <int KH, int KW, int SH, int SW, int PH, int PW>
struct max_pool2d_op {
  static constexpr const char* name = "max_pool2d";
  static constexpr window params{spatial_op::max_pool2d, KH, KW, SH, SW, PH, PW};
};
template <int KH, int KW, int SH, int SW, int PH, int PW>
struct max_pool2d_backward_op {
  static constexpr const char* name = "max_pool2d_backward";
  static constexpr window params{spatial_op::max_pool2d_backward, KH, KW, SH, SW, PH, PW};
};
template <int KH, int KW, int SH, int SW, int PH, int PW>
struct avg_pool2d_op {
  static constexpr const char* name = "avg_pool2d";
  static constexpr window params{spatial_op::avg_pool2d, KH, KW, SH, SW, PH, PW};
};
template <int KH, int KW, int SH, int SW, int PH, int PW, int IH, int IW>
struct avg_pool2d_backward_op {
  static constexpr const char* name = "avg_pool2d_backward";
  static constexpr window params{spatial_op::avg_pool2d_backward, KH, KW, SH, SW, PH, PW, IH, IW};
};

}  // namespace ops

template <int Kernel, int Stride = Kernel, int Padding = 0, array_operand X>
auto max_pool2d(const X& x, std::source_location loc = std::source_location::current()) {
  static_assert(Kernel >= 1 && Stride >= 1 && Padding >= 0 && 2 * Padding <= Kernel,
                "fusebox: max_pool2d<Kernel, Stride, Padding>: need Kernel, Stride >= 1 and 0 <= Padding <= Kernel / 2");
  return detail::make_spatial<ops::max_pool2d_op<Kernel, Kernel, Stride, Stride, Padding, Padding>>(loc, x);
}

template <int Kernel, int Stride = Kernel, int Padding = 0, array_operand X>
auto avg_pool2d(const X& x, std::source_location loc = std::source_location::current()) {
  static_assert(Kernel >= 1 && Stride >= 1 && Padding >= 0 && 2 * Padding <= Kernel,
                "fusebox: avg_pool2d<Kernel, Stride, Padding>: need Kernel, Stride >= 1 and 0 <= Padding <= Kernel / 2");
  return detail::make_spatial<ops::avg_pool2d_op<Kernel, Kernel, Stride, Stride, Padding, Padding>>(loc, x);
}

// ---- derivatives (autodiff/rule.hpp) ----
namespace autodiff {
template <int KH, int KW, int SH, int SW, int PH, int PW>
struct derivative<ops::max_pool2d_op<KH, KW, SH, SW, PH, PW>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = spatial_node<ops::max_pool2d_backward_op<KH, KW, SH, SW, PH, PW>, exact<G, Y>, operand<Y, 0>>;
};
template <int KH, int KW, int SH, int SW, int PH, int PW>
struct derivative<ops::avg_pool2d_op<KH, KW, SH, SW, PH, PW>> {
  template <class Y>
  static constexpr dims x_shape = operand<Y, 0>::desc.shape;
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = spatial_node<ops::avg_pool2d_backward_op<KH, KW, SH, SW, PH, PW, static_cast<int>(x_shape<Y>.extent[2]),
                                                       static_cast<int>(x_shape<Y>.extent[3])>,
                           exact<G, Y>>;
};
}  // namespace autodiff

}  // namespace fusebox
