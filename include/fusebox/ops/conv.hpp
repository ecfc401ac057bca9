// ops/conv.hpp: 2-d convolution, torch's conv2d: NCHW input, OIHW weight, optional bias [O].
//
//   auto y = conv2d(x, w);                                    // x [N,C,H,W], w [O,C,KH,KW] -> [N,O,OH,OW]
//   auto y = conv2d<fb::stride<S>, fb::padding<P>>(x, w, b);  // + b as [O,1,1]
//   OH = (H + 2 * PH - KH) / SH + 1 (floor), likewise OW; no dilation, no groups.
//
// Stride and padding are named template arguments (ops/spatial.hpp: fb::stride<S> or <SH, SW>,
// default 1; fb::padding<P> or <PH, PW>, default 0; either order): they are part of the node's
// type, so static shapes are checked at build time and the kernel is specialised for them
// (conv2d<fb::padding<2>> keeps a 5x5 conv's 28x28 image at 28x28). The positional conv2d<S, P>
// of earlier releases still compiles, deprecated. The bias is not part of the op: it is added as a broadcast [O,1,1]
// view, which the planner fuses into the convolution as its epilogue (with a following relu), as it
// does for a matmul's bias; its gradient is then the reverse pass's ordinary sum over N, H, W.
// Kernels: backend/cpu/conv.hpp (im2row/im2col into cpu::gemm, threaded over images).
// Derivatives at the end: dx is conv2d_input_grad (a transposed convolution), dw is
// conv2d_weight_grad; both are spatial ops of their own with their own kernels.
// Depends on: ops/spatial.hpp, ops/layout.hpp, ops/elementwise.hpp, autodiff/rule.hpp.
#pragma once

#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/layout.hpp"
#include "fusebox/ops/spatial.hpp"

namespace fusebox {
namespace ops {

/// The forward op; the window comes from the weight's shape.
template <int SH, int SW, int PH, int PW>
struct conv2d_op {
  static constexpr const char* name = "conv2d";
  static constexpr window params{spatial_op::conv2d, 0, 0, SH, SW, PH, PW};
};

/// dL/dx of conv2d: g [N,O,OH,OW] and w [O,C,KH,KW] to [N,C,IH,IW] (torch's conv_transpose2d of g
/// with w, cropped by the padding; IH, IW name the forward input's extents).
template <int SH, int SW, int PH, int PW, int IH, int IW>
struct conv2d_input_grad_op {
  static constexpr const char* name = "conv2d_input_grad";
  static constexpr window params{spatial_op::conv2d_input_grad, 0, 0, SH, SW, PH, PW, IH, IW};
};

/// dL/dw of conv2d: g [N,O,OH,OW] and x [N,C,H,W] to [O,C,KH,KW] (summed over the batch).
template <int KH, int KW, int SH, int SW, int PH, int PW>
struct conv2d_weight_grad_op {
  static constexpr const char* name = "conv2d_weight_grad";
  static constexpr window params{spatial_op::conv2d_weight_grad, KH, KW, SH, SW, PH, PW};
};

}  // namespace ops

namespace detail {
template <int SH, int SW, int PH, int PW, array_operand X, array_operand W>
auto conv2d_node(const X& x, const W& w, const std::source_location& loc) {
  static_assert(SH >= 1 && SW >= 1 && PH >= 0 && PW >= 0,
                "fusebox: conv2d<fb::stride<S>, fb::padding<P>>: need S >= 1 and P >= 0");
  return make_spatial<ops::conv2d_op<SH, SW, PH, PW>>(loc, x, w);
}

template <int SH, int SW, int PH, int PW, array_operand X, array_operand W, array_operand B>
auto conv2d_node(const X& x, const W& w, const B& b, const std::source_location& loc) {
  using T = typename common_element<X>::type;
  using EW = decltype(as_expr<T>(w));
  using EB = decltype(as_expr<T>(b));
  constexpr dims sw = EW::desc.shape, sb = EB::desc.shape;
  static_assert(sb.rank == 1 && is_known_extent(sb.extent[0]),
                "fusebox: conv2d(x, w, b): the bias is [out channels], with a static extent");
  static_assert(sw.rank != 4 || !is_known_extent(sw.extent[0]) || sw.extent[0] == sb.extent[0],
                "fusebox: conv2d(x, w, b): the bias needs one value per out channel (w's dimension 0)");
  // A computed weight's out channels stay unknown here (only an argument's are bound): checked on
  // the call's extents by the run-time path then.
  if constexpr (sw.rank == 4 && !is_known_extent(sw.extent[0]))
    if (const std::size_t o = runtime_shape(as_expr<T>(w)).extent[0]; is_known_extent(o) && o != sb.extent[0])
      FUSEBOX_THROW(shape_error("conv2d: w is " + to_string(runtime_shape(as_expr<T>(w))) + ", b is " + to_string(sb) +
                                    "; the bias needs one value per out channel",
                                loc));
  return add(conv2d_node<SH, SW, PH, PW>(x, w, loc), reshape<shape<sb.extent[0], 1, 1>>(b, loc), loc);
}
}  // namespace detail

/// conv2d<Options...>(x, w[, b]): Options are fb::stride<S> (or <SH, SW>; default 1) and
/// fb::padding<P> (or <PH, PW>; default 0), in either order (ops/spatial.hpp).
template <auto... Options, array_operand X, array_operand W>
  requires detail::named_window_options<Options...>
auto conv2d(const X& x, const W& w, std::source_location loc = std::source_location::current()) {
  using o = detail::window_options<1, Options...>;
  static_assert(!o::has_number && !o::has_other,
                "fusebox: conv2d<...>(x, w): its template arguments are fb::stride<S> and fb::padding<P>, not bare "
                "numbers: write conv2d<fb::stride<S>, fb::padding<P>>(x, w)");
  static_assert(o::once,
                "fusebox: conv2d<...>(x, w): fb::stride or fb::padding given twice; give each at most once: "
                "conv2d<fb::stride<S>, fb::padding<P>>(x, w)");
  return detail::conv2d_node<o::sh, o::sw, o::ph, o::pw>(x, w, loc);
}

template <auto... Options, array_operand X, array_operand W, array_operand B>
  requires detail::named_window_options<Options...>
auto conv2d(const X& x, const W& w, const B& b, std::source_location loc = std::source_location::current()) {
  using o = detail::window_options<1, Options...>;
  static_assert(!o::has_number && !o::has_other,
                "fusebox: conv2d<...>(x, w, b): its template arguments are fb::stride<S> and fb::padding<P>, not bare "
                "numbers: write conv2d<fb::stride<S>, fb::padding<P>>(x, w, b)");
  static_assert(o::once,
                "fusebox: conv2d<...>(x, w, b): fb::stride or fb::padding given twice; give each at most once: "
                "conv2d<fb::stride<S>, fb::padding<P>>(x, w, b)");
  return detail::conv2d_node<o::sh, o::sw, o::ph, o::pw>(x, w, b, loc);
}

// The positional form of fusebox 0.x, kept for one release.
template <int Stride, int Padding = 0, array_operand X, array_operand W>
[[deprecated("use conv2d<fb::stride<S>, fb::padding<P>>")]] auto conv2d(
    const X& x, const W& w, std::source_location loc = std::source_location::current()) {
  return detail::conv2d_node<Stride, Stride, Padding, Padding>(x, w, loc);
}

template <int Stride, int Padding = 0, array_operand X, array_operand W, array_operand B>
[[deprecated("use conv2d<fb::stride<S>, fb::padding<P>>")]] auto conv2d(
    const X& x, const W& w, const B& b, std::source_location loc = std::source_location::current()) {
  return detail::conv2d_node<Stride, Stride, Padding, Padding>(x, w, b, loc);
}

// ---- derivatives (autodiff/rule.hpp): G the incoming gradient, Y the conv2d node ----
namespace autodiff {
template <int SH, int SW, int PH, int PW>
struct derivative<ops::conv2d_op<SH, SW, PH, PW>> {
  template <class Y>
  static constexpr dims x_shape = operand<Y, 0>::desc.shape;
  template <class Y>
  static constexpr dims w_shape = operand<Y, 1>::desc.shape;
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = std::conditional_t<
      I == 0,
      spatial_node<ops::conv2d_input_grad_op<SH, SW, PH, PW, static_cast<int>(x_shape<Y>.extent[2]),
                                             static_cast<int>(x_shape<Y>.extent[3])>,
                   exact<G, Y>, operand<Y, 1>>,
      spatial_node<ops::conv2d_weight_grad_op<static_cast<int>(w_shape<Y>.extent[2]),
                                              static_cast<int>(w_shape<Y>.extent[3]), SH, SW, PH, PW>,
                   exact<G, Y>, operand<Y, 0>>>;
};
}  // namespace autodiff

}  // namespace fusebox
