// ops/spatial.hpp: the front-end step shared by conv2d and pooling (ops/conv.hpp, ops/pool.hpp):
// operands to expression leaves, a spatial_node of Op, and, where an extent is dyn, the shape
// rule checked on the actual shapes with a shape_error naming the op, the shapes and the
// caller's line. (Static shapes are checked by the node type itself: a build error.)
// Also the ops' named options, torch's keyword arguments as template arguments:
//
//   conv2d<fb::stride<2>, fb::padding<1>>(x, w)      // F.conv2d(x, w, stride=2, padding=1)
//   max_pool2d<3, fb::padding<1>, fb::stride<2>>(x)  // F.max_pool2d(x, 3, stride=2, padding=1)
//   fb::stride<SH, SW>, fb::padding<PH, PW>           // torch's (height, width) pairs
//
// Each is optional (torch's defaults), in any order, at most once. They must be compile-time
// values: with static shapes they decide the result's shape type. They are constexpr objects
// (of empty tag types), not types, so that one template parameter pack `auto... Options` sees a
// bare number among them and the op can refuse it with a static_assert naming the fix; a pack
// cannot hold both types and numbers.
// Depends on: expr/spatial.hpp, ops/operand.hpp.
#pragma once

#include <array>
#include <source_location>
#include <type_traits>

#include "fusebox/core/errors.hpp"
#include "fusebox/expr/spatial.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {
namespace detail {
template <int H, int W>
struct stride_option {};
template <int H, int W>
struct padding_option {};
}  // namespace detail

/// stride=(H, W) of conv2d, max_pool2d, avg_pool2d; one number for both.
template <int H, int W = H>
inline constexpr detail::stride_option<H, W> stride{};
/// padding=(H, W) of conv2d, max_pool2d, avg_pool2d; one number for both.
template <int H, int W = H>
inline constexpr detail::padding_option<H, W> padding{};

}  // namespace fusebox

namespace fusebox::detail {

template <class O>
struct window_option_of {
  static constexpr bool stride = false, padding = false, number = std::is_integral_v<O>;
};
template <int H, int W>
struct window_option_of<stride_option<H, W>> {
  static constexpr bool stride = true, padding = false, number = false;
};
template <int H, int W>
struct window_option_of<padding_option<H, W>> {
  static constexpr bool stride = false, padding = true, number = false;
};

template <int H, int W>
constexpr void read_window_option(stride_option<H, W>, std::array<int, 4>& r) {
  r[0] = H, r[1] = W;
}
template <int H, int W>
constexpr void read_window_option(padding_option<H, W>, std::array<int, 4>& r) {
  r[2] = H, r[3] = W;
}
template <class O>
constexpr void read_window_option(O, std::array<int, 4>&) {}  // refused by well_formed

/// A spatial op's options: stride (DefaultStride where none is given) and padding (0), and
/// whether the list is well formed. An ill-formed list still yields valid numbers, so that the
/// op's static_assert is the only error the user sees.
template <int DefaultStride, auto... Options>
struct window_options {
  static constexpr bool has_number = (window_option_of<std::remove_cvref_t<decltype(Options)>>::number || ...);
  static constexpr bool has_other = ((!window_option_of<std::remove_cvref_t<decltype(Options)>>::number &&
                                      !window_option_of<std::remove_cvref_t<decltype(Options)>>::stride &&
                                      !window_option_of<std::remove_cvref_t<decltype(Options)>>::padding) ||
                                     ...);
  static constexpr int strides = (int{window_option_of<std::remove_cvref_t<decltype(Options)>>::stride} + ... + 0);
  static constexpr int paddings = (int{window_option_of<std::remove_cvref_t<decltype(Options)>>::padding} + ... + 0);
  static constexpr bool once = strides <= 1 && paddings <= 1;
  static constexpr std::array<int, 4> value = [] {
    std::array<int, 4> r{DefaultStride, DefaultStride, 0, 0};
    (read_window_option(Options, r), ...);
    return r;
  }();
  static constexpr int sh = value[0], sw = value[1], ph = value[2], pw = value[3];
};

/// The named form's overloads take every option list but the old one (numbers only), which has
/// its own deprecated overloads.
template <auto... Options>
concept named_window_options =
    sizeof...(Options) == 0 || !(window_option_of<std::remove_cvref_t<decltype(Options)>>::number && ...);

template <class Op, class... X>
auto make_spatial(const std::source_location& loc, const X&... xs) {
  using T = typename common_element<X...>::type;
  spatial_node<Op, decltype(as_expr<T>(xs))...> e{{}, {as_expr<T>(xs)...}};
  if constexpr ((!decltype(as_expr<T>(xs))::desc.shape.is_static() || ...)) {
    const dims shapes[] = {runtime_shape(std::get<0>(e.args)), runtime_shape(std::get<sizeof...(X) - 1>(e.args))};
    const dims b = sizeof...(X) == 2 ? shapes[1] : dims{};
    const auto r = spatial_shape(Op::params, shapes[0], b);
    if (r.error != spatial_ok) FUSEBOX_THROW(shape_error(spatial_error_text(Op::params, shapes[0], b, r.error), loc));
  }
  return finish(e);
}

}  // namespace fusebox::detail
