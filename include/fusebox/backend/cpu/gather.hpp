// backend/cpu/gather.hpp: the host kernels of expr/gather.hpp's nodes, shared by the static executor
// (backend/cpu/executor.hpp) and the run-time path (backend/cpu/generated_program.hpp).
//
//   embedding           out[i, :] = w[ids[i], :]: one pass over ids checking them (serial: once per
//                       call, before anything is written), then row copies, a task per block of ids.
//   embedding_backward  dw[v, :] = sum of g[i, :] over ids[i] == v, in increasing i. The ids are
//                       bucketed by row once (a counting sort: stable, so each row's positions stay
//                       in increasing order), then a task per block of vocabulary rows writes its
//                       rows: every row is summed by one task in one fixed order, so the result is
//                       the same bit for bit for any thread count, and no two tasks touch one row.
//                       Rows no id names are zero. Scratch: V + 1 + N indices, per call.
// Ids are numbers in the weight's element type; each must be an integer in [0, V). A bad one is a
// fusebox::invalid_argument naming the op, the id, its position, V and the shapes (the op's front
// end checks the same on the call's ids where it can see them, and adds the caller's line).
// Operands and result are read and written through their strides.
// Depends on: core/tensor.hpp, backend/cpu/thread_pool.hpp, expr/node.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <source_location>
#include <string>
#include <vector>

#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/node.hpp"

namespace fusebox::cpu {

namespace detail {
/// Offset of element `flat` (row-major over `shape`) of a tensor with these strides; `rank` dims.
inline std::ptrdiff_t gather_offset(std::size_t flat, const dims& shape, const strides_t& stride, std::size_t rank) {
  std::ptrdiff_t o = 0;
  for (std::size_t d = rank; d-- > 0;) {
    const std::size_t e = shape.extent[d];
    o += static_cast<std::ptrdiff_t>(flat % e) * stride[d];
    flat /= e;
  }
  return o;
}
}  // namespace detail

/// The message for an id that is not an integer in [0, rows): op, id, position, V, shapes.
inline std::string embedding_id_error(const char* op, double id, std::size_t position, const dims& ids,
                                      std::size_t rows, const dims& weight) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", id);
  return std::string(op) + "(weight, ids): id " + buf + " (element " + std::to_string(position) + " of ids " +
         to_string(ids) + ") is out of range: ids must be integers in [0, " + std::to_string(rows) +
         ") for a weight of " + std::to_string(rows) + " rows (V = " + std::to_string(rows) + ", weight " +
         to_string(weight) + ")";
}

/// Reads and checks every id of `ids` (row-major order) into `out`; throws on the first bad one,
/// naming the caller's line where `loc` is given (an eager call; a compiled model's ids are read
/// at run time, far from the user's line).
template <class T>
void read_ids(const strided<T>& ids, std::size_t rows, const dims& weight, const char* op,
              std::vector<std::uint32_t>& out, const std::source_location* loc = nullptr) {
  const std::size_t n = ids.shape.size();
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const T v = ids.data[detail::gather_offset(i, ids.shape, ids.stride, ids.shape.rank)];
    // !(v >= 0) also catches NaN; an integer test that needs no conversion of a huge value.
    if (!(v >= T(0)) || !(v < static_cast<T>(rows)) || v != std::floor(v))
      FUSEBOX_THROW(invalid_argument("fusebox: " + embedding_id_error(op, static_cast<double>(v), i, ids.shape, rows, weight) +
                                     (loc ? " (at " + where(*loc) + ")" : std::string())));
    out[i] = static_cast<std::uint32_t>(v);
  }
}

/// out [ids..., D] = rows of w [V, D] picked by ids.
template <class T>
void embedding(const strided<T>& w, const strided<T>& ids, const strided<T>& out, thread_pool& pool) {
  const std::size_t V = w.shape[0], D = w.shape[1];
  thread_local std::vector<std::uint32_t> idx;
  read_ids(ids, V, w.shape, "embedding", idx);
  const std::size_t n = idx.size();
  if (n == 0 || D == 0) return;
  const std::size_t lead = out.shape.rank - 1;
  const std::ptrdiff_t ws = w.stride[1], os = out.stride[lead];
  const std::size_t per = std::max<std::size_t>(1, (std::size_t{1} << 13) / D);
  const std::uint32_t* id = idx.data();
  pool.parallel_for((n + per - 1) / per, [&](std::size_t task, unsigned) {
    for (std::size_t i = task * per, last = std::min(n, i + per); i < last; ++i) {
      const T* src = w.data + static_cast<std::ptrdiff_t>(id[i]) * w.stride[0];
      T* dst = out.data + detail::gather_offset(i, out.shape, out.stride, lead);
      if (ws == 1 && os == 1) std::copy(src, src + D, dst);
      else
        for (std::size_t e = 0; e < D; ++e) dst[static_cast<std::ptrdiff_t>(e) * os] = src[static_cast<std::ptrdiff_t>(e) * ws];
    }
  });
}

/// out [V, D] = the rows of g [ids..., D] added into the rows ids name (torch's embedding_backward,
/// without padding_idx or scale_grad_by_freq). `weight` is the forward weight's shape, for messages.
template <class T>
void embedding_backward(const strided<T>& g, const strided<T>& ids, const strided<T>& out, thread_pool& pool) {
  const std::size_t V = out.shape[0], D = out.shape[1];
  thread_local std::vector<std::uint32_t> idx;
  read_ids(ids, V, out.shape, "embedding_backward", idx);
  const std::size_t n = idx.size();
  // Counting sort: start[v] .. start[v + 1] are the positions of row v, in increasing order.
  std::vector<std::uint32_t> start(V + 1, 0), pos(n);
  for (std::size_t i = 0; i < n; ++i) ++start[idx[i] + 1];
  for (std::size_t v = 0; v < V; ++v) start[v + 1] += start[v];
  {
    std::vector<std::uint32_t> at(start.begin(), start.end() - 1);
    for (std::size_t i = 0; i < n; ++i) pos[at[idx[i]]++] = static_cast<std::uint32_t>(i);
  }
  if (D == 0) return;
  const std::size_t lead = g.shape.rank - 1;
  const std::ptrdiff_t gs = g.stride[lead], os = out.stride[1];
  const std::size_t per = std::max<std::size_t>(1, (std::size_t{1} << 13) / D);
  pool.parallel_for((V + per - 1) / per, [&](std::size_t task, unsigned) {
    for (std::size_t v = task * per, last = std::min(V, v + per); v < last; ++v) {
      T* o = out.data + static_cast<std::ptrdiff_t>(v) * out.stride[0];
      if (os == 1) std::fill(o, o + D, T(0));
      else
        for (std::size_t e = 0; e < D; ++e) o[static_cast<std::ptrdiff_t>(e) * os] = T(0);
      for (std::uint32_t k = start[v]; k < start[v + 1]; ++k) {
        const T* src = g.data + detail::gather_offset(pos[k], g.shape, g.stride, lead);
        if (os == 1 && gs == 1)
          for (std::size_t e = 0; e < D; ++e) o[e] += src[e];
        else
          for (std::size_t e = 0; e < D; ++e)
            o[static_cast<std::ptrdiff_t>(e) * os] += src[static_cast<std::ptrdiff_t>(e) * gs];
      }
    }
  });
}

/// A gather node by its desc: operand a (the weight, or the gradient) and ids into out.
template <class T>
void run_gather(const node_desc& d, const strided<T>& a, const strided<T>& ids, const strided<T>& out,
                thread_pool& pool) {
  if (d.variant == 0) embedding(a, ids, out, pool);
  else embedding_backward(a, ids, out, pool);
}

}  // namespace fusebox::cpu
