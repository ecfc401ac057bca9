// ops/pool.hpp: 2-d max and average pooling over NCHW, torch's max_pool2d / avg_pool2d.
//
//   auto y = max_pool2d<Kernel>(x);                                   // x [N,C,H,W] -> [N,C,OH,OW]
//   auto y = avg_pool2d<Kernel, fb::stride<S>, fb::padding<P>>(x);  // stride default Kernel, padding 0
//   OH = (H + 2 * PH - Kernel) / SH + 1 (floor: torch's ceil_mode=False); P <= Kernel / 2.
// Stride and padding are named, in either order, as for conv2d (ops/spatial.hpp; <H, W> pairs too);
// the positional max_pool2d<Kernel, Stride, Padding> of earlier releases still compiles, deprecated.
//
// max_pool2d pads with -infinity (padding never wins) and propagates NaN (a NaN in a window is its
// maximum, as in torch). avg_pool2d divides by Kernel * Kernel whether or not the window covers
// padding (torch's default count_include_pad=True).
// Kernels: backend/cpu/pool.hpp, a task per block of (batch, channel) planes.
// Derivatives at the end, each an op of its own: max_pool2d_backward(g, x) gives each output's
// gradient to the first maximum of its window in row-major order (torch's CPU rule for ties: a
// later equal value does not replace the maximum; gradients of overlapping windows add up), and
// avg_pool2d_backward(g) spreads g / (Kernel * Kernel) over each window.
// Depends on: ops/spatial.hpp, ops/elementwise.hpp (relu's derivative), autodiff/rule.hpp, autodiff/sym.hpp.
#pragma once

#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/autodiff/sym.hpp"
#include "fusebox/ops/elementwise.hpp"
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

namespace detail {
template <int Kernel, int SH, int SW, int PH, int PW>
constexpr bool pool_window_ok = Kernel >= 1 && SH >= 1 && SW >= 1 && PH >= 0 && PW >= 0 && 2 * PH <= Kernel &&
                                2 * PW <= Kernel;
}  // namespace detail

/// max_pool2d<Kernel, Options...>(x): Options are fb::stride<S> (or <SH, SW>; default Kernel) and
/// fb::padding<P> (or <PH, PW>; default 0), in either order (ops/spatial.hpp).
template <int Kernel, auto... Options, array_operand X>
  requires detail::named_window_options<Options...>
auto max_pool2d(const X& x, std::source_location loc = std::source_location::current()) {
  using o = detail::window_options<Kernel, Options...>;
  static_assert(!o::has_number && !o::has_other,
                "fusebox: max_pool2d<Kernel, ...>(x): after the kernel size its template arguments are fb::stride<S> "
                "and fb::padding<P>, not bare numbers: write max_pool2d<K, fb::stride<S>, fb::padding<P>>(x)");
  static_assert(o::once,
                "fusebox: max_pool2d<Kernel, ...>(x): fb::stride or fb::padding given twice; give each at most once: "
                "max_pool2d<K, fb::stride<S>, fb::padding<P>>(x)");
  static_assert(detail::pool_window_ok<Kernel, o::sh, o::sw, o::ph, o::pw>,
                "fusebox: max_pool2d<K, fb::stride<S>, fb::padding<P>>: need K, S >= 1 and 0 <= P <= K / 2");
  return detail::make_spatial<ops::max_pool2d_op<Kernel, Kernel, o::sh, o::sw, o::ph, o::pw>>(loc, x);
}

/// avg_pool2d<Kernel, Options...>(x): as max_pool2d.
template <int Kernel, auto... Options, array_operand X>
  requires detail::named_window_options<Options...>
auto avg_pool2d(const X& x, std::source_location loc = std::source_location::current()) {
  using o = detail::window_options<Kernel, Options...>;
  static_assert(!o::has_number && !o::has_other,
                "fusebox: avg_pool2d<Kernel, ...>(x): after the kernel size its template arguments are fb::stride<S> "
                "and fb::padding<P>, not bare numbers: write avg_pool2d<K, fb::stride<S>, fb::padding<P>>(x)");
  static_assert(o::once,
                "fusebox: avg_pool2d<Kernel, ...>(x): fb::stride or fb::padding given twice; give each at most once: "
                "avg_pool2d<K, fb::stride<S>, fb::padding<P>>(x)");
  static_assert(detail::pool_window_ok<Kernel, o::sh, o::sw, o::ph, o::pw>,
                "fusebox: avg_pool2d<K, fb::stride<S>, fb::padding<P>>: need K, S >= 1 and 0 <= P <= K / 2");
  return detail::make_spatial<ops::avg_pool2d_op<Kernel, Kernel, o::sh, o::sw, o::ph, o::pw>>(loc, x);
}

// The positional form of fusebox 0.x (stride and padding as bare numbers), kept for one release.
template <int Kernel, int Stride, int Padding = 0, array_operand X>
[[deprecated("use max_pool2d<Kernel, fb::stride<S>, fb::padding<P>>")]] auto max_pool2d(
    const X& x, std::source_location loc = std::source_location::current()) {
  return max_pool2d<Kernel, stride<Stride>, padding<Padding>>(x, loc);
}

template <int Kernel, int Stride, int Padding = 0, array_operand X>
[[deprecated("use avg_pool2d<Kernel, fb::stride<S>, fb::padding<P>>")]] auto avg_pool2d(
    const X& x, std::source_location loc = std::source_location::current()) {
  return avg_pool2d<Kernel, stride<Stride>, padding<Padding>>(x, loc);
}

// ---- derivatives (autodiff/rule.hpp) ----
namespace autodiff {
// relu, then max pooling (conv -> relu -> pool): relu's gradient is the pooling's backward G_p
// scattered to each window's maximum, then zeroed where relu's output y is 0. The maximum is
// where the gradient lands, so its own value decides the mask: the same gradient is G_p masked
// where the pooled value is 0, then scattered,
//
//   relu_backward(max_pool_backward(G_p, y), y) == max_pool_backward(relu_backward(G_p, max_pool(y)), y),
//
// to the bit (a window whose maximum is NaN gives 0 either way; overlapping windows add masked
// terms that the original masks after adding). The mask then reads the pooled tensor, a quarter
// of y for 2x2 windows, and fuses upstream of the scatter, whose output is the final gradient:
// T2's conv 1 no longer reads and writes [128, 32, 24, 24] once more to mask it.
template <int KH, int KW, int SH, int SW, int PH, int PW, class Gp, class Y>
struct relu_vjp<sym::spatial<ops::max_pool2d_backward_op<KH, KW, SH, SW, PH, PW>, Gp, Y>, Y> {
  using pooled = spatial_node<ops::max_pool2d_op<KH, KW, SH, SW, PH, PW>, Y>;
  using type = spatial_node<ops::max_pool2d_backward_op<KH, KW, SH, SW, PH, PW>,
                            pointwise<ops::relu_backward, Gp, pooled>, Y>;
};

// Summed over whole planes (H and W, as a convolution's bias gradient is), a max pooling's
// backward is its incoming gradient summed: each of its elements lands once in its plane (the
// window's maximum is never padding). T2's bias gradients then read the pooled gradients, a
// quarter of the size, instead of the scattered ones.
template <int KH, int KW, int SH, int SW, int PH, int PW, class Gp, class X, class Target>
  requires(Target::value.rank >= 2 && Target::value.back(0) == 1 && Target::value.back(1) == 1)
struct restate_for_sum<sym::spatial<ops::max_pool2d_backward_op<KH, KW, SH, SW, PH, PW>, Gp, X>, Target> {
  using type = Gp;
};

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
