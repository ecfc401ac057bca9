// dtype.hpp: the element types fusebox computes in, as a value the IR and the reports can carry.
// Depends on: the standard library only.
#pragma once

#include <cstdint>
#include <type_traits>

namespace fusebox {

/// bf16 and f16 are storage types of the CUDA backend (computed in float there).
enum class dtype : std::uint8_t { f32, f64, boolean, bf16, f16 };

template <class T>
inline constexpr bool is_element_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
constexpr dtype dtype_of() {
  static_assert(is_element_v<T>, "fusebox: tensors hold float or double");
  return std::is_same_v<T, float> ? dtype::f32 : dtype::f64;
}

constexpr const char* name(dtype t) {
  switch (t) {
    case dtype::f32: return "float32";
    case dtype::f64: return "float64";
    case dtype::boolean: return "bool";
    case dtype::bf16: return "bfloat16";
    case dtype::f16: return "float16";
  }
  return "?";
}

constexpr std::size_t size_of(dtype t) {
  return t == dtype::f64 ? 8 : t == dtype::bf16 || t == dtype::f16 ? 2 : 4;
}

}  // namespace fusebox
