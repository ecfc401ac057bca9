// The static CUDA path (backend/cuda/static_kernels.cuh): this unit is compiled by nvcc, so compile() on
// device tensors of static shape runs kernels nvcc instantiated from the plan at build time. On a
// GPU each case checks every output element against a double reference on random inputs, that
// the call took the static path (static_path::calls()) and compiled nothing (compiles forbidden:
// an NVRTC or host-compiler run would throw; the counters do not move), and that the run-time
// path (NVRTC, the same model on a dyn batch) gives the same numbers. Without a GPU (CI) the
// build is the test (the kernel templates instantiate for sm_90) and the cases skip, saying so.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/gpu.hpp"
#include "../support/profile_spans.hpp"

#if !defined(__CUDACC__)
#error "static_nvcc.cu must be compiled by nvcc"
#endif

namespace fb = fusebox;

namespace {

auto w1 = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x); };
auto w2 = [](auto x, auto g, auto b) { return fb::layer_norm(fb::softmax(x), g, b, 1e-5f); };
auto mlp = [](auto x, auto m, auto b) { return fb::gelu(fb::matmul(x, m) + b); };
auto row_max = [](auto x) { return std::make_tuple(fb::max(x, fb::axis<-1>), fb::exp(x) * 0.5f); };
auto cols = [](auto x, auto w) { return fb::sum(fb::exp(x) * w, fb::axis<0>); };

double gelu(double u) { return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0))); }

/// Largest relative error of y against r, every element: |y - r| / (|r| + 1e-3).
template <class T>
double worst(const T& y, const std::vector<double>& r) {
  REQUIRE(y.size() == r.size());
  double e = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double d = std::fabs(y.flat(i) - r[i]) / (std::fabs(r[i]) + 1e-3);
    if (!(d <= e)) e = d;
  }
  return e;
}
template <class T, class U>
double worst(const T& y, const U& z) {
  std::vector<double> r(z.size());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = z.flat(i);
  return worst(y, r);
}

/// x on the device as a tensor of shape S (a dyn batch: the run-time path's NVRTC kernels).
template <class S, class T>
fb::cuda::tensor<float, S> dev(const fb::tensor<float, T>& x) {
  return fb::cuda::tensor<float, S>(x.template reshape<S>());
}

/// Runs `call` with compiles forbidden and checks that it took the static path exactly once.
template <class F>
auto on_static_path(F&& call) {
  const auto before = fb::jit::counters().snapshot();
  const auto static_before = fb::cuda::static_path::calls().load();
  fb::jit::forbid_compiles(true);
  struct allow {
    ~allow() { fb::jit::forbid_compiles(false); }
  } a;
  auto y = call();
  fb::cuda::synchronize();
  CHECK(fb::cuda::static_path::calls().load() == static_before + 1);
  CHECK(fb::jit::counters().snapshot().compiles == before.compiles);  // zero NVRTC / host-compiler runs
  return y;
}

template <std::size_t R, std::size_t C>
void check_w1() {
  fb::tensor<float, fb::shape<R, C>> x;
  fb::tensor<float, fb::shape<C>> w, b;
  x.fill_random(R * 3 + C, -4.0f, 4.0f);
  w.fill_random(5, 0.5f, 1.5f);
  b.fill_random(6);
  auto fast = fb::compile(w1);
  const fb::cuda::tensor<float, fb::shape<R, C>> dx(x);
  const fb::cuda::tensor<float, fb::shape<C>> dw(w), db(b);
  const auto y = on_static_path([&] { return fast(dx, dw, db); }).to_host();
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double xv = x.flat(i), u = xv * w.flat(i % C) + b.flat(i % C);
    r[i] = gelu(u) / (1.0 + std::exp(-xv));
  }
  CHECK(worst(y, r) < 5e-5);  // float erff/expf near gelu's zero crossing (H100: 1.3e-5, NVRTC alike)
  // The run-time path (NVRTC) on the same numbers, through a dyn batch.
  const auto z = fast(dev<fb::shape<fb::dyn, C>>(x), dw, db).to_host();
  CHECK(worst(y, z) < 1e-6);
}

template <std::size_t R, std::size_t C>
void check_w2() {
  fb::tensor<float, fb::shape<R, C>> x;
  fb::tensor<float, fb::shape<C>> g, b;
  x.fill_random(R + 7 * C, -4.0f, 4.0f);
  g.fill_random(8, 0.5f, 1.5f);
  b.fill_random(9);
  auto fast = fb::compile(w2);
  const fb::cuda::tensor<float, fb::shape<R, C>> dx(x);
  const fb::cuda::tensor<float, fb::shape<C>> dg(g), db(b);
  const auto y = on_static_path([&] { return fast(dx, dg, db); }).to_host();
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < R; ++i) {
    double mx = -1e300, s = 0, mean = 0, var = 0;
    for (std::size_t j = 0; j < C; ++j) mx = std::max(mx, static_cast<double>(x.flat(i * C + j)));
    std::vector<double> p(C);
    for (std::size_t j = 0; j < C; ++j) s += p[j] = std::exp(x.flat(i * C + j) - mx);
    for (auto& v : p) mean += v /= s;
    mean /= C;
    for (auto v : p) var += (v - mean) * (v - mean);
    var /= C;
    for (std::size_t j = 0; j < C; ++j) r[i * C + j] = (p[j] - mean) / std::sqrt(var + 1e-5) * g.flat(j) + b.flat(j);
  }
  CHECK(worst(y, r) < 1e-3);  // (p - mean) cancels: float noise relative to the row's spread
  const auto z = fast(dev<fb::shape<fb::dyn, C>>(x), dg, db).to_host();
  CHECK(worst(y, z) < 1e-4);  // the reductions' order differs between the two paths
}

template <std::size_t R, std::size_t K, std::size_t C>
void check_mlp() {
  fb::tensor<float, fb::shape<R, K>> x;
  fb::tensor<float, fb::shape<K, C>> m;
  fb::tensor<float, fb::shape<C>> b;
  x.fill_random(11, -1.0f, 1.0f);
  m.fill_random(12, -0.2f, 0.2f);
  b.fill_random(13);
  auto fast = fb::compile(mlp);
  const fb::cuda::tensor<float, fb::shape<R, K>> dx(x);
  const fb::cuda::tensor<float, fb::shape<K, C>> dm(m);
  const fb::cuda::tensor<float, fb::shape<C>> db(b);
  const auto y = on_static_path([&] { return fast(dx, dm, db); }).to_host();
  std::vector<double> r(R * C);
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      double acc = b.flat(j);
      for (std::size_t k = 0; k < K; ++k) acc += static_cast<double>(x.flat(i * K + k)) * m.flat(k * C + j);
      r[i * C + j] = gelu(acc);
    }
  CHECK(worst(y, r) < 1e-4);
  const auto z = fast(dev<fb::shape<fb::dyn, K>>(x), dm, db).to_host();
  CHECK(worst(y, z) < 1e-5);
}

/// relu(x m + b), and x m + b + r: epilogues cuBLASLt takes whole on the static path as on the
/// run-time path (the schedule's library_epilogue): one span, the library call, every element
/// against a double reference.
template <std::size_t R, std::size_t K, std::size_t C>
void check_library_epilogues() {
  fb::tensor<float, fb::shape<R, K>> x;
  fb::tensor<float, fb::shape<K, C>> m;
  fb::tensor<float, fb::shape<C>> b;
  fb::tensor<float, fb::shape<R, C>> res;
  x.fill_random(21, -1.0f, 1.0f);
  m.fill_random(22, -0.2f, 0.2f);
  b.fill_random(23);
  res.fill_random(24);
  const fb::cuda::tensor<float, fb::shape<R, K>> dx(x);
  const fb::cuda::tensor<float, fb::shape<K, C>> dm(m);
  const fb::cuda::tensor<float, fb::shape<C>> db(b);
  const fb::cuda::tensor<float, fb::shape<R, C>> dres(res);
  // The product in double, and the sum of its terms' magnitudes (float's error bound scales with it).
  auto product = [&](std::size_t i, std::size_t j, double& mag) {
    double acc = 0;
    mag = 0;
    for (std::size_t k = 0; k < K; ++k) {
      const double t = static_cast<double>(x.flat(i * K + k)) * m.flat(k * C + j);
      acc += t;
      mag += std::fabs(t);
    }
    return acc;
  };
  auto relu_model = fb::compile([](auto a, auto w, auto c) { return fb::relu(fb::matmul(a, w) + c); });
  auto residual_model = fb::compile([](auto a, auto w, auto c, auto r) { return fb::matmul(a, w) + c + r; });
  (void)on_static_path([&] { return relu_model(dx, dm, db); });  // cuBLASLt's choice made
  (void)on_static_path([&] { return residual_model(dx, dm, db, dres); });
  fb::cuda::tensor<float, fb::shape<R, C>> y1, y2;
  const auto spans1 = fbt::profiled([&] { y1 = on_static_path([&] { return relu_model(dx, dm, db); }); });
  const auto spans2 = fbt::profiled([&] { y2 = on_static_path([&] { return residual_model(dx, dm, db, dres); }); });
  REQUIRE(spans1.size() == 1);
  CHECK(spans1[0] == "cuBLASLt matmul + epilogue (static path)");
  REQUIRE(spans2.size() == 1);
  CHECK(spans2[0] == "cuBLASLt matmul + epilogue (static path)");
  // Every element within float's bound for a K-term sum: K * 2^-24 of the terms' magnitudes
  // (plus the bias and residual), whatever order cuBLASLt sums in.
  const auto h1 = y1.to_host(), h2 = y2.to_host();
  int bad1 = 0, bad2 = 0;
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      double mag = 0;
      const double p = product(i, j, mag) + b.flat(j);
      const double res_ij = res.flat(i * C + j);
      const double bound = static_cast<double>(K) * 0x1p-24 * (mag + std::fabs(b.flat(j)) + std::fabs(res_ij)) + 1e-30;
      bad1 += !(std::fabs(h1.flat(i * C + j) - (p > 0 ? p : 0)) <= bound);
      bad2 += !(std::fabs(h2.flat(i * C + j) - (p + res_ij)) <= bound);
    }
  CHECK(bad1 == 0);
  CHECK(bad2 == 0);
}

}  // namespace

TEST_CASE("CUDA static path: fused elementwise, 16-byte and scalar entries", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  check_w1<65, 384>();  // rows a multiple of 4: float4 loads and stores
  check_w1<33, 37>();   // odd width: one element a thread
}

TEST_CASE("CUDA static path: softmax then layer_norm, a block per row", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  check_w2<17, 768>();
  check_w2<9, 101>();
}

TEST_CASE("CUDA static path: matmul through cuBLASLt with a bias + gelu epilogue", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  check_mlp<64, 256, 128>();
}

TEST_CASE("CUDA static path: cuBLASLt takes a bias + relu and a bias + residual epilogue whole", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  check_library_epilogues<64, 256, 128>();
}

TEST_CASE("CUDA static path: a row reduction as an output, beside an elementwise output", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  constexpr std::size_t R = 12, C = 300;
  fb::tensor<float, fb::shape<R, C>> x;
  x.fill_random(21, -3.0f, 3.0f);
  auto fast = fb::compile(row_max);
  const fb::cuda::tensor<float, fb::shape<R, C>> dx(x);
  const auto [mx, e] = on_static_path([&] { return fast(dx); });
  const auto hm = mx.to_host();
  const auto he = e.to_host();
  std::vector<double> rm(R), re(R * C);
  for (std::size_t i = 0; i < R; ++i) {
    double m = -1e300;
    for (std::size_t j = 0; j < C; ++j) {
      m = std::max(m, static_cast<double>(x.flat(i * C + j)));
      re[i * C + j] = 0.5 * std::exp(static_cast<double>(x.flat(i * C + j)));
    }
    rm[i] = m;
  }
  CHECK(worst(hm, rm) == 0);
  CHECK(worst(he, re) < 1e-5);
}

TEST_CASE("CUDA static path: a column reduction has no template and takes the run-time path", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  constexpr std::size_t R = 40, C = 24;
  fb::tensor<float, fb::shape<R, C>> x;
  fb::tensor<float, fb::shape<C>> w;
  x.fill_random(31, -2.0f, 2.0f);
  w.fill_random(32, 0.5f, 1.5f);
  auto fast = fb::compile(cols);
  const auto static_before = fb::cuda::static_path::calls().load();
  const auto y = fast(fb::cuda::tensor<float, fb::shape<R, C>>(x), fb::cuda::tensor<float, fb::shape<C>>(w)).to_host();
  CHECK(fb::cuda::static_path::calls().load() == static_before);
  std::vector<double> r(C, 0.0);
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) r[j] += std::exp(static_cast<double>(x.flat(i * C + j))) * w.flat(j);
  CHECK(worst(y, r) < 1e-5);
}
