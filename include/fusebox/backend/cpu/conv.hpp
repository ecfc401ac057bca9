// backend/cpu/conv.hpp: conv2d and its two gradients on the host (ops/conv.hpp), as GEMMs on cpu::gemm.
//
// Per image n, with P = OH*OW output pixels and CK = C*KH*KW:
//   forward       y[n] [O, P]   = w [O, CK] · col(x[n]) [CK, P]
//   input grad    dcol [CK, P]  = wᵀ [CK, O] · g[n] [O, P], then dx[n] = col2im(dcol) (a scatter-add)
//   weight grad   dw [O, CK]   += g[n] [O, P] · col(x[n])ᵀ [P, CK]
// col(x[n]) is im2col: row ck = (c, kh, kw) holds, for every output pixel, the input element its
// window puts there (0 in the padding).
//
// The products are gemm's micro-kernel (backend/cpu/gemm.hpp's `tile`) driven from here, not gemm()
// called per image: gemm would pack its A operand (the weight, as large as an image's col for
// T2's second layer) again for every image. Here the weight operand is packed into MR-row
// slivers once per call and shared by every task; the per-image operand is packed into NR-wide
// panels by the task that uses them:
//   forward       implicit GEMM: each [CK, NR] panel of col(x[n]) is gathered straight from the
//                 image (no col buffer); the NR pixels' output runs get the epilogue at once.
//   input grad    panels of g[n] [O, NR]; dcol per image in the worker's scratch, then col2im.
//   weight grad   K runs over the pixels of all images of a chunk: the chunk's partial sum stays
//                 in the C tiles (each element one fma chain over the chunk's images and pixels in
//                 order), no per-image product buffer and no add pass. A = g[n] (packed per image),
//                 B = col(x[n])ᵀ, each [P, NR] panel gathered straight from the image (no col).
// Every output element is one chain of fused multiply-adds in increasing k, as gemm's contract
// says, so the forward and the input gradient equal what gemm() gave bit for bit.
//
// Threads: forward and input grad, a task per (image, panel of NR output columns); the weight
// gradient sums images in a fixed number of chunks (each a task, images in order) and then the
// chunks in order, so no result depends on the thread count.
//
// The epilogue (the planner's fused bias / activation, evaluated in place) is called on finished
// output: epilogue(row, j0, n) with row the index over the output's leading dimensions ([N, O, OH]
// for the forward) and [j0, j0 + n) along its last one; whole rows finished together go as one
// run where the epilogue takes spans of rows (backend/cpu/spatial_epilogue.hpp).
//
// Operands are read through their strides (x, g) or used as matrix views where their layout
// allows (w; g per image), copied to scratch otherwise. The output must be contiguous.
// Depends on: core/tensor.hpp, backend/cpu/gemm.hpp, backend/cpu/spatial_epilogue.hpp, backend/cpu/thread_pool.hpp, expr/window.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "fusebox/backend/cpu/gemm.hpp"
#include "fusebox/backend/cpu/spatial_epilogue.hpp"
#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/window.hpp"

namespace fusebox::cpu {

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

/// dx[n] (contiguous [C, H, W] at `dx`) = the scatter-add of dcol [CK, P].
template <class T>
void col2im(const T* dcol, const conv_geometry& g, T* dx) {
  const std::size_t P = g.pixels();
  std::fill(dx, dx + g.c * g.h * g.w, T(0));
  if (g.ph == 0 && g.pw == 0 && g.sh == 1 && g.sw == 1) {
    // Unit strides, no padding: every window is inside the image; the same adds in the same
    // order as below, without the range arithmetic per (c, kh, kw).
    for (std::size_t c = 0; c < g.c; ++c)
      for (std::size_t kh = 0; kh < g.kh; ++kh)
        for (std::size_t kw = 0; kw < g.kw; ++kw) {
          const T* src = dcol + ((c * g.kh + kh) * g.kw + kw) * P;
          for (std::size_t oh = 0; oh < g.oh; ++oh) {
            T* d = dx + (c * g.h + oh + kh) * g.w + kw;
            const T* s = src + oh * g.ow;
            for (std::size_t ow = 0; ow < g.ow; ++ow) d[ow] += s[ow];
          }
        }
    return;
  }
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
constexpr conv_geometry conv_geometry_of(const window& win, const dims& x, const dims& w, const dims& y) {
  return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], win.sh, win.sw, win.ph, win.pw};
}

template <class T>
void require_contiguous(const strided<T>& out, const char* what) {
  if (!out.contiguous())
    FUSEBOX_THROW(invalid_argument(std::string("fusebox internal: ") + what + ": the output " + to_string(out.shape) +
                                   " must be contiguous"));
}

/// Number of chunks the weight gradient sums the batch in (fixed: results independent of threads).
constexpr std::size_t weight_grad_chunks(std::size_t images) { return std::min<std::size_t>(images, 8); }

// ---- the products on gemm's micro-kernel ----

template <class T>
inline constexpr std::size_t conv_mr = gemm_config<T>::mr;
template <class T>
inline constexpr std::size_t conv_nr = gemm_config<T>::nr;

/// Elements of A [M, K] packed as slivers of MR rows (pack_a).
template <class T>
constexpr std::size_t packed_a_elems(std::size_t M, std::size_t K) {
  return (M + conv_mr<T> - 1) / conv_mr<T> * conv_mr<T> * K;
}
/// A [M, K] (a strided view) into slivers of MR rows: sliver s at dst + s * K * MR, element
/// (r, k) of it at [k * MR + r]; rows past M are zero.
template <class T>
void pack_a(std::size_t M, std::size_t K, matrix_view<T> a, T* dst) {
  constexpr std::size_t MR = conv_mr<T>;
  for (std::size_t i = 0; i < M; i += MR)
    pack_a_sliver(std::min(MR, M - i), K, a.data + static_cast<std::ptrdiff_t>(i) * a.row_stride, a.row_stride,
                  a.col_stride, dst + i * K, MR);
}

/// C [M, n] (row stride ldc) = (or += with `accumulate`) packed A [M, K] · panel [K, NR] (its
/// columns n..NR zero or ignored). K in blocks of gemm_config's kc, so a block of the panel stays
/// in L1 while every sliver of A passes over it; a block after the first continues the C tile's
/// chain, so each element is one fma chain in increasing k.
template <class T>
void packed_product(std::size_t M, std::size_t K, std::size_t n, const T* ap, const T* panel, T* c, std::ptrdiff_t ldc,
                    bool accumulate) {
  constexpr std::size_t MR = conv_mr<T>, NR = conv_nr<T>, KC = gemm_config<T>::kc;
  for (std::size_t k0 = 0; k0 < K; k0 += KC) {
    const std::size_t kc = std::min(KC, K - k0);
    for (std::size_t i = 0; i < M; i += MR)
      tile<T, MR>(std::min(MR, M - i), n,
                  kernel_args<T>{kc, ap + i * K + k0 * MR, 0, 0, panel + k0 * NR, static_cast<std::ptrdiff_t>(NR),
                                 c + static_cast<std::ptrdiff_t>(i) * ldc, ldc, accumulate || k0 > 0});
  }
}

/// One output row's piece of a panel of pixels: pixels [p, p + m) are output row oh, columns
/// [ow, ow + m), at panel column j.
struct panel_run {
  std::size_t j, oh, ow, m;
};
/// The runs of pixels [p0, p0 + cnt) (at most NR + 1 runs: one per output row touched).
template <class T>
std::size_t panel_runs(const conv_geometry& g, std::size_t p0, std::size_t cnt, panel_run* runs) {
  std::size_t r = 0;
  for (std::size_t j = 0; j < cnt;) {
    const std::size_t p = p0 + j, oh = p / g.ow, ow = p % g.ow, m = std::min(g.ow - ow, cnt - j);
    runs[r++] = {j, oh, ow, m};
    j += m;
  }
  return r;
}

/// The implicit im2col: panel[ck * NR + j] = col(x[n])[ck, p0 + j] for j < cnt, 0 for the rest
/// of the NR columns (the runs from panel_runs).
template <class T>
void pack_image_panel(const strided<T>& x, std::size_t n, const conv_geometry& g, const panel_run* runs,
                      std::size_t nruns, std::size_t cnt, T* panel) {
  constexpr std::size_t NR = conv_nr<T>;
  const std::ptrdiff_t s1 = x.stride[1], s2 = x.stride[2], s3 = x.stride[3];
  const T* img = x.data + static_cast<std::ptrdiff_t>(n) * x.stride[0];
  const bool unit = g.sw == 1 && s3 == 1;
  T* d = panel;
  if (unit && g.sh == 1 && g.ph == 0 && g.pw == 0) {
    // Unit strides, no padding: every window lies inside the image, so each run is a plain copy
    // from a fixed offset of the (c, kh, kw) row's corner. The range arithmetic per row below
    // cost as much as the copies (T2's conv 2: runs of 8 pixels): conv 2's forward 12.8 -> 9.6 ms.
    std::ptrdiff_t from[NR + 1];
    for (std::size_t r = 0; r < nruns; ++r)
      from[r] = static_cast<std::ptrdiff_t>(runs[r].oh) * s2 + static_cast<std::ptrdiff_t>(runs[r].ow);
    for (std::size_t c = 0; c < g.c; ++c)
      for (std::size_t kh = 0; kh < g.kh; ++kh)
        for (std::size_t kw = 0; kw < g.kw; ++kw, d += NR) {
          const T* corner = img + static_cast<std::ptrdiff_t>(c) * s1 + static_cast<std::ptrdiff_t>(kh) * s2 +
                            static_cast<std::ptrdiff_t>(kw);
          for (std::size_t r = 0; r < nruns; ++r) {
            const T* src = corner + from[r];
            T* o = d + runs[r].j;
            for (std::size_t t = 0; t < runs[r].m; ++t) o[t] = src[t];
          }
          for (std::size_t j = cnt; j < NR; ++j) d[j] = T(0);
        }
    return;
  }
  for (std::size_t c = 0; c < g.c; ++c)
    for (std::size_t kh = 0; kh < g.kh; ++kh)
      for (std::size_t kw = 0; kw < g.kw; ++kw, d += NR) {
        std::size_t lo, hi;
        valid_range(g.ow, g.w, g.sw, g.pw, kw, lo, hi);
        const std::ptrdiff_t iw0 = static_cast<std::ptrdiff_t>(kw) - g.pw;
        for (std::size_t r = 0; r < nruns; ++r) {
          const panel_run& u = runs[r];
          T* o = d + u.j;
          const std::ptrdiff_t ih = static_cast<std::ptrdiff_t>(u.oh) * g.sh - g.ph + static_cast<std::ptrdiff_t>(kh);
          if (ih < 0 || ih >= static_cast<std::ptrdiff_t>(g.h)) {
            for (std::size_t t = 0; t < u.m; ++t) o[t] = T(0);
            continue;
          }
          const T* src = img + static_cast<std::ptrdiff_t>(c) * s1 + ih * s2;
          const std::size_t a = std::clamp(lo, u.ow, u.ow + u.m), b = std::clamp(hi, a, u.ow + u.m);
          for (std::size_t ow = u.ow; ow < a; ++ow) o[ow - u.ow] = T(0);
          if (unit) {
            const T* from = src + iw0;
            for (std::size_t ow = a; ow < b; ++ow) o[ow - u.ow] = from[ow];
          } else {
            for (std::size_t ow = a; ow < b; ++ow)
              o[ow - u.ow] = src[(static_cast<std::ptrdiff_t>(ow) * g.sw + iw0) * s3];
          }
          for (std::size_t ow = b; ow < u.ow + u.m; ++ow) o[ow - u.ow] = T(0);
        }
        for (std::size_t j = cnt; j < NR; ++j) d[j] = T(0);
      }
}

/// w [O, C, KH, KW] as the packed A of the forward (A = w [O, CK]) or of the input gradient
/// (A = wᵀ [CK, O]).
template <class T>
void pack_weight(const strided<T>& w, bool transposed, T* dst) {
  const std::size_t O = w.shape[0], KH = w.shape[2], KW = w.shape[3], CK = w.shape[1] * KH * KW;
  if (weight_is_matrix(w)) {
    if (transposed) pack_a(CK, O, matrix_view<T>{w.data, 1, w.stride[0]}, dst);
    else pack_a(O, CK, matrix_view<T>{w.data, w.stride[0], 1}, dst);
    return;
  }
  constexpr std::size_t MR = conv_mr<T>;
  const std::size_t M = transposed ? CK : O, K = transposed ? O : CK, rows = packed_a_elems<T>(M, K) / (K ? K : 1);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t k = 0; k < K; ++k) {
      T v = T(0);
      if (i < M) {
        const std::size_t o = transposed ? k : i, ck = transposed ? i : k;
        const std::size_t c = ck / (KH * KW), kh = ck / KW % KH, kw = ck % KW;
        v = w.data[static_cast<std::ptrdiff_t>(o) * w.stride[0] + static_cast<std::ptrdiff_t>(c) * w.stride[1] +
                   static_cast<std::ptrdiff_t>(kh) * w.stride[2] + static_cast<std::ptrdiff_t>(kw) * w.stride[3]];
      }
      dst[i / MR * K * MR + k * MR + i % MR] = v;
    }
}

/// The weight gradient's B panel, gathered straight from the image: panel[p * NR + j] =
/// col(x[n])[j0 + j, p] (colᵀ's rows p, columns j0..j0+cnt), 0 for j in [cnt, NR) and in the
/// padding. A pixel whose window lies inside the image (all of them without padding) is one
/// gather at fixed offsets from its window's corner.
template <class T>
void pack_colT_panel(const strided<T>& x, std::size_t n, const conv_geometry& g, std::size_t j0, std::size_t cnt,
                     T* panel) {
  constexpr std::size_t NR = conv_nr<T>;
  const std::ptrdiff_t s1 = x.stride[1], s2 = x.stride[2], s3 = x.stride[3];
  const T* img = x.data + static_cast<std::ptrdiff_t>(n) * x.stride[0];
  std::ptrdiff_t off[NR], dh[NR], dw[NR], ch[NR];
  for (std::size_t j = 0; j < cnt; ++j) {
    const std::size_t ck = j0 + j, c = ck / (g.kh * g.kw), kh = ck / g.kw % g.kh, kw = ck % g.kw;
    ch[j] = static_cast<std::ptrdiff_t>(c);
    dh[j] = static_cast<std::ptrdiff_t>(kh);
    dw[j] = static_cast<std::ptrdiff_t>(kw);
    off[j] = ch[j] * s1 + dh[j] * s2 + dw[j] * s3;
  }
  const std::ptrdiff_t H = static_cast<std::ptrdiff_t>(g.h), W = static_cast<std::ptrdiff_t>(g.w);
  const std::ptrdiff_t KH = static_cast<std::ptrdiff_t>(g.kh), KW = static_cast<std::ptrdiff_t>(g.kw);
  T* d = panel;
  for (std::size_t oh = 0; oh < g.oh; ++oh) {
    const std::ptrdiff_t ih0 = static_cast<std::ptrdiff_t>(oh) * g.sh - g.ph;
    for (std::size_t ow = 0; ow < g.ow; ++ow, d += NR) {
      const std::ptrdiff_t iw0 = static_cast<std::ptrdiff_t>(ow) * g.sw - g.pw;
      if (ih0 >= 0 && ih0 + KH <= H && iw0 >= 0 && iw0 + KW <= W) {
        const T* corner = img + ih0 * s2 + iw0 * s3;
        for (std::size_t j = 0; j < cnt; ++j) d[j] = corner[off[j]];
      } else {
        for (std::size_t j = 0; j < cnt; ++j) {
          const std::ptrdiff_t ih = ih0 + dh[j], iw = iw0 + dw[j];
          d[j] = ih >= 0 && ih < H && iw >= 0 && iw < W ? img[ch[j] * s1 + ih * s2 + iw * s3] : T(0);
        }
      }
      for (std::size_t j = cnt; j < NR; ++j) d[j] = T(0);
    }
  }
}

}  // namespace detail

// ---- workspace: what each kernel needs, for the executors to size before a call ----

namespace detail {
/// Bytes of each piece of a conv kernel's workspace (each rounded to 64): shared by the tasks
/// (the packed weight; the weight gradient's chunk partials) and per worker.
struct conv_sizes {
  std::size_t shared = 0, per_worker = 0;
  std::size_t col = 0, g_image = 0, panel = 0, a_pack = 0;  // the per-worker pieces, in this order
};
template <class T>
constexpr conv_sizes conv_sizes_of(spatial_op op, const conv_geometry& g) {
  const std::size_t CK = g.ck(), P = g.pixels(), NR = conv_nr<T>;
  conv_sizes s;
  if (op == spatial_op::conv2d) {
    s.shared = round64(packed_a_elems<T>(g.o, CK) * sizeof(T));
    s.panel = round64(CK * NR * sizeof(T));
  } else if (op == spatial_op::conv2d_input_grad) {
    s.shared = round64(packed_a_elems<T>(CK, g.o) * sizeof(T));
    s.col = round64(CK * P * sizeof(T));
    s.g_image = round64(g.o * P * sizeof(T));
    s.panel = round64(g.o * NR * sizeof(T));
  } else {  // weight grad: the chunks' partial sums
    s.shared = weight_grad_chunks(g.n) * round64(g.o * CK * sizeof(T));
    s.g_image = round64(g.o * P * sizeof(T));
    s.panel = round64(P * NR * sizeof(T));
    s.a_pack = round64(packed_a_elems<T>(g.o, P) * sizeof(T));
  }
  s.per_worker = s.col + s.g_image + s.panel + s.a_pack;
  return s;
}
}  // namespace detail

/// Bytes of workspace conv kernel `op` needs (x: the image operand's shape, w: the weight's, y:
/// the convolution's output [N, O, OH, OW]).
template <class T>
constexpr std::size_t conv_workspace_bytes(spatial_op op, const window& win, const dims& x, const dims& w, const dims& y,
                                 unsigned threads) {
  using detail::round64;
  if (threads == 0) threads = 1;
  const detail::conv_geometry g = detail::conv_geometry_of(win, x, w, y);
  const detail::conv_sizes s = detail::conv_sizes_of<T>(op, g);
  return s.shared + s.per_worker * threads + 64;  // alignment slack
}

namespace detail {
struct conv_scratch {
  std::byte* shared;
  std::byte* worker0;
  std::size_t per_worker;
};
template <class T>
conv_scratch carve_conv(spatial_op op, const conv_geometry& g, unsigned threads, std::span<std::byte> ws) {
  const std::size_t need = conv_workspace_bytes<T>(op, window{op, 0, 0, g.sh, g.sw, g.ph, g.pw},
                                                   dims{4, {g.n, g.c, g.h, g.w}}, dims{4, {g.o, g.c, g.kh, g.kw}},
                                                   dims{4, {g.n, g.o, g.oh, g.ow}}, threads);
  if (ws.size() < need)
    FUSEBOX_THROW(invalid_argument("fusebox internal: " + std::string(name(op)) + " needs " + std::to_string(need) +
                                   " bytes of workspace, got " + std::to_string(ws.size())));
  const conv_sizes s = conv_sizes_of<T>(op, g);
  std::byte* base = ws.data() + (64 - reinterpret_cast<std::uintptr_t>(ws.data()) % 64) % 64;
  return {base, base + s.shared, s.per_worker};
}
/// A worker's pieces (those its op uses): col [CK, P], an image of g [O, P], a packed panel
/// [K, NR], packed slivers of g[n] (weight grad).
template <class T>
struct worker_scratch {
  T* col;
  T* g_image;
  T* panel;
  T* a_pack;
};
template <class T>
worker_scratch<T> worker_pieces(spatial_op op, const conv_scratch& s, const conv_geometry& g, unsigned worker) {
  const conv_sizes z = conv_sizes_of<T>(op, g);
  std::byte* at = s.worker0 + worker * s.per_worker;
  worker_scratch<T> w;
  w.col = reinterpret_cast<T*>(at);
  w.g_image = reinterpret_cast<T*>(at + z.col);
  w.panel = reinterpret_cast<T*>(at + z.col + z.g_image);
  w.a_pack = reinterpret_cast<T*>(at + z.col + z.g_image + z.panel);
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
  const std::size_t CK = g.ck(), P = g.pixels(), NR = detail::conv_nr<T>;
  if (g.n == 0 || g.o == 0 || P == 0) return;
  const auto s = detail::carve_conv<T>(spatial_op::conv2d, g, pool.size(), ws);
  T* const ap = reinterpret_cast<T*>(s.shared);
  detail::pack_weight(w, false, ap);
  const std::size_t panels = (P + NR - 1) / NR;
  // One panel of NR output pixels, all O channels, of image n.
  auto panel = [&](std::size_t n, std::size_t p0, unsigned worker, detail::panel_run* runs) {
    const std::size_t cnt = std::min(NR, P - p0);
    const auto piece = detail::worker_pieces<T>(spatial_op::conv2d, s, g, worker);
    const std::size_t nruns = detail::panel_runs<T>(g, p0, cnt, runs);
    T* out = y.data + n * g.o * P + p0;
    if (CK == 0)
      for (std::size_t o = 0; o < g.o; ++o) std::fill(out + o * P, out + o * P + cnt, T(0));
    else {
      detail::pack_image_panel(x, n, g, runs, nruns, cnt, piece.panel);
      detail::packed_product(g.o, CK, cnt, ap, piece.panel, out, static_cast<std::ptrdiff_t>(P), false);
    }
    return nruns;
  };
  // With images enough for every thread, a task is a whole image and the epilogue runs after its
  // panels, over whole rows in order: a panel's runs are short and hop between channels (T2's
  // first layer: 1344 epilogue calls an image of ~14 elements, against 768 whole rows in order,
  // which the epilogue's row addressing follows without divisions). So does one thread, whatever
  // the batch: at batch 1 the per-run epilogue took as long as the products (T2's first layer,
  // 40 against 15 us). Otherwise (small batches) a task is one panel, so that the threads share
  // an image.
  if (g.n >= 4 * std::size_t{pool.size()} || pool.size() == 1) {
    pool.parallel_for(g.n, [&](std::size_t n, unsigned worker) {
      detail::panel_run runs[detail::conv_nr<T> + 1];
      for (std::size_t p0 = 0; p0 < P; p0 += NR) panel(n, p0, worker, runs);
      epilogue_rows(epilogue, n * g.o * g.oh, g.o * g.oh, g.ow);
    });
    return;
  }
  pool.parallel_for(g.n * panels, [&](std::size_t t, unsigned worker) {
    const std::size_t n = t / panels, p0 = t % panels * NR;
    detail::panel_run runs[detail::conv_nr<T> + 1];
    const std::size_t nruns = panel(n, p0, worker, runs);
    for (std::size_t o = 0; o < g.o; ++o)
      for (std::size_t r = 0; r < nruns; ++r) epilogue((n * g.o + o) * g.oh + runs[r].oh, runs[r].ow, runs[r].m);
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
  T* const ap = reinterpret_cast<T*>(s.shared);
  detail::pack_weight(w, true, ap);
  const std::size_t CK = g.ck(), P = g.pixels(), NR = detail::conv_nr<T>;
  // A task per image: col2im scatters over the whole image, so its panels go together.
  pool.parallel_for(g.n, [&](std::size_t n, unsigned worker) {
    const auto piece = detail::worker_pieces<T>(spatial_op::conv2d_input_grad, s, g, worker);
    const matrix_view<T> gi = detail::image_matrix(gy, n, piece.g_image);
    for (std::size_t p0 = 0; p0 < P; p0 += NR) {
      const std::size_t cnt = std::min(NR, P - p0);
      if (g.o == 0) {
        for (std::size_t i = 0; i < CK; ++i) std::fill(piece.col + i * P + p0, piece.col + i * P + p0 + cnt, T(0));
        continue;
      }
      detail::pack_b_panel(cnt, g.o, gi.data + static_cast<std::ptrdiff_t>(p0) * gi.col_stride, gi.row_stride,
                           gi.col_stride, piece.panel, NR);
      detail::packed_product(CK, g.o, cnt, ap, piece.panel, piece.col + p0, static_cast<std::ptrdiff_t>(P), false);
    }
    T* out = dx.data + n * g.c * g.h * g.w;
    detail::col2im(piece.col, g, out);
    epilogue_rows(epilogue, n * g.c * g.h, g.c * g.h, g.w);
  });
}

/// dw = conv2d_weight_grad(g, x): the gradient of conv2d's weight, [O, C, kh, kw], summed over
/// the batch in a fixed order.
template <class T, class Epilogue>
void conv2d_weight_grad(const window& win, const strided<T>& gy, const strided<T>& x, const strided<T>& dw,
                        thread_pool& pool, std::span<std::byte> ws, Epilogue&& epilogue) {
  detail::require_contiguous(dw, "conv2d_weight_grad");
  const detail::conv_geometry g = detail::conv_geometry_of(win, x.shape, dw.shape, gy.shape);
  const std::size_t CK = g.ck(), P = g.pixels(), NR = detail::conv_nr<T>;
  if (g.o * CK == 0) return;
  if (g.n == 0 || P == 0) {
    std::fill(dw.data, dw.data + g.o * CK, T(0));
    epilogue_rows(epilogue, 0, g.o * g.c * g.kh, g.kw);
    return;
  }
  const auto s = detail::carve_conv<T>(spatial_op::conv2d_weight_grad, g, pool.size(), ws);
  T* partials = reinterpret_cast<T*>(s.shared);
  const std::size_t part_stride = detail::round64(g.o * CK * sizeof(T)) / sizeof(T);
  const std::size_t chunks = detail::weight_grad_chunks(g.n);
  // Chunk ch's partial [O, CK] = sum over its images n, in order, of g[n] [O, P] · col(x[n])ᵀ [P, CK]:
  // per image, A = g[n] packed, then for each panel of NR columns of colᵀ, the product continues
  // the partial's chains (the first image of the chunk starts them).
  pool.parallel_for(chunks, [&](std::size_t ch, unsigned worker) {
    const auto piece = detail::worker_pieces<T>(spatial_op::conv2d_weight_grad, s, g, worker);
    T* part = partials + ch * part_stride;
    const std::size_t n0 = ch * g.n / chunks, n1 = (ch + 1) * g.n / chunks;
    for (std::size_t n = n0; n < n1; ++n) {
      const matrix_view<T> gi = detail::image_matrix(gy, n, piece.g_image);
      detail::pack_a(g.o, P, gi, piece.a_pack);
      for (std::size_t j0 = 0; j0 < CK; j0 += NR) {
        const std::size_t cnt = std::min(NR, CK - j0);
        detail::pack_colT_panel(x, n, g, j0, cnt, piece.panel);
        detail::packed_product(g.o, P, cnt, piece.a_pack, piece.panel, part + j0, static_cast<std::ptrdiff_t>(CK),
                               n != n0);
      }
    }
  });
  // The chunks in order, a task per output channel; then its rows' epilogue.
  pool.parallel_for(g.o, [&](std::size_t o, unsigned) {
    T* out = dw.data + o * CK;
    std::copy(partials + o * CK, partials + (o + 1) * CK, out);
    for (std::size_t ch = 1; ch < chunks; ++ch) {
      const T* p = partials + ch * part_stride + o * CK;
      for (std::size_t i = 0; i < CK; ++i) out[i] += p[i];
    }
    epilogue_rows(epilogue, o * g.c * g.kh, g.c * g.kh, g.kw);
  });
}

}  // namespace fusebox::cpu
