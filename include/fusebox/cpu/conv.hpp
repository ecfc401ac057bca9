// cpu/conv.hpp: conv2d and its two gradients on the host (ops/conv.hpp), as GEMMs on cpu::gemm.
//
// Per image n, with P = OH*OW output pixels and CK = C*KH*KW:
//   forward       y[n] [O, P]   = w [O, CK] · col(x[n]) [CK, P]
//   input grad    dcol [CK, P]  = wᵀ [CK, O] · g[n] [O, P], then dx[n] = col2im(dcol) (a scatter-add)
//   weight grad   dw [O, CK]   += g[n] [O, P] · col(x[n])ᵀ [P, CK]
// col(x[n]) is im2col: row ck = (c, kh, kw) holds, for every output pixel, the input element its
// window puts there (0 in the padding). That layout copies long runs (an output row of OW
// elements per (ck, oh)) where an "im2row" [P, CK] would copy runs of KW; the forward product then
// takes gemm's packed path, the weight gradient reads colᵀ in place (gemm's "stream Bᵀ" case).
//
// Threads: with at least as many images as threads, a task per image (its col in the worker's
// own scratch, gemm single-threaded inside the task: a nested parallel_for runs in place); with
// fewer images, images in turn and gemm threaded. The weight gradient sums images in a fixed
// number of chunks (each a task, images in order) and then the chunks in order, so its result does
// not depend on the thread count.
//
// The epilogue (the planner's fused bias / activation, evaluated in place) is called once per
// output row run: epilogue(row, j0, n) with row the index over the output's leading dimensions
// ([N, O, OH] for the forward) and [j0, j0 + n) along its last one.
//
// Operands are read through their strides (x, g) or used as matrix views where their layout
// allows (w; g per image), copied to scratch otherwise. The output must be contiguous.
// Depends on: core/tensor.hpp, cpu/gemm.hpp, cpu/thread_pool.hpp, expr/window.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/cpu/gemm.hpp"
#include "fusebox/cpu/thread_pool.hpp"
#include "fusebox/expr/window.hpp"

namespace fusebox::cpu {

/// An epilogue that does nothing (a spatial kernel without a fused consumer).
struct no_spatial_epilogue {
  void operator()(std::size_t, std::size_t, std::size_t) const noexcept {}
};

namespace detail {

inline constexpr std::size_t round64(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

/// Takes 64-byte-aligned pieces of a workspace in order.
struct carver {
  std::byte* at;
  template <class T>
  T* take(std::size_t elems) {
    T* p = reinterpret_cast<T*>(at);
    at += round64(elems * sizeof(T));
    return p;
  }
};

/// The sizes of one convolution: input [n, c, h, w], weight [o, c, kh, kw], output [n, o, oh, ow].
struct conv_geometry {
  std::size_t n, c, h, w, o, kh, kw, oh, ow;
  int sh, sw, ph, pw;
  constexpr std::size_t ck() const { return c * kh * kw; }
  constexpr std::size_t pixels() const { return oh * ow; }
};

/// [lo, hi): the output columns whose input column ow * s - p + k lies in [0, in).
inline void valid_range(std::size_t out, std::size_t in, int s, int p, std::size_t k, std::size_t& lo, std::size_t& hi) {
  const std::ptrdiff_t off = static_cast<std::ptrdiff_t>(k) - p;  // input column of output 0
  const std::ptrdiff_t st = s;
  std::ptrdiff_t l = off >= 0 ? 0 : (-off + st - 1) / st;
  std::ptrdiff_t h = static_cast<std::ptrdiff_t>(in) - off <= 0 ? 0 : (static_cast<std::ptrdiff_t>(in) - off + st - 1) / st;
  l = std::min<std::ptrdiff_t>(l, static_cast<std::ptrdiff_t>(out));
  h = std::clamp<std::ptrdiff_t>(h, l, static_cast<std::ptrdiff_t>(out));
  lo = static_cast<std::size_t>(l);
  hi = static_cast<std::size_t>(h);
}

/// col [CK, P] of image n of x (read through its strides).
template <class T>
void im2col(const strided<T>& x, std::size_t n, const conv_geometry& g, T* col) {
  const std::size_t P = g.pixels();
  const std::ptrdiff_t s1 = x.stride[1], s2 = x.stride[2], s3 = x.stride[3];
  const T* img = x.data + static_cast<std::ptrdiff_t>(n) * x.stride[0];
  for (std::size_t c = 0; c < g.c; ++c)
    for (std::size_t kh = 0; kh < g.kh; ++kh)
      for (std::size_t kw = 0; kw < g.kw; ++kw) {
        T* dst = col + ((c * g.kh + kh) * g.kw + kw) * P;
        std::size_t lo, hi;
        valid_range(g.ow, g.w, g.sw, g.pw, kw, lo, hi);
        const std::ptrdiff_t iw0 = static_cast<std::ptrdiff_t>(kw) - g.pw;
        for (std::size_t oh = 0; oh < g.oh; ++oh) {
          T* d = dst + oh * g.ow;
          const std::ptrdiff_t ih = static_cast<std::ptrdiff_t>(oh) * g.sh - g.ph + static_cast<std::ptrdiff_t>(kh);
          if (ih < 0 || ih >= static_cast<std::ptrdiff_t>(g.h)) {
            std::fill(d, d + g.ow, T(0));
            continue;
          }
          const T* src = img + static_cast<std::ptrdiff_t>(c) * s1 + ih * s2;
          // Plain loops, not memcpy/fill: the runs are an output row (14 or 28 elements for T2),
          // where the calls cost more than the copy (measured: 107 -> 85 us for a 32x14x14 image).
          for (std::size_t ow = 0; ow < lo; ++ow) d[ow] = T(0);
          if (g.sw == 1 && s3 == 1) {
            const T* from = src + iw0;
            for (std::size_t ow = lo; ow < hi; ++ow) d[ow] = from[ow];
          } else {
            for (std::size_t ow = lo; ow < hi; ++ow)
              d[ow] = src[(static_cast<std::ptrdiff_t>(ow) * g.sw + iw0) * s3];
          }
          for (std::size_t ow = hi; ow < g.ow; ++ow) d[ow] = T(0);
        }
      }
}

/// dx[n] (contiguous [C, H, W] at `dx`) = the scatter-add of dcol [CK, P].
template <class T>
void col2im(const T* dcol, const conv_geometry& g, T* dx) {
  const std::size_t P = g.pixels();
  std::fill(dx, dx + g.c * g.h * g.w, T(0));
  for (std::size_t c = 0; c < g.c; ++c)
    for (std::size_t kh = 0; kh < g.kh; ++kh)
      for (std::size_t kw = 0; kw < g.kw; ++kw) {
        const T* src = dcol + ((c * g.kh + kh) * g.kw + kw) * P;
        std::size_t lo, hi;
        valid_range(g.ow, g.w, g.sw, g.pw, kw, lo, hi);
        const std::ptrdiff_t iw0 = static_cast<std::ptrdiff_t>(kw) - g.pw;
        for (std::size_t oh = 0; oh < g.oh; ++oh) {
          const std::ptrdiff_t ih = static_cast<std::ptrdiff_t>(oh) * g.sh - g.ph + static_cast<std::ptrdiff_t>(kh);
          if (ih < 0 || ih >= static_cast<std::ptrdiff_t>(g.h)) continue;
          T* drow = dx + (c * g.h + static_cast<std::size_t>(ih)) * g.w;
          const T* s = src + oh * g.ow;
          if (g.sw == 1) {
            T* d = drow + iw0;
            for (std::size_t ow = lo; ow < hi; ++ow) d[ow] += s[ow];
          } else {
            for (std::size_t ow = lo; ow < hi; ++ow) drow[static_cast<std::ptrdiff_t>(ow) * g.sw + iw0] += s[ow];
          }
        }
      }
}

/// Does w [O, C, KH, KW] read as a row-major [O, CK] matrix (rows w.stride[0] apart)?
template <class T>
bool weight_is_matrix(const strided<T>& w) {
  return w.stride[3] == 1 && w.stride[2] == static_cast<std::ptrdiff_t>(w.shape[3]) &&
         w.stride[1] == static_cast<std::ptrdiff_t>(w.shape[2] * w.shape[3]);
}
/// Does image n of g [N, O, OH, OW] read as a row-major [O, P] matrix?
template <class T>
bool image_is_matrix(const strided<T>& g) {
  return g.stride[3] == 1 && g.stride[2] == static_cast<std::ptrdiff_t>(g.shape[3]);
}
/// Image n of g as a row-major [O, P] matrix: in place, or copied to buf.
template <class T>
matrix_view<T> image_matrix(const strided<T>& g, std::size_t n, T* buf) {
  const T* img = g.data + static_cast<std::ptrdiff_t>(n) * g.stride[0];
  if (image_is_matrix(g)) return {img, g.stride[1], 1};
  const std::size_t O = g.shape[1], OH = g.shape[2], OW = g.shape[3];
  for (std::size_t o = 0; o < O; ++o)
    for (std::size_t i = 0; i < OH; ++i)
      for (std::size_t j = 0; j < OW; ++j)
        buf[(o * OH + i) * OW + j] = img[static_cast<std::ptrdiff_t>(o) * g.stride[1] +
                                         static_cast<std::ptrdiff_t>(i) * g.stride[2] +
                                         static_cast<std::ptrdiff_t>(j) * g.stride[3]];
  return {buf, static_cast<std::ptrdiff_t>(OH * OW), 1};
}
/// w as a row-major [O, CK] matrix: in place, or copied to buf.
template <class T>
matrix_view<T> weight_matrix(const strided<T>& w, T* buf) {
  if (weight_is_matrix(w)) return {w.data, w.stride[0], 1};
  const std::size_t O = w.shape[0], C = w.shape[1], KH = w.shape[2], KW = w.shape[3];
  std::size_t k = 0;
  for (std::size_t o = 0; o < O; ++o)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t i = 0; i < KH; ++i)
        for (std::size_t j = 0; j < KW; ++j)
          buf[k++] = w.data[static_cast<std::ptrdiff_t>(o) * w.stride[0] + static_cast<std::ptrdiff_t>(c) * w.stride[1] +
                            static_cast<std::ptrdiff_t>(i) * w.stride[2] + static_cast<std::ptrdiff_t>(j) * w.stride[3]];
  return {buf, static_cast<std::ptrdiff_t>(C * KH * KW), 1};
}

constexpr conv_geometry conv_geometry_of(const window& win, const dims& x, const dims& w, const dims& y) {
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], win.sh, win.sw, win.ph, win.pw};
}

/// Runs task(image, worker, gemm_pool_is_nested) over the images: a task per image when there are
/// at least as many images as threads, else images in turn (gemm then uses the threads).
template <class F>
void over_images(std::size_t images, thread_pool& pool, F&& task) {
  if (images >= pool.size()) pool.parallel_for(images, [&](std::size_t n, unsigned worker) { task(n, worker); });
  else
    for (std::size_t n = 0; n < images; ++n) task(n, 0u);
}

template <class T>
void require_contiguous(const strided<T>& out, const char* what) {
  if (!out.contiguous())
    throw invalid_argument(std::string("fusebox internal: ") + what + ": the output " + to_string(out.shape) +
                           " must be contiguous");
}

/// Number of chunks the weight gradient sums the batch in (fixed: results independent of threads).
constexpr std::size_t weight_grad_chunks(std::size_t images) { return std::min<std::size_t>(images, 8); }

}  // namespace detail

// ---- workspace: what each kernel needs, for the executors to size before a call ----

/// Bytes of workspace conv kernel `op` needs (x: the image operand's shape, w: the weight's, y:
/// the convolution's output [N, O, OH, OW]).
template <class T>
constexpr std::size_t conv_workspace_bytes(spatial_op op, const window& win, const dims& x, const dims& w, const dims& y,
                                 unsigned threads) {
  using detail::round64;
  if (threads == 0) threads = 1;
  const detail::conv_geometry g = detail::conv_geometry_of(win, x, w, y);
  const std::size_t CK = g.ck(), P = g.pixels();
  std::size_t shared = round64(g.o * CK * sizeof(T)) + 64;  // a contiguous copy of w; alignment slack
  std::size_t per_worker = round64(CK * P * sizeof(T)) + round64(g.o * P * sizeof(T));  // col, g image
  if (op == spatial_op::conv2d) per_worker += round64(gemm_workspace_bytes<T>(1, g.o, P, CK, threads));
  if (op == spatial_op::conv2d_input_grad) per_worker += round64(gemm_workspace_bytes<T>(1, CK, P, g.o, threads));
  if (op == spatial_op::conv2d_weight_grad) {
    per_worker += round64(gemm_workspace_bytes<T>(1, g.o, CK, P, threads)) + round64(g.o * CK * sizeof(T));
    shared += detail::weight_grad_chunks(g.n) * round64(g.o * CK * sizeof(T));
  }
  return shared + per_worker * threads;
}

namespace detail {
struct conv_scratch {
  std::byte* shared;
  std::byte* worker0;
  std::size_t per_worker;
  std::size_t gemm_bytes;
};
template <class T>
conv_scratch carve_conv(spatial_op op, const conv_geometry& g, unsigned threads, std::span<std::byte> ws) {
  const std::size_t need = conv_workspace_bytes<T>(op, window{op, 0, 0, g.sh, g.sw, g.ph, g.pw},
                                                   dims{4, {g.n, g.c, g.h, g.w}}, dims{4, {g.o, g.c, g.kh, g.kw}},
                                                   dims{4, {g.n, g.o, g.oh, g.ow}}, threads);
  if (ws.size() < need)
    throw invalid_argument("fusebox internal: " + std::string(name(op)) + " needs " + std::to_string(need) +
                           " bytes of workspace, got " + std::to_string(ws.size()));
  const std::size_t CK = g.ck(), P = g.pixels();
  std::size_t gemm_bytes = 0, extra = 0;
  if (op == spatial_op::conv2d) gemm_bytes = gemm_workspace_bytes<T>(1, g.o, P, CK, threads);
  if (op == spatial_op::conv2d_input_grad) gemm_bytes = gemm_workspace_bytes<T>(1, CK, P, g.o, threads);
  if (op == spatial_op::conv2d_weight_grad) {
    gemm_bytes = gemm_workspace_bytes<T>(1, g.o, CK, P, threads);
    extra = round64(g.o * CK * sizeof(T));
  }
  const std::size_t per_worker = round64(CK * P * sizeof(T)) + round64(g.o * P * sizeof(T)) + round64(gemm_bytes) + extra;
  std::byte* base = ws.data() + (64 - reinterpret_cast<std::uintptr_t>(ws.data()) % 64) % 64;
  const std::size_t shared = round64(g.o * CK * sizeof(T)) +
                             (op == spatial_op::conv2d_weight_grad ? weight_grad_chunks(g.n) * round64(g.o * CK * sizeof(T)) : 0);
  return {base, base + shared, per_worker, gemm_bytes};
}
/// A worker's pieces: col [CK, P], an image of g [O, P], gemm's workspace, (weight grad) a product [O, CK].
template <class T>
struct worker_scratch {
  T* col;
  T* g_image;
  std::span<std::byte> gemm_ws;
  T* product;
};
template <class T>
worker_scratch<T> worker_pieces(const conv_scratch& s, const conv_geometry& g, unsigned worker) {
  carver c{s.worker0 + worker * s.per_worker};
  worker_scratch<T> w;
  w.col = c.take<T>(g.ck() * g.pixels());
  w.g_image = c.take<T>(g.o * g.pixels());
  w.gemm_ws = std::span<std::byte>(c.at, s.gemm_bytes);
  c.at += round64(s.gemm_bytes);
  w.product = c.take<T>(g.o * g.ck());
  return w;
}
}  // namespace detail

// ---- the kernels ----

/// y = conv2d(x, w) (ops/conv.hpp), then epilogue(row, j0, n) over y's rows [N*O*OH] of OW.
template <class T, class Epilogue>
void conv2d_forward(const window& win, const strided<T>& x, const strided<T>& w, const strided<T>& y, thread_pool& pool,
                    std::span<std::byte> ws, Epilogue&& epilogue) {
  detail::require_contiguous(y, "conv2d");
  const detail::conv_geometry g = detail::conv_geometry_of(win, x.shape, w.shape, y.shape);
  if (g.n == 0 || g.o == 0 || g.pixels() == 0) return;
  const auto s = detail::carve_conv<T>(spatial_op::conv2d, g, pool.size(), ws);
  const matrix_view<T> wm = detail::weight_matrix(w, reinterpret_cast<T*>(s.shared));
  const std::size_t CK = g.ck(), P = g.pixels();
  detail::over_images(g.n, pool, [&](std::size_t n, unsigned worker) {
    const auto piece = detail::worker_pieces<T>(s, g, worker);
    detail::im2col(x, n, g, piece.col);
    T* out = y.data + n * g.o * P;
    gemm<T>(1, g.o, P, CK, wm, 0, matrix_view<T>{piece.col, static_cast<std::ptrdiff_t>(P), 1}, 0, out,
            static_cast<std::ptrdiff_t>(P), 0,
            [&](std::size_t, std::size_t o, std::size_t j0, std::size_t cnt, T*) {
              // A run of output channel o over pixels [j0, j0 + cnt): split at output rows.
              for (std::size_t j = j0; j < j0 + cnt;) {
                const std::size_t oh = j / g.ow, ow = j % g.ow, m = std::min(g.ow - ow, j0 + cnt - j);
                epilogue((n * g.o + o) * g.oh + oh, ow, m);
                j += m;
              }
            },
            pool, piece.gemm_ws);
  });
}

/// dx = conv2d_input_grad(g, w): the gradient of conv2d's input, [N, C, ih, iw].
template <class T, class Epilogue>
void conv2d_input_grad(const window& win, const strided<T>& gy, const strided<T>& w, const strided<T>& dx,
                       thread_pool& pool, std::span<std::byte> ws, Epilogue&& epilogue) {
  detail::require_contiguous(dx, "conv2d_input_grad");
  const detail::conv_geometry g = detail::conv_geometry_of(win, dx.shape, w.shape, gy.shape);
  if (g.n == 0 || g.c * g.h * g.w == 0) return;
  const auto s = detail::carve_conv<T>(spatial_op::conv2d_input_grad, g, pool.size(), ws);
  const matrix_view<T> wm = detail::weight_matrix(w, reinterpret_cast<T*>(s.shared));
  const matrix_view<T> wt{wm.data, 1, wm.row_stride};  // wᵀ [CK, O]
  const std::size_t CK = g.ck(), P = g.pixels();
  detail::over_images(g.n, pool, [&](std::size_t n, unsigned worker) {
    const auto piece = detail::worker_pieces<T>(s, g, worker);
    const matrix_view<T> gi = detail::image_matrix(gy, n, piece.g_image);
    gemm<T>(1, CK, P, g.o, wt, 0, gi, 0, piece.col, static_cast<std::ptrdiff_t>(P), 0, no_epilogue{}, pool,
            piece.gemm_ws);
    T* out = dx.data + n * g.c * g.h * g.w;
    detail::col2im(piece.col, g, out);
    for (std::size_t r = 0; r < g.c * g.h; ++r) epilogue(n * g.c * g.h + r, 0, g.w);
  });
}

/// dw = conv2d_weight_grad(g, x): the gradient of conv2d's weight, [O, C, kh, kw], summed over
/// the batch in a fixed order.
template <class T, class Epilogue>
void conv2d_weight_grad(const window& win, const strided<T>& gy, const strided<T>& x, const strided<T>& dw,
                        thread_pool& pool, std::span<std::byte> ws, Epilogue&& epilogue) {
  detail::require_contiguous(dw, "conv2d_weight_grad");
  const detail::conv_geometry g = detail::conv_geometry_of(win, x.shape, dw.shape, gy.shape);
  const std::size_t CK = g.ck(), P = g.pixels();
  if (g.o * CK == 0) return;
  if (g.n == 0 || P == 0) {
    std::fill(dw.data, dw.data + g.o * CK, T(0));
    for (std::size_t r = 0; r < g.o * g.c * g.kh; ++r) epilogue(r, 0, g.kw);
    return;
  }
  const auto s = detail::carve_conv<T>(spatial_op::conv2d_weight_grad, g, pool.size(), ws);
  T* partials = reinterpret_cast<T*>(s.shared + detail::round64(g.o * CK * sizeof(T)));
  const std::size_t part_stride = detail::round64(g.o * CK * sizeof(T)) / sizeof(T);
  const std::size_t chunks = detail::weight_grad_chunks(g.n);
  auto chunk_task = [&](std::size_t ch, unsigned worker) {
    const auto piece = detail::worker_pieces<T>(s, g, worker);
    T* part = partials + ch * part_stride;
    const std::size_t n0 = ch * g.n / chunks, n1 = (ch + 1) * g.n / chunks;
    for (std::size_t n = n0; n < n1; ++n) {
      detail::im2col(x, n, g, piece.col);
      const matrix_view<T> gi = detail::image_matrix(gy, n, piece.g_image);
      T* dst = n == n0 ? part : piece.product;
      // colᵀ [P, CK] read in place: B(k = pixel, j = ck) = col[ck * P + pixel].
      gemm<T>(1, g.o, CK, P, gi, 0, matrix_view<T>{piece.col, 1, static_cast<std::ptrdiff_t>(P)}, 0, dst,
              static_cast<std::ptrdiff_t>(CK), 0, no_epilogue{}, pool, piece.gemm_ws);
      if (n != n0)
        for (std::size_t i = 0; i < g.o * CK; ++i) part[i] += piece.product[i];
    }
  };
  if (chunks >= pool.size()) pool.parallel_for(chunks, chunk_task);
  else
    for (std::size_t ch = 0; ch < chunks; ++ch) chunk_task(ch, 0u);
  // The chunks in order, a task per output channel; then its rows' epilogue.
  pool.parallel_for(g.o, [&](std::size_t o, unsigned) {
    T* out = dw.data + o * CK;
    std::copy(partials + o * CK, partials + (o + 1) * CK, out);
    for (std::size_t ch = 1; ch < chunks; ++ch) {
      const T* p = partials + ch * part_stride + o * CK;
      for (std::size_t i = 0; i < CK; ++i) out[i] += p[i];
    }
    for (std::size_t r = 0; r < g.c * g.kh; ++r) epilogue(o * g.c * g.kh + r, 0, g.kw);
  });
}

}  // namespace fusebox::cpu
