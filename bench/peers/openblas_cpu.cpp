// bench/peers/openblas_cpu.cpp: the OpenBLAS peer for W3c, and the machine's arithmetic limit
// (sgemm on large square matrices).
//
// Configuration (say it next to every number):
//   - Debian's OpenBLAS (pthreads build), openblas_set_num_threads(threads).
//   - Batch 1: cblas_sgemv (BENCHMARKS.md: 2.5-4x faster than sgemm with one row); batch > 1:
//     cblas_sgemm. Both weight layouts: [K, N] (NoTrans) and [N, K] (Trans).
//   - Bias + exact GELU as a separate pass written plainly (std::erf). Two ways to thread it, both
//     reported (the table's best OpenBLAS is the faster): rows split with an `omp parallel for`,
//     or on the calling thread alone (OpenBLAS's own threads spin for a while after each call and
//     can slow OpenMP threads down on a 2-core machine). One row is always done serially.
//   - Also reported, not as a W3c result: the three GEMMs alone, without bias or GELU (a lower bound
//     for any peer built on this BLAS).
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "../cpu_workloads.hpp"

namespace fusebox::bench {
namespace {

constexpr float inv_sqrt2 = 0.70710678118654752f;

void linear(const float* x, int B, int K, int N, const float* w, bool nk, float* y) {
  if (B == 1) {
    if (nk) cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w, K, x, 1, 0.0f, y, 1);
    else cblas_sgemv(CblasRowMajor, CblasTrans, K, N, 1.0f, w, N, x, 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, nk ? CblasTrans : CblasNoTrans, B, N, K, 1.0f, x, K, w, nk ? K : N,
                0.0f, y, N);
  }
}

/// y = gelu(y + b) (or y + b), row by row.
void epilogue(float* y, int B, int N, const float* b, bool gelu, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (B > 1 && threads > 1)
  for (int r = 0; r < B; ++r) {
    float* row = y + static_cast<std::ptrdiff_t>(r) * N;
    for (int j = 0; j < N; ++j) {
      const float v = row[j] + b[j];
      row[j] = gelu ? 0.5f * v * (1.0f + std::erf(v * inv_sqrt2)) : v;
    }
  }
}

}  // namespace

std::string openblas_describe() {
  return std::string(openblas_get_config()) + ", core " + openblas_get_corename() + ", " +
         std::to_string(openblas_get_num_procs()) + " procs";
}

double openblas_sgemm_gflops(unsigned threads, std::size_t n, timing& t) {
  openblas_set_num_threads(static_cast<int>(threads));
  floats a(n * n), b(n * n), c(n * n);
  fill_uniform(a.data(), a.size(), 1, -1, 1);
  fill_uniform(b.data(), b.size(), 2, -1, 1);
  const int N = static_cast<int>(n);
  auto call = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a.data(), N, b.data(), N, 0.0f, c.data(), N);
  };
  // A limit, not a workload: a few calls of a second or so each are plenty.
  measure_config cfg;
  cfg.warmup = 2;
  cfg.long_min_iters = 5;
  cfg.min_seconds = 0;
  t = measure(call, cfg);
  return 2.0 * static_cast<double>(n) * n * n / (t.min_us * 1e3);  // a limit: the best call
}

candidates openblas_w3(const w3_data& d, unsigned threads) {
  const auto& dim = w3_data::dim;
  const int B = static_cast<int>(d.batch), nt = static_cast<int>(threads);
  struct state {
    floats h1, h2, out;
  };
  auto st = std::make_shared<state>(state{floats(d.batch * dim[1]), floats(d.batch * dim[2]), floats(d.batch * dim[3])});
  const w3_data* dp = &d;
  const std::string routine = B == 1 ? "cblas_sgemv" : "cblas_sgemm";
  candidates cs;
  for (const bool nk : {false, true}) {
    const std::string layout = nk ? "W [N,K]" : "W [K,N]";
    // 0: no epilogue (GEMMs alone); 1: epilogue on the calling thread; nt > 1: OpenMP rows.
    std::vector<int> epilogue_threads{1, 0};
    if (nt > 1 && B > 1) epilogue_threads.insert(epilogue_threads.begin(), nt);
    for (const int et : epilogue_threads) {
      const bool with_epilogue = et > 0;
      auto call = [=] {
        const auto& dim = w3_data::dim;
        const auto& w = nk ? dp->w_nk : dp->w_kn;
        state& s = *st;
        linear(dp->x.data(), B, dim[0], dim[1], w[0].data(), nk, s.h1.data());
        if (with_epilogue) epilogue(s.h1.data(), B, dim[1], dp->b[0].data(), true, et);
        linear(s.h1.data(), B, dim[1], dim[2], w[1].data(), nk, s.h2.data());
        if (with_epilogue) epilogue(s.h2.data(), B, dim[2], dp->b[1].data(), true, et);
        linear(s.h2.data(), B, dim[2], dim[3], w[2].data(), nk, s.out.data());
        if (with_epilogue) epilogue(s.out.data(), B, dim[3], dp->b[2].data(), false, et);
      };
      const std::string epi = !with_epilogue ? "no epilogue"
                              : et > 1       ? "plain bias+GELU pass (std::erf), omp rows x" + std::to_string(et)
                                             : "plain bias+GELU pass (std::erf), calling thread";
      cs.push_back({"openblas", with_epilogue ? "eager" : "gemm_only",
                    layout + ", " + routine + " + " + epi + ", openblas_set_num_threads(" + std::to_string(nt) + ")",
                    with_epilogue ? "" : "GEMMs alone, not a full W3c: not checked, not a peer in the targets",
                    [nt] { openblas_set_num_threads(nt); }, call,
                    [st, with_epilogue] {
                      return with_epilogue ? std::span<const float>(st->out.data(), st->out.size())
                                           : std::span<const float>();
                    },
                    st});
    }
  }
  return cs;
}

}  // namespace fusebox::bench
