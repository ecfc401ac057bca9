// backend/cpu/max_pool_2x2.hpp: max pooling with a 2x2 window at stride 2 and no padding, a plane at a
// time, with explicit SIMD (backend/cpu/pool.hpp calls it; T2's two poolings are this case). A plane is
// done in column ranges, 8 lanes, then 4, then scalar, each over all rows: T2's rows are short (12
// and 4 outputs), and a call per row cost as much as the row's work.
//
// Why its own kernels: the general row passes (backend/cpu/pool.hpp) read x at stride 2, which compilers
// turn into gathers or scalar code; written as plain loops over pairs, GCC kept them scalar or
// branchy, and random activations mispredict the branches. Here a row pair is read with
// contiguous loads; a window's two columns meet in one register through a lane swizzle.
//
// The semantics are backend/cpu/pool.hpp's exactly, bit for bit: the first maximum in row-major order
// wins, a NaN replaces the running maximum (`c > m || c != c`; on batches xsimd::isnan, since
// xsimd's `!=` is an ordered comparison, false for NaN). That selection is associative
// when its operands stay in order, so a window is reduced as (x00 . x01) . (x10 . x11): each row's
// pair first, then the two rows, the same element as the left-to-right loop picks.
//
// The backward writes every element of the two dx rows under the window row once (windows do
// not overlap at stride 2), the gradient where the window's winner is and zero elsewhere; so
// nothing needs zeroing first except rows and columns no window reaches (odd sizes).
//
// Only x86 targets with SSE2 or AVX2 take the vector loops (xsimd's swizzle for those arches was
// checked here); elsewhere, and for the tail of a row, a scalar loop with the same selection runs.
// AVX-512's 16 lanes are not used: T2's rows have 12 and 4 outputs.
// Depends on: xsimd.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <fusebox/backend/cpu/vector_isa.hpp>

#if XSIMD_WITH_SSE2
#define FUSEBOX_MAX_POOL_2X2_SIMD 1
#else
#define FUSEBOX_MAX_POOL_2X2_SIMD 0
#endif

namespace fusebox::cpu {
namespace detail {

/// The pooling's selection: c replaces m when larger, or when NaN.
template <class T>
inline bool max_pool_takes(T m, T c) {
  return c > m || c != c;
}

#if FUSEBOX_MAX_POOL_2X2_SIMD

// Lane patterns, as xsimd generators (get(lane, lanes)).
struct swap_pair_lanes {  // each lane reads its pair partner: 1 0 3 2 ...
  static constexpr unsigned get(unsigned i, unsigned) { return i ^ 1u; }
};
struct even_lane_of_pair {  // both lanes of a pair read the pair's even lane: 0 0 2 2 ...
  static constexpr unsigned get(unsigned i, unsigned) { return i & ~1u; }
};
struct even_lanes_first {  // the even lanes packed into the low half (and again the high half)
  static constexpr unsigned get(unsigned i, unsigned n) { return (2 * i) % n; }
};
struct low_half_lanes {
  static constexpr bool get(unsigned i, unsigned n) { return i < n / 2; }
};
struct odd_lanes {
  static constexpr bool get(unsigned i, unsigned) { return (i & 1u) != 0; }
};
struct spread_low_half {  // lane i reads i / 2: each of the low half's values twice
  static constexpr unsigned get(unsigned i, unsigned) { return i / 2; }
};
struct spread_high_half {
  static constexpr unsigned get(unsigned i, unsigned n) { return n / 2 + i / 2; }
};

template <class T, class A>
using max_pool_lane_index = xsimd::batch<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>, A>;

/// Columns [j0, j1) of every output row of a plane, j1 - j0 a multiple of the lane count: output
/// row i reads x rows 2i and 2i + 1 (x_row apart in x), and is y + i * ow.
template <class A, class T>
void max_pool_2x2_simd(const T* x, std::ptrdiff_t x_row, std::size_t oh, std::size_t ow, std::size_t j0, std::size_t j1,
                       T* y) {
  using V = xsimd::batch<T, A>;
  using I = max_pool_lane_index<T, A>;
  constexpr std::size_t N = V::size;
  constexpr auto swap = xsimd::make_batch_constant<I, swap_pair_lanes>();
  constexpr auto evens = xsimd::make_batch_constant<I, even_lanes_first>();
  constexpr auto low = xsimd::make_batch_bool_constant<V, low_half_lanes>();
  const auto pick = [](V m, V c) { return xsimd::select((c > m) || xsimd::isnan(c), c, m); };
  for (std::size_t i = 0; i < oh; ++i) {
    const T* a = x + static_cast<std::ptrdiff_t>(2 * i) * x_row;
    const T* b = a + x_row;
    for (std::size_t j = j0; j < j1; j += N) {
      const V a0 = V::load_unaligned(a + 2 * j), a1 = V::load_unaligned(a + 2 * j + N);
      const V b0 = V::load_unaligned(b + 2 * j), b1 = V::load_unaligned(b + 2 * j + N);
      // Each window's maximum lands in its pair's even lane: row a's pair, then row b's.
      const V r0 = pick(pick(a0, xsimd::swizzle(a0, swap)), pick(b0, xsimd::swizzle(b0, swap)));
      const V r1 = pick(pick(a1, xsimd::swizzle(a1, swap)), pick(b1, xsimd::swizzle(b1, swap)));
      xsimd::select(low, xsimd::swizzle(r0, evens), xsimd::swizzle(r1, evens)).store_unaligned(y + i * ow + j);
    }
  }
}

/// The backward of columns [j0, j1) (as above) of a plane: dx rows 2i and 2i + 1 (dx_row apart,
/// from dx) under output row i, whose gradient row is g + i * g_row.
template <class A, class T>
void max_pool_2x2_backward_simd(const T* x, std::ptrdiff_t x_row, const T* g, std::ptrdiff_t g_row, std::size_t oh,
                                std::size_t j0, std::size_t j1, T* dx, std::ptrdiff_t dx_row) {
  using V = xsimd::batch<T, A>;
  using I = max_pool_lane_index<T, A>;
  constexpr std::size_t N = V::size;
  constexpr auto swap = xsimd::make_batch_constant<I, swap_pair_lanes>();
  constexpr auto pair_even = xsimd::make_batch_constant<I, even_lane_of_pair>();
  constexpr auto spread_low = xsimd::make_batch_constant<I, spread_low_half>();
  constexpr auto spread_high = xsimd::make_batch_constant<I, spread_high_half>();
  constexpr auto odd = xsimd::make_batch_bool_constant<V, odd_lanes>();
  const V zero(T(0)), one(T(1)), two(T(2)), three(T(3));
  // The window element each dx lane is: 0 and 1 alternate along a's row, 2 and 3 along b's.
  const V lane_in_a = xsimd::select(odd, one, zero), lane_in_b = xsimd::select(odd, three, two);
  for (std::size_t i = 0; i < oh; ++i) {
    const T* a = x + static_cast<std::ptrdiff_t>(2 * i) * x_row;
    const T* b = a + x_row;
    T* da = dx + static_cast<std::ptrdiff_t>(2 * i) * dx_row;
    T* db = da + dx_row;
    for (std::size_t j = j0; j < j1; j += N) {
      const V gv = V::load_unaligned(g + static_cast<std::ptrdiff_t>(i) * g_row + static_cast<std::ptrdiff_t>(j));
      const V spread[2] = {xsimd::swizzle(gv, spread_low), xsimd::swizzle(gv, spread_high)};
      for (std::size_t half = 0; half < 2; ++half) {
        const std::size_t at = 2 * j + half * N;
        const V av = V::load_unaligned(a + at), bv = V::load_unaligned(b + at);
        const V as = xsimd::swizzle(av, swap), bs = xsimd::swizzle(bv, swap);
        const auto take_a = (as > av) || xsimd::isnan(as), take_b = (bs > bv) || xsimd::isnan(bs);
        const V ha = xsimd::select(take_a, as, av), hb = xsimd::select(take_b, bs, bv);
        const auto take_row_b = (hb > ha) || xsimd::isnan(hb);
        // The winner (0..3, row-major) in each pair's even lane, then copied to its odd lane.
        const V winner =
            xsimd::select(take_row_b, xsimd::select(take_b, three, two), xsimd::select(take_a, one, zero));
        const V both = xsimd::swizzle(winner, pair_even);
        xsimd::select(both == lane_in_a, spread[half], zero).store_unaligned(da + at);
        xsimd::select(both == lane_in_b, spread[half], zero).store_unaligned(db + at);
      }
    }
  }
}

/// Runs kernel(arch, j0, j1) over the widest column range [j0, j1) whole vectors of arch cover,
/// widest arch first; returns the columns done.
template <class T, class Kernel>
std::size_t max_pool_2x2_over_arches(std::size_t ow, Kernel&& kernel) {
  std::size_t j = 0;
  const auto run = [&](auto arch) {
    constexpr std::size_t lanes = xsimd::batch<T, decltype(arch)>::size;
    const std::size_t end = j + (ow - j) / lanes * lanes;
    if (end > j) kernel(arch, j, end);
    j = end;
  };
#if XSIMD_WITH_AVX2
  run(xsimd::avx2{});
#endif
  run(xsimd::sse2{});
  return j;
}
#endif

}  // namespace detail

/// A plane of max_pool2d (2x2, stride 2): output row i (y + i * ow, ow long) reads x rows 2i and
/// 2i + 1 (x_row apart), columns [0, 2 ow).
template <class T>
void max_pool_2x2_plane(const T* x, std::ptrdiff_t x_row, std::size_t oh, std::size_t ow, T* y) {
  std::size_t j = 0;
#if FUSEBOX_MAX_POOL_2X2_SIMD
  j = detail::max_pool_2x2_over_arches<T>(ow, [&](auto arch, std::size_t j0, std::size_t j1) {
    detail::max_pool_2x2_simd<decltype(arch)>(x, x_row, oh, ow, j0, j1, y);
  });
#endif
  for (std::size_t i = 0; i < oh && j < ow; ++i) {
    const T* a = x + static_cast<std::ptrdiff_t>(2 * i) * x_row;
    const T* b = a + x_row;
    for (std::size_t c = j; c < ow; ++c) {
      T m = a[2 * c];
      if (detail::max_pool_takes(m, a[2 * c + 1])) m = a[2 * c + 1];
      T r = b[2 * c];
      if (detail::max_pool_takes(r, b[2 * c + 1])) r = b[2 * c + 1];
      y[i * ow + c] = detail::max_pool_takes(m, r) ? r : m;
    }
  }
}

/// The backward of max_pool_2x2_plane: dx rows 2i and 2i + 1 (dx_row apart), columns [0, 2 ow),
/// get g's row i (g + i * g_row, contiguous) at each window's winner and zero elsewhere.
template <class T>
void max_pool_2x2_backward_plane(const T* x, std::ptrdiff_t x_row, const T* g, std::ptrdiff_t g_row, std::size_t oh,
                                 std::size_t ow, T* dx, std::ptrdiff_t dx_row) {
  std::size_t j = 0;
#if FUSEBOX_MAX_POOL_2X2_SIMD
  j = detail::max_pool_2x2_over_arches<T>(ow, [&](auto arch, std::size_t j0, std::size_t j1) {
    detail::max_pool_2x2_backward_simd<decltype(arch)>(x, x_row, g, g_row, oh, j0, j1, dx, dx_row);
  });
#endif
  for (std::size_t i = 0; i < oh && j < ow; ++i) {
    const T* a = x + static_cast<std::ptrdiff_t>(2 * i) * x_row;
    const T* b = a + x_row;
    const T* gi = g + static_cast<std::ptrdiff_t>(i) * g_row;
    T* da = dx + static_cast<std::ptrdiff_t>(2 * i) * dx_row;
    T* db = da + dx_row;
    for (std::size_t c = j; c < ow; ++c) {
      const bool take_a = detail::max_pool_takes(a[2 * c], a[2 * c + 1]);
      const bool take_b = detail::max_pool_takes(b[2 * c], b[2 * c + 1]);
      const T ha = take_a ? a[2 * c + 1] : a[2 * c], hb = take_b ? b[2 * c + 1] : b[2 * c];
      const int winner = detail::max_pool_takes(ha, hb) ? (take_b ? 3 : 2) : (take_a ? 1 : 0);
      da[2 * c] = winner == 0 ? gi[c] : T(0);
      da[2 * c + 1] = winner == 1 ? gi[c] : T(0);
      db[2 * c] = winner == 2 ? gi[c] : T(0);
      db[2 * c + 1] = winner == 3 ? gi[c] : T(0);
    }
  }
}

}  // namespace fusebox::cpu
