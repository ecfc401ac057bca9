// backend/cpu/winograd.hpp: conv2d and its two gradients for 5x5 kernels at unit stride, in float, by
// Winograd's minimal filtering on 8x8 tiles: F(4x4, 5x5) for the forward, its adjoint for the
// input gradient, F(5x5, 4x4) for the weight gradient. Where direct convolution (backend/cpu/conv.hpp)
// spends 400 multiply-adds on a 4x4 output tile and an (input, output) channel pair, this spends
// 64, in 64 independent GEMMs over the channels, plus the transforms of the tiles in and out.
// T2's second layer (32 -> 64 channels, 12x12 -> 8x8) has 4.4x fewer flops this way; issue 5's
// T2 needs them (docs/benchmarks.md: direct convolution at the machine's FMA peak cannot give 2x
// libtorch).
// The input gradient is not a forward F(4x4, 5x5) over gy padded by 4: on T2's second layer that
// is 9 tiles an image whose 8x8 windows are mostly padding, and it measured 7.1 ms against direct
// convolution's 6.1 (one thread). The adjoint of the forward's tiling (transposed_convolution)
// tiles gy instead: 4 dense tiles an image, 3.4 ms.
//
// The transforms (points 0, 1, -1, 2, -2, 1/2, -1/2 and infinity; derived exactly in rationals
// and checked against direct correlation, then rows balanced so no entry is far from 1):
//   Y = Aᵀ [ (G w Gᵀ) ⊙ (Bᵀ d B) ] A,   d an 8x8 input tile, w the 5x5 kernel, Y a 4x4 output tile.
// With the evaluation matrix V of the points (8x8, infinity's row picking the leading
// coefficient), Bᵀ = (V⁻¹)ᵀ; G = V's first r columns; Aᵀ = the first m columns of V, transposed.
// Bᵀ and Aᵀ are exact in float; G's fractions of 9 and 45 are rounded to float.
// The weight gradient is the same identity with the output gradient's 4x4 tiles as the kernel:
//   dw[o, c] = A'ᵀ [ Σ_{images, tiles} (G' gy_tile G'ᵀ) ⊙ (Bᵀ x_tile B) ] A'   (5x5),
// whose input tiles are exactly the forward's (the same Bᵀ, windows at a stride of 4).
//
// Accuracy: each output is a sum of 64 products of transformed values instead of 25 C products
// of the raw ones; the transforms' constants (up to 5.25 in Bᵀ, 8 and 16 in Aᵀ) grow rounding
// error. tests/cpu/conv.cpp bounds it against a double reference at 64 eps * sum|products| per
// element; measured worst there: 9.9 (forward), 11.7 (input gradient) and 10.9 (weight
// gradient), where direct
// convolution's worst is about 1-2. On T2's second layer (batch 128), Winograd's and direct
// convolution's outputs differ by at most 5.4e-6 of the largest output. Training T2 with it is
// measured in docs/benchmarks.md.
// `FUSEBOX_CONV_WINOGRAD=0` in the environment, or set_conv_winograd(false), turns it off (every
// convolution then runs direct, as in double).
//
// Work split (threads take tasks; no result depends on the thread count):
//   forward               a task per group of whole images, in panels of NR tiles: gather and
//                         transform the panel's tiles into 64 [C, NR] GEMM panels, multiply by
//                         the 64 packed transformed weights [O, C], transform the 64 [O, NR]
//                         products back to 4x4 tiles, then run the epilogue on the images' rows;
//   input grad            the same with gy's 4x4 tiles spread to 8x8 ([O, NR] panels), the
//                         weights as [C, O], and the 8x8 results added into dx's windows;
//   weight grad           a fixed number of image chunks, each a task summing its images' tiles
//                         into 64 partial [O, C] products (one fma chain per element, tiles in
//                         order), then the chunks summed in order and transformed back.
// Depends on: backend/cpu/conv.hpp (geometry, packing, the micro-kernel product), backend/cpu/thread_pool.hpp,
// core/environment.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>

#include "fusebox/backend/cpu/conv.hpp"
#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/environment.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/window.hpp"

namespace fusebox::cpu {

/// Whether float convolutions that qualify run by Winograd (on unless FUSEBOX_CONV_WINOGRAD=0).
inline std::atomic<bool>& conv_winograd_flag() {
  static std::atomic<bool> on{[] {
    const char* e = ::fusebox::detail::environment_variable("FUSEBOX_CONV_WINOGRAD");
    return !(e && e[0] == '0' && e[1] == '\0');
  }()};
  return on;
}
inline void set_conv_winograd(bool on) { conv_winograd_flag().store(on, std::memory_order_relaxed); }
inline bool conv_winograd() { return conv_winograd_flag().load(std::memory_order_relaxed); }

/// Where a convolution keeps its prepared weights between calls (options::freezing): `data`
/// (64-byte aligned, winograd::frozen_bytes of it) and `*made_from`, the address of the weight
/// tensor they were made from (null: not made yet). All null: prepared per call in the workspace.
struct frozen_weights {
  std::byte* data = nullptr;
  const void** made_from = nullptr;
};

namespace winograd {

inline constexpr std::size_t alpha = 8;   // tile side, in
inline constexpr std::size_t m = 4;       // output tile side (forward, input grad)
inline constexpr std::size_t r = 5;       // kernel side
inline constexpr std::size_t points = alpha * alpha;

// The 1-D transforms on L lanes at once (L tiles side by side: the loops over j vectorize).
// Each takes its 8 (or 4) inputs `ds` floats apart and writes its outputs `vs` apart.

/// v = Bᵀ d (8 -> 8).
template <std::size_t L>
inline void input_1d(const float* __restrict d, std::ptrdiff_t ds, float* __restrict v, std::ptrdiff_t vs) {
  for (std::size_t j = 0; j < L; ++j) {
    const float d0 = d[j], d1 = d[ds + j], d2 = d[2 * ds + j], d3 = d[3 * ds + j], d4 = d[4 * ds + j],
                d5 = d[5 * ds + j], d6 = d[6 * ds + j], d7 = d[7 * ds + j];
    const float e1 = 4.25f * d4 - d2 - d6, o1 = 4.25f * d3 - d1 - d5;
    const float e3 = 0.25f * d2 - 1.25f * d4 + d6, o3 = 0.5f * d1 - 2.5f * d3 + 2.0f * d5;
    const float e5 = 4.0f * d2 - 5.0f * d4 + d6, o5 = 2.0f * d1 - 2.5f * d3 + 0.5f * d5;
    v[j] = d0 - 5.25f * d2 + 5.25f * d4 - d6;
    v[vs + j] = e1 + o1;
    v[2 * vs + j] = e1 - o1;
    v[3 * vs + j] = e3 + o3;
    v[4 * vs + j] = e3 - o3;
    v[5 * vs + j] = e5 + o5;
    v[6 * vs + j] = e5 - o5;
    v[7 * vs + j] = d7 - d1 + 5.25f * d3 - 5.25f * d5;
  }
}

/// y = Aᵀ v (8 -> 4, F(4, 5)) or A'ᵀ v (8 -> 5, F(5, 4)).
template <std::size_t L, std::size_t Out>
inline void output_1d(const float* __restrict v, std::ptrdiff_t ds, float* __restrict y, std::ptrdiff_t ys) {
  static_assert(Out == 4 || Out == 5);
  for (std::size_t j = 0; j < L; ++j) {
    const float v0 = v[j], v7 = v[7 * ds + j];
    const float s1 = v[ds + j] + v[2 * ds + j], d1 = v[ds + j] - v[2 * ds + j];
    const float s2 = v[3 * ds + j] + v[4 * ds + j], d2 = v[3 * ds + j] - v[4 * ds + j];
    const float s3 = v[5 * ds + j] + v[6 * ds + j], d3 = v[5 * ds + j] - v[6 * ds + j];
    y[j] = v0 + s1 + s2 + s3;
    y[ys + j] = d1 + 2.0f * d2 + 0.5f * d3;
    y[2 * ys + j] = s1 + 4.0f * s2 + 0.25f * s3;
    if constexpr (Out == 4) {
      y[3 * ys + j] = d1 + 8.0f * d2 + 0.125f * d3 + v7;
    } else {
      y[3 * ys + j] = d1 + 8.0f * d2 + 0.125f * d3;
      y[4 * ys + j] = s1 + 16.0f * s2 + 0.0625f * s3 + v7;
    }
  }
}

/// v = A g (4 -> 8): the input gradient's spread of gy's 4x4 tiles (Aᵀ of F(4, 5), transposed).
template <std::size_t L>
inline void spread_1d(const float* __restrict g, std::ptrdiff_t gs, float* __restrict v, std::ptrdiff_t vs) {
  for (std::size_t j = 0; j < L; ++j) {
    const float g0 = g[j], g1 = g[gs + j], g2 = g[2 * gs + j], g3 = g[3 * gs + j];
    const float e = g0 + g2, o = g1 + g3, e2 = g0 + 4.0f * g2, o2 = 2.0f * g1 + 8.0f * g3, eh = g0 + 0.25f * g2,
                oh = 0.5f * g1 + 0.125f * g3;
    v[j] = g0;
    v[vs + j] = e + o;
    v[2 * vs + j] = e - o;
    v[3 * vs + j] = e2 + o2;
    v[4 * vs + j] = e2 - o2;
    v[5 * vs + j] = eh + oh;
    v[6 * vs + j] = eh - oh;
    v[7 * vs + j] = g3;
  }
}

/// w = B v (8 -> 8): the input gradient's way back from the 64 products (Bᵀ transposed).
template <std::size_t L>
inline void gather_1d(const float* __restrict v, std::ptrdiff_t vs, float* __restrict w, std::ptrdiff_t ws) {
  for (std::size_t j = 0; j < L; ++j) {
    const float v0 = v[j], v7 = v[7 * vs + j];
    const float s1 = v[vs + j] + v[2 * vs + j], d1 = v[vs + j] - v[2 * vs + j];
    const float s3 = v[3 * vs + j] + v[4 * vs + j], d3 = v[3 * vs + j] - v[4 * vs + j];
    const float s5 = v[5 * vs + j] + v[6 * vs + j], d5 = v[5 * vs + j] - v[6 * vs + j];
    w[j] = v0;
    w[ws + j] = 0.5f * d3 + 2.0f * d5 - d1 - v7;
    w[2 * ws + j] = 0.25f * s3 + 4.0f * s5 - 5.25f * v0 - s1;
    w[3 * ws + j] = 4.25f * d1 - 2.5f * d3 - 2.5f * d5 + 5.25f * v7;
    w[4 * ws + j] = 5.25f * v0 + 4.25f * s1 - 1.25f * s3 - 5.0f * s5;
    w[5 * ws + j] = 2.0f * d3 + 0.5f * d5 - d1 - 5.25f * v7;
    w[6 * ws + j] = s3 + s5 - v0 - s1;
    w[7 * ws + j] = v7;
  }
}

/// u = G g (R -> 8): G (8x5) of F(4, 5) on the weights, G' (8x4) of F(5, 4) on the weight
/// gradient's 4x4 tiles of gy (G's first four columns, its last row picking g[R-1]).
/// Rows: 1, 2/9 (1 ±1 1 ±1 1), (1/90 ±1/45 2/45 ±4/45 8/45), (32/45 ±16/45 8/45 ±4/45 2/45), infinity.
template <std::size_t L, std::size_t R>
inline void kernel_1d(const float* __restrict g, std::ptrdiff_t gs, float* __restrict u, std::ptrdiff_t us) {
  static_assert(R == 4 || R == 5);
  constexpr float a = 2.0f / 9, b0 = 1.0f / 90, b1 = 1.0f / 45, b2 = 2.0f / 45, b3 = 4.0f / 45, b4 = 8.0f / 45,
                  c0 = 32.0f / 45, c1 = 16.0f / 45, c2 = 8.0f / 45, c3 = 4.0f / 45, c4 = 2.0f / 45;
  for (std::size_t j = 0; j < L; ++j) {
    const float g0 = g[j], g1 = g[gs + j], g2 = g[2 * gs + j], g3 = g[3 * gs + j];
    const float g4 = R == 5 ? g[4 * gs + j] : 0.0f;
    const float e = g0 + g2 + g4, o = g1 + g3, e3 = b0 * g0 + b2 * g2 + b4 * g4, o3 = b1 * g1 + b3 * g3,
                e5 = c0 * g0 + c2 * g2 + c4 * g4, o5 = c1 * g1 + c3 * g3;
    u[j] = g0;
    u[us + j] = a * (e + o);
    u[2 * us + j] = a * (e - o);
    u[3 * us + j] = e3 + o3;
    u[4 * us + j] = e3 - o3;
    u[5 * us + j] = e5 + o5;
    u[6 * us + j] = e5 - o5;
    u[7 * us + j] = R == 5 ? g4 : g3;
  }
}

/// Whether op (conv2d or either gradient) qualifies: float, a 5x5 kernel at unit stride, padding
/// under 5, and enough channels on both sides that the 64 products are GEMMs worth the transforms
/// (T2's first layer, one input channel, stays direct).
template <class T>
constexpr bool applies(spatial_op op, const detail::conv_geometry& g) {
  if (!std::is_same_v<T, float>) return false;
  if (g.kh != r || g.kw != r || g.sh != 1 || g.sw != 1) return false;
  if (g.ph < 0 || g.pw < 0 || g.ph >= static_cast<int>(r) || g.pw >= static_cast<int>(r)) return false;
  if (g.n == 0 || g.c < 8 || g.o < 8 || g.oh == 0 || g.ow == 0) return false;
  return op == spatial_op::conv2d || op == spatial_op::conv2d_input_grad || op == spatial_op::conv2d_weight_grad;
}

/// The forward's problem: `in` channels of the tiled operand, `out` channels of the result, the
/// result's spatial size and the padding of the tiled operand.
struct tiled_problem {
  std::size_t n, in, out, h, w, oh, ow;
  std::ptrdiff_t ph, pw;
  constexpr std::size_t tiles_h() const { return (oh + m - 1) / m; }
  constexpr std::size_t tiles_w() const { return (ow + m - 1) / m; }
  constexpr std::size_t tiles_per_image() const { return tiles_h() * tiles_w(); }
};
constexpr tiled_problem tiled_of(const detail::conv_geometry& g) {
  return {g.n, g.c, g.o, g.h, g.w, g.oh, g.ow, g.ph, g.pw};
}

/// Images a forward task takes: the count up to 8 whose tiles fill NR-wide panels best.
template <class T>
constexpr std::size_t images_per_task(std::size_t tiles_per_image) {
  constexpr std::size_t NR = detail::conv_nr<T>;
  std::size_t best = 1, best_waste_num = NR, best_den = 1;  // waste fraction = num / den
  for (std::size_t k = 1; k <= 8; ++k) {
    const std::size_t t = k * tiles_per_image, padded = (t + NR - 1) / NR * NR;
    if ((padded - t) * best_den < best_waste_num * t) best = k, best_waste_num = padded - t, best_den = t;
  }
  return best;
}

/// Whether the forward puts channels in the vector lanes (few_tiles_convolution) rather than
/// tiles (tiled_convolution): when a task's tiles would fill at most half of an NR-wide panel.
/// At batch 1 T2's second layer has 4 tiles: the tile-lane layout computed NR = 32 lanes (AVX-512)
/// for 4 of them in every transform and product.
template <class T>
constexpr bool few_tiles(const tiled_problem& t) {
  const std::size_t tp = t.tiles_per_image();
  return std::min(t.n, images_per_task<T>(tp)) * tp * 2 <= detail::conv_nr<T>;
}

/// The channel-lane layout's sizes: C and O rounded up to whole vectors and whole NR panels.
template <class T>
constexpr std::size_t lane_channels(std::size_t c) {
  constexpr std::size_t L = xsimd::batch<float>::size;
  return (c + L - 1) / L * L;
}
template <class T>
constexpr std::size_t panel_channels(std::size_t o) {
  constexpr std::size_t NR = detail::conv_nr<T>;
  return (o + NR - 1) / NR * NR;
}
/// A worker's scratch in few_tiles_convolution: MR tiles' 64 transformed inputs [MR, C'] and
/// products [MR, O'], and two tile buffers [64, L].
template <class T>
constexpr std::size_t few_tiles_scratch_bytes(std::size_t c, std::size_t o) {
  constexpr std::size_t MR = detail::conv_mr<T>, L = xsimd::batch<float>::size;
  return detail::round64(points * MR * lane_channels<T>(c) * sizeof(float)) +
         detail::round64(points * MR * panel_channels<T>(o) * sizeof(float)) + 2 * detail::round64(points * L * sizeof(float));
}

/// Images a weight-gradient group takes: about 32 tiles (a group's tiles are the GEMMs' K).
constexpr std::size_t images_per_group(std::size_t tiles_per_image) {
  return std::max<std::size_t>(1, 32 / std::max<std::size_t>(tiles_per_image, 1));
}

/// A worker's scratch in the forward and the input gradient: the 64 GEMM panels [k_rows, NR] of
/// a panel of tiles, their 64 products [m_rows, NR], and two tile buffers [64, NR].
struct panel_scratch {
  float *panels, *prod, *tile, *tmp;
};
template <class T>
constexpr std::size_t panel_scratch_bytes(std::size_t k_rows, std::size_t m_rows) {
  constexpr std::size_t NR = detail::conv_nr<T>;
  return detail::round64(points * k_rows * NR * sizeof(float)) + detail::round64(points * m_rows * NR * sizeof(float)) +
         2 * detail::round64(points * NR * sizeof(float));
}
inline panel_scratch carve_panels(std::byte* at, std::size_t k_rows, std::size_t m_rows) {
  constexpr std::size_t NR = detail::conv_nr<float>;
  panel_scratch s;
  s.panels = reinterpret_cast<float*>(at);
  at += detail::round64(points * k_rows * NR * sizeof(float));
  s.prod = reinterpret_cast<float*>(at);
  at += detail::round64(points * m_rows * NR * sizeof(float));
  s.tile = reinterpret_cast<float*>(at);
  s.tmp = reinterpret_cast<float*>(at + detail::round64(points * NR * sizeof(float)));
  return s;
}

/// Workspace pieces, each a multiple of 64 bytes.
struct sizes {
  std::size_t shared = 0, per_worker = 0;
};
template <class T>
constexpr sizes sizes_of(spatial_op op, const detail::conv_geometry& g) {
  using detail::round64;
  constexpr std::size_t NR = detail::conv_nr<T>;
  sizes s;
  if (op == spatial_op::conv2d_weight_grad) {
    const std::size_t tp = ((g.oh + m - 1) / m) * ((g.ow + m - 1) / m), kg = images_per_group(tp) * tp;
    const std::size_t c_pad = (g.c + NR - 1) / NR * NR;
    s.shared = detail::weight_grad_chunks(g.n) * round64(points * g.o * g.c * sizeof(float));
    s.per_worker = round64(points * detail::packed_a_elems<float>(g.o, kg) * sizeof(float)) +  // gy tiles, packed A
                   round64(points * kg * c_pad * sizeof(float)) +                               // x tiles, B panels
                   2 * round64(points * NR * sizeof(float));                                    // tile buffers
    return s;
  }
  if (op == spatial_op::conv2d_input_grad) {  // [C, O] · [O, NR] products (transposed_convolution)
    s.shared = round64(points * detail::packed_a_elems<float>(g.c, g.o) * sizeof(float));
    s.per_worker = panel_scratch_bytes<T>(g.o, g.c);
    return s;
  }
  const tiled_problem t = tiled_of(g);
  if (few_tiles<T>(t)) {
    s.shared = round64(points * t.in * panel_channels<T>(t.out) * sizeof(float));
    s.per_worker = few_tiles_scratch_bytes<T>(t.in, t.out);
    return s;
  }
  s.shared = round64(points * detail::packed_a_elems<float>(t.out, t.in) * sizeof(float));
  s.per_worker = panel_scratch_bytes<T>(t.in, t.out);
  return s;
}

/// Bytes of a forward's transformed weights kept between calls under options::freezing (0 for
/// the gradients, and where Winograd does not apply).
template <class T>
constexpr std::size_t frozen_bytes(spatial_op op, const detail::conv_geometry& g) {
  return op == spatial_op::conv2d && applies<T>(op, g) ? sizes_of<T>(op, g).shared : 0;
}

/// Bytes of workspace op needs by Winograd (0 where it does not apply); `frozen`: a forward's
/// transformed weights are kept elsewhere (frozen_weights), not made in the workspace.
template <class T>
constexpr std::size_t workspace_bytes(spatial_op op, const detail::conv_geometry& g, unsigned threads, bool frozen = false) {
  if (!applies<T>(op, g)) return 0;
  const sizes s = sizes_of<T>(op, g);
  const std::size_t weights = frozen && op == spatial_op::conv2d ? 0 : s.shared;
  return weights + s.per_worker * (threads == 0 ? 1 : threads) + 64;  // alignment slack
}

namespace detail {
using cpu::detail::conv_geometry;

inline std::byte* align64(std::span<std::byte> ws) {
  return ws.data() + (64 - reinterpret_cast<std::uintptr_t>(ws.data()) % 64) % 64;
}

inline void require_workspace(spatial_op op, std::size_t have, std::size_t need) {
  if (have < need)
    FUSEBOX_THROW(invalid_argument("fusebox internal: Winograd " + std::string(name(op)) + " needs " + std::to_string(need) +
                                   " bytes of workspace, got " + std::to_string(have)));
}

/// The 64 transformed kernels G k Gᵀ, each packed as gemm's A [rows, cols] (MR-row slivers) at
/// dst + point * packed_a_elems(rows, cols): k = w[row, col] of w [rows, cols, 5, 5], or with
/// `swap` k = w[col, row] of w [cols, rows, 5, 5] (the input gradient's A = Uᵀ). A task per
/// sliver (rows interleave within one: a task per row had the two threads writing the same cache
/// lines, and two threads took longer than one), its columns NR at a time side by side.
inline void transform_weights(const strided<float>& w, bool swap, std::size_t out, std::size_t in, float* dst,
                              thread_pool& pool) {
  constexpr std::size_t MR = cpu::detail::conv_mr<float>, NR = cpu::detail::conv_nr<float>;
  const std::size_t stride = cpu::detail::packed_a_elems<float>(out, in), slivers = (out + MR - 1) / MR;
  pool.parallel_for(slivers, [&](std::size_t sl, unsigned) {
    float kk[r * r * NR], t[alpha * r * NR], u[points * NR];
    const std::ptrdiff_t lane = static_cast<std::ptrdiff_t>(NR), five = static_cast<std::ptrdiff_t>(r * NR);
    float* const sliver = dst + sl * in * MR;  // (row sl * MR + rr, column ic) at sliver[ic * MR + rr]
    for (std::size_t rr = 0; rr < MR; ++rr) {
      const std::size_t oc = sl * MR + rr;
      if (oc >= out) {  // rows past `out` are zero
        for (std::size_t p = 0; p < points; ++p)
          for (std::size_t ic = 0; ic < in; ++ic) sliver[p * stride + ic * MR + rr] = 0.0f;
        continue;
      }
      for (std::size_t ic0 = 0; ic0 < in; ic0 += NR) {
        const std::size_t cnt = std::min(NR, in - ic0);
        for (std::size_t j = 0; j < NR; ++j) {
          const std::ptrdiff_t col = static_cast<std::ptrdiff_t>(ic0 + std::min(j, cnt - 1)), row = static_cast<std::ptrdiff_t>(oc);
          const float* k = w.data + (swap ? col * w.stride[0] + row * w.stride[1] : row * w.stride[0] + col * w.stride[1]);
          for (std::size_t a = 0; a < r; ++a)
            for (std::size_t b = 0; b < r; ++b)
              kk[(a * r + b) * NR + j] = k[static_cast<std::ptrdiff_t>(a) * w.stride[2] + static_cast<std::ptrdiff_t>(b) * w.stride[3]];
        }
        for (std::size_t b = 0; b < r; ++b) kernel_1d<NR, r>(kk + b * NR, five, t + b * NR, five);  // t[ξ][b]
        for (std::size_t xi = 0; xi < alpha; ++xi) kernel_1d<NR, r>(t + xi * r * NR, lane, u + xi * alpha * NR, lane);
        for (std::size_t p = 0; p < points; ++p)
          for (std::size_t j = 0; j < cnt; ++j) sliver[p * stride + (ic0 + j) * MR + rr] = u[p * NR + j];
      }
    }
  });
}

/// tile[a][b][j] (S x S values, L lanes) = the plane at base[j] (h x w, strides sh, sw), rows
/// ih0[j] + a, columns iw0[j] + b, 0 outside it; lanes j >= cnt are 0. Lanes are tiles (the
/// forward, the input gradient) or channels (the weight gradient).
/// Each window is copied whole first, tile-major (its rows are contiguous floats where the
/// plane's are), then turned lane-major by register transposes (cpu::detail::transpose_block):
/// gathered lane-major directly, every element was a scalar load at a stride, which was about as
/// much time as the 64 products.
template <std::size_t L, std::size_t S = alpha>
inline void gather_tiles(std::ptrdiff_t sh, std::ptrdiff_t sw, std::size_t h, std::size_t w, const std::ptrdiff_t* ih0,
                         const std::ptrdiff_t* iw0, const float* const* base, std::size_t cnt, float* tile) {
  constexpr std::size_t lanes = xsimd::batch<float>::size, area = S * S;
  static_assert(L % lanes == 0 && area % lanes == 0, "whole transpose blocks");
  const std::ptrdiff_t H = static_cast<std::ptrdiff_t>(h), W = static_cast<std::ptrdiff_t>(w), side = S;
  alignas(64) float by_tile[L * area];
  for (std::size_t j = 0; j < cnt; ++j) {
    // Rows [a0, a1) and columns [b0, b1) of the tile lie in the plane; the rest is padding.
    const std::ptrdiff_t a0 = std::clamp<std::ptrdiff_t>(-ih0[j], 0, side), a1 = std::clamp<std::ptrdiff_t>(H - ih0[j], a0, side);
    const std::ptrdiff_t b0 = std::clamp<std::ptrdiff_t>(-iw0[j], 0, side), b1 = std::clamp<std::ptrdiff_t>(W - iw0[j], b0, side);
    const float* row = base[j] + ih0[j] * sh + iw0[j] * sw;
    float* t = by_tile + j * area;
    if (a0 == 0 && a1 == side && b0 == 0 && b1 == side) {
      for (std::size_t a = 0; a < S; ++a, row += sh, t += S)
        if (sw == 1)
          for (std::size_t b = 0; b < S; ++b) t[b] = row[b];
        else
          for (std::size_t b = 0; b < S; ++b) t[b] = row[static_cast<std::ptrdiff_t>(b) * sw];
      continue;
    }
    for (std::ptrdiff_t a = 0; a < side; ++a, t += S) {
      if (a < a0 || a >= a1) {
        std::fill(t, t + S, 0.0f);
        continue;
      }
      const float* ra = row + a * sh;
      for (std::ptrdiff_t b = 0; b < side; ++b) t[b] = b >= b0 && b < b1 ? ra[b * sw] : 0.0f;
    }
  }
  std::fill(by_tile + cnt * area, by_tile + L * area, 0.0f);
  for (std::size_t p0 = 0; p0 < area; p0 += lanes)
    for (std::size_t j0 = 0; j0 < L; j0 += lanes)
      cpu::detail::transpose_block(by_tile + j0 * area + p0, static_cast<std::ptrdiff_t>(area), tile + p0 * L + j0, L);
}

/// V = Bᵀ d B for L tiles: tile [8][8][L], the first pass in tmp, result point (ξ, ν) lane j at
/// out[(ξ * 8 + ν) * point_stride + j] (out may be tile itself: the second pass reads tmp only).
template <std::size_t L>
inline void transform_input(float* tile, float* tmp, float* out, std::ptrdiff_t point_stride) {
  const std::ptrdiff_t row = static_cast<std::ptrdiff_t>(alpha * L), lane = static_cast<std::ptrdiff_t>(L);
  for (std::size_t b = 0; b < alpha; ++b) input_1d<L>(tile + b * L, row, tmp + b * L, row);  // along a: tmp[ξ][b]
  for (std::size_t xi = 0; xi < alpha; ++xi)
    input_1d<L>(tmp + xi * alpha * L, lane, out + static_cast<std::ptrdiff_t>(xi * alpha) * point_stride, point_stride);
}

/// The tiles of a forward-shaped problem: tile t of image n is (t / tiles_w, t % tiles_w).
struct tile_ref {
  std::size_t n, th, tw;
};

/// y [N, out, oh, ow] from x [N, in, h, w] (padded by t.ph, t.pw) and the packed transformed
/// kernels u (transform_weights).
template <class Epilogue>
void tiled_convolution(const tiled_problem& t, const strided<float>& x, const float* u, const strided<float>& y,
                       thread_pool& pool, std::byte* workers, std::size_t per_worker, Epilogue& epilogue) {
  constexpr std::size_t NR = cpu::detail::conv_nr<float>;
  const std::size_t tp = t.tiles_per_image(), tw_n = t.tiles_w(), k_img = images_per_task<float>(tp);
  const std::size_t tasks = (t.n + k_img - 1) / k_img, u_stride = cpu::detail::packed_a_elems<float>(t.out, t.in);
  const std::size_t out_plane = t.oh * t.ow;
  constexpr std::size_t lanes = xsimd::batch<float>::size;  // cpu::detail::transpose_block's side
  static_assert(NR % lanes == 0 && (m * m) % lanes == 0);
  pool.parallel_for(tasks, [&](std::size_t task, unsigned worker) {
    const auto [panels, prod, tile, tmp] = carve_panels(workers + worker * per_worker, t.in, t.out);
    alignas(64) float by_tile[lanes * m * m];  // the out step's tiles one after another: [lanes][16]
    const std::size_t n0 = task * k_img, n1 = std::min(t.n, n0 + k_img), tiles = (n1 - n0) * tp;
    for (std::size_t p0 = 0; p0 < tiles; p0 += NR) {
      const std::size_t cnt = std::min(NR, tiles - p0);
      tile_ref ref[NR];
      std::ptrdiff_t ih0[NR], iw0[NR];
      for (std::size_t j = 0; j < cnt; ++j) {
        const std::size_t q = p0 + j, n = n0 + q / tp, th = q % tp / tw_n, tw = q % tp % tw_n;
        ref[j] = {n, th, tw};
        ih0[j] = static_cast<std::ptrdiff_t>(th * m) - t.ph;
        iw0[j] = static_cast<std::ptrdiff_t>(tw * m) - t.pw;
      }
      // In: each channel's NR tiles, transformed into the 64 panels [in, NR].
      const float* base[NR];
      for (std::size_t c = 0; c < t.in; ++c) {
        for (std::size_t j = 0; j < cnt; ++j)
          base[j] = x.data + static_cast<std::ptrdiff_t>(ref[j].n) * x.stride[0] + static_cast<std::ptrdiff_t>(c) * x.stride[1];
        gather_tiles<NR>(x.stride[2], x.stride[3], t.h, t.w, ih0, iw0, base, cnt, tile);
        transform_input<NR>(tile, tmp, panels + c * NR, static_cast<std::ptrdiff_t>(t.in * NR));
      }
      // The 64 products [out, in] · [in, NR].
      for (std::size_t p = 0; p < points; ++p)
        cpu::detail::packed_product(t.out, t.in, cnt, u + p * u_stride, panels + p * t.in * NR, prod + p * t.out * NR,
                                    static_cast<std::ptrdiff_t>(NR), false);
      // Out: each output channel's NR tiles, back to 4x4 and into y.
      const std::ptrdiff_t point = static_cast<std::ptrdiff_t>(t.out * NR), lane = static_cast<std::ptrdiff_t>(NR);
      for (std::size_t o = 0; o < t.out; ++o) {
        const float* mo = prod + o * NR;
        for (std::size_t nu = 0; nu < alpha; ++nu)  // along ξ: tmp[i][ν]
          output_1d<NR, m>(mo + static_cast<std::ptrdiff_t>(nu) * point, alpha * point, tmp + nu * NR,
                           static_cast<std::ptrdiff_t>(alpha * NR));
        for (std::size_t i = 0; i < m; ++i)  // along ν: tile[i][k]
          output_1d<NR, m>(tmp + i * alpha * NR, lane, tile + i * m * NR, lane);
        // Tile-major by register transposes, so each of a tile's rows is 4 contiguous floats.
        for (std::size_t j0 = 0; j0 < cnt; j0 += lanes) {
          for (std::size_t k0 = 0; k0 < m * m; k0 += lanes)
            cpu::detail::transpose_block(tile + k0 * NR + j0, lane, by_tile + k0, m * m);
          for (std::size_t j = j0; j < std::min(cnt, j0 + lanes); ++j) {
            const float* from = by_tile + (j - j0) * m * m;
            float* dst = y.data + (ref[j].n * t.out + o) * out_plane;
            const std::size_t oh0 = ref[j].th * m, ow0 = ref[j].tw * m;
            const std::size_t rows = std::min(m, t.oh - oh0), cols = std::min(m, t.ow - ow0);
            for (std::size_t i = 0; i < rows; ++i) {
              float* to = dst + (oh0 + i) * t.ow + ow0;
              if (cols == m)  // a constant length: one vector move, not a call to memmove
                for (std::size_t k = 0; k < m; ++k) to[k] = from[i * m + k];
              else
                for (std::size_t k = 0; k < cols; ++k) to[k] = from[i * m + k];
            }
          }
        }
      }
    }
    epilogue_rows(epilogue, n0 * t.out * t.oh, (n1 - n0) * t.out * t.oh, t.ow);
  });
}

/// The 64 transformed kernels G k Gᵀ of w [out, in, 5, 5] as B panels for few_tiles_convolution:
/// point p's [in, out'] (out' = panel_channels(out)) at dst + p * in * out', panel q (columns
/// q*NR..) at + q * in * NR, element (c, o) at [c * NR + o % NR]; columns past `out` are zero.
/// A task per input channel, its output channels NR at a time side by side.
inline void transform_weights_panels(const strided<float>& w, std::size_t out, std::size_t in, float* dst, thread_pool& pool) {
  constexpr std::size_t NR = cpu::detail::conv_nr<float>;
  const std::size_t po = panel_channels<float>(out), stride = in * po;
  pool.parallel_for(in, [&](std::size_t c, unsigned) {
    float kk[r * r * NR], t[alpha * r * NR], u[points * NR];
    const std::ptrdiff_t lane = static_cast<std::ptrdiff_t>(NR), five = static_cast<std::ptrdiff_t>(r * NR);
    for (std::size_t o0 = 0; o0 < out; o0 += NR) {
      const std::size_t cnt = std::min(NR, out - o0);
      for (std::size_t j = 0; j < NR; ++j) {
        const std::ptrdiff_t o = static_cast<std::ptrdiff_t>(o0 + std::min(j, cnt - 1));
        const float* k = w.data + o * w.stride[0] + static_cast<std::ptrdiff_t>(c) * w.stride[1];
        for (std::size_t a = 0; a < r; ++a)
          for (std::size_t b = 0; b < r; ++b)
            kk[(a * r + b) * NR + j] = k[static_cast<std::ptrdiff_t>(a) * w.stride[2] + static_cast<std::ptrdiff_t>(b) * w.stride[3]];
      }
      for (std::size_t b = 0; b < r; ++b) kernel_1d<NR, r>(kk + b * NR, five, t + b * NR, five);  // t[ξ][b]
      for (std::size_t xi = 0; xi < alpha; ++xi) kernel_1d<NR, r>(t + xi * r * NR, lane, u + xi * alpha * NR, lane);
      float* panel = dst + o0 * in + c * NR;  // panel o0 / NR starts at (o0 / NR) * in * NR
      for (std::size_t p = 0; p < points; ++p)
        for (std::size_t j = 0; j < NR; ++j) panel[p * stride + j] = j < cnt ? u[p * NR + j] : 0.0f;
    }
  });
}

/// y [N, out, oh, ow] from x (padded by t.ph, t.pw) and u (transform_weights_panels), channels in
/// the vector lanes: up to MR tiles at a time, each channel group's 8x8 windows gathered and
/// transformed L channels at once into V [64][MR][C'], the 64 products [tiles, in] · [in, out']
/// on gemm's micro-kernel (A read in place, so one tile costs one row of it), and the products
/// transformed back L output channels at once. A task per image.
template <class Epilogue>
void few_tiles_convolution(const tiled_problem& t, const strided<float>& x, const float* u, const strided<float>& y,
                           thread_pool& pool, std::byte* workers, std::size_t per_worker, Epilogue& epilogue) {
  constexpr std::size_t MR = cpu::detail::conv_mr<float>, NR = cpu::detail::conv_nr<float>, L = xsimd::batch<float>::size;
  const std::size_t tp = t.tiles_per_image(), tw_n = t.tiles_w(), cp = lane_channels<float>(t.in),
                    po = panel_channels<float>(t.out), out_plane = t.oh * t.ow;
  pool.parallel_for(t.n, [&](std::size_t n, unsigned worker) {
    std::byte* at = workers + worker * per_worker;
    float* const v = reinterpret_cast<float*>(at);
    at += cpu::detail::round64(points * MR * cp * sizeof(float));
    float* const prod = reinterpret_cast<float*>(at);
    at += cpu::detail::round64(points * MR * po * sizeof(float));
    float* const tile = reinterpret_cast<float*>(at);
    float* const tmp = reinterpret_cast<float*>(at + cpu::detail::round64(points * L * sizeof(float)));
    const float* img = x.data + static_cast<std::ptrdiff_t>(n) * x.stride[0];
    for (std::size_t q0 = 0; q0 < tp; q0 += MR) {
      const std::size_t cnt = std::min(MR, tp - q0);
      const std::ptrdiff_t a_stride = static_cast<std::ptrdiff_t>(cnt * cp), c_stride = static_cast<std::ptrdiff_t>(cnt * po);
      // In: each tile's window, L channels at a time, into V [64][cnt][C'].
      for (std::size_t q = 0; q < cnt; ++q) {
        const std::size_t th = (q0 + q) / tw_n, tw = (q0 + q) % tw_n;
        std::ptrdiff_t ih0[L], iw0[L];
        const float* base[L];
        for (std::size_t c0 = 0; c0 < t.in; c0 += L) {
          const std::size_t lanes = std::min(L, t.in - c0);
          for (std::size_t j = 0; j < lanes; ++j) {
            ih0[j] = static_cast<std::ptrdiff_t>(th * m) - t.ph;
            iw0[j] = static_cast<std::ptrdiff_t>(tw * m) - t.pw;
            base[j] = img + static_cast<std::ptrdiff_t>(c0 + j) * x.stride[1];
          }
          gather_tiles<L>(x.stride[2], x.stride[3], t.h, t.w, ih0, iw0, base, lanes, tile);
          transform_input<L>(tile, tmp, v + q * cp + c0, a_stride);
        }
      }
      // The 64 products [cnt, in] · [in, out'], a panel of NR output channels at a time.
      for (std::size_t p = 0; p < points; ++p)
        for (std::size_t o0 = 0; o0 < po; o0 += NR)
          cpu::detail::tile<float, 0>(cnt, NR,
                                      cpu::detail::kernel_args<float>{t.in, v + static_cast<std::ptrdiff_t>(p) * a_stride,
                                                                      static_cast<std::ptrdiff_t>(cp), 1,
                                                                      u + p * t.in * po + o0 * t.in, static_cast<std::ptrdiff_t>(NR),
                                                                      prod + static_cast<std::ptrdiff_t>(p) * c_stride + o0,
                                                                      static_cast<std::ptrdiff_t>(po), false});
      // Out: each tile, L output channels at a time, back to 4x4 and into y.
      const std::ptrdiff_t lane = static_cast<std::ptrdiff_t>(L);
      for (std::size_t q = 0; q < cnt; ++q) {
        const std::size_t oh0 = (q0 + q) / tw_n * m, ow0 = (q0 + q) % tw_n * m;
        const std::size_t rows = std::min(m, t.oh - oh0), cols = std::min(m, t.ow - ow0);
        for (std::size_t o0 = 0; o0 < t.out; o0 += L) {
          const float* mo = prod + q * po + o0;
          for (std::size_t nu = 0; nu < alpha; ++nu)  // along ξ: tmp[i][ν]
            output_1d<L, m>(mo + static_cast<std::ptrdiff_t>(nu) * c_stride, alpha * c_stride, tmp + nu * L,
                            static_cast<std::ptrdiff_t>(alpha * L));
          for (std::size_t i = 0; i < m; ++i)  // along ν: tile[i][k]
            output_1d<L, m>(tmp + i * alpha * L, lane, tile + i * m * L, lane);
          const std::size_t chans = std::min(L, t.out - o0);
          for (std::size_t j = 0; j < chans; ++j) {
            float* dst = y.data + (n * t.out + o0 + j) * out_plane + oh0 * t.ow + ow0;
            for (std::size_t i = 0; i < rows; ++i)
              for (std::size_t k = 0; k < cols; ++k) dst[i * t.ow + k] = tile[(i * m + k) * L + j];
          }
        }
      }
    }
    epilogue_rows(epilogue, n * t.out * t.oh, t.out * t.oh, t.ow);
  });
}

/// The input gradient: dx [N, C, H, W] = the adjoint of the forward's tiling. A 4x4 tile of gy
/// (tiles over gy's OH x OW, cut by its edge) meets the forward's 8x8 window of x at the same
/// place; the adjoint of Y = Aᵀ [U ⊙ (Bᵀ d B)] A sends it back as B [U ⊙ (A g Aᵀ)] Bᵀ, added
/// into that window of dx (windows 4 apart overlap; their parts in the padding are dropped).
/// So the 64 products are [C, O] · [O, tiles], with no padding gathered: T2's second layer has
/// 4 tiles an image, as its forward. u holds the packed transformed kernels with `swap`.
template <class Epilogue>
void transposed_convolution(const conv_geometry& g, const strided<float>& gy, const float* u, const strided<float>& dx,
                            thread_pool& pool, std::byte* workers, std::size_t per_worker, Epilogue& epilogue) {
  constexpr std::size_t NR = cpu::detail::conv_nr<float>;
  const std::size_t tw_n = (g.ow + m - 1) / m, tp = (g.oh + m - 1) / m * tw_n, k_img = images_per_task<float>(tp);
  const std::size_t tasks = (g.n + k_img - 1) / k_img, u_stride = cpu::detail::packed_a_elems<float>(g.c, g.o);
  const std::size_t plane = g.h * g.w;
  const std::ptrdiff_t lane = static_cast<std::ptrdiff_t>(NR), A = alpha;
  constexpr std::size_t lanes = xsimd::batch<float>::size;  // cpu::detail::transpose_block's side
  static_assert(NR % lanes == 0 && points % lanes == 0);
  pool.parallel_for(tasks, [&](std::size_t task, unsigned worker) {
    const auto [panels, prod, tile, tmp] = carve_panels(workers + worker * per_worker, g.o, g.c);
    alignas(64) float by_tile[lanes * points];  // the out step's tiles one after another: [lanes][64]
    const std::size_t n0 = task * k_img, n1 = std::min(g.n, n0 + k_img), tiles = (n1 - n0) * tp;
    std::fill(dx.data + n0 * g.c * plane, dx.data + n1 * g.c * plane, 0.0f);
    for (std::size_t p0 = 0; p0 < tiles; p0 += NR) {
      const std::size_t cnt = std::min(NR, tiles - p0);
      std::size_t img[NR];
      std::ptrdiff_t gh0[NR], gw0[NR], ih0[NR], iw0[NR];  // the tile's corner in gy, its window's in dx
      for (std::size_t j = 0; j < cnt; ++j) {
        const std::size_t q = p0 + j, oh0 = q % tp / tw_n * m, ow0 = q % tp % tw_n * m;
        img[j] = n0 + q / tp;
        gh0[j] = static_cast<std::ptrdiff_t>(oh0);
        gw0[j] = static_cast<std::ptrdiff_t>(ow0);
        ih0[j] = gh0[j] - g.ph;
        iw0[j] = gw0[j] - g.pw;
      }
      // In: each channel of gy, its NR tiles spread to 8x8 (A g Aᵀ), into the 64 panels [O, NR].
      const float* base[NR];
      for (std::size_t o = 0; o < g.o; ++o) {
        for (std::size_t j = 0; j < cnt; ++j)
          base[j] = gy.data + static_cast<std::ptrdiff_t>(img[j]) * gy.stride[0] + static_cast<std::ptrdiff_t>(o) * gy.stride[1];
        gather_tiles<NR, m>(gy.stride[2], gy.stride[3], g.oh, g.ow, gh0, gw0, base, cnt, tile);
        const std::ptrdiff_t four = static_cast<std::ptrdiff_t>(m * NR);
        for (std::size_t b = 0; b < m; ++b) spread_1d<NR>(tile + b * NR, four, tmp + b * NR, four);  // tmp[ξ][b]
        for (std::size_t xi = 0; xi < alpha; ++xi)
          spread_1d<NR>(tmp + xi * m * NR, lane, panels + (xi * alpha * g.o + o) * NR, static_cast<std::ptrdiff_t>(g.o * NR));
      }
      // The 64 products [C, O] · [O, NR].
      for (std::size_t p = 0; p < points; ++p)
        cpu::detail::packed_product(g.c, g.o, cnt, u + p * u_stride, panels + p * g.o * NR, prod + p * g.c * NR, lane, false);
      // Out: each channel of dx, its NR 8x8 pieces (B M Bᵀ) added into their windows.
      const std::ptrdiff_t point = static_cast<std::ptrdiff_t>(g.c * NR), H = static_cast<std::ptrdiff_t>(g.h),
                           W = static_cast<std::ptrdiff_t>(g.w);
      for (std::size_t c = 0; c < g.c; ++c) {
        const float* mc = prod + c * NR;
        for (std::size_t nu = 0; nu < alpha; ++nu)  // along ξ: tmp[a][ν]
          gather_1d<NR>(mc + static_cast<std::ptrdiff_t>(nu) * point, A * point, tmp + nu * NR, A * lane);
        for (std::size_t a = 0; a < alpha; ++a)  // along ν: tile[a][b]
          gather_1d<NR>(tmp + a * alpha * NR, lane, tile + a * alpha * NR, lane);
        // Tile-major by register transposes (lanes tiles at a time), so a window row is 8 contiguous
        // floats added at once; tiles in order and rows in order within each, as the scalar
        // loop over the lane-major tile added them, so the sums are the same to the bit.
        for (std::size_t j0 = 0; j0 < cnt; j0 += lanes) {
          for (std::size_t p0 = 0; p0 < points; p0 += lanes)
            cpu::detail::transpose_block(tile + p0 * NR + j0, lane, by_tile + p0, points);
          for (std::size_t j = j0; j < std::min(cnt, j0 + lanes); ++j) {
            const float* t = by_tile + (j - j0) * points;
            float* d = dx.data + (img[j] * g.c + c) * plane;
            const std::ptrdiff_t a0 = std::clamp<std::ptrdiff_t>(-ih0[j], 0, A), a1 = std::clamp<std::ptrdiff_t>(H - ih0[j], a0, A);
            const std::ptrdiff_t b0 = std::clamp<std::ptrdiff_t>(-iw0[j], 0, A), b1 = std::clamp<std::ptrdiff_t>(W - iw0[j], b0, A);
            for (std::ptrdiff_t a = a0; a < a1; ++a) {
              float* drow = d + (ih0[j] + a) * W + iw0[j];
              const float* trow = t + a * A;
              if (b0 == 0 && b1 == A)
                for (std::size_t b = 0; b < alpha; ++b) drow[b] += trow[b];
              else
                for (std::ptrdiff_t b = b0; b < b1; ++b) drow[b] += trow[b];
            }
          }
        }
      }
    }
    epilogue_rows(epilogue, n0 * g.c * g.h, (n1 - n0) * g.c * g.h, g.w);
  });
}

}  // namespace detail

/// y = conv2d(x, w) by F(4x4, 5x5), then epilogue(row, j0, n) over y's rows [N*O*OH] of OW.
/// With `frozen` (options::freezing), the transformed weights are kept in frozen.data and made
/// again only when w is another tensor than the one they were made from.
template <class Epilogue>
void conv2d_forward(const window& win, const strided<float>& x, const strided<float>& w, const strided<float>& y,
                    thread_pool& pool, std::span<std::byte> ws, Epilogue&& epilogue, frozen_weights frozen = {}) {
  cpu::detail::require_contiguous(y, "conv2d");
  const auto g = cpu::detail::conv_geometry_of(win, x.shape, w.shape, y.shape);
  const bool kept = frozen.data != nullptr;
  detail::require_workspace(spatial_op::conv2d, ws.size(), workspace_bytes<float>(spatial_op::conv2d, g, pool.size(), kept));
  const sizes s = sizes_of<float>(spatial_op::conv2d, g);
  std::byte* base = detail::align64(ws);
  std::byte* workers = kept ? base : base + s.shared;
  const tiled_problem t = tiled_of(g);
  const bool few = few_tiles<float>(t);
  float* u = reinterpret_cast<float*>(kept ? frozen.data : base);
  if (!kept || *frozen.made_from != w.data) {
    if (few) detail::transform_weights_panels(w, t.out, t.in, u, pool);
    else detail::transform_weights(w, false, t.out, t.in, u, pool);
    if (kept) *frozen.made_from = w.data;
  }
  if (few) detail::few_tiles_convolution(t, x, u, y, pool, workers, s.per_worker, epilogue);
  else detail::tiled_convolution(t, x, u, y, pool, workers, s.per_worker, epilogue);
}

/// dx = conv2d_input_grad(gy, w) [N, C, H, W]: the adjoint of the forward's F(4x4, 5x5) tiling.
template <class Epilogue>
void conv2d_input_grad(const window& win, const strided<float>& gy, const strided<float>& w, const strided<float>& dx,
                       thread_pool& pool, std::span<std::byte> ws, Epilogue&& epilogue) {
  cpu::detail::require_contiguous(dx, "conv2d_input_grad");
  const auto g = cpu::detail::conv_geometry_of(win, dx.shape, w.shape, gy.shape);
  detail::require_workspace(spatial_op::conv2d_input_grad, ws.size(),
                            workspace_bytes<float>(spatial_op::conv2d_input_grad, g, pool.size()));
  const sizes s = sizes_of<float>(spatial_op::conv2d_input_grad, g);
  std::byte* base = detail::align64(ws);
  float* u = reinterpret_cast<float*>(base);
  detail::transform_weights(w, true, g.c, g.o, u, pool);
  detail::transposed_convolution(g, gy, u, dx, pool, base + s.shared, s.per_worker, epilogue);
}

/// dw = conv2d_weight_grad(gy, x) [O, C, 5, 5] by F(5x5, 4x4), summed over the batch in a
/// fixed order (weight_grad_chunks chunks of images, then the chunks in order).
template <class Epilogue>
void conv2d_weight_grad(const window& win, const strided<float>& gy, const strided<float>& x, const strided<float>& dw,
                        thread_pool& pool, std::span<std::byte> ws, Epilogue&& epilogue) {
  constexpr std::size_t NR = cpu::detail::conv_nr<float>, MR = cpu::detail::conv_mr<float>;
  using cpu::detail::round64;
  cpu::detail::require_contiguous(dw, "conv2d_weight_grad");
  const auto g = cpu::detail::conv_geometry_of(win, x.shape, dw.shape, gy.shape);
  detail::require_workspace(spatial_op::conv2d_weight_grad, ws.size(),
                            workspace_bytes<float>(spatial_op::conv2d_weight_grad, g, pool.size()));
  const sizes s = sizes_of<float>(spatial_op::conv2d_weight_grad, g);
  std::byte* base = detail::align64(ws);
  float* partials = reinterpret_cast<float*>(base);
  const std::size_t part_stride = round64(points * g.o * g.c * sizeof(float)) / sizeof(float);
  const std::size_t chunks = cpu::detail::weight_grad_chunks(g.n);
  const std::size_t tw_n = (g.ow + m - 1) / m, tp = (g.oh + m - 1) / m * tw_n, k_img = images_per_group(tp);
  const std::size_t kg_max = k_img * tp, c_panels = (g.c + NR - 1) / NR;
  const std::size_t a_stride = cpu::detail::packed_a_elems<float>(g.o, kg_max);
  pool.parallel_for(chunks, [&](std::size_t ch, unsigned worker) {
    std::byte* at = base + s.shared + worker * s.per_worker;
    float* a_pack = reinterpret_cast<float*>(at);  // [64] packed A [O, kg]
    at += round64(points * a_stride * sizeof(float));
    float* b_pan = reinterpret_cast<float*>(at);  // [64][c_panels][kg][NR]
    at += round64(points * kg_max * c_panels * NR * sizeof(float));
    float* tile = reinterpret_cast<float*>(at);
    float* tmp = reinterpret_cast<float*>(at + round64(points * NR * sizeof(float)));
    float* part = partials + ch * part_stride;  // [64][O][C]
    const std::size_t n0 = ch * g.n / chunks, n1 = (ch + 1) * g.n / chunks;
    bool first = true;
    for (std::size_t gn = n0; gn < n1; gn += k_img) {
      const std::size_t images = std::min(k_img, n1 - gn), kg = images * tp;
      const std::size_t b_stride = c_panels * kg * NR;  // a point's panels
      // Tile k of the group: image n, its corner in gy (oh0, ow0) and in x (ih0, iw0).
      // A: gy's 4x4 tiles through G', NR output channels side by side, into the packed A
      // [O, kg] of each point (runs of MR channels are contiguous there).
      // B: x's 8x8 tiles through Bᵀ, NR input channels side by side, straight into the [kg, NR]
      // panels of each point.
      for (std::size_t k = 0; k < kg; ++k) {
        const std::size_t n = gn + k / tp, oh0 = k % tp / tw_n * m, ow0 = k % tp % tw_n * m;
        // Every lane (channel) has the same corners.
        std::ptrdiff_t gh0[NR], gw0[NR], ih0s[NR], iw0s[NR];
        std::fill(gh0, gh0 + NR, static_cast<std::ptrdiff_t>(oh0));
        std::fill(gw0, gw0 + NR, static_cast<std::ptrdiff_t>(ow0));
        std::fill(ih0s, ih0s + NR, static_cast<std::ptrdiff_t>(oh0) - g.ph);
        std::fill(iw0s, iw0s + NR, static_cast<std::ptrdiff_t>(ow0) - g.pw);
        const float* base[NR];
        for (std::size_t o0 = 0; o0 < g.o; o0 += NR) {
          const std::size_t cnt = std::min(NR, g.o - o0);
          for (std::size_t j = 0; j < cnt; ++j)
            base[j] = gy.data + static_cast<std::ptrdiff_t>(n) * gy.stride[0] + static_cast<std::ptrdiff_t>(o0 + j) * gy.stride[1];
          detail::gather_tiles<NR, m>(gy.stride[2], gy.stride[3], g.oh, g.ow, gh0, gw0, base, cnt, tile);
          const std::ptrdiff_t lane = static_cast<std::ptrdiff_t>(NR), row = static_cast<std::ptrdiff_t>(m * NR);
          for (std::size_t b = 0; b < m; ++b) kernel_1d<NR, m>(tile + b * NR, row, tmp + b * NR, row);  // tmp[ξ][b]
          float* u8 = tile;  // [64][NR]: tile's first pass is read
          for (std::size_t xi = 0; xi < alpha; ++xi) kernel_1d<NR, m>(tmp + xi * m * NR, lane, u8 + xi * alpha * NR, lane);
          for (std::size_t p = 0; p < points; ++p)
            for (std::size_t o = o0; o < o0 + cnt;) {  // (row o, column k) of the packed A
              const std::size_t rr = o % MR, len = std::min(MR - rr, o0 + cnt - o);
              std::copy(u8 + p * NR + (o - o0), u8 + p * NR + (o - o0) + len, a_pack + p * a_stride + o / MR * kg * MR + k * MR + rr);
              o += len;
            }
        }
        for (std::size_t c0 = 0; c0 < g.c; c0 += NR) {
          const std::size_t cnt = std::min(NR, g.c - c0);
          for (std::size_t j = 0; j < cnt; ++j)
            base[j] = x.data + static_cast<std::ptrdiff_t>(n) * x.stride[0] + static_cast<std::ptrdiff_t>(c0 + j) * x.stride[1];
          detail::gather_tiles<NR>(x.stride[2], x.stride[3], g.h, g.w, ih0s, iw0s, base, cnt, tile);
          detail::transform_input<NR>(tile, tmp, b_pan + c0 / NR * kg * NR + k * NR, static_cast<std::ptrdiff_t>(b_stride));
        }
      }
      // The 64 products, continuing the chunk's chains.
      for (std::size_t p = 0; p < points; ++p)
        for (std::size_t cp = 0; cp < c_panels; ++cp)
          cpu::detail::packed_product(g.o, kg, std::min(NR, g.c - cp * NR), a_pack + p * a_stride,
                                      b_pan + p * b_stride + cp * kg * NR, part + p * g.o * g.c + cp * NR,
                                      static_cast<std::ptrdiff_t>(g.c), !first);
      first = false;
    }
  });
  // The chunks in order (into chunk 0's partial), then A'ᵀ M A' (8x8 -> 5x5), a task per
  // output channel, NR channels side by side.
  pool.parallel_for(g.o, [&](std::size_t o, unsigned) {
    for (std::size_t p = 0; p < points; ++p) {
      float* sum = partials + p * g.o * g.c + o * g.c;
      for (std::size_t ch = 1; ch < chunks; ++ch) {
        const float* add = partials + ch * part_stride + p * g.o * g.c + o * g.c;
        for (std::size_t c = 0; c < g.c; ++c) sum[c] += add[c];
      }
    }
    float t1[r * alpha * NR], res[r * r * NR];
    const std::ptrdiff_t point = static_cast<std::ptrdiff_t>(g.o * g.c), lane = static_cast<std::ptrdiff_t>(NR);
    for (std::size_t c0 = 0; c0 < g.c; c0 += NR) {
      const std::size_t cnt = std::min(NR, g.c - c0);
      const float* mo = partials + o * g.c + c0;
      if (cnt == NR) {
        for (std::size_t nu = 0; nu < alpha; ++nu)  // along ξ: t1[u][ν]
          output_1d<NR, r>(mo + static_cast<std::ptrdiff_t>(nu) * point, alpha * point, t1 + nu * NR, alpha * lane);
        for (std::size_t u = 0; u < r; ++u)  // along ν: res[u][v]
          output_1d<NR, r>(t1 + u * alpha * NR, lane, res + u * r * NR, lane);
      } else {
        for (std::size_t j = 0; j < cnt; ++j) {
          for (std::size_t nu = 0; nu < alpha; ++nu)
            output_1d<1, r>(mo + j + static_cast<std::ptrdiff_t>(nu) * point, alpha * point, t1 + nu * NR + j, alpha * lane);
          for (std::size_t u = 0; u < r; ++u) output_1d<1, r>(t1 + u * alpha * NR + j, lane, res + u * r * NR + j, lane);
        }
      }
      for (std::size_t j = 0; j < cnt; ++j) {
        float* dst = dw.data + (o * g.c + c0 + j) * r * r;
        for (std::size_t q = 0; q < r * r; ++q) dst[q] = res[q * NR + j];
      }
    }
    epilogue_rows(epilogue, o * g.c * r, g.c * r, r);
  });
}

}  // namespace winograd
}  // namespace fusebox::cpu
