// dtype.hpp: the element types fusebox computes in, as a value the IR and the reports can carry.
// Depends on: the standard library only.
#pragma once

#include <cstdint>
#include <type_traits>

namespace fusebox {

enum class dtype : std::uint8_t { f32, f64, boolean };

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
  }
  return "?";
}

constexpr std::size_t size_of(dtype t) { return t == dtype::f64 ? 8 : 4; }

}  // namespace fusebox
