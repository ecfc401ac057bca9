// backend/cpu/simd.hpp: the handful of vector operations the kernels use, over xsimd batches or scalars.
// Kernels are written once for a value type V that is either T (scalar tails, strided fallbacks)
// or xsimd::batch<T> (the vector body); these helpers give both the same spelling.
// Depends on: xsimd.
#pragma once

#include <cstddef>
#include <type_traits>

#include <fusebox/backend/cpu/vector_isa.hpp>

namespace fusebox::cpu {

template <class T>
using vec = xsimd::batch<T>;

template <class V>
inline constexpr bool is_batch_v = false;
template <class T, class A>
inline constexpr bool is_batch_v<xsimd::batch<T, A>> = true;

template <class V>
struct lanes_of : std::integral_constant<std::size_t, 1> {};
template <class T, class A>
struct lanes_of<xsimd::batch<T, A>> : std::integral_constant<std::size_t, xsimd::batch<T, A>::size> {};

/// The scalar type of V (V itself for scalars).
template <class V>
struct element_type {
  using type = V;
};
template <class T, class A>
struct element_type<xsimd::batch<T, A>> {
  using type = T;
};

/// V's worth of elements from p (unit stride).
template <class V, class T>
inline V load_v(const T* p) {
  if constexpr (is_batch_v<V>) return V::load_unaligned(p);
  else return *p;
}

/// V's worth of elements from p with element stride s (gathered lane by lane for batches).
template <class V, class T>
inline V load_strided_v(const T* p, std::ptrdiff_t s) {
  if constexpr (is_batch_v<V>) {
    alignas(64) T tmp[V::size];
    for (std::size_t l = 0; l < V::size; ++l) tmp[l] = p[static_cast<std::ptrdiff_t>(l) * s];
    return V::load_aligned(tmp);
  } else {
    return *p;
  }
}

template <class V, class T>
inline void store_v(T* p, const V& v) {
  if constexpr (is_batch_v<V>) v.store_unaligned(p);
  else *p = v;
}

}  // namespace fusebox::cpu
