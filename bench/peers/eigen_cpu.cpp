// bench/peers/eigen_cpu.cpp: the Eigen 3.4 peer for W1c, W2c and W3c, written as well as Eigen
// allows.
//
// Configuration (say it next to every number):
//   - Built with -fopenmp and -march=native (the same flags as fusebox's own code). Eigen's GEMM
//     is threaded by Eigen itself through OpenMP (Eigen::setNbThreads); Eigen never threads
//     coefficient-wise expressions, so those are split over rows (or blocks of rows) with an
//     `omp parallel for` here, the way an Eigen user would.
//   - Eigen's own GEMM/GEMV kernels (EIGEN_USE_BLAS is not defined: the BLAS peer is OpenBLAS).
//   - Row-major maps over the shared, 64-byte-aligned inputs; no copies in the timed calls; every
//     buffer an expression writes into is allocated once, outside the timed calls.
//   - Vectorised erf and logistic from Eigen 3.4 (unsupported/Eigen/SpecialFunctions, ArrayBase).
//   - Two spellings of W1c and W2c: `rows` (each row a 1-D array expression over one row of
//     contiguous data, which keeps erf/logistic vectorised) and `matrix` (one broadcasting
//     expression over the whole matrix, which BENCHMARKS.md notes loses vectorisation); both are
//     reported, the table's "best Eigen" is the faster.
#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include <omp.h>

#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "../cpu_workloads.hpp"

namespace fusebox::bench {
namespace {

using row_major = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using mat_rm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using cmap_rm = Eigen::Map<const row_major, Eigen::Aligned64>;
using map_rm = Eigen::Map<row_major, Eigen::Aligned64>;
using cmat_map = Eigen::Map<const mat_rm, Eigen::Aligned64>;
using mat_map = Eigen::Map<mat_rm, Eigen::Aligned64>;
using row_arr = Eigen::Array<float, 1, Eigen::Dynamic>;
using cmap_row = Eigen::Map<const row_arr>;
using map_row = Eigen::Map<row_arr>;

constexpr float inv_sqrt2 = 0.70710678118654752f;

std::string threading(unsigned threads) {
  return "OpenMP " + std::to_string(threads) + " thread(s)";
}

}  // namespace

std::string eigen_describe() {
  return "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
         std::to_string(EIGEN_MINOR_VERSION) + ", SIMD: " + Eigen::SimdInstructionSetsInUse() +
         ", OpenMP (GEMM via Eigen::setNbThreads, elementwise via omp parallel for over rows)";
}

namespace {
/// An output buffer and the span a candidate reports.
struct out_buffer {
  floats y;
  std::span<const float> span() const { return {y.data(), y.size()}; }
};
}  // namespace

candidates eigen_w1(const w1_data& d, unsigned threads) {
  const int R = static_cast<int>(d.rows), C = static_cast<int>(d.cols), nt = static_cast<int>(threads);
  auto st = std::make_shared<out_buffer>(out_buffer{floats(d.rows * d.cols)});
  float* y = st->y.data();
  const float *x = d.x.data(), *wp = d.w.data(), *bp = d.b.data();
  candidates cs;

  // Row by row: every operand a contiguous row, erf and logistic stay vectorised. The affine part
  // goes through a per-thread row buffer (16 KiB: L1) so it is computed once.
  cs.push_back({"eigen", "eager", "rows: per-row ArrayXf expressions, " + threading(threads), "", {},
                [=] {
                  const cmap_row w(wp, C), b(bp, C);
#pragma omp parallel num_threads(nt)
                  {
                    row_arr t(C);
#pragma omp for schedule(static)
                    for (int r = 0; r < R; ++r) {
                      const cmap_row xr(x + static_cast<std::ptrdiff_t>(r) * C, C);
                      map_row yr(y + static_cast<std::ptrdiff_t>(r) * C, C);
                      t = xr * w + b;
                      yr = (0.5f * t * (1.0f + (t * inv_sqrt2).erf())) * xr.logistic();
                    }
                  }
                },
                [st] { return st->span(); }, st});
  // One broadcasting expression per block of rows.
  cs.push_back({"eigen", "eager", "matrix: one rowwise-broadcast expression per row block, " + threading(threads), "",
                {},
                [=] {
                  const cmap_row w(wp, C), b(bp, C);
#pragma omp parallel num_threads(nt)
                  {
                    const int me = omp_get_thread_num(), n = omp_get_num_threads();
                    const int r0 = R * me / n, r1 = R * (me + 1) / n;
                    const cmap_rm X(x + static_cast<std::ptrdiff_t>(r0) * C, r1 - r0, C);
                    map_rm Y(y + static_cast<std::ptrdiff_t>(r0) * C, r1 - r0, C);
                    const auto t = (X.rowwise() * w).rowwise() + b;
                    Y = (0.5f * t * (1.0f + (t * inv_sqrt2).erf())) * X.logistic();
                  }
                },
                [st] { return st->span(); }, st});
  return cs;
}

candidates eigen_w2(const w2_data& d, unsigned threads) {
  const int R = static_cast<int>(d.rows), C = static_cast<int>(d.cols), nt = static_cast<int>(threads);
  struct state {
    out_buffer out;
    row_major tmp;
  };
  auto st = std::make_shared<state>(state{{floats(d.rows * d.cols)}, row_major(R, C)});
  float* y = st->out.y.data();
  const float *x = d.x.data(), *gp = d.gamma.data(), *bp = d.beta.data();
  const float eps = d.eps;
  candidates cs;

  // Row by row: softmax and layer_norm of one row in a per-thread row buffer (L1/L2).
  cs.push_back({"eigen", "eager", "rows: per-row ArrayXf expressions, " + threading(threads), "", {},
                [=] {
                  const cmap_row g(gp, C), be(bp, C);
#pragma omp parallel num_threads(nt)
                  {
                    row_arr e(C);
#pragma omp for schedule(static)
                    for (int r = 0; r < R; ++r) {
                      const cmap_row xr(x + static_cast<std::ptrdiff_t>(r) * C, C);
                      map_row yr(y + static_cast<std::ptrdiff_t>(r) * C, C);
                      e = (xr - xr.maxCoeff()).exp();
                      e *= 1.0f / e.sum();
                      e -= e.mean();
                      const float var = e.square().mean();
                      yr = e * (1.0f / std::sqrt(var + eps)) * g + be;
                    }
                  }
                },
                [st] { return st->out.span(); }, st});
  // Whole-matrix expressions over each thread's block of rows, one full-size temporary.
  cs.push_back({"eigen", "eager", "matrix: whole-block rowwise/colwise expressions, " + threading(threads), "", {},
                [=] {
                  const cmap_row g(gp, C), be(bp, C);
#pragma omp parallel num_threads(nt)
                  {
                    const int me = omp_get_thread_num(), n = omp_get_num_threads();
                    const int r0 = R * me / n, r1 = R * (me + 1) / n;
                    const cmap_rm X(x + static_cast<std::ptrdiff_t>(r0) * C, r1 - r0, C);
                    map_rm Y(y + static_cast<std::ptrdiff_t>(r0) * C, r1 - r0, C);
                    auto E = st->tmp.middleRows(r0, r1 - r0);
                    const Eigen::ArrayXf mx = X.rowwise().maxCoeff();
                    E = (X.colwise() - mx).exp();
                    const Eigen::ArrayXf inv_sum = E.rowwise().sum().inverse();
                    E.colwise() *= inv_sum;
                    const Eigen::ArrayXf mean = E.rowwise().mean();
                    E.colwise() -= mean;
                    const Eigen::ArrayXf inv = (E.square().rowwise().mean() + eps).rsqrt();
                    Y = (E.colwise() * inv).rowwise() * g + be.replicate(r1 - r0, 1);
                  }
                },
                [st] { return st->out.span(); }, st});
  return cs;
}

candidates eigen_w3(const w3_data& d, unsigned threads) {
  const auto& dim = w3_data::dim;
  const int B = static_cast<int>(d.batch), nt = static_cast<int>(threads);
  struct state {
    mat_rm h1, h2, out;
  };
  auto st = std::make_shared<state>(state{mat_rm(B, dim[1]), mat_rm(B, dim[2]), mat_rm(B, dim[3])});
  const w3_data* dp = &d;

  // Bias + exact GELU on each row, in place; rows split over threads when there are several.
  auto bias_gelu = [nt](mat_rm& h, const float* bias) {
    const int rows = static_cast<int>(h.rows()), cols = static_cast<int>(h.cols());
    const Eigen::Map<const row_arr> b(bias, cols);
#pragma omp parallel for num_threads(nt) schedule(static) if (rows > 1)
    for (int r = 0; r < rows; ++r) {
      map_row hr(h.data() + static_cast<std::ptrdiff_t>(r) * cols, cols);
      hr += b;
      hr = 0.5f * hr * (1.0f + (hr * inv_sqrt2).erf());
    }
  };

  candidates cs;
  for (const bool nk : {false, true}) {
    auto call = [=] {
      const auto& dim = w3_data::dim;
      const cmat_map x(dp->x.data(), B, dim[0]);
      auto W = [&](int l) {
        return nk ? cmat_map(dp->w_nk[l].data(), dim[l + 1], dim[l]) : cmat_map(dp->w_kn[l].data(), dim[l], dim[l + 1]);
      };
      state& s = *st;
      if (nk) s.h1.noalias() = x * W(0).transpose();
      else s.h1.noalias() = x * W(0);
      bias_gelu(s.h1, dp->b[0].data());
      if (nk) s.h2.noalias() = s.h1 * W(1).transpose();
      else s.h2.noalias() = s.h1 * W(1);
      bias_gelu(s.h2, dp->b[1].data());
      if (nk) s.out.noalias() = s.h2 * W(2).transpose();
      else s.out.noalias() = s.h2 * W(2);
      s.out.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(dp->b[2].data(), dim[3]);
    };
    cs.push_back({"eigen", "eager",
                  std::string(nk ? "W [N,K] (x*W^T)" : "W [K,N] (x*W)") + ", row-major, Eigen GEMM" +
                      (B == 1 ? "V (one thread: Eigen does not thread GEMV)" : "") + ", setNbThreads(" +
                      std::to_string(nt) + "), bias+GELU per row",
                  "", [nt] { Eigen::setNbThreads(nt); }, call,
                  [st] { return std::span<const float>(st->out.data(), static_cast<std::size_t>(st->out.size())); },
                  st});
  }
  return cs;
}

}  // namespace fusebox::bench
