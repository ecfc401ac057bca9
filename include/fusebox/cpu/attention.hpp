// cpu/attention.hpp: attention() on the host (ops/attention.hpp). One task per (batch, head,
// query row): an online softmax over the keys (running maximum and sum; the accumulated output
// is rescaled when the maximum grows), so the scores are never stored and each key costs one
// dot product, one exp and one axpy. Operands are read through their strides (q, k, v may be
// views of a wider projection); the output is written through its strides.
// Depends on: core/tensor.hpp, cpu/thread_pool.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "fusebox/core/tensor.hpp"
#include "fusebox/cpu/thread_pool.hpp"

namespace fusebox::cpu {

/// o = softmax(q·kᵀ / sqrt(E), causal) · v for [B, T, H, E] operands (see ops/attention.hpp).
/// Accumulates in double for double, else in float.
template <class T>
void attention(const strided<T>& q, const strided<T>& k, const strided<T>& v, const strided<T>& o, bool causal,
               thread_pool& pool) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const std::size_t B = q.shape[0], Tq = q.shape[1], H = q.shape[2], E = q.shape[3];
  const std::size_t Tk = k.shape[1], Ev = v.shape[3];
  const A scale = static_cast<A>(1.0 / std::sqrt(static_cast<double>(E)));
  constexpr std::size_t stack_width = 256;  // accumulators on the stack up to this head dim
  auto at = [](const strided<T>& x, std::size_t b, std::size_t t, std::size_t h) {
    return x.data + static_cast<std::ptrdiff_t>(b) * x.stride[0] + static_cast<std::ptrdiff_t>(t) * x.stride[1] +
           static_cast<std::ptrdiff_t>(h) * x.stride[2];
  };
  pool.parallel_for(B * H * Tq, [&](std::size_t task, unsigned) {
    const std::size_t i = task % Tq, h = task / Tq % H, b = task / (Tq * H);
    A stack_acc[stack_width];
    std::vector<A> heap_acc(Ev > stack_width ? Ev : 0);
    A* acc = Ev > stack_width ? heap_acc.data() : stack_acc;
    std::fill(acc, acc + Ev, A{0});
    const T* qi = at(q, b, i, h);
    const std::ptrdiff_t qs = q.stride[3], ks = k.stride[3], vs = v.stride[3];
    A m = -INFINITY, l = 0;
    const std::size_t keys = causal ? std::min(i + 1, Tk) : Tk;
    for (std::size_t j = 0; j < keys; ++j) {
      const T* kj = at(k, b, j, h);
      A s = 0;
      for (std::size_t e = 0; e < E; ++e)
        s += static_cast<A>(qi[static_cast<std::ptrdiff_t>(e) * qs]) * static_cast<A>(kj[static_cast<std::ptrdiff_t>(e) * ks]);
      s *= scale;
      if (s > m) {  // a new maximum: rescale what is accumulated
        const A r = std::exp(m - s);
        l *= r;
        for (std::size_t e = 0; e < Ev; ++e) acc[e] *= r;
        m = s;
      }
      const A p = std::exp(s - m);
      l += p;
      const T* vj = at(v, b, j, h);
      for (std::size_t e = 0; e < Ev; ++e) acc[e] += p * static_cast<A>(vj[static_cast<std::ptrdiff_t>(e) * vs]);
    }
    T* oi = const_cast<T*>(at(o, b, i, h));
    const A inv = l > 0 ? A{1} / l : A{0};
    for (std::size_t e = 0; e < Ev; ++e) oi[static_cast<std::ptrdiff_t>(e) * o.stride[3]] = static_cast<T>(acc[e] * inv);
  });
}

}  // namespace fusebox::cpu
