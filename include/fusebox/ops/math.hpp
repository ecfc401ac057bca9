// ops/math.hpp: small generic helpers so one op body serves float, double and xsimd batches.
// Depends on: xsimd, backend/cpu/simd.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "fusebox/backend/cpu/simd.hpp"

namespace fusebox::ops::math {

/// a where the mask is non-zero, NaN included (C's `c != 0` is true for NaN; xsimd's batch `!=` is
/// an ordered compare, false for NaN, so the batch form tests `== 0` and swaps the arms).
template <class V>
inline V select(const V& mask_nonzero, const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::select(mask_nonzero == V(0), b, a);
  else return mask_nonzero != V(0) ? a : b;
}

/// 1 where the comparison holds, else 0, in the operand type (masks are plain numbers in fusebox).
/// IEEE 754: every comparison with a NaN is false except `!=`, which is true (unordered).
#define FUSEBOX_DEFINE_COMPARE(fn, op)                                             \
  template <class V>                                                               \
  inline V fn(const V& a, const V& b) {                                            \
    if constexpr (cpu::is_batch_v<V>) return xsimd::select(a op b, V(1), V(0));    \
    else return a op b ? V(1) : V(0);                                              \
  }
FUSEBOX_DEFINE_COMPARE(eq, ==)
FUSEBOX_DEFINE_COMPARE(lt, <)
FUSEBOX_DEFINE_COMPARE(le, <=)
FUSEBOX_DEFINE_COMPARE(gt, >)
FUSEBOX_DEFINE_COMPARE(ge, >=)
#undef FUSEBOX_DEFINE_COMPARE
/// Not `a != b` on batches: xsimd's `!=` is _CMP_NEQ_OQ (ordered: false for NaN); not-equal is the
/// complement of the ordered `==`, which C's scalar `!=` is.
template <class V>
inline V ne(const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::select(a == b, V(0), V(1));
  else return a != b ? V(1) : V(0);
}

/// maximum / minimum as torch.maximum / torch.minimum: a NaN in either operand gives NaN (b's NaN
/// when both are); otherwise ties, +0 against -0 included, give a. The NaN test is on b only: the
/// compare-and-select already keeps a NaN in a. In a reduction's combine(acc, x) that test reads x,
/// off the accumulator's dependency chain, so the chain is as long as before (compare, blend).
template <class V>
inline V maximum(const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::select(xsimd::isnan(b), b, xsimd::select(a < b, b, a));
  else return b != b ? b : (a < b ? b : a);
}
template <class V>
inline V minimum(const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::select(xsimd::isnan(b), b, xsimd::select(b < a, b, a));
  else return b != b ? b : (b < a ? b : a);
}
/// -a with the sign bit flipped, as IEEE negation and C's unary minus: -(+0) = -0. (xsimd's batch
/// negation is 0 - a on AVX-512, which gives +0 for +0.)
template <class V>
inline V neg(const V& a) {
  if constexpr (cpu::is_batch_v<V>) {
    using T = typename cpu::element_type<V>::type;
    return xsimd::bitwise_xor(a, V(T(-0.0)));
  } else {
    return -a;
  }
}
template <class V>
inline V abs(const V& a) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::abs(a);
  else return std::fabs(a);
}
namespace detail {
/// Whether y is an odd integer. xsimd::is_odd tests (y - 1) / 2, which rounds for |y| >= 2^24
/// (float) and calls some even numbers odd; every float from 2^24 on is even.
template <class V>
inline auto is_odd_integer(const V& y) {
  using T = typename cpu::element_type<V>::type;
  const V big(T(std::numeric_limits<T>::radix) * T(1ull << (std::numeric_limits<T>::digits - 1)));
  return xsimd::abs(y) < big && xsimd::is_flint(y) && !xsimd::is_flint(y * V(T(0.5)));
}
/// pow on a batch: C's pow (C11 F.10.4.4) on every special value; elsewhere exp(b log|a|) with
/// xsimd's exp and log (the kernel xsimd::pow uses), with the sign of a for odd integer b.
template <class V>
inline V pow_batch(const V& a, const V& b) {
  using T = typename cpu::element_type<V>::type;
  const V zero(T(0)), one(T(1)), inf(std::numeric_limits<T>::infinity());
  const V ax = xsimd::abs(a), ab = xsimd::abs(b);
  const auto odd = is_odd_integer(b);
  V mag = xsimd::exp(b * xsimd::log(ax));
  mag = xsimd::select(ax == zero, xsimd::select(b < zero, inf, zero), mag);
  mag = xsimd::select(ax == inf, xsimd::select(b < zero, zero, inf), mag);
  mag = xsimd::select(ab == inf, xsimd::select(ax == one, one, xsimd::select((ax < one) == (b < zero), inf, zero)), mag);
  V r = xsimd::select(odd && xsimd::copysign(one, a) < zero, neg(mag), mag);
  r = xsimd::select(a < zero && ax != inf && ab != inf && !xsimd::is_flint(b), V(std::numeric_limits<T>::quiet_NaN()), r);
  r = xsimd::select(xsimd::isnan(a) || xsimd::isnan(b), a + b, r);
  r = xsimd::select(b == one, a, r);  // exact (exp(log x) rounds: pow(FLT_MAX, 1) would overflow)
  return xsimd::select(b == zero || a == one, one, r);
}
}  // namespace detail

/// C's pow on every special value (pow(x, 0) = 1 and pow(1, y) = 1 even for NaN, pow(+-0, y < 0) =
/// +-inf, pow(-inf, 0.5) = +inf, ...). A scalar runs the batch kernel on one broadcast lane, so a
/// SIMD lane and the scalar tail give the same bits.
template <class V>
inline V pow(const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) {
    return detail::pow_batch(a, b);
  } else {
    using B = xsimd::batch<V>;
    return detail::pow_batch(B(a), B(b)).get(0);
  }
}

}  // namespace fusebox::ops::math
