// backend/cpu/attention.hpp: attention() on the host (ops/attention.hpp). One task per (batch, head, block
// of four query rows) where the element is float or double with unit inner strides and head dims
// that are multiples of the vector (attention_rows4: a register-blocked micro-kernel), else per
// query row: the rows' scores into a buffer, their maximum, exp on xsimd vectors, then the value
// rows weighted; nothing larger than four rows of scores is stored. Operands are read through their strides (q, k, v may be
// views of a wider projection); the output is written through its strides.
//
// attention_backward(): the gradients (expr/grad_nodes.hpp), as FlashAttention-2's backward
// computes them, with the softmax recomputed rather than saved: per query row the log-sum-exp
// L_i of the scaled scores and D_i = g_i · o_i, then per (query, key) pair p = exp(s - L_i),
// dp = g_i · v_j, ds = p (dp - D_i), and dq_i += ds k_j, dk_j += ds q_i, dv_j += p g_i (dq, dk
// scaled by 1/sqrt(E)). Part 3 (as many queries as keys, E == Ev) writes [B, T, 3, H, E], a task
// per (batch, head): L and D of its rows first, then each key row against the query rows that see
// it, dq rows accumulated in the task (FlashAttention-2 adds them with atomics across blocks; a
// task owning its (batch, head) needs none, and the sums do not depend on the thread count).
// Otherwise part 1 writes dq, a task per (batch, head, query), each computing its own L_i, and
// part 2 writes dk | dv, a task per (batch, head, key), after a first pass that stores L and D for
// every query row. Scratch (L, D, dq rows) is allocated per call or task.
// Dots and axpys run on xsimd vectors where the element is float or double and the head dimension
// is contiguous (two accumulators, a fixed order), else on scalars.
// Depends on: core/tensor.hpp, backend/cpu/thread_pool.hpp, xsimd.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include <fusebox/backend/cpu/vector_isa.hpp>

#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/tensor.hpp"

namespace fusebox::cpu {

namespace detail {
template <class T>
const T* attention_row(const strided<T>& x, std::size_t b, std::size_t t, std::size_t h) {
  return x.data + static_cast<std::ptrdiff_t>(b) * x.stride[0] + static_cast<std::ptrdiff_t>(t) * x.stride[1] +
         static_cast<std::ptrdiff_t>(h) * x.stride[2];
}
template <class A, class T>
A attention_dot(const T* a, std::ptrdiff_t as, const T* b, std::ptrdiff_t bs, std::size_t n) {
  if constexpr (std::is_same_v<A, T> && xsimd::has_simd_register<T>::value) {
    if (as == 1 && bs == 1) {  // two vector accumulators, a fixed order: results do not depend on threads
      using V = xsimd::batch<T>;
      constexpr std::size_t w = V::size;
      V s0(T(0)), s1(T(0));
      std::size_t e = 0;
      for (; e + 2 * w <= n; e += 2 * w) {
        s0 = xsimd::fma(V::load_unaligned(a + e), V::load_unaligned(b + e), s0);
        s1 = xsimd::fma(V::load_unaligned(a + e + w), V::load_unaligned(b + e + w), s1);
      }
      for (; e + w <= n; e += w) s0 = xsimd::fma(V::load_unaligned(a + e), V::load_unaligned(b + e), s0);
      A s = xsimd::hadd(s0 + s1);
      for (; e < n; ++e) s += a[e] * b[e];
      return s;
    }
  }
  A s = 0;
  for (std::size_t e = 0; e < n; ++e)
    s += static_cast<A>(a[static_cast<std::ptrdiff_t>(e) * as]) * static_cast<A>(b[static_cast<std::ptrdiff_t>(e) * bs]);
  return s;
}
template <class A, class T>
void attention_axpy(A* acc, A p, const T* x, std::ptrdiff_t xs, std::size_t n) {
  if constexpr (std::is_same_v<A, T> && xsimd::has_simd_register<T>::value) {
    if (xs == 1) {
      using V = xsimd::batch<T>;
      constexpr std::size_t w = V::size;
      const V pv(p);
      std::size_t e = 0;
      for (; e + w <= n; e += w) xsimd::fma(pv, V::load_unaligned(x + e), V::load_unaligned(acc + e)).store_unaligned(acc + e);
      for (; e < n; ++e) acc[e] += p * x[e];
      return;
    }
  }
  for (std::size_t e = 0; e < n; ++e) acc[e] += p * static_cast<A>(x[static_cast<std::ptrdiff_t>(e) * xs]);
}
/// x[i] = exp(x[i]) for i < n, on xsimd vectors where A has them (the scores of a block of pairs:
/// one exp per pair, so vectorising it matters as much as the dots).
template <class A>
void attention_exp(A* x, std::size_t n) {
  std::size_t i = 0;
  if constexpr (xsimd::has_simd_register<A>::value) {
    using V = xsimd::batch<A>;
    for (; i + V::size <= n; i += V::size) xsimd::exp(V::load_unaligned(x + i)).store_unaligned(x + i);
  }
  for (; i < n; ++i) x[i] = std::exp(x[i]);
}
/// A per-thread buffer of at least n elements (grown, never shrunk: no allocation per task).
template <class A>
A* attention_buffer(std::size_t n) {
  thread_local std::vector<A> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}
/// Accumulators of n elements: on the stack up to 256, else on the heap.
template <class A>
struct attention_scratch {
  A stack[256];
  std::vector<A> heap;
  A* get(std::size_t n) {
    if (n <= 256) return stack;
    heap.resize(n);
    return heap.data();
  }
};
}  // namespace detail

namespace detail {
inline constexpr std::size_t attention_rows = 4;
/// The forward for query rows [i0, i0 + nr) (nr <= 4) of one (batch, head) on xsimd vectors, in the
/// way of gemm's micro-kernel: the four rows' scores against each key row (a k row loaded once for
/// the four), per row its maximum and exp over the row, then the four output rows a vector of Ev
/// at a time with the accumulators in registers (a v row loaded once for the four). T == A, unit
/// inner strides, E and Ev multiples of the vector size.
template <class T, class QR, class KR, class VR, class OR>
void attention_rows4(QR qrow, KR krow, VR vrow, OR orow, std::size_t i0, std::size_t nr, std::size_t Tk, std::size_t E,
                     std::size_t Ev, T scale, bool causal) {
  using V = xsimd::batch<T>;
  constexpr std::size_t w = V::size, rb = attention_rows;
  const std::size_t last = i0 + nr - 1, keys = causal ? std::min(last + 1, Tk) : Tk;
  thread_local std::vector<T> sbuf;
  if (sbuf.size() < rb * keys) sbuf.resize(rb * keys);
  T* S = sbuf.data();  // [rb][keys]
  const T* qr[rb];
  for (std::size_t r = 0; r < rb; ++r) qr[r] = qrow(i0 + std::min(r, nr - 1));  // past nr: repeats, unused
  for (std::size_t j = 0; j < keys; ++j) {
    const T* kj = krow(j);
    V s[rb];
    for (std::size_t r = 0; r < rb; ++r) s[r] = V(T(0));
    for (std::size_t c = 0; c < E; c += w) {
      const V kv = V::load_unaligned(kj + c);
      for (std::size_t r = 0; r < rb; ++r) s[r] = xsimd::fma(V::load_unaligned(qr[r] + c), kv, s[r]);
    }
    for (std::size_t r = 0; r < rb; ++r)
      S[r * keys + j] = (causal && j > i0 + r) ? T(-INFINITY) : scale * xsimd::hadd(s[r]);
  }
  T inv[rb];
  for (std::size_t r = 0; r < rb; ++r) {
    T* row = S + r * keys;
    T m = T(-INFINITY), l = 0;
    for (std::size_t j = 0; j < keys; ++j) m = std::max(m, row[j]);
    for (std::size_t j = 0; j < keys; ++j) row[j] -= m;
    attention_exp(row, keys);  // masked scores: exp(-inf) = 0
    for (std::size_t j = 0; j < keys; ++j) l += row[j];
    inv[r] = l > 0 ? T(1) / l : T(0);
  }
  for (std::size_t c = 0; c < Ev; c += w) {
    V acc[rb];
    for (std::size_t r = 0; r < rb; ++r) acc[r] = V(T(0));
    for (std::size_t j = 0; j < keys; ++j) {
      const V vv = V::load_unaligned(vrow(j) + c);
      for (std::size_t r = 0; r < rb; ++r) acc[r] = xsimd::fma(V(S[r * keys + j]), vv, acc[r]);
    }
    for (std::size_t r = 0; r < nr; ++r) (acc[r] * V(inv[r])).store_unaligned(orow(i0 + r) + c);
  }
}
}  // namespace detail

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
  if constexpr (std::is_same_v<A, T> && xsimd::has_simd_register<T>::value) {
    constexpr std::size_t w = xsimd::batch<T>::size, rb = detail::attention_rows;
    if (q.stride[3] == 1 && k.stride[3] == 1 && v.stride[3] == 1 && o.stride[3] == 1 && E % w == 0 && Ev % w == 0) {
      const std::size_t blocks = (Tq + rb - 1) / rb;
      pool.parallel_for(B * H * blocks, [&](std::size_t task, unsigned) {
        const std::size_t i0 = task % blocks * rb, h = task / blocks % H, b = task / (blocks * H);
        detail::attention_rows4(
            [&](std::size_t i) { return at(q, b, i, h); }, [&](std::size_t j) { return at(k, b, j, h); },
            [&](std::size_t j) { return at(v, b, j, h); }, [&](std::size_t i) { return const_cast<T*>(at(o, b, i, h)); },
            i0, std::min(rb, Tq - i0), Tk, E, Ev, scale, causal);
      });
      return;
    }
  }
  pool.parallel_for(B * H * Tq, [&](std::size_t task, unsigned) {
    const std::size_t i = task % Tq, h = task / Tq % H, b = task / (Tq * H);
    A stack_acc[stack_width];
    std::vector<A> heap_acc(Ev > stack_width ? Ev : 0);
    A* acc = Ev > stack_width ? heap_acc.data() : stack_acc;
    std::fill(acc, acc + Ev, A{0});
    const T* qi = at(q, b, i, h);
    const std::ptrdiff_t qs = q.stride[3], ks = k.stride[3], vs = v.stride[3];
    // The row's scores, their maximum, exp on vectors, then the weighted sum of the value rows.
    const std::size_t keys = causal ? std::min(i + 1, Tk) : Tk;
    A stack_s[stack_width];
    A* sc = stack_s;
    if (keys > stack_width) sc = detail::attention_buffer<A>(keys);
    A m = -INFINITY;
    for (std::size_t j = 0; j < keys; ++j) {
      sc[j] = scale * detail::attention_dot<A>(qi, qs, at(k, b, j, h), ks, E);
      m = std::max(m, sc[j]);
    }
    for (std::size_t j = 0; j < keys; ++j) sc[j] -= m;
    detail::attention_exp(sc, keys);
    A l = 0;
    for (std::size_t j = 0; j < keys; ++j) {
      l += sc[j];
      detail::attention_axpy(acc, sc[j], at(v, b, j, h), vs, Ev);
    }
    T* oi = const_cast<T*>(at(o, b, i, h));
    const A inv = l > 0 ? A{1} / l : A{0};
    for (std::size_t e = 0; e < Ev; ++e) oi[static_cast<std::ptrdiff_t>(e) * o.stride[3]] = static_cast<T>(acc[e] * inv);
  });
}


namespace detail {
/// Part 3's body for one (batch, head) on xsimd vectors, four key rows at a time (a micro-kernel
/// in the way gemm's is): the scores and dp of the four keys against every query row that sees
/// them (each q and g row loaded once for the four), exp over the block, then dk and dv of the
/// four keys with their accumulators in registers (a vector of the head dimension at a time, each
/// q and g row loaded once for four keys), then dq rows += ds k for the four keys (each dq row
/// loaded and stored once for four). Operands T == A with unit inner stride, E (== Ev) a multiple
/// of the vector size. dq is accumulated unscaled into `dq` [Tq, E]; dk, dv are written scaled.
template <class T, class QR, class KR, class VR, class GR, class DKR, class DVR>
void attention_backward_keys4(QR qrow, KR krow, VR vrow, GR grow, DKR dkrow, DVR dvrow, const T* lse, const T* dd,
                              T* dq, std::size_t Tq, std::size_t Tk, std::size_t E, T scale, bool causal) {
  using V = xsimd::batch<T>;
  constexpr std::size_t w = V::size, jb = 4;
  const std::size_t chunks = E / w;
  thread_local std::vector<T> pbuf, dsbuf;
  if (pbuf.size() < Tq * jb) pbuf.resize(Tq * jb), dsbuf.resize(Tq * jb);
  T *P = pbuf.data(), *DS = dsbuf.data();
  for (std::size_t j0 = 0; j0 < Tk; j0 += jb) {
    const std::size_t nj = std::min(jb, Tk - j0), i0 = causal ? j0 : 0, n = Tq - i0;
    const T* kr[jb];
    const T* vr[jb];
    for (std::size_t jj = 0; jj < jb; ++jj) {  // rows past the end repeat the last one; their p is 0
      kr[jj] = krow(j0 + std::min(jj, nj - 1));
      vr[jj] = vrow(j0 + std::min(jj, nj - 1));
    }
    for (std::size_t i = i0; i < Tq; ++i) {
      const T *qi = qrow(i), *gi = grow(i);
      V s[jb], d[jb];
      for (std::size_t jj = 0; jj < jb; ++jj) s[jj] = d[jj] = V(T(0));
      for (std::size_t c = 0; c < chunks; ++c) {
        const V qv = V::load_unaligned(qi + c * w), gv = V::load_unaligned(gi + c * w);
        for (std::size_t jj = 0; jj < jb; ++jj) {
          s[jj] = xsimd::fma(qv, V::load_unaligned(kr[jj] + c * w), s[jj]);
          d[jj] = xsimd::fma(gv, V::load_unaligned(vr[jj] + c * w), d[jj]);
        }
      }
      for (std::size_t jj = 0; jj < jb; ++jj) {
        const bool live = jj < nj && (!causal || j0 + jj <= i);
        P[(i - i0) * jb + jj] = live ? scale * xsimd::hadd(s[jj]) - lse[i] : -INFINITY;
        DS[(i - i0) * jb + jj] = xsimd::hadd(d[jj]) - dd[i];
      }
    }
    attention_exp(P, n * jb);  // exp(-inf) = 0: masked and padding pairs contribute nothing
    for (std::size_t x = 0; x < n * jb; ++x) DS[x] *= P[x];
    for (std::size_t c = 0; c < chunks; ++c) {  // dk, dv of the four keys, a vector of E at a time
      V ak[jb], av[jb];
      for (std::size_t jj = 0; jj < jb; ++jj) ak[jj] = av[jj] = V(T(0));
      for (std::size_t i = i0; i < Tq; ++i) {
        const V qv = V::load_unaligned(qrow(i) + c * w), gv = V::load_unaligned(grow(i) + c * w);
        const T *ds = DS + (i - i0) * jb, *p = P + (i - i0) * jb;
        for (std::size_t jj = 0; jj < jb; ++jj) {
          ak[jj] = xsimd::fma(V(ds[jj]), qv, ak[jj]);
          av[jj] = xsimd::fma(V(p[jj]), gv, av[jj]);
        }
      }
      for (std::size_t jj = 0; jj < nj; ++jj) {
        (ak[jj] * V(scale)).store_unaligned(dkrow(j0 + jj) + c * w);
        av[jj].store_unaligned(dvrow(j0 + jj) + c * w);
      }
    }
    for (std::size_t c = 0; c < chunks; ++c) {  // dq rows += ds k over the four keys
      V kv[jb];
      for (std::size_t jj = 0; jj < jb; ++jj) kv[jj] = V::load_unaligned(kr[jj] + c * w);
      for (std::size_t i = i0; i < Tq; ++i) {
        T* dqi = dq + i * E + c * w;
        const T* ds = DS + (i - i0) * jb;
        V r = V::load_unaligned(dqi);
        for (std::size_t jj = 0; jj < jb; ++jj) r = xsimd::fma(V(ds[jj]), kv[jj], r);
        r.store_unaligned(dqi);
      }
    }
  }
}
}  // namespace detail

/// Part 1: dq [B, Tq, H, E]; part 2: dk | dv [B, Tk, H, E + Ev]; part 3 (Tq == Tk, E == Ev): dq, dk,
/// dv as [B, T, 3, H, E], of o = attention(q, k, v, causal)
/// at the gradient g (shaped like o). See the header comment.
template <class T>
void attention_backward(const strided<T>& q, const strided<T>& k, const strided<T>& v, const strided<T>& o,
                        const strided<T>& g, const strided<T>& out, int part, bool causal, thread_pool& pool) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  using detail::attention_row;
  const std::size_t B = q.shape[0], Tq = q.shape[1], H = q.shape[2], E = q.shape[3];
  const std::size_t Tk = k.shape[1], Ev = v.shape[3];
  const A scale = static_cast<A>(1.0 / std::sqrt(static_cast<double>(E)));
  const std::ptrdiff_t qs = q.stride[3], ks = k.stride[3], vs = v.stride[3], os = o.stride[3], gs = g.stride[3],
                       outs = out.stride[3];
  auto keys_of = [&](std::size_t i) { return causal ? std::min(i + 1, Tk) : Tk; };
  // L_i (log-sum-exp of the scaled scores) and D_i = g_i · o_i for query row (b, i, h).
  // L_i (log-sum-exp of the scaled scores) and D_i = g_i · o_i for query row (b, i, h); buf holds Tk.
  auto row_stats = [&](std::size_t b, std::size_t i, std::size_t h, A& lse, A& d, A* buf) {
    const T* qi = attention_row(q, b, i, h);
    const std::size_t n = keys_of(i);
    A m = -INFINITY, l = 0;
    for (std::size_t j = 0; j < n; ++j) {
      buf[j] = scale * detail::attention_dot<A>(qi, qs, attention_row(k, b, j, h), ks, E);
      m = std::max(m, buf[j]);
    }
    for (std::size_t j = 0; j < n; ++j) buf[j] -= m;
    detail::attention_exp(buf, n);
    for (std::size_t j = 0; j < n; ++j) l += buf[j];
    lse = m + std::log(l);
    d = detail::attention_dot<A>(attention_row(g, b, i, h), gs, attention_row(o, b, i, h), os, Ev);
  };
  if (part == 3) {  // a task per (batch, head): every pair once; dq rows accumulated in the task
    const std::ptrdiff_t out5 = out.stride[4];  // out is [B, T, 3, H, E]: dq, dk, dv at index 0, 1, 2
    auto grad_row = [&](std::size_t b, std::size_t t, std::size_t which, std::size_t h) {
      return out.data + static_cast<std::ptrdiff_t>(b) * out.stride[0] + static_cast<std::ptrdiff_t>(t) * out.stride[1] +
             static_cast<std::ptrdiff_t>(which) * out.stride[2] + static_cast<std::ptrdiff_t>(h) * out.stride[3];
    };
    bool blocked = false;  // the register-blocked body: A is T, unit inner strides, E a multiple of the vector
    if constexpr (std::is_same_v<A, T> && xsimd::has_simd_register<T>::value)
      blocked = qs == 1 && ks == 1 && vs == 1 && gs == 1 && out5 == 1 && E % xsimd::batch<T>::size == 0;
    pool.parallel_for(B * H, [&](std::size_t task, unsigned) {
      const std::size_t h = task % H, b = task / H;
      if constexpr (std::is_same_v<A, T> && xsimd::has_simd_register<T>::value) {
        if (blocked) {
          std::vector<A> lse(Tq), dd(Tq), buf(std::max(Tq, Tk)), dq(Tq * E, A{0});
          for (std::size_t i = 0; i < Tq; ++i) row_stats(b, i, h, lse[i], dd[i], buf.data());
          detail::attention_backward_keys4(
              [&](std::size_t i) { return attention_row(q, b, i, h); }, [&](std::size_t j) { return attention_row(k, b, j, h); },
              [&](std::size_t j) { return attention_row(v, b, j, h); }, [&](std::size_t i) { return attention_row(g, b, i, h); },
              [&](std::size_t j) { return grad_row(b, j, 1, h); }, [&](std::size_t j) { return grad_row(b, j, 2, h); },
              lse.data(), dd.data(), dq.data(), Tq, Tk, E, scale, causal);
          for (std::size_t i = 0; i < Tq; ++i) {
            T* row = grad_row(b, i, 0, h);
            for (std::size_t e = 0; e < E; ++e) row[e] = scale * dq[i * E + e];
          }
          return;
        }
      }
      // lse, D per query row; p and dp of one key row against every query row; dq rows.
      std::vector<A> lse(Tq), dd(Tq), p(std::max(Tq, Tk)), dp(Tq), dq(Tq * E, A{0});
      for (std::size_t i = 0; i < Tq; ++i) row_stats(b, i, h, lse[i], dd[i], p.data());
      detail::attention_scratch<A> scratch;
      A* acc = scratch.get(E + Ev);  // dk_j then dv_j
      for (std::size_t j = 0; j < Tk; ++j) {
        std::fill(acc, acc + E + Ev, A{0});
        const T *kj = attention_row(k, b, j, h), *vj = attention_row(v, b, j, h);
        const std::size_t i0 = causal ? j : 0, n = Tq - i0;
        for (std::size_t i = i0; i < Tq; ++i) {  // the pairs' scores and dp first, then exp on vectors
          p[i - i0] = scale * detail::attention_dot<A>(attention_row(q, b, i, h), qs, kj, ks, E) - lse[i];
          dp[i - i0] = detail::attention_dot<A>(attention_row(g, b, i, h), gs, vj, vs, Ev) - dd[i];
        }
        detail::attention_exp(p.data(), n);
        for (std::size_t i = i0; i < Tq; ++i) {
          const T *qi = attention_row(q, b, i, h), *gi = attention_row(g, b, i, h);
          const A pi = p[i - i0], ds = pi * dp[i - i0];
          detail::attention_axpy(acc, ds, qi, qs, E);
          detail::attention_axpy(acc + E, pi, gi, gs, Ev);
          detail::attention_axpy(dq.data() + i * E, ds, kj, ks, E);
        }
        T *dk = grad_row(b, j, 1, h), *dv = grad_row(b, j, 2, h);
        for (std::size_t e = 0; e < E; ++e) dk[static_cast<std::ptrdiff_t>(e) * out5] = static_cast<T>(scale * acc[e]);
        for (std::size_t e = 0; e < Ev; ++e) dv[static_cast<std::ptrdiff_t>(e) * out5] = static_cast<T>(acc[E + e]);
      }
      for (std::size_t i = 0; i < Tq; ++i) {
        T* row = grad_row(b, i, 0, h);
        for (std::size_t e = 0; e < E; ++e) row[static_cast<std::ptrdiff_t>(e) * out5] = static_cast<T>(scale * dq[i * E + e]);
      }
    });
    return;
  }
  if (part == 1) {
    pool.parallel_for(B * H * Tq, [&](std::size_t task, unsigned) {
      const std::size_t i = task % Tq, h = task / Tq % H, b = task / (Tq * H);
      detail::attention_scratch<A> scratch;
      A* acc = scratch.get(E);
      std::fill(acc, acc + E, A{0});
      A lse, d;
      row_stats(b, i, h, lse, d, detail::attention_buffer<A>(Tk));
      const T *qi = attention_row(q, b, i, h), *gi = attention_row(g, b, i, h);
      for (std::size_t j = 0, n = keys_of(i); j < n; ++j) {
        const T* kj = attention_row(k, b, j, h);
        const A p = std::exp(scale * detail::attention_dot<A>(qi, qs, kj, ks, E) - lse);
        const A dp = detail::attention_dot<A>(gi, gs, attention_row(v, b, j, h), vs, Ev);
        detail::attention_axpy(acc, p * (dp - d), kj, ks, E);
      }
      T* dq = const_cast<T*>(attention_row(out, b, i, h));
      for (std::size_t e = 0; e < E; ++e) dq[static_cast<std::ptrdiff_t>(e) * outs] = static_cast<T>(scale * acc[e]);
    });
    return;
  }
  std::vector<A> stats(2 * B * H * Tq);  // (L, D) per (b, h, i)
  pool.parallel_for(B * H * Tq, [&](std::size_t task, unsigned) {
    const std::size_t i = task % Tq, h = task / Tq % H, b = task / (Tq * H);
    row_stats(b, i, h, stats[2 * task], stats[2 * task + 1], detail::attention_buffer<A>(Tk));
  });
  pool.parallel_for(B * H * Tk, [&](std::size_t task, unsigned) {
    const std::size_t j = task % Tk, h = task / Tk % H, b = task / (Tk * H);
    detail::attention_scratch<A> scratch;
    A* acc = scratch.get(E + Ev);  // dk then dv
    std::fill(acc, acc + E + Ev, A{0});
    const T *kj = attention_row(k, b, j, h), *vj = attention_row(v, b, j, h);
    const A* st = stats.data() + 2 * (b * H + h) * Tq;
    for (std::size_t i = causal ? j : 0; i < Tq; ++i) {
      const T *qi = attention_row(q, b, i, h), *gi = attention_row(g, b, i, h);
      const A p = std::exp(scale * detail::attention_dot<A>(qi, qs, kj, ks, E) - st[2 * i]);
      const A dp = detail::attention_dot<A>(gi, gs, vj, vs, Ev);
      detail::attention_axpy(acc, p * (dp - st[2 * i + 1]), qi, qs, E);
      detail::attention_axpy(acc + E, p, gi, gs, Ev);
    }
    T* dkv = const_cast<T*>(attention_row(out, b, j, h));
    for (std::size_t e = 0; e < E; ++e) dkv[static_cast<std::ptrdiff_t>(e) * outs] = static_cast<T>(scale * acc[e]);
    for (std::size_t e = 0; e < Ev; ++e)
      dkv[static_cast<std::ptrdiff_t>(E + e) * outs] = static_cast<T>(acc[E + e]);
  });
}

/// out = the n operands side by side along dimension `axis` from `start` on, zeros elsewhere (a
/// slice's gradient, or the joined gradients of adjacent slices: expr/grad_nodes.hpp's pad_node).
/// Operands are read through their strides (views of a gradient kernel's output); out through its
/// own. Rows of the last dimension are split over threads.
template <class T>
void pad(const strided<T>* in, int n, const strided<T>& out, std::size_t axis, std::size_t start, thread_pool& pool) {
  const std::size_t r = out.shape.rank, W = out.shape[r - 1];
  const std::size_t rows = W ? out.size() / W : 0;
  const std::size_t per = std::max<std::size_t>(1, (std::size_t{1} << 14) / std::max<std::size_t>(W, 1));
  std::size_t begin[8] = {}, end[8] = {};  // each operand's range along axis
  for (int k = 0, at = static_cast<int>(start); k < n; ++k) {
    begin[k] = static_cast<std::size_t>(at);
    at += static_cast<int>(in[k].shape[axis]);
    end[k] = static_cast<std::size_t>(at);
  }
  auto owner = [&](std::size_t c) {  // the operand holding index c along axis, or -1
    for (int k = 0; k < n; ++k)
      if (c >= begin[k] && c < end[k]) return k;
    return -1;
  };
  pool.parallel_for((rows + per - 1) / per, [&](std::size_t task, unsigned) {
    std::size_t idx[max_rank] = {};
    for (std::size_t row = task * per, last = std::min(rows, row + per); row < last; ++row) {
      std::size_t rest = row;
      for (std::size_t d = r - 1; d-- > 0;) {
        idx[d] = rest % out.shape[d];
        rest /= out.shape[d];
      }
      std::ptrdiff_t dst = 0;
      for (std::size_t d = 0; d + 1 < r; ++d) dst += static_cast<std::ptrdiff_t>(idx[d]) * out.stride[d];
      T* o = out.data + dst;
      const std::ptrdiff_t os = out.stride[r - 1];
      auto source = [&](int k) {  // operand k's row at this row's index (its own coordinate along axis)
        std::ptrdiff_t src = 0;
        for (std::size_t d = 0; d + 1 < r; ++d)
          src += static_cast<std::ptrdiff_t>(d == axis ? idx[d] - begin[k] : idx[d]) * in[k].stride[d];
        return in[k].data + src;
      };
      if (axis + 1 < r) {  // the whole row comes from one operand, or is zero
        const int k = owner(idx[axis]);
        if (k < 0) {
          for (std::size_t e = 0; e < W; ++e) o[static_cast<std::ptrdiff_t>(e) * os] = T{0};
        } else {
          const T* g = source(k);
          const std::ptrdiff_t gs = in[k].stride[r - 1];
          for (std::size_t e = 0; e < W; ++e) o[static_cast<std::ptrdiff_t>(e) * os] = g[static_cast<std::ptrdiff_t>(e) * gs];
        }
        continue;
      }
      std::size_t e = 0;  // the last dimension is the padded one: runs of zeros and of each operand
      for (; e < start; ++e) o[static_cast<std::ptrdiff_t>(e) * os] = T{0};
      for (int k = 0; k < n; ++k) {
        const T* g = source(k);
        const std::ptrdiff_t gs = in[k].stride[r - 1];
        for (std::size_t c = 0; c < end[k] - begin[k]; ++c, ++e)
          o[static_cast<std::ptrdiff_t>(e) * os] = g[static_cast<std::ptrdiff_t>(c) * gs];
      }
      for (; e < W; ++e) o[static_cast<std::ptrdiff_t>(e) * os] = T{0};
    }
  });
}

}  // namespace fusebox::cpu
