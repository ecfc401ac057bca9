// expr/spatial.hpp: the node type of windowed NCHW ops (conv2d, max/avg pooling and the ops their
// gradients need) and their shape rules.
//
// One node type for all of them, `spatial_node<Op, Args...>` (one or two operands), in the way one
// `pointwise<Op, Args...>` serves every elementwise op: Op is a small struct in ops/conv.hpp or
// ops/pool.hpp with a `name` and a `params` window (expr/window.hpp). Every stage that does not
// know op types (the planner, the run-time path, autodiff's storage-free types) handles the
// family once, by `node_kind::spatial` and `desc.win`.
//
// Shape rules (NCHW tensors, OIHW weights, as torch; floor division, no ceil mode):
//   out extent = (in + 2 * padding - window) / stride + 1, needs in + 2 * padding >= window
//   conv2d              x [N,C,H,W], w [O,C,KH,KW]        -> [N,O,OH,OW]
//   conv2d_input_grad   g [N,O,OH,OW], w [O,C,KH,KW]      -> [N,C,ih,iw]
//   conv2d_weight_grad  g [N,O,OH,OW], x [N,C,H,W]        -> [O,C,kh,kw]
//   max/avg_pool2d      x [N,C,H,W]                       -> [N,C,OH,OW]
//   max_pool2d_backward g [N,C,OH,OW], x [N,C,H,W]        -> [N,C,H,W]
//   avg_pool2d_backward g [N,C,OH,OW]                     -> [N,C,ih,iw]
// A `dyn` extent (the batch, typically) is carried through and checked when it is known.
// Depends on: expr/node.hpp, expr/window.hpp.
#pragma once

#include <cstddef>
#include <string>
#include <tuple>

#include "fusebox/expr/node.hpp"
#include "fusebox/expr/window.hpp"

namespace fusebox {
namespace detail {

/// Why a spatial op's operands do not fit (0: they do).
enum spatial_error : int {
  spatial_ok = 0,
  spatial_bad_rank = 1,      // operands are not rank 4
  spatial_bad_channels = 2,  // conv2d: x's channels differ from w's in-channels (or g's from w's out-channels)
  spatial_bad_window = 3,    // the window does not fit the padded input, or stride/window/padding out of range
  spatial_bad_grad = 4,      // a gradient op's operands do not belong to one forward call
};

struct spatial_shape_result {
  dims out{};
  int error = spatial_ok;
};

/// Does a window of k fit the input padded by pad on both sides? (An unknown extent may.)
constexpr bool window_fits(std::size_t in, int k, int pad) {
  return !is_known_extent(in) || in + 2 * static_cast<std::size_t>(pad) >= static_cast<std::size_t>(k);
}
/// (in + 2 pad - k) / s + 1 for a window that fits; dyn when `in` is not a number: a symbol
/// (ir/specialize.hpp) names one extent, and the output's is another.
constexpr std::size_t window_out(std::size_t in, int k, int s, int pad) {
  if (!is_known_extent(in)) return dyn;
  return (in + 2 * static_cast<std::size_t>(pad) - static_cast<std::size_t>(k)) / static_cast<std::size_t>(s) + 1;
}

constexpr spatial_shape_result spatial_shape(const window& w, const dims& a, const dims& b = dims{}) {
  spatial_shape_result r;
  const bool two = w.op == spatial_op::conv2d || w.op == spatial_op::conv2d_input_grad ||
                   w.op == spatial_op::conv2d_weight_grad || w.op == spatial_op::max_pool2d_backward;
  if (a.rank != 4 || (two && b.rank != 4)) {
    r.error = spatial_bad_rank;
    return r;
  }
  if (w.sh < 1 || w.sw < 1 || w.ph < 0 || w.pw < 0) {
    r.error = spatial_bad_window;
    return r;
  }
  // The window: from the weight for conv2d and its input gradient, else from the params.
  const bool from_weight = w.op == spatial_op::conv2d || w.op == spatial_op::conv2d_input_grad;
  const std::size_t kh = from_weight ? b.extent[2] : static_cast<std::size_t>(w.kh);
  const std::size_t kw = from_weight ? b.extent[3] : static_cast<std::size_t>(w.kw);
  if (!is_known_extent(kh) || !is_known_extent(kw) || kh < 1 || kw < 1) {
    r.error = spatial_bad_window;
    return r;
  }
  const int ikh = static_cast<int>(kh), ikw = static_cast<int>(kw);
  // Pooling pads at most half a window (torch's rule): a window of padding only has no maximum.
  if ((w.op == spatial_op::max_pool2d || w.op == spatial_op::avg_pool2d || w.op == spatial_op::max_pool2d_backward ||
       w.op == spatial_op::avg_pool2d_backward) &&
      (2 * w.ph > ikh || 2 * w.pw > ikw)) {
    r.error = spatial_bad_window;
    return r;
  }
  auto out_hw = [&](std::size_t h, std::size_t wd, std::size_t& oh, std::size_t& ow) {
    if (!window_fits(h, ikh, w.ph) || !window_fits(wd, ikw, w.pw)) return false;
    oh = window_out(h, ikh, w.sh, w.ph);
    ow = window_out(wd, ikw, w.sw, w.pw);
    return true;
  };
  std::size_t oh = 0, ow = 0;
  switch (w.op) {
    case spatial_op::conv2d:
      if (!same_extent(a.extent[1], b.extent[1])) r.error = spatial_bad_channels;
      else if (!out_hw(a.extent[2], a.extent[3], oh, ow)) r.error = spatial_bad_window;
      r.out = dims{4, {a.extent[0], b.extent[0], oh, ow}};
      break;
    case spatial_op::conv2d_input_grad:
      if (!same_extent(a.extent[1], b.extent[0])) r.error = spatial_bad_channels;
      else if (!out_hw(static_cast<std::size_t>(w.ih), static_cast<std::size_t>(w.iw), oh, ow))
        r.error = spatial_bad_window;
      else if (!same_extent(a.extent[2], oh) || !same_extent(a.extent[3], ow)) r.error = spatial_bad_grad;
      r.out = dims{4, {a.extent[0], b.extent[1], static_cast<std::size_t>(w.ih), static_cast<std::size_t>(w.iw)}};
      break;
    case spatial_op::conv2d_weight_grad:
      if (!same_extent(a.extent[0], b.extent[0])) r.error = spatial_bad_grad;
      else if (!out_hw(b.extent[2], b.extent[3], oh, ow)) r.error = spatial_bad_window;
      else if (!same_extent(a.extent[2], oh) || !same_extent(a.extent[3], ow)) r.error = spatial_bad_grad;
      r.out = dims{4, {a.extent[1], b.extent[1], kh, kw}};
      break;
    case spatial_op::max_pool2d:
    case spatial_op::avg_pool2d:
      if (!out_hw(a.extent[2], a.extent[3], oh, ow)) r.error = spatial_bad_window;
      r.out = dims{4, {a.extent[0], a.extent[1], oh, ow}};
      break;
    case spatial_op::max_pool2d_backward:
      if (!same_extent(a.extent[0], b.extent[0]) || !same_extent(a.extent[1], b.extent[1])) r.error = spatial_bad_grad;
      else if (!out_hw(b.extent[2], b.extent[3], oh, ow)) r.error = spatial_bad_window;
      else if (!same_extent(a.extent[2], oh) || !same_extent(a.extent[3], ow)) r.error = spatial_bad_grad;
      r.out = b;
      break;
    case spatial_op::avg_pool2d_backward:
      if (!out_hw(static_cast<std::size_t>(w.ih), static_cast<std::size_t>(w.iw), oh, ow)) r.error = spatial_bad_window;
      else if (!same_extent(a.extent[2], oh) || !same_extent(a.extent[3], ow)) r.error = spatial_bad_grad;
      r.out = dims{4, {a.extent[0], a.extent[1], static_cast<std::size_t>(w.ih), static_cast<std::size_t>(w.iw)}};
      break;
    default: r.error = spatial_bad_window;
  }
  if (r.error != spatial_ok) r.out = dims{};
  return r;
}

/// Flops per output element (0 where an extent is dyn): what reports and fusion heuristics read.
constexpr int spatial_flops(const window& w, const dims& a, const dims& b, const dims& out) {
  auto known = [](std::size_t e) { return is_known_extent(e) ? static_cast<long long>(e) : 0LL; };
  long long f = 0;
  switch (w.op) {
    case spatial_op::conv2d: f = 2 * known(b.extent[1]) * known(b.extent[2]) * known(b.extent[3]); break;
    case spatial_op::conv2d_input_grad:
      f = 2 * known(b.extent[0]) * known(b.extent[2]) * known(b.extent[3]) / (w.sh * w.sw);
      break;
    case spatial_op::conv2d_weight_grad: f = 2 * known(a.extent[0]) * known(a.extent[2]) * known(a.extent[3]); break;
    default: f = static_cast<long long>(w.kh) * w.kw;
  }
  (void)out;
  return static_cast<int>(f);
}

/// What went wrong, for shape_error and the run-time path: the op, the shapes, the rule.
inline std::string spatial_error_text(const window& w, const dims& a, const dims& b, int error) {
  const std::string op = name(w.op);
  const bool conv = w.op == spatial_op::conv2d || w.op == spatial_op::conv2d_input_grad ||
                    w.op == spatial_op::conv2d_weight_grad;
  std::string s = op + ": " + (w.op == spatial_op::conv2d ? "x is " : "operand 0 is ") + to_string(a);
  if (b.rank) s += std::string(w.op == spatial_op::conv2d ? ", w is " : ", operand 1 is ") + to_string(b);
  s += " (stride " + std::to_string(w.sh) + "x" + std::to_string(w.sw) + ", padding " + std::to_string(w.ph) + "x" +
       std::to_string(w.pw) + (conv ? "" : ", window " + std::to_string(w.kh) + "x" + std::to_string(w.kw)) + "); ";
  switch (error) {
    case spatial_bad_rank:
      return s + "need NCHW operands [batch, channels, height, width]" +
             (conv ? std::string(" and an OIHW weight [out channels, in channels, kernel h, kernel w]") : "");
    case spatial_bad_channels:
      return s + "x's channels (dimension 1) must equal w's in-channels (dimension 1 of OIHW)";
    case spatial_bad_window:
      return s + "the window must fit the padded input (height + 2 * padding >= kernel), stride >= 1, and pooling "
                 "padding at most half the window";
    default: return s + "the gradient's shape does not match the forward call's";
  }
}

}  // namespace detail

/// A windowed NCHW op (see the header comment); Op names the op and holds its window.
template <class Op, class... Args>
struct spatial_node : expr_base {
  static_assert(sizeof...(Args) == 1 || sizeof...(Args) == 2, "fusebox internal: spatial ops take 1 or 2 operands");
  using children = meta::type_list<Args...>;
  using A0 = meta::at_t<0, children>;
  using A1 = meta::at_t<sizeof...(Args) - 1, children>;
  static constexpr dims shape_b = sizeof...(Args) == 2 ? A1::desc.shape : dims{};
  static constexpr auto rule = detail::spatial_shape(Op::params, A0::desc.shape, shape_b);
  static_assert(static_check::spatial_shapes<Op, detail::shape_type_of<A0>, detail::shape_type_of<A1>, rule.error>::value);
  static_assert(std::is_same_v<typename A0::value_type, typename A1::value_type>,
                "fusebox: conv2d / pooling: operands must hold the same element type");
  using value_type = typename A0::value_type;
  using op = Op;
  static constexpr node_desc desc{node_kind::spatial, Op::name, rule.out, -1, false,
                                  detail::spatial_flops(Op::params, A0::desc.shape, shape_b, rule.out), 0, -1, -1, "",
                                  Op::params};
  static constexpr bool has_payload = (Args::has_payload || ...);
  static constexpr bool symbolic = (Args::symbolic || ...);
  static constexpr bool fullgraph = (Args::fullgraph || ...);
  std::tuple<Args...> args;

  template <std::size_t I>
  const auto& child() const { return std::get<I>(args); }
};

}  // namespace fusebox
