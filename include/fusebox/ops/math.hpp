// ops/math.hpp: small generic helpers so one op body serves float, double and xsimd batches.
// Depends on: xsimd, cpu/simd.hpp.
#pragma once

#include <algorithm>
#include <cmath>

#include "fusebox/cpu/simd.hpp"

namespace fusebox::ops::math {

template <class V>
inline V select(const V& mask_nonzero, const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::select(mask_nonzero != V(0), a, b);
  else return mask_nonzero != V(0) ? a : b;
}

/// 1 where the comparison holds, else 0, in the operand type (masks are plain numbers in fusebox).
#define FUSEBOX_DEFINE_COMPARE(fn, op)                                             \
  template <class V>                                                               \
  inline V fn(const V& a, const V& b) {                                            \
    if constexpr (cpu::is_batch_v<V>) return xsimd::select(a op b, V(1), V(0));    \
    else return a op b ? V(1) : V(0);                                              \
  }
FUSEBOX_DEFINE_COMPARE(eq, ==)
FUSEBOX_DEFINE_COMPARE(ne, !=)
FUSEBOX_DEFINE_COMPARE(lt, <)
FUSEBOX_DEFINE_COMPARE(le, <=)
FUSEBOX_DEFINE_COMPARE(gt, >)
FUSEBOX_DEFINE_COMPARE(ge, >=)
#undef FUSEBOX_DEFINE_COMPARE

/// max/min that return the first operand when the other is NaN-free and equal; NaN in a gives a.
template <class V>
inline V maximum(const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::select(a < b, b, a);
  else return a < b ? b : a;
}
template <class V>
inline V minimum(const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::select(b < a, b, a);
  else return b < a ? b : a;
}
template <class V>
inline V abs(const V& a) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::abs(a);
  else return std::fabs(a);
}
template <class V>
inline V pow(const V& a, const V& b) {
  if constexpr (cpu::is_batch_v<V>) return xsimd::pow(a, b);
  else return std::pow(a, b);
}

}  // namespace fusebox::ops::math
