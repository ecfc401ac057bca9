// backend/cpu/eager_kernels.hpp: eager mode's kernels for elementwise ops and reductions, one per
// op and element type, whatever the shapes.
//
// Why: eager mode used to run every op as a one-node static program (backend/cpu/evaluate.hpp),
// which instantiates the whole static executor (rows kernel, task split, autotuning, pool
// dispatch) once per op *and shape*. In a program that compiles two small models and checks them
// against eager, those one-node programs were most of the object code and of the build (issue 22;
// docs/benchmarks.md, "Build cost"). These kernels take extents and strides at run time, as
// PyTorch's eager kernels do, so `exp` over [64, 256] and over [256, 512] share one instantiation.
// The math is the op's own `apply` (the same function the static and generated kernels call),
// over xsimd batches along the last dimension, scalars for the tail and for strided rows.
//
// Matmuls go straight to the shared GEMM (gemm<T> with no epilogue), which is what their one-node
// program called too.
//
// Depends on: backend/cpu/gemm.hpp, backend/cpu/simd.hpp, backend/cpu/thread_pool.hpp, core/tensor.hpp.
#pragma once

#include <array>
#include <cstddef>

#include "fusebox/backend/cpu/gemm.hpp"
#include "fusebox/backend/cpu/simd.hpp"
#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/tensor.hpp"

namespace fusebox::cpu::eager {

/// Elements below which an eager kernel runs on the calling thread (a pool wake-up costs more).
inline constexpr std::size_t parallel_threshold = std::size_t{1} << 15;

/// v seen with out's extents, aligned right: stride 0 where v broadcasts (missing or extent 1).
template <class T>
strided<const T> broadcast_to(const strided<const T>& v, const dims& out) {
  strided<const T> r{v.data, out, {}};
  const std::size_t skip = out.rank - v.shape.rank;
  for (std::size_t d = skip; d < out.rank; ++d)
    r.stride[d] = v.shape[d - skip] == 1 ? 0 : v.stride[d - skip];
  return r;
}

/// Element offset of row `row` (all dimensions but the last, row-major) in a view of `shape`.
inline std::ptrdiff_t row_offset(std::size_t row, const dims& shape, const strides_t& stride) {
  std::ptrdiff_t off = 0;
  for (std::size_t d = shape.rank - 1; d-- > 0;) {
    off += static_cast<std::ptrdiff_t>(row % shape[d]) * stride[d];
    row /= shape[d];
  }
  return off;
}

/// Runs body(first_row, end_row) over `rows` rows of `row_elems` elements each, split into tasks
/// on the pool when the work is large enough.
template <class Body>
void for_rows(std::size_t rows, std::size_t row_elems, thread_pool& pool, Body&& body) {
  const std::size_t tasks = rows * row_elems < parallel_threshold ? 1 : std::min<std::size_t>(rows, pool.size() * 4);
  if (tasks <= 1) return body(std::size_t{0}, rows);
  pool.parallel_for(tasks, [&](std::size_t t, unsigned) { body(rows * t / tasks, rows * (t + 1) / tasks); });
}

/// out = Op(in...) elementwise, the operands broadcast to out's extents; out is contiguous.
template <class Op, class T, std::size_t N>
void pointwise(const std::array<strided<const T>, N>& operands, const strided<T>& out, thread_pool& pool) {
  using V = vec<T>;
  constexpr std::size_t W = V::size;
  if (out.shape.size() == 0) return;
  const dims space = out.shape.rank == 0 ? dims{1, {1}} : out.shape;
  std::array<strided<const T>, N> in;
  for (std::size_t i = 0; i < N; ++i) {
    in[i] = broadcast_to(operands[i], out.shape);
    in[i].shape = space;  // a rank-0 operand of a rank-0 result: one row of one element, stride 0
  }
  const std::size_t n = space.back(0), rows = space.size() / n;
  bool vector_rows = true;  // every operand unit-stride or broadcast along the row
  bool unit_rows = true;    // every operand unit-stride along the row: plain loads, no choice per vector
  for (std::size_t i = 0; i < N; ++i) {
    const std::ptrdiff_t s = in[i].stride[space.rank - 1];
    vector_rows = vector_rows && (s == 0 || s == 1);
    unit_rows = unit_rows && s == 1;
  }
  for_rows(rows, n, pool, [&](std::size_t first, std::size_t end) {
    for (std::size_t r = first; r < end; ++r) {
      std::array<const T*, N> p;
      std::array<std::ptrdiff_t, N> s;
      for (std::size_t i = 0; i < N; ++i) {
        p[i] = in[i].data + row_offset(r, space, in[i].stride);
        s[i] = in[i].stride[space.rank - 1];
      }
      T* o = out.data + r * n;
      // The row length as a local: xsimd's stores are may_alias, so GCC reloaded the captured `n`
      // from memory after each vector (two loads of nine instructions a vector in an add).
      const std::size_t cols = n;
      std::size_t j = 0;
      // Rows of unit-stride operands take plain loads: GCC left the per-operand choice below in
      // the loop of some ops (gelu over [4096, 4096] at AVX2: 5.6% more instructions with it;
      // docs/benchmarks.md, run AI).
      if (unit_rows) {
        for (; j + W <= cols; j += W) {
          const V y = [&]<std::size_t... I>(std::index_sequence<I...>) {
            return Op::apply(V::load_unaligned(p[I] + j)...);
          }(std::make_index_sequence<N>{});
          y.store_unaligned(o + j);
        }
      } else if (vector_rows) {
        for (; j + W <= cols; j += W) {
          const V y = [&]<std::size_t... I>(std::index_sequence<I...>) {
            return Op::apply((s[I] == 0 ? V(*p[I]) : V::load_unaligned(p[I] + j))...);
          }(std::make_index_sequence<N>{});
          y.store_unaligned(o + j);
        }
      }
      for (; j < cols; ++j)
        o[j] = [&]<std::size_t... I>(std::index_sequence<I...>) {
          return Op::apply(p[I][static_cast<std::ptrdiff_t>(j) * s[I]]...);
        }(std::make_index_sequence<N>{});
    }
  });
}

/// out = Op-reduction of `in` along `axis` (keepdim or not: out holds the same elements); out is
/// contiguous. Combines in the order the static kernels do (a row: see below; across rows: one
/// accumulator per output element, down the axis).
template <class Op, class T>
void reduce(const strided<const T>& in, std::size_t axis, const strided<T>& out, thread_pool& pool) {
  using V = vec<T>;
  constexpr std::size_t W = V::size;
  const std::size_t n = in.shape[axis];
  std::size_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < axis; ++d) outer *= in.shape[d];
  for (std::size_t d = axis + 1; d < in.shape.rank; ++d) inner *= in.shape[d];
  if (outer * inner == 0) return;
  // The input as [outer..., n, inner...]: offsets of an outer index and of an inner index.
  auto offset = [&](std::size_t idx, std::size_t from, std::size_t to) {
    std::ptrdiff_t off = 0;
    for (std::size_t d = to; d-- > from;) {
      off += static_cast<std::ptrdiff_t>(idx % in.shape[d]) * in.stride[d];
      idx /= in.shape[d];
    }
    return off;
  };
  const std::ptrdiff_t sa = in.stride[axis];
  const bool last = inner == 1;
  const std::ptrdiff_t s_inner = last ? 0 : in.stride[in.shape.rank - 1];
  const std::size_t inner_n = last ? 1 : in.shape.back(0), inner_rows = inner / inner_n;
  for_rows(outer, n * inner, pool, [&](std::size_t first, std::size_t end) {
    for (std::size_t o = first; o < end; ++o) {
      const T* base = in.data + offset(o, 0, axis);
      T* dst = out.data + o * inner;
      if (last) {
        // Along a row, in the static rows kernel's order (backend/cpu/executor.hpp, step): four
        // vector accumulators, the rest of the vectors into the first, the four combined pairwise
        // and across lanes, then the scalar tail; a strided row is one scalar pass. Rounding is
        // then the same as a compiled model's, bit for bit (tests/ops/special_values.cpp).
        T acc = Op::template identity<T>();
        std::size_t k = 0;
        if (sa == 1) {
          V a0 = Op::template identity<V>(), a1 = a0, a2 = a0, a3 = a0;
          for (; k + 4 * W <= n; k += 4 * W) {
            a0 = Op::combine(a0, V::load_unaligned(base + k));
            a1 = Op::combine(a1, V::load_unaligned(base + k + W));
            a2 = Op::combine(a2, V::load_unaligned(base + k + 2 * W));
            a3 = Op::combine(a3, V::load_unaligned(base + k + 3 * W));
          }
          for (; k + W <= n; k += W) a0 = Op::combine(a0, V::load_unaligned(base + k));
          acc = Op::horizontal(Op::combine(Op::combine(a0, a1), Op::combine(a2, a3)));
        }
        for (; k < n; ++k) acc = Op::combine(acc, base[static_cast<std::ptrdiff_t>(k) * sa]);
        dst[0] = Op::finalize(acc, n);
        continue;
      }
      // Across rows: each output element of a contiguous inner row accumulates down the axis.
      for (std::size_t ir = 0; ir < inner_rows; ++ir) {
        const T* b = base + offset(ir * inner_n, axis + 1, in.shape.rank);
        T* d = dst + ir * inner_n;
        std::size_t j = 0;
        if (s_inner == 1)
          for (; j + W <= inner_n; j += W) {
            V va = Op::template identity<V>();
            for (std::size_t k = 0; k < n; ++k) va = Op::combine(va, V::load_unaligned(b + static_cast<std::ptrdiff_t>(k) * sa + j));
            alignas(64) T lanes[W];
            va.store_aligned(lanes);
            for (std::size_t l = 0; l < W; ++l) d[j + l] = Op::finalize(lanes[l], n);
          }
        for (; j < inner_n; ++j) {
          T acc = Op::template identity<T>();
          for (std::size_t k = 0; k < n; ++k)
            acc = Op::combine(acc, b[static_cast<std::ptrdiff_t>(k) * sa + static_cast<std::ptrdiff_t>(j) * s_inner]);
          d[j] = Op::finalize(acc, n);
        }
      }
    }
  });
}

/// out = a b: [M, K] x [K, N], or batched [B, M, K] x [B or 1, K, N] (either side rank 2, a batch
/// extent of 1 broadcast), any strides; out is contiguous. `workspace` grows to what gemm needs.
template <class T, class Workspace>
void matmul(const strided<const T>& a, const strided<const T>& b, const strided<T>& out, Workspace& workspace,
            thread_pool& pool) {
  const std::size_t ra = a.shape.rank, rb = b.shape.rank;
  const std::size_t batch = out.shape.rank == 3 ? out.shape[0] : 1, m = out.shape.back(1), n = out.shape.back(0),
                    k = a.shape.back(0);
  const matrix_view<T> av{a.data, a.stride[ra - 2], a.stride[ra - 1]};
  const matrix_view<T> bv{b.data, b.stride[rb - 2], b.stride[rb - 1]};
  const std::ptrdiff_t a_bs = ra == 3 && a.shape[0] != 1 ? a.stride[0] : 0;
  const std::ptrdiff_t b_bs = rb == 3 && b.shape[0] != 1 ? b.stride[0] : 0;
  const std::ptrdiff_t ldc = static_cast<std::ptrdiff_t>(n), c_bs = static_cast<std::ptrdiff_t>(m * n);
  const std::size_t bytes = gemm_workspace_bytes<T>(batch, m, n, k, pool.size());
  std::span<std::byte> ws(workspace.ensure(bytes), bytes);
  gemm<T>(batch, m, n, k, av, a_bs, bv, b_bs, out.data, ldc, c_bs, no_epilogue{}, pool, ws);
}

}  // namespace fusebox::cpu::eager
