// core/low_precision.hpp: 16-bit storage types of the CUDA backend. `bfloat16` (the top half of a
// float) and `float16` (IEEE half) are plain 2-byte values with round-to-nearest-even conversion
// from float; all arithmetic happens in float. `storage_dtype<T>()` names a storage type's dtype.
// Depends on: core/dtype.hpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fusebox/core/dtype.hpp"

namespace fusebox {

/// bfloat16 storage: the top 16 bits of a float.
struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  /// From float, rounding to nearest even (scalars in a model: `x * 0.5f`).
  explicit bfloat16(float f) : bits(from_float(f).bits) {}
  explicit operator float() const { return to_float(); }
  static bfloat16 from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
      r.bits = static_cast<std::uint16_t>((u >> 16) | 0x40);
      return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    r.bits = static_cast<std::uint16_t>(u >> 16);
    return r;
  }
  float to_float() const {
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

/// IEEE half storage.
struct float16 {
  std::uint16_t bits = 0;
  float16() = default;
  explicit float16(float f) : bits(from_float(f).bits) {}
  explicit operator float() const { return to_float(); }
  static float16 of_bits(std::uint32_t b) {
    float16 h;
    h.bits = static_cast<std::uint16_t>(b);
    return h;
  }
  static float16 from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return of_bits(sign | 0x7e00u);
    if (a >= 0x477ff000u) return of_bits(sign | 0x7c00u);  // overflow: inf
    if (a < 0x38800000u) {  // subnormal or zero: scale into the 10-bit field, round half even
      float mag;
      std::uint32_t au = a;
      std::memcpy(&mag, &au, 4);
      const float scaled = mag * 16777216.0f;  // 2^24: one unit of the smallest subnormal
      std::uint32_t q = static_cast<std::uint32_t>(scaled);
      const float rest = scaled - static_cast<float>(q);
      if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;
      return of_bits(sign | q);
    }
    std::uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return of_bits(sign | (r >> 13));
  }
  float to_float() const {
    const std::uint32_t sign = (bits & 0x8000u) << 16;
    const std::uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
    std::uint32_t u;
    if (e == 0) {
      float f = static_cast<float>(m) / 16777216.0f;
      std::memcpy(&u, &f, 4);
      u |= sign;
    } else if (e == 31) {
      u = sign | 0x7f800000u | (m << 13);
    } else {
      u = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <class T>
constexpr dtype storage_dtype() {
  if constexpr (std::is_same_v<T, bfloat16>) return dtype::bf16;
  else if constexpr (std::is_same_v<T, float16>) return dtype::f16;
  else if constexpr (std::is_same_v<T, double>) return dtype::f64;
  else return dtype::f32;
}

}  // namespace fusebox
