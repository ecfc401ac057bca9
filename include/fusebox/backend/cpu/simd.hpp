// backend/cpu/simd.hpp: the handful of vector operations the kernels use, over xsimd batches or scalars.
// Kernels are written once for a value type V that is either T (scalar tails, strided fallbacks)
// or xsimd::batch<T> (the vector body); these helpers give both the same spelling.
// Depends on: xsimd.
#pragma once

#include <cstddef>
#include <cstdint>
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

/// store_v bypassing the caches: a non-temporal store where the ISA has one for T (x86: float and
/// double at every vector width) and p is aligned to the vector, an ordinary store otherwise (a
/// scalar tail, an unaligned start, NEON, whose non-temporal pair store GCC does not expose). An
/// output larger than the last-level cache (schedule::streams_output) would be evicted before it
/// is read again; written this way it is not first read into the cache (the read-for-ownership
/// that makes a written byte cost two bytes of memory traffic). Visible to other threads after
/// stream_fence().
template <class V, class T>
inline void store_stream_v(T* p, const V& v) {
  if constexpr (is_batch_v<V> && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
    if (reinterpret_cast<std::uintptr_t>(p) % sizeof(V) == 0) {
#if defined(__AVX512F__)
      if constexpr (sizeof(V) == 64) {
        if constexpr (std::is_same_v<T, float>) _mm512_stream_ps(p, v);
        else _mm512_stream_pd(p, v);
        return;
      }
#endif
#if defined(__AVX__)
      if constexpr (sizeof(V) == 32) {
        if constexpr (std::is_same_v<T, float>) _mm256_stream_ps(p, v);
        else _mm256_stream_pd(p, v);
        return;
      }
#endif
#if defined(__SSE2__)
      if constexpr (sizeof(V) == 16) {
        if constexpr (std::is_same_v<T, float>) _mm_stream_ps(p, v);
        else _mm_stream_pd(p, v);
        return;
      }
#endif
    }
  }
  store_v(p, v);
}

/// A rows kernel's output store: store_stream_v where the kernel streams its outputs, store_v
/// otherwise (one spelling for the static executor and the generated kernels).
template <class V, class T>
inline void store_out_v(bool stream, T* p, const V& v) {
  if (stream) store_stream_v(p, v);
  else store_v(p, v);
}

/// Orders this thread's store_stream_v stores before its later stores (x86 `sfence`: non-temporal
/// stores are weakly ordered), so that a thread that sees the task finished sees its data.
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace fusebox::cpu
