// backend/cpu/pool.hpp: max and average pooling and their gradients on the host (ops/pool.hpp).
//
// Every kernel works plane by plane (one (batch, channel) pair): a task is a block of planes, so
// no two tasks write the same element and the results do not depend on the thread count. Inputs
// are read through their strides; outputs must be contiguous. After a plane is final its rows get
// the epilogue (backend/cpu/spatial_epilogue.hpp), as one run where the epilogue takes spans of rows.
//
// Max: the first maximum of a window in row-major order wins, a NaN replaces it (torch's CPU rule:
// `v > max || isnan(v)`), padding is never a candidate. The backward recomputes that choice from x
// (nothing is saved but x, which the forward read anyway) and adds each output's gradient there.
// Average: the window's sum over Kernel * Kernel (torch's count_include_pad=True); the backward
// spreads g / (Kernel * Kernel) over the in-bounds part of each window.
// Max with a 2x2 window at stride 2, no padding, and x's rows contiguous (T2's poolings) runs
// backend/cpu/max_pool_2x2.hpp's vector kernels, with the same results bit for bit.
// Depends on: core/tensor.hpp, backend/cpu/max_pool_2x2.hpp, backend/cpu/spatial_epilogue.hpp, backend/cpu/thread_pool.hpp, expr/window.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "fusebox/backend/cpu/max_pool_2x2.hpp"
#include "fusebox/backend/cpu/spatial_epilogue.hpp"
#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/window.hpp"

namespace fusebox::cpu {
namespace detail {

struct pool_geometry {
  std::size_t planes, c, h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
};

/// The in-bounds part [lo, hi) of the window of output index o along one axis.
inline void window_span(std::size_t o, int k, int s, int p, std::size_t in, std::ptrdiff_t& lo, std::ptrdiff_t& hi) {
  lo = static_cast<std::ptrdiff_t>(o) * s - p;
  hi = std::min<std::ptrdiff_t>(lo + k, static_cast<std::ptrdiff_t>(in));
  lo = std::max<std::ptrdiff_t>(lo, 0);
}

/// Runs plane(p) for every plane, in blocks of planes of about 16K elements per task.
template <class F>
void over_planes(std::size_t planes, std::size_t plane_elems, thread_pool& pool, F&& plane) {
  const std::size_t per_task = std::max<std::size_t>(1, (std::size_t{1} << 14) / std::max<std::size_t>(1, plane_elems));
  const std::size_t tasks = (planes + per_task - 1) / per_task;
  pool.parallel_for(tasks, [&](std::size_t t, unsigned) {
    for (std::size_t p = t * per_task; p < std::min(planes, (t + 1) * per_task); ++p) plane(p);
  });
}

/// Plane p of x (planes are (n, c) pairs) read through its strides: element (i, j).
template <class T>
struct plane_reader {
  const T* base;
  std::ptrdiff_t s2, s3;
  T operator()(std::ptrdiff_t i, std::ptrdiff_t j) const { return base[i * s2 + j * s3]; }
};
template <class T>
plane_reader<T> plane_of(const strided<T>& x, std::size_t p, std::size_t channels) {
  return {x.data + static_cast<std::ptrdiff_t>(p / channels) * x.stride[0] +
              static_cast<std::ptrdiff_t>(p % channels) * x.stride[1],
          x.stride[2], x.stride[3]};
}

/// Where the maximum of output (i, j)'s window is, as (row, column) in the plane, and its value.
template <class T>
T window_max(const plane_reader<T>& x, const pool_geometry& g, std::size_t i, std::size_t j, std::ptrdiff_t& at_r,
             std::ptrdiff_t& at_c) {
  std::ptrdiff_t r0, r1, c0, c1;
  window_span(i, g.kh, g.sh, g.ph, g.h, r0, r1);
  window_span(j, g.kw, g.sw, g.pw, g.w, c0, c1);
  T m = -std::numeric_limits<T>::infinity();
  at_r = r0;
  at_c = c0;
  for (std::ptrdiff_t r = r0; r < r1; ++r)
    for (std::ptrdiff_t c = c0; c < c1; ++c) {
      const T v = x(r, c);
      if (v > m || std::isnan(v)) {
        m = v;
        at_r = r;
        at_c = c;
      }
    }
  return m;
}

template <class T>
void require_contiguous_output(const strided<T>& out, spatial_op op) {
  if (!out.contiguous())
    FUSEBOX_THROW(invalid_argument(std::string("fusebox internal: ") + name(op) + ": the output " + to_string(out.shape) +
                                   " must be contiguous"));
}

inline pool_geometry pool_geometry_of(const window& win, const dims& x, const dims& y) {
  return {x[0] * x[1], x[1], x[2], x[3], y[2], y[3], win.kh, win.kw, win.sh, win.sw, win.ph, win.pw};
}

/// Whether max pooling of x takes backend/cpu/max_pool_2x2.hpp's kernels: a 2x2 window at stride 2, no
/// padding, x's rows contiguous.
template <class T>
bool is_max_pool_2x2(const pool_geometry& g, const strided<T>& x) {
  return g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 && x.stride[3] == 1;
}

}  // namespace detail

/// y = max_pool2d(x) or avg_pool2d(x), by win.op.
template <class T, class Epilogue>
void pool2d_forward(const window& win, const strided<T>& x, const strided<T>& y, thread_pool& pool, Epilogue&& epilogue) {
  detail::require_contiguous_output(y, win.op);
  const detail::pool_geometry g = detail::pool_geometry_of(win, x.shape, y.shape);
  const bool is_max = win.op == spatial_op::max_pool2d;
  const T inv_area = T(1) / static_cast<T>(g.kh * g.kw);
  // Without padding every window lies inside the plane (floor mode): an output row is then a
  // sequence of row-long passes, one per window element in row-major order, over contiguous
  // accumulators the compiler vectorises. Each output still sees its candidates in row-major
  // order, so the maximum (first wins, NaN wins) is the one the general loop below picks.
  constexpr std::size_t row_cap = 1024;
  const bool interior = g.ph == 0 && g.pw == 0 && g.ow <= row_cap;
  const bool max_2x2 = is_max && detail::is_max_pool_2x2(g, x);
  detail::over_planes(g.planes, g.h * g.w, pool, [&](std::size_t p) {
    const auto xp = detail::plane_of(x, p, g.c);
    T* out = y.data + p * g.oh * g.ow;
    if (max_2x2) {
      max_pool_2x2_plane(xp.base, xp.s2, g.oh, g.ow, out);
      epilogue_rows(epilogue, p * g.oh, g.oh, g.ow);
      return;
    }
    if (interior) {
      for (std::size_t i = 0; i < g.oh; ++i) {
        T* acc = out + i * g.ow;
        for (std::size_t j = 0; j < g.ow; ++j) acc[j] = is_max ? -std::numeric_limits<T>::infinity() : T(0);
        for (int u = 0; u < g.kh; ++u)
          for (int v = 0; v < g.kw; ++v) {
            const T* src = xp.base + (static_cast<std::ptrdiff_t>(i) * g.sh + u) * xp.s2 + v * xp.s3;
            const std::ptrdiff_t step = g.sw * xp.s3;
            if (is_max)
              for (std::size_t j = 0; j < g.ow; ++j) {
                const T c = src[static_cast<std::ptrdiff_t>(j) * step];
                acc[j] = (c > acc[j] || c != c) ? c : acc[j];
              }
            else
              for (std::size_t j = 0; j < g.ow; ++j) acc[j] += src[static_cast<std::ptrdiff_t>(j) * step];
          }
        if (!is_max)
          for (std::size_t j = 0; j < g.ow; ++j) acc[j] *= inv_area;
        epilogue(p * g.oh + i, 0, g.ow);
      }
      return;
    }
    for (std::size_t i = 0; i < g.oh; ++i) {
      for (std::size_t j = 0; j < g.ow; ++j) {
        if (is_max) {
          std::ptrdiff_t r, c;
          out[i * g.ow + j] = detail::window_max(xp, g, i, j, r, c);
        } else {
          std::ptrdiff_t r0, r1, c0, c1;
          detail::window_span(i, g.kh, g.sh, g.ph, g.h, r0, r1);
          detail::window_span(j, g.kw, g.sw, g.pw, g.w, c0, c1);
          T s = 0;
          for (std::ptrdiff_t r = r0; r < r1; ++r)
            for (std::ptrdiff_t c = c0; c < c1; ++c) s += xp(r, c);
          out[i * g.ow + j] = s * inv_area;
        }
      }
      epilogue(p * g.oh + i, 0, g.ow);
    }
  });
}

/// dx = max_pool2d_backward(gy, x) or avg_pool2d_backward(gy) (x unused), by win.op.
template <class T, class Epilogue>
void pool2d_backward(const window& win, const strided<T>& gy, const strided<T>& x, const strided<T>& dx,
                     thread_pool& pool, Epilogue&& epilogue) {
  detail::require_contiguous_output(dx, win.op);
  const detail::pool_geometry g = detail::pool_geometry_of(win, dx.shape, gy.shape);
  const bool is_max = win.op == spatial_op::max_pool2d_backward;
  const T inv_area = T(1) / static_cast<T>(g.kh * g.kw);
  // Max without padding: as the forward's interior path, an output row's window maxima and their
  // places come from row-long passes (one per window element, in row-major order, so the same
  // element wins as in window_max), then the row's gradients are added there in column order:
  // the same sums in the same order as the per-window loop below, without its per-window bounds
  // and calls (that loop was 16% of T2's training step).
  constexpr std::size_t row_cap = 1024;
  const bool interior = is_max && g.ph == 0 && g.pw == 0 && g.ow <= row_cap;
  // The 2x2 kernels (gy's rows contiguous) write every element windows cover, once.
  const bool max_2x2 = is_max && detail::is_max_pool_2x2(g, x) && gy.stride[3] == 1;
  const bool covered = g.h == 2 * g.oh && g.w == 2 * g.ow;
  detail::over_planes(g.planes, g.h * g.w, pool, [&](std::size_t p) {
    const auto gp = detail::plane_of(gy, p, g.c);
    T* out = dx.data + p * g.h * g.w;
    if (max_2x2) {
      if (!covered) std::fill(out, out + g.h * g.w, T(0));
      const auto xp = detail::plane_of(x, p, g.c);
      max_pool_2x2_backward_plane(xp.base, xp.s2, gp.base, gp.s2, g.oh, g.ow, out, static_cast<std::ptrdiff_t>(g.w));
      epilogue_rows(epilogue, p * g.h, g.h, g.w);
      return;
    }
    std::fill(out, out + g.h * g.w, T(0));
    if (interior) {
      const auto xp = detail::plane_of(x, p, g.c);
      T m[row_cap];
      std::ptrdiff_t at[row_cap];  // the maximum's offset in the plane (row * w + column)
      const std::ptrdiff_t step = g.sw * xp.s3, w = static_cast<std::ptrdiff_t>(g.w);
      for (std::size_t i = 0; i < g.oh; ++i) {
        const std::ptrdiff_t r0 = static_cast<std::ptrdiff_t>(i) * g.sh;
        for (std::size_t j = 0; j < g.ow; ++j) {
          m[j] = -std::numeric_limits<T>::infinity();
          at[j] = r0 * w + static_cast<std::ptrdiff_t>(j) * g.sw;
        }
        for (int u = 0; u < g.kh; ++u)
          for (int v = 0; v < g.kw; ++v) {
            const T* src = xp.base + (r0 + u) * xp.s2 + v * xp.s3;
            const std::ptrdiff_t here = (r0 + u) * w + v;
            for (std::size_t j = 0; j < g.ow; ++j) {
              const T c = src[static_cast<std::ptrdiff_t>(j) * step];
              const bool take = c > m[j] || c != c;
              m[j] = take ? c : m[j];
              at[j] = take ? here + static_cast<std::ptrdiff_t>(j) * g.sw : at[j];
            }
          }
        for (std::size_t j = 0; j < g.ow; ++j)
          out[at[j]] += gp(static_cast<std::ptrdiff_t>(i), static_cast<std::ptrdiff_t>(j));
      }
      epilogue_rows(epilogue, p * g.h, g.h, g.w);
      return;
    }
    for (std::size_t i = 0; i < g.oh; ++i)
      for (std::size_t j = 0; j < g.ow; ++j) {
        const T gv = gp(static_cast<std::ptrdiff_t>(i), static_cast<std::ptrdiff_t>(j));
        if (is_max) {
          std::ptrdiff_t r, c;
          detail::window_max(detail::plane_of(x, p, g.c), g, i, j, r, c);
          out[static_cast<std::size_t>(r) * g.w + static_cast<std::size_t>(c)] += gv;
        } else {
          std::ptrdiff_t r0, r1, c0, c1;
          detail::window_span(i, g.kh, g.sh, g.ph, g.h, r0, r1);
          detail::window_span(j, g.kw, g.sw, g.pw, g.w, c0, c1);
          const T v = gv * inv_area;
          for (std::ptrdiff_t r = r0; r < r1; ++r)
            for (std::ptrdiff_t c = c0; c < c1; ++c) out[r * static_cast<std::ptrdiff_t>(g.w) + c] += v;
        }
      }
    epilogue_rows(epilogue, p * g.h, g.h, g.w);
  });
}

}  // namespace fusebox::cpu
