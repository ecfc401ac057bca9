// backend/cpu/spatial.hpp: runs a spatial node (conv2d, pooling, their gradients) from its IR desc. Both
// executors call this: the static one (backend/cpu/executor.hpp) and the run-time path's host side
// (backend/cpu/generated_program.hpp), which knows nodes only by their desc, so the choice of kernel is a switch on
// `desc.win.op` here, in one place; the kernels are in backend/cpu/conv.hpp (direct), backend/cpu/winograd.hpp
// (float 5x5 kernels at unit stride, while conv_winograd() is on) and backend/cpu/pool.hpp. Workspace
// sizes cover both convolution algorithms, so turning Winograd off or on never needs more. Under
// max_autotune (backend/cpu/autotune.hpp) a convolution's algorithm and thread count are timed choices.
// Depends on: backend/cpu/autotune.hpp, backend/cpu/conv.hpp, backend/cpu/winograd.hpp, backend/cpu/pool.hpp, expr/window.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fusebox/backend/cpu/autotune.hpp"
#include "fusebox/backend/cpu/conv.hpp"
#include "fusebox/backend/cpu/pool.hpp"
#include "fusebox/backend/cpu/winograd.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/expr/window.hpp"

namespace fusebox::cpu {

/// Workspace bytes of a spatial node with operand shapes a, b (b: rank 0 for one operand) and
/// output shape out, on `threads` threads; `frozen`: a forward that keeps its transformed weights
/// elsewhere (options::freezing).
template <class T>
constexpr std::size_t spatial_workspace_bytes(const window& win, const dims& a, const dims& b, const dims& out, unsigned threads,
                                              bool frozen = false) {
  auto both = [&](const dims& x, const dims& w, const dims& y) {
    const detail::conv_geometry g = detail::conv_geometry_of(win, x, w, y);
    return std::max(conv_workspace_bytes<T>(win.op, win, x, w, y, threads),
                    winograd::workspace_bytes<T>(win.op, g, threads, frozen));
  };
  switch (win.op) {
    case spatial_op::conv2d: return both(a, b, out);
    case spatial_op::conv2d_input_grad: return both(out, b, a);
    case spatial_op::conv2d_weight_grad: return both(b, out, a);
    default: return 0;  // pooling needs none
  }
}

/// Whether a convolution (or gradient) of these extents runs by Winograd when it is on (the
/// shapes qualify): the rule runs_winograd applies per call, and explain() reports.
template <class T>
bool winograd_applies(const window& win, const dims& a, const dims& b, const dims& out) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    switch (win.op) {
      case spatial_op::conv2d: return winograd::applies<T>(win.op, detail::conv_geometry_of(win, a, b, out));
      case spatial_op::conv2d_input_grad: return winograd::applies<T>(win.op, detail::conv_geometry_of(win, out, b, a));
      case spatial_op::conv2d_weight_grad: return winograd::applies<T>(win.op, detail::conv_geometry_of(win, b, out, a));
      default: return false;
    }
  }
}

/// Whether this call of a convolution runs by Winograd (the shapes qualify and it is on).
template <class T>
bool runs_winograd(const window& win, const strided<T>& a, const strided<T>& b, const strided<T>& out) {
  return conv_winograd() && winograd_applies<T>(win, a.shape, b.shape, out.shape);
}

namespace detail {

/// A convolution (or gradient) by the algorithm given: Winograd (the shapes must qualify) or direct.
template <class T, class Epilogue>
void run_conv(bool winograd, const window& win, const strided<T>& a, const strided<T>& b, const strided<T>& out,
              thread_pool& pool, std::span<std::byte> ws, Epilogue& epilogue, frozen_weights frozen = {}) {
  if constexpr (std::is_same_v<T, float>) {
    if (winograd) {
      switch (win.op) {
        case spatial_op::conv2d: winograd::conv2d_forward(win, a, b, out, pool, ws, epilogue, frozen); return;
        case spatial_op::conv2d_input_grad: winograd::conv2d_input_grad(win, a, b, out, pool, ws, epilogue); return;
        default: winograd::conv2d_weight_grad(win, a, b, out, pool, ws, epilogue); return;
      }
    }
  }
  switch (win.op) {
    case spatial_op::conv2d: conv2d_forward(win, a, b, out, pool, ws, epilogue); break;
    case spatial_op::conv2d_input_grad: conv2d_input_grad(win, a, b, out, pool, ws, epilogue); break;
    default: conv2d_weight_grad(win, a, b, out, pool, ws, epilogue); break;
  }
}

struct conv_choice {
  bool winograd = false;
  bool serial = false;
};

/// max_autotune's choice for this convolution (backend/cpu/autotune.hpp): candidate 0 is the default
/// (Winograd where it applies and is on, else direct), then the other algorithm where both apply,
/// then each on one thread. Timed into a private output without the epilogue.
template <class T>
conv_choice tuned_conv(const window& win, const strided<T>& a, const strided<T>& b, const strided<T>& out,
                       thread_pool& pool, std::span<std::byte> ws) {
  const bool wino = runs_winograd(win, a, b, out);
  std::vector<conv_choice> cands{conv_choice{wino, false}};
  if (wino) cands.push_back(conv_choice{false, false});
  if (pool.size() > 1) {
    const std::size_t parallel = cands.size();
    for (std::size_t i = 0; i < parallel; ++i) cands.push_back(conv_choice{cands[i].winograd, true});
  }
  autotune::problem_id id;
  std::size_t k = 0;
  id.v[k++] = 2;
  id.v[k++] = static_cast<std::uint64_t>(win.op) << 32 | sizeof(T) << 16 | std::uint64_t(wino) << 2 |
              std::uint64_t(a.contiguous()) << 1 | std::uint64_t(b.contiguous());
  for (const dims* d : {&a.shape, &b.shape, &out.shape})
    for (std::size_t i = 0; i < 4; ++i) id.v[k++] = i < d->rank ? d->extent[i] : 0;
  id.v[k++] = std::uint64_t(std::uint16_t(win.sh)) << 48 | std::uint64_t(std::uint16_t(win.sw)) << 32 |
              std::uint64_t(std::uint16_t(win.ph)) << 16 | std::uint16_t(win.pw);
  id.v[k++] = pool.size();
  auto text = [&] {
    auto layout = [](const strided<T>& v) { return std::string(v.contiguous() ? "" : " (strided)"); };
    return std::string(name(win.op)) + " " + (sizeof(T) == 4 ? "f32 " : "f64 ") + to_string(a.shape) + layout(a) +
           " " + to_string(b.shape) + layout(b) + " -> " + to_string(out.shape) + " stride " + std::to_string(win.sh) +
           "x" + std::to_string(win.sw) + " pad " + std::to_string(win.ph) + "x" + std::to_string(win.pw) +
           " threads " + std::to_string(pool.size());
  };
  const std::size_t pick = autotune::choose(id, cands.size(), text, [&] {
    std::vector<autotune::candidate> list;
    auto scratch = std::make_shared<std::vector<T>>(out.shape.size());
    const strided<T> priv{scratch->data(), out.shape, contiguous_strides(out.shape)};
    for (const conv_choice& c : cands)
      list.push_back({std::string(c.winograd ? "winograd" : "direct") +
                          (c.serial ? ", 1 thread" : ", " + std::to_string(pool.size()) + " threads"),
                      [=, &pool, keep = scratch] {  // keep: the private output lives while they do
                        no_spatial_epilogue none;
                        run_conv(c.winograd, win, a, b, priv, c.serial ? autotune::serial_pool() : pool, ws, none);
                      }});
    return list;
  });
  return cands[pick];
}

inline bool is_conv(spatial_op op) {
  return op == spatial_op::conv2d || op == spatial_op::conv2d_input_grad || op == spatial_op::conv2d_weight_grad;
}

}  // namespace detail

/// out = the op of `win` over a (and b), then epilogue(row, j0, n) on each finished row run of out.
/// Inside a max_autotune call a convolution runs its problem's tuned algorithm and thread count.
/// `frozen`: where a forward by Winograd keeps its transformed weights between calls (options::freezing).
template <class T, class Epilogue>
void run_spatial(const window& win, const strided<T>& a, const strided<T>& b, const strided<T>& out, thread_pool& pool,
                 std::span<std::byte> ws, Epilogue&& epilogue, frozen_weights frozen = {}) {
  if (detail::is_conv(win.op)) {
    if (autotune::active()) [[unlikely]] {
      const detail::conv_choice c = detail::tuned_conv(win, a, b, out, pool, ws);
      detail::run_conv(c.winograd, win, a, b, out, c.serial ? autotune::serial_pool() : pool, ws, epilogue, frozen);
      return;
    }
    detail::run_conv(runs_winograd(win, a, b, out), win, a, b, out, pool, ws, epilogue, frozen);
    return;
  }
  switch (win.op) {
    case spatial_op::max_pool2d:
    case spatial_op::avg_pool2d: pool2d_forward(win, a, out, pool, epilogue); break;
    case spatial_op::max_pool2d_backward:
    case spatial_op::avg_pool2d_backward: pool2d_backward(win, a, b, out, pool, epilogue); break;
    default: FUSEBOX_THROW(invalid_argument("fusebox internal: a spatial node without an op"));
  }
}

}  // namespace fusebox::cpu
