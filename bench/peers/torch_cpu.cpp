// bench/peers/torch_cpu.cpp: the libtorch eager peer (Debian's libtorch 1.13) for W1c, W2c, W3c.
//
// Configuration (say it next to every number):
//   - ATen ops as a PyTorch user writes them, under c10::InferenceMode (no autograd records);
//     inputs wrap the shared arrays with at::from_blob (no copies); each call's result is kept
//     until the next call replaces it, as `y = f(x)` in a loop does.
//   - at::set_num_threads(threads) for ATen's OpenMP, and openblas_set_num_threads(threads) for the
//     OpenBLAS that this libtorch calls for float GEMM (BLAS_INFO=generic -> libblas.so.3).
//   - run_all runs with OMP_WAIT_POLICY=passive and glibc malloc tunables that keep freed memory
//     (BENCHMARKS.md: without them page faults on fresh temporaries and spinning OpenMP threads
//     cost libtorch 2-5x).
//   - W3c: both weight layouts, at::addmm(b, x, W^T) for nn.Linear's [N, K] (what at::linear runs)
//     and at::addmm(b, x, W) for [K, N], each followed by at::gelu (exact).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "../cpu_workloads.hpp"

extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_config(void);

namespace fusebox::bench {
namespace {

at::Tensor wrap(const floats& f, std::vector<int64_t> sizes) {
  return at::from_blob(const_cast<float*>(f.data()), sizes, at::TensorOptions().dtype(at::kFloat));
}

void set_threads(unsigned threads) {
  at::set_num_threads(static_cast<int>(threads));
  openblas_set_num_threads(static_cast<int>(threads));
}

std::string threading(unsigned threads) {
  return "at::set_num_threads(" + std::to_string(threads) + ")";
}

/// A candidate whose call keeps its result (as `y = f(x)` in a loop does) for the check.
template <class F>
candidate make(const std::string& config, unsigned threads, F f) {
  struct state {
    at::Tensor y;
  };
  auto st = std::make_shared<state>();
  return {"libtorch", "eager", config, "", [threads] { set_threads(threads); },
          [st, f] {
            c10::InferenceMode guard;
            st->y = f();
          },
          [st] {
            st->y = st->y.contiguous();
            return std::span<const float>(st->y.template data_ptr<float>(), static_cast<std::size_t>(st->y.numel()));
          },
          st};
}

}  // namespace

std::string torch_describe() {
  std::string cfg = at::show_config();
  std::string cap;
  if (auto p = cfg.find("CPU capability usage: "); p != std::string::npos)
    cap = cfg.substr(p + 22, cfg.find('\n', p) - p - 22);
  const char* omp = std::getenv("OMP_WAIT_POLICY");
  const char* tun = std::getenv("GLIBC_TUNABLES");
  const char* isa = std::getenv("ATEN_CPU_CAPABILITY");
  // The BLAS libtorch was built with (PyTorch's wheels: mkl; Debian's 1.13: generic, the system's
  // libblas.so.3, OpenBLAS on Debian 12 as in this process). The label used to give the OpenBLAS
  // peer's configuration whichever BLAS libtorch ran.
  std::string blas = "unknown";
  if (auto p = cfg.find("BLAS_INFO="); p != std::string::npos)
    blas = cfg.substr(p + 10, cfg.find_first_of(", \n", p + 10) - p - 10);
  if (blas == "open" || blas == "generic")
    blas += std::string(" (this process's OpenBLAS: ") + openblas_get_config() + ")";
  const char* mkl = std::getenv("MKL_ENABLE_INSTRUCTIONS");
  if (blas == "mkl" && mkl) blas += std::string(" (MKL_ENABLE_INSTRUCTIONS=") + mkl + ")";
  return std::string("libtorch ") + TORCH_VERSION + ", CPU capability " + cap + (isa ? std::string(" (ATEN_CPU_CAPABILITY=") + isa + ")" : "") +
         ", BLAS: " + blas + ", OMP_WAIT_POLICY=" + (omp ? omp : "(unset)") +
         ", GLIBC_TUNABLES=" + (tun ? tun : "(unset)");
}

candidates torch_w1(const w1_data& d, unsigned threads) {
  const auto R = static_cast<int64_t>(d.rows), C = static_cast<int64_t>(d.cols);
  const at::Tensor x = wrap(d.x, {R, C}), w = wrap(d.w, {C}), b = wrap(d.b, {C});
  return {make("at::gelu(x * w + b) * at::sigmoid(x), " + threading(threads), threads,
               [=] { return at::gelu(x * w + b) * at::sigmoid(x); })};
}

candidates torch_w2(const w2_data& d, unsigned threads) {
  const auto R = static_cast<int64_t>(d.rows), C = static_cast<int64_t>(d.cols);
  const at::Tensor x = wrap(d.x, {R, C}), g = wrap(d.gamma, {C}), b = wrap(d.beta, {C});
  const double eps = d.eps;
  return {make("at::layer_norm(at::softmax(x, -1), {C}, g, b, 1e-5), " + threading(threads), threads,
               [=] { return at::layer_norm(at::softmax(x, -1), {C}, g, b, eps); })};
}

candidates torch_w3(const w3_data& d, unsigned threads) {
  const auto& dim = w3_data::dim;
  const auto B = static_cast<int64_t>(d.batch);
  const at::Tensor x = wrap(d.x, {B, static_cast<int64_t>(dim[0])});
  std::array<at::Tensor, 3> wkn, wnk, b;
  for (int l = 0; l < 3; ++l) {
    const auto K = static_cast<int64_t>(dim[l]), N = static_cast<int64_t>(dim[l + 1]);
    wkn[l] = wrap(d.w_kn[l], {K, N});
    wnk[l] = wrap(d.w_nk[l], {N, K});
    b[l] = wrap(d.b[l], {N});
  }
  candidates cs;
  cs.push_back(make("W [N,K] (nn.Linear layout): at::addmm(b, x, W.t()) + at::gelu, " + threading(threads), threads,
                    [=] {
                      const at::Tensor h1 = at::gelu(at::addmm(b[0], x, wnk[0].t()));
                      const at::Tensor h2 = at::gelu(at::addmm(b[1], h1, wnk[1].t()));
                      return at::addmm(b[2], h2, wnk[2].t());
                    }));
  cs.push_back(make("W [K,N]: at::addmm(b, x, W) + at::gelu, " + threading(threads), threads, [=] {
    const at::Tensor h1 = at::gelu(at::addmm(b[0], x, wkn[0]));
    const at::Tensor h2 = at::gelu(at::addmm(b[1], h1, wkn[1]));
    return at::addmm(b[2], h2, wkn[2]);
  }));
  return cs;
}

}  // namespace fusebox::bench
