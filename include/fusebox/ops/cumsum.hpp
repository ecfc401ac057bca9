// ops/cumsum.hpp: cumsum(x, axis<A>), torch.cumsum: running sums along one dimension.
//
//   auto y = cumsum(x, axis<1>);   // y[.., i, ..] = x[.., 0, ..] + ... + x[.., i, ..], same shape as x
//
// A custom op (expr/custom.hpp): this header is the whole op, with its host kernel, its CUDA
// kernel and its derivative; no stage of the library names it. The node is a scan,
// `scan<R, Axis, Reverse>`, over the combine of reduction R (ops/reduce.hpp: identity, combine
// and their device spellings), so cumsum is `scan<ops::sum, ...>` and a running max or product is
// the same kernel over another R. Reverse runs the scan from the end of the line (suffix sums):
// cumsum's derivative is the reversed cumsum of the incoming gradient.
// Accumulates in the element type, in index order along the line (as torch's CPU cumsum): float
// sums of long lines carry float's rounding. The host kernel takes, when the axis is not the last
// dimension, a row of the last dimension at a time (contiguous reads, one accumulator per column);
// along the last dimension a line at a time. On CUDA a thread walks one line (lines spread over
// the grid; adjacent threads take adjacent columns when the axis is not the last dimension): fine
// for many lines, slow for a few very long ones (no block-wide scan yet).
// Depends on: expr/custom.hpp, ops/reduce.hpp (the combines), ops/operand.hpp, autodiff/rule.hpp,
// backend/cpu/thread_pool.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/backend/cpu/thread_pool.hpp"
#include "fusebox/expr/custom.hpp"
#include "fusebox/ops/operand.hpp"
#include "fusebox/ops/reduce.hpp"

namespace fusebox {
namespace ops {

/// A running combine of reduction R along dimension Axis (normalised), from the end when Reverse.
template <class R, int Axis, bool Reverse>
struct scan {
  static constexpr const char* name = std::is_same_v<R, sum> ? (Reverse ? "cumsum_reverse" : "cumsum")
                                     : std::is_same_v<R, max> ? (Reverse ? "cummax_reverse" : "cummax")
                                     : std::is_same_v<R, min> ? (Reverse ? "cummin_reverse" : "cummin")
                                                              : (Reverse ? "scan_reverse" : "scan");
  static constexpr int flops = R::flops;

  static constexpr custom_shape_result shape(const dims* in, int) {
    return custom_shape_result{in[0], Axis >= 0 && static_cast<std::size_t>(Axis) < in[0].rank};
  }
  static std::string error(const dims* in, int) {
    return std::string(name) + ": operand " + to_string(in[0]) + " has no dimension " + std::to_string(Axis);
  }
  static std::string summary(const dims* in, int, const dims&) {
    return std::string(name) + " along dimension " + std::to_string(Axis) + " of " + to_string(in[0]);
  }

  // ---- host ----
  /// The lines of a [.., n (Axis), .., inner] walk: `other` lists the dimensions a line index
  /// runs over (all but Axis and, when Axis is not last, the last one, walked as a row).
  template <class T>
  static void run(const strided<T>* in, int, const strided<T>& out, cpu::thread_pool& pool) {
    const strided<T>& x = in[0];
    const std::size_t rank = out.shape.rank, axis = static_cast<std::size_t>(Axis);
    if (out.shape.size() == 0) return;
    const bool along_last = axis + 1 == rank;
    const std::size_t n = out.shape[axis], inner = along_last ? 1 : out.shape[rank - 1];
    const std::size_t lines = out.shape.size() / (n * inner);
    std::size_t other[max_rank];
    std::size_t n_other = 0;
    for (std::size_t d = 0; d < rank; ++d)
      if (d != axis && (along_last || d + 1 != rank)) other[n_other++] = d;
    const std::ptrdiff_t xa = x.stride[axis], oa = out.stride[axis];
    const std::ptrdiff_t xl = along_last ? 0 : x.stride[rank - 1], ol = along_last ? 0 : out.stride[rank - 1];
    const std::size_t tasks = std::min<std::size_t>(lines, 4 * static_cast<std::size_t>(pool.size()));
    pool.parallel_for(tasks, [&](std::size_t task, unsigned) {
      std::vector<T> acc(inner);
      for (std::size_t line = lines * task / tasks; line < lines * (task + 1) / tasks; ++line) {
        std::ptrdiff_t bx = 0, bo = 0;
        std::size_t rest = line;
        for (std::size_t k = n_other; k-- > 0;) {
          const std::size_t d = other[k], c = rest % out.shape[d];
          rest /= out.shape[d];
          bx += static_cast<std::ptrdiff_t>(c) * x.stride[d];
          bo += static_cast<std::ptrdiff_t>(c) * out.stride[d];
        }
        std::fill(acc.begin(), acc.end(), R::template identity<T>());
        for (std::size_t i = 0; i < n; ++i) {
          const auto at = static_cast<std::ptrdiff_t>(Reverse ? n - 1 - i : i);
          const T* xr = x.data + bx + at * xa;
          T* orow = out.data + bo + at * oa;
          for (std::size_t j = 0; j < inner; ++j) {
            const auto jj = static_cast<std::ptrdiff_t>(j);
            acc[j] = R::combine(acc[j], xr[jj * xl]);
            orow[jj * ol] = acc[j];
          }
        }
      }
    });
  }

  // ---- CUDA (expr/custom.hpp's protocol) ----
  /// The parameter block, as the unit declares it: the line dimensions' extents and strides.
  struct params {
    std::uint64_t x = 0, y = 0;
    long long n = 0, xs = 0, ys = 0, lines = 0;
    long long ext[max_rank] = {}, xst[max_rank] = {}, yst[max_rank] = {};
  };
  static std::string cuda_unit(const dims* in, int, const dims&, const char* storage) {
    const std::string mr = std::to_string(max_rank);
    return "typedef " + std::string(storage) + " fbc_t;\nstruct fbc_op {\n" + R::device +
           "\n};\nconstexpr int FBC_ND = " + std::to_string(in[0].rank - 1) +
           ";\nconstexpr bool FBC_REVERSE = " + (Reverse ? "true" : "false") +
           ";\nstruct fbc_args {\n  const fbc_t* x; fbc_t* y;\n  long long n, xs, ys, lines;\n  long long ext[" + mr +
           "], xst[" + mr + "], yst[" + mr + "];\n};\n" + R"(__device__ void fbc_body(const fbc_args& a) {
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < a.lines; t += (long long)gridDim.x * blockDim.x) {
    long long rest = t, bx = 0, by = 0;
    for (int d = FBC_ND - 1; d >= 0; --d) {
      const long long c = rest % a.ext[d];
      rest /= a.ext[d];
      bx += c * a.xst[d];
      by += c * a.yst[d];
    }
    float acc = fbc_op::identity();
    for (long long i = 0; i < a.n; ++i) {
      const long long at = FBC_REVERSE ? a.n - 1 - i : i;
      acc = fbc_op::combine(acc, fb_to_float(a.x[bx + at * a.xs]));
      a.y[by + at * a.ys] = fb_from_float<fbc_t>(acc);
    }
  }
}
)";
  }
  static custom_launch cuda_params(const custom_device_view* in, int, const custom_device_view& out, void* block) {
    params p;
    const std::size_t rank = out.shape.rank, axis = static_cast<std::size_t>(Axis);
    p.x = in[0].address;
    p.y = out.address;
    p.n = static_cast<long long>(out.shape[axis]);
    p.xs = in[0].stride[axis];
    p.ys = out.stride[axis];
    p.lines = 1;
    int k = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      if (d == axis) continue;
      p.ext[k] = static_cast<long long>(out.shape[d]);
      p.xst[k] = in[0].stride[d];
      p.yst[k] = out.stride[d];
      p.lines *= p.ext[k++];
    }
    std::memcpy(block, &p, sizeof p);
    custom_launch l;
    l.bytes = sizeof p;
    l.block = 256;
    if (p.n == 0 || p.lines == 0) return l;  // grid 0: nothing to launch
    l.grid = static_cast<unsigned>(std::min<long long>((p.lines + 255) / 256, 1 << 20));
    return l;
  }
};

}  // namespace ops

namespace static_check {
template <class Shape, int A, bool Ok>
struct cumsum_axis {
  static_assert(Ok, "fusebox: cumsum(x, axis<A>): the axis (above) is not a dimension of x's shape (above); use -1 "
                    "for the last dimension");
  static constexpr bool value = Ok;
};
}  // namespace static_check

/// torch.cumsum(x, dim): running sums along dimension A (negative counts from the end).
template <array_operand X, int A = -1>
auto cumsum(const X& x, axis_t<A> = {}, std::source_location = std::source_location::current()) {
  using T = typename detail::common_element<X>::type;
  using Arg = decltype(detail::as_expr<T>(x));
  constexpr int rank = static_cast<int>(Arg::desc.shape.rank);
  constexpr int axis_n = A < 0 ? rank + A : A;
  static_assert(static_check::cumsum_axis<shape_of_t<Arg>, A, (axis_n >= 0 && axis_n < rank)>::value);
  if constexpr (axis_n >= 0 && axis_n < rank)
    return detail::finish(custom_node<ops::scan<ops::sum, axis_n, false>, Arg>{{}, {detail::as_expr<T>(x)}});
}

// ---- derivative (autodiff/rule.hpp): the incoming gradient summed from each position to the end ----
namespace autodiff {
template <int Axis, bool Reverse>
struct derivative<ops::scan<ops::sum, Axis, Reverse>> {
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = custom_node<ops::scan<ops::sum, Axis, !Reverse>, exact<G, Y>>;
};
}  // namespace autodiff

}  // namespace fusebox
