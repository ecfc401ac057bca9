// Compiled models on the CUDA backend, through the public compile() with cuda::tensor arguments:
// the reference workloads' structures (elementwise with row broadcasts, softmax + layer_norm,
// matmul + bias + GELU, column reductions) at widths that take the 16-byte vector entry and widths
// that take the scalar one, a batch that changes (symbolic recompile), against double-precision
// references, every element. Every case needs a GPU: where the build found none
// (FUSEBOX_TEST_CUDA_DEVICE=OFF, as on CI) this file is only compiled, -fsyntax-only
// (tests/CMakeLists.txt); what runs without a GPU, the NVRTC build of every kernel of these models
// and the unavailable backend's error, is tests/cuda/codegen.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/gpu.hpp"
#include "models.hpp"

namespace fb = fusebox;

namespace {

using fbt::cuda_models::cols;
using fbt::cuda_models::mlp;
using fbt::cuda_models::w1;
using fbt::cuda_models::w2;

double gelu(double u) { return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0))); }

/// Relative error of y against reference r, element by element: max |y - r| / (|r| + 1e-3).
template <class T>
double worst(const T& y, const std::vector<double>& r, std::size_t* at = nullptr) {
  REQUIRE(y.size() == r.size());
  double e = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double d = std::fabs(y.flat(i) - r[i]) / (std::fabs(r[i]) + 1e-3);
    if (!(d <= e)) {
      e = d;
      if (at) *at = i;
    }
  }
  return e;
}

/// W1's inputs on the device (x in [-4, 4], w in [0.5, 1.5]) and its double reference.
template <std::size_t C>
struct w1_case {
  fb::cuda::tensor<float, fb::shape<fb::dyn, C>> dx;
  fb::cuda::tensor<float, fb::shape<C>> dw, db;
  std::vector<double> r;
  w1_case(std::size_t rows, std::uint64_t seed) : dx(rows), dw(), db() {
    fb::tensor<float, fb::shape<fb::dyn, C>> x(rows);
    fb::tensor<float, fb::shape<C>> w, b;
    x.fill_random(seed, -4.0f, 4.0f);
    w.fill_random(seed + 1, 0.5f, 1.5f);
    b.fill_random(seed + 2);
    dx.upload(x), dw.upload(w), db.upload(b);
    r.resize(x.size());
    for (std::size_t i = 0; i < r.size(); ++i) {
      const double xv = x.flat(i), u = xv * w.flat(i % C) + b.flat(i % C);
      r[i] = gelu(u) / (1.0 + std::exp(-xv));
    }
  }
};

template <std::size_t C>
void check_w1(std::size_t rows) {
  fb::tensor<float, fb::shape<fb::dyn, C>> x(rows);
  fb::tensor<float, fb::shape<C>> w, b;
  x.fill_random(rows * 3 + C);
  w.fill_random(5, 0.5f, 1.5f);
  b.fill_random(6);
  auto fast = fb::compile(w1);
  const auto y = fast(fb::cuda::tensor<float, fb::shape<fb::dyn, C>>(x), fb::cuda::tensor<float, fb::shape<C>>(w),
                      fb::cuda::tensor<float, fb::shape<C>>(b))
                     .to_host();
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double xv = x.flat(i), u = xv * w.flat(i % C) + b.flat(i % C);
    r[i] = gelu(u) / (1.0 + std::exp(-xv));
  }
  CHECK(worst(y, r) < 1e-5);
}

template <std::size_t C>
void check_w2(std::size_t rows) {
  fb::tensor<float, fb::shape<fb::dyn, C>> x(rows);
  fb::tensor<float, fb::shape<C>> g, b;
  x.fill_random(rows + 7 * C, -4.0f, 4.0f);
  g.fill_random(8, 0.5f, 1.5f);
  b.fill_random(9);
  auto fast = fb::compile(w2);
  const auto y = fast(fb::cuda::tensor<float, fb::shape<fb::dyn, C>>(x), fb::cuda::tensor<float, fb::shape<C>>(g),
                      fb::cuda::tensor<float, fb::shape<C>>(b))
                     .to_host();
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < rows; ++i) {
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
}

}  // namespace

TEST_CASE("CUDA: elementwise with row broadcasts, vector and scalar entries", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  check_w1<384>(65);  // width a multiple of 4: 16-byte accesses
  check_w1<37>(33);   // odd width: the scalar entry
  check_w1<1>(9);
}

TEST_CASE("CUDA: softmax then layer_norm, a block per row, or a warp per row for short rows", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  check_w2<4096>(17);
  check_w2<1003>(5);
  // Rows of at most 128 vectors: a warp each, four a block; row counts that leave a block's last
  // warps without a row, and an odd width (the scalar entry).
  check_w2<32>(64);
  check_w2<512>(37);
  check_w2<300>(6);
  check_w2<77>(3);
}

TEST_CASE("CUDA: matmul through cuBLASLt with a fused epilogue kernel; the batch changes", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  fb::tensor<float, fb::shape<96, 80>> m;
  fb::tensor<float, fb::shape<80>> b;
  m.fill_random(11, -0.2f, 0.2f);
  b.fill_random(12);
  const fb::cuda::tensor<float, fb::shape<96, 80>> dm(m);
  const fb::cuda::tensor<float, fb::shape<80>> db(b);
  auto fast = fb::compile(mlp);
  for (std::size_t rows : {33u, 7u, 200u}) {
    fb::tensor<float, fb::shape<fb::dyn, 96>> x(rows);
    x.fill_random(rows);
    const auto y = fast(fb::cuda::tensor<float, fb::shape<fb::dyn, 96>>(x), dm, db).to_host();
    std::vector<double> r(rows * 80);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < 80; ++j) {
        double s = b.flat(j);
        for (std::size_t k = 0; k < 96; ++k) s += static_cast<double>(x.flat(i * 96 + k)) * m.flat(k * 80 + j);
        r[i * 80 + j] = gelu(s);
      }
    INFO("rows " << rows);
    CHECK(worst(y, r) < 1e-4);
  }
  CHECK(fast.recompiles() == 1);  // 33 -> 7 makes the batch symbolic; 200 reuses it
}

namespace {

/// mlp's reference in double: gelu(x m + b), x [rows, K], m [K, C].
template <class X, class M, class B>
std::vector<double> mlp_reference(const X& x, const M& m, const B& b) {
  const std::size_t rows = x.extent(0), k_in = x.extent(1), cols = m.extent(1);
  std::vector<double> r(rows * cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      double s = b.flat(j);
      for (std::size_t k = 0; k < k_in; ++k) s += static_cast<double>(x.flat(i * k_in + k)) * m.flat(k * cols + j);
      r[i * cols + j] = gelu(s);
    }
  return r;
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a.flat(i), &b.flat(i), sizeof(float)) != 0) return false;
  return true;
}

/// A layer's weights [K, C] and bias [C]: random on the host, uploaded once.
template <std::size_t K, std::size_t C>
struct layer_params {
  fb::tensor<float, fb::shape<K, C>> m;
  fb::tensor<float, fb::shape<C>> b;
  fb::cuda::tensor<float, fb::shape<K, C>> dm;
  fb::cuda::tensor<float, fb::shape<C>> db;
  layer_params(std::uint64_t seed, float weight_range, float bias_range = 1.0f)
      : m(random<decltype(m)>(seed, weight_range)), b(random<decltype(b)>(seed + 1, bias_range)), dm(m), db(b) {}

 private:
  template <class H>
  static H random(std::uint64_t seed, float range) {
    H h;
    h.fill_random(seed, -range, range);
    return h;
  }
};

}  // namespace

TEST_CASE("CUDA: reduce_overhead replays CUDA graphs: same bits as the default mode; new data, tensors, sizes",
          "[cuda][cudagraphs]") {
  FUSEBOX_REQUIRE_GPU();
  // Sizes no other case here uses, so the device block cache hands a freed output block back.
  constexpr std::size_t K = 88, C = 72;
  using X = fb::cuda::tensor<float, fb::shape<fb::dyn, K>>;
  const layer_params<K, C> w(31, 0.2f);
  const auto& [m, b, dm, db] = w;
  auto graphs = fb::compile(mlp, fb::options{.mode = fb::mode::reduce_overhead});
  auto plain = fb::compile(mlp);
  auto& counters = fb::jit::counters();

  fb::tensor<float, fb::shape<fb::dyn, K>> x(41);
  x.fill_random(33);
  X dx(x);
  auto r = mlp_reference(x, m, b);
  const auto want = plain(dx, dm, db).to_host();
  CHECK(worst(want, r) < 1e-4);

  // The same arguments six times: a graph per distinct output address (the block cache usually
  // returns the block freed by the previous iteration), replays for the rest.
  const auto before = counters.snapshot();
  std::vector<const float*> outputs;
  for (int call = 0; call < 6; ++call) {
    const auto y = graphs(dx, dm, db);
    if (std::find(outputs.begin(), outputs.end(), y.data()) == outputs.end()) outputs.push_back(y.data());
    INFO("call " << call);
    CHECK(same_bits(y.to_host(), want));
  }
  const auto after = counters.snapshot();
  CHECK(after.graph_captures - before.graph_captures == outputs.size());
  CHECK(after.graph_replays - before.graph_replays == 6 - outputs.size());
  REQUIRE(after.graph_replays > before.graph_replays);  // the replay path ran at all

  // New values in the same tensor: a replay reads them.
  x.fill_random(34);
  dx.upload(x);
  r = mlp_reference(x, m, b);
  {
    const auto replays = counters.snapshot().graph_replays;
    const auto y = graphs(dx, dm, db).to_host();
    CHECK(worst(y, r) < 1e-4);
    CHECK(same_bits(y, plain(dx, dm, db).to_host()));
    CHECK(counters.snapshot().graph_replays == replays + 1);
  }

  // Another tensor (another address) and another batch (another specialisation): recorded anew.
  X dx2(x);
  CHECK(worst(graphs(dx2, dm, db).to_host(), r) < 1e-4);
  fb::tensor<float, fb::shape<fb::dyn, K>> x7(7);
  x7.fill_random(35);
  CHECK(worst(graphs(X(x7), dm, db).to_host(), mlp_reference(x7, m, b)) < 1e-4);
}

TEST_CASE("CUDA: reduce_overhead: the graph cap updates graphs in place; scalars and size lists are honoured",
          "[cuda][cudagraphs]") {
  FUSEBOX_REQUIRE_GPU();
  constexpr std::size_t K = 40, C = 24;
  using X = fb::cuda::tensor<float, fb::shape<fb::dyn, K>>;
  const layer_params<K, C> w(41, 0.3f);
  const auto& [m, b, dm, db] = w;
  auto& counters = fb::jit::counters();

  // Cap 2, three live input tensors: the third call writes over the older graph of its shape.
  auto capped = fb::compile(mlp, fb::options{.mode = fb::mode::reduce_overhead, .cudagraph_cap = 2});
  std::vector<fb::tensor<float, fb::shape<fb::dyn, K>>> xs;
  std::vector<X> dxs;
  for (int i = 0; i < 3; ++i) {
    xs.emplace_back(19);
    xs.back().fill_random(43 + i);
    dxs.emplace_back(xs.back());
  }
  const auto before = counters.snapshot();
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 3; ++i) {
      INFO("round " << round << ", input " << i);
      CHECK(worst(capped(dxs[i], dm, db).to_host(), mlp_reference(xs[i], m, b)) < 1e-4);
    }
  const auto after = counters.snapshot();
  CHECK(after.graph_captures - before.graph_captures == 6);  // no signature survives a cycle of three in two slots
  CHECK(after.graph_updates - before.graph_updates == 4);    // calls past the cap update in place

  // A scalar argument is part of what a graph bakes in: a new value is a new recording.
  auto scale = fb::compile([](auto x, float a) { return x * a + 1.0f; }, fb::options{.mode = fb::mode::reduce_overhead});
  for (float a : {2.0f, -3.0f, 2.0f}) {
    const auto y = scale(dxs[0], a).to_host();
    std::vector<double> r(xs[0].size());
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = static_cast<double>(xs[0].flat(i)) * a + 1.0;
    INFO("a = " << a);
    CHECK(worst(y, r) < 1e-6);
  }

  // With a size list, other batch sizes run without a graph.
  auto listed = fb::compile(mlp, fb::options{.mode = fb::mode::reduce_overhead});
  listed.cudagraph_sizes(0, 0, {19});
  fb::tensor<float, fb::shape<fb::dyn, K>> x5(5);
  x5.fill_random(47);
  const auto captures = counters.snapshot().graph_captures;
  CHECK(worst(listed(X(x5), dm, db).to_host(), mlp_reference(x5, m, b)) < 1e-4);
  CHECK(counters.snapshot().graph_captures == captures);
  CHECK(worst(listed(dxs[1], dm, db).to_host(), mlp_reference(xs[1], m, b)) < 1e-4);
  CHECK(counters.snapshot().graph_captures == captures + 1);
  listed.cudagraph_sizes(3, 0, {1});
  CHECK_THROWS_WITH(listed(dxs[1], dm, db), Catch::Contains("cudagraph_sizes names argument 3"));
}

TEST_CASE("CUDA: max_autotune times cuBLASLt's candidates once per problem, then replays graphs", "[cuda][autotune]") {
  FUSEBOX_REQUIRE_GPU();
  constexpr std::size_t K = 136, C = 104;  // a problem no other case tunes
  const layer_params<K, C> w(51, 0.2f);
  const auto& [m, b, dm, db] = w;
  auto& tuner = fb::jit::lt_tuner::instance();
  const auto tuned0 = tuner.timed() + tuner.from_disk();
  auto tuned = fb::compile(mlp, fb::options{.mode = fb::mode::max_autotune});
  fb::tensor<float, fb::shape<fb::dyn, K>> x(57);
  x.fill_random(53);
  const fb::cuda::tensor<float, fb::shape<fb::dyn, K>> dx(x);
  const auto r = mlp_reference(x, m, b);
  const auto graphs0 = fb::jit::counters().snapshot().graph_captures;
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    CHECK(worst(tuned(dx, dm, db).to_host(), r) < 1e-4);
  }
  CHECK(tuner.timed() + tuner.from_disk() == tuned0 + 1);  // one problem, chosen once
  CHECK(fb::jit::counters().snapshot().graph_captures > graphs0);  // calls after the first replay graphs
  // Another function with the same problem takes the choice already made.
  auto again = fb::compile(mlp, fb::options{.mode = fb::mode::max_autotune});
  CHECK(worst(again(dx, dm, db).to_host(), r) < 1e-4);
  CHECK(tuner.timed() + tuner.from_disk() == tuned0 + 1);
}

TEST_CASE("CUDA: max_autotune times the launch configurations of a generated kernel once per kernel and shape",
          "[cuda][autotune]") {
  FUSEBOX_REQUIRE_GPU();
  const w1_case<328> c(70, 64);  // a width no other case uses: a kernel the tuner has not seen
  const auto& [dx, dw, db, r] = c;
  auto& tuner = fb::jit::kernel_tuner::instance();
  const auto chosen0 = tuner.timed() + tuner.from_disk();
  auto tuned = fb::compile(w1, fb::options{.mode = fb::mode::max_autotune});
  const auto plain = fb::compile(w1)(dx, dw, db).to_host();
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    const auto y = tuned(dx, dw, db).to_host();
    CHECK(worst(y, r) < 3e-5);
    CHECK(same_bits(y, plain));  // an elementwise kernel computes each element alike under any launch
  }
  CHECK(tuner.timed() + tuner.from_disk() == chosen0 + 1);  // one kernel and shape, chosen once
  // Another function with the same kernel and shape takes the choice already made.
  auto again = fb::compile(w1, fb::options{.mode = fb::mode::max_autotune});
  CHECK(same_bits(again(dx, dw, db).to_host(), plain));
  CHECK(tuner.timed() + tuner.from_disk() == chosen0 + 1);
}

TEST_CASE("CUDA: fast_math compiles its own kernels (NVRTC --use_fast_math) and stays close to the reference",
          "[cuda][fast_math]") {
  FUSEBOX_REQUIRE_GPU();
  const w1_case<264> c(45, 61);
  const auto& [dx, dw, db, r] = c;
  auto faithful = fb::compile(w1);
  auto fast = fb::compile(w1, fb::options{.fast_math = true});
  CHECK(worst(faithful(dx, dw, db).to_host(), r) < 3e-5);  // float rounding near the output's zeros
  const auto before = fb::jit::counters().snapshot();
  const auto y = fast(dx, dw, db).to_host();
  const auto after = fb::jit::counters().snapshot();
  CHECK(after.misses == before.misses + 1);  // its own unit (another key), not the faithful one's
  CHECK(after.hits == before.hits);
  CHECK(worst(y, r) < 1e-4);  // approximate exp, erf and division: a few ulp, not a different function
}

TEST_CASE("CUDA: matmul + bias runs as one cuBLASLt call with its bias epilogue", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  auto affine = [](auto x, auto m, auto b) { return fb::matmul(x, m) + b; };
  auto affine_swapped = [](auto x, auto m, auto b) { return b + fb::matmul(x, m); };
  constexpr std::size_t K = 72, C = 56;
  const layer_params<K, C> w(71, 0.3f, 2.0f);
  const auto& [m, b, dm, db] = w;
  auto one = fb::compile(affine);
  auto two = fb::compile(affine_swapped);
  // The path taken: cuBLASLt with its bias epilogue, and no epilogue kernel after it.
  auto epilogue_path = [&](auto& f, const auto& dx) {
    fb::profile::start();
    (void)f(dx, dm, db).to_host();
    fb::profile::stop();
    bool lt_bias = false, epilogue_kernel = false;
    for (const auto& e : fb::profile::events()) {
      lt_bias = lt_bias || e.name == "cuBLASLt matmul + bias";
      epilogue_kernel = epilogue_kernel || (e.category == "kernel" && e.name.rfind("matmul epilogue", 0) == 0);
    }
    fb::profile::clear();
    return lt_bias && !epilogue_kernel;
  };
  for (std::size_t rows : {std::size_t{1}, std::size_t{31}}) {
    fb::tensor<float, fb::shape<fb::dyn, K>> x(rows);
    x.fill_random(73 + rows);
    const fb::cuda::tensor<float, fb::shape<fb::dyn, K>> dx(x);
    std::vector<double> r(rows * C);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < C; ++j) {
        double acc = b.flat(j);
        for (std::size_t k = 0; k < K; ++k) acc += static_cast<double>(x.flat(i * K + k)) * m.flat(k * C + j);
        r[i * C + j] = acc;
      }
    INFO("rows " << rows);
    CHECK(worst(one(dx, dm, db).to_host(), r) < 1e-4);  // float sums of 72 products, as the mlp case
    CHECK(worst(two(dx, dm, db).to_host(), r) < 1e-4);
    CHECK(epilogue_path(one, dx));
    CHECK(epilogue_path(two, dx));
  }
}

TEST_CASE("CUDA: relu, tanh-GELU and residuals after matmul (+ bias) run in cuBLASLt's epilogue; erf GELU does not",
          "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  constexpr std::size_t K = 64, C = 48, R = 37;
  const layer_params<K, C> w(81, 0.3f, 1.0f);
  const auto& [m, b, dm, db] = w;
  fb::tensor<float, fb::shape<fb::dyn, K>> x(R);
  x.fill_random(82);
  const fb::cuda::tensor<float, fb::shape<fb::dyn, K>> dx(x);
  std::vector<double> u(R * C);  // x·m + b in double
  for (std::size_t i = 0; i < R; ++i)
    for (std::size_t j = 0; j < C; ++j) {
      double acc = b.flat(j);
      for (std::size_t k = 0; k < K; ++k) acc += static_cast<double>(x.flat(i * K + k)) * m.flat(k * C + j);
      u[i * C + j] = acc;
    }
  auto tanh_gelu = [](double v) { return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); };
  // Which span ran the product, and whether an epilogue kernel followed it.
  auto path = [&](auto&& call) {
    fb::profile::start();
    call();
    fb::cuda::synchronize();
    fb::profile::stop();
    std::string lt;
    bool epilogue_kernel = false;
    for (const auto& e : fb::profile::events()) {
      if (e.name.rfind("cuBLASLt", 0) == 0) lt = e.name;
      epilogue_kernel = epilogue_kernel || (e.category == "kernel" && e.name.rfind("matmul epilogue", 0) == 0);
    }
    fb::profile::clear();
    return lt + (epilogue_kernel ? " then an epilogue kernel" : "");
  };
  auto gelu_bias = fb::compile([](auto a, auto mm, auto bb) { return fb::gelu_tanh(fb::matmul(a, mm) + bb); });
  auto relu_only = fb::compile([](auto a, auto mm) { return fb::relu(fb::matmul(a, mm)); });
  auto erf_gelu = fb::compile(mlp);
  fb::cuda::tensor<float, fb::shape<fb::dyn, C>> y(R);
  CHECK(path([&] { y = gelu_bias(dx, dm, db); }) == "cuBLASLt matmul + bias + gelu_tanh");
  std::vector<double> r(R * C);
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = tanh_gelu(u[i]);
  CHECK(worst(y.to_host(), r) < 1e-4);
  CHECK(path([&] { y = relu_only(dx, dm); }) == "cuBLASLt matmul + relu");
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = std::max(0.0, u[i] - b.flat(i % C));
  CHECK(worst(y.to_host(), r) < 1e-4);
  CHECK(path([&] { y = erf_gelu(dx, dm, db); }) == "cuBLASLt matmul then an epilogue kernel");
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = gelu(u[i]);
  CHECK(worst(y.to_host(), r) < 1e-4);
  // A residual (a matrix laid out as the product) is cuBLASLt's beta·C: x + product + bias is one
  // call; relu(product + bias) + x is not (cuBLASLt adds C before its activation).
  fb::tensor<float, fb::shape<fb::dyn, C>> res(R);
  res.fill_random(83);
  const fb::cuda::tensor<float, fb::shape<fb::dyn, C>> dres(res);
  auto residual = fb::compile([](auto a, auto mm, auto bb, auto xr) { return xr + fb::matmul(a, mm) + bb; });
  auto relu_then_residual = fb::compile([](auto a, auto mm, auto bb, auto xr) { return fb::relu(fb::matmul(a, mm) + bb) + xr; });
  CHECK(path([&] { y = residual(dx, dm, db, dres); }) == "cuBLASLt matmul + residual + bias");
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = u[i] + res.flat(i);
  CHECK(worst(y.to_host(), r) < 1e-4);
  CHECK(path([&] { y = relu_then_residual(dx, dm, db, dres); }) == "cuBLASLt matmul then an epilogue kernel");
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = std::max(0.0, u[i]) + res.flat(i);
  CHECK(worst(y.to_host(), r) < 1e-4);
}

TEST_CASE("CUDA: transposed matmul operands are read by cuBLASLt as they are, batched too", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  // a · wᵀ (a linear layer stored [out, in]), aᵀ · b, and batched q · kᵀ (attention scores).
  auto linear = [](auto a, auto w) { return fb::matmul(a, fb::transpose(w)); };
  auto gram = [](auto a, auto b) { return fb::matmul(fb::transpose(a), b); };
  auto scores = [](auto q, auto k) { return fb::matmul(q, fb::transpose<1, 2>(k)); };
  fb::tensor<float, fb::shape<fb::dyn, 40>> a(23);
  fb::tensor<float, fb::shape<28, 40>> w;
  fb::tensor<float, fb::shape<fb::dyn, 36>> b(23);
  fb::tensor<float, fb::shape<3, 17, 24>> q, k;
  a.fill_random(81);
  w.fill_random(82);
  b.fill_random(83);
  q.fill_random(84);
  k.fill_random(85);
  auto ref = [](std::size_t M, std::size_t N, std::size_t K, auto at_a, auto at_b) {
    std::vector<double> r(M * N);
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        double acc = 0;
        for (std::size_t t = 0; t < K; ++t) acc += static_cast<double>(at_a(i, t)) * at_b(t, j);
        r[i * N + j] = acc;
      }
    return r;
  };
  const fb::cuda::tensor<float, fb::shape<fb::dyn, 40>> da(a);
  const fb::cuda::tensor<float, fb::shape<28, 40>> dw(w);
  const fb::cuda::tensor<float, fb::shape<fb::dyn, 36>> db(b);
  CHECK(worst(fb::compile(linear)(da, dw).to_host(),
              ref(23, 28, 40, [&](auto i, auto t) { return a.flat(i * 40 + t); }, [&](auto t, auto j) { return w.flat(j * 40 + t); })) <
        1e-4);
  CHECK(worst(fb::compile(gram)(da, db).to_host(),
              ref(40, 36, 23, [&](auto i, auto t) { return a.flat(t * 40 + i); }, [&](auto t, auto j) { return b.flat(t * 36 + j); })) <
        1e-4);
  const auto s = fb::compile(scores)(fb::cuda::tensor<float, fb::shape<3, 17, 24>>(q),
                                     fb::cuda::tensor<float, fb::shape<3, 17, 24>>(k))
                     .to_host();
  REQUIRE(s.size() == 3 * 17 * 17);
  for (std::size_t h = 0; h < 3; ++h) {
    const auto r = ref(17, 17, 24, [&](auto i, auto t) { return q.flat(h * 408 + i * 24 + t); },
                       [&](auto t, auto j) { return k.flat(h * 408 + j * 24 + t); });
    for (std::size_t e = 0; e < r.size(); ++e) {
      INFO("head " << h << ", element " << e);
      CHECK(std::fabs(s.flat(h * 289 + e) - r[e]) <= 1e-4 * (std::fabs(r[e]) + 1e-3) + 1e-5);
    }
  }
}

TEST_CASE("CUDA: column reductions, the reduced axis split over a block's threads", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  fb::tensor<float, fb::shape<fb::dyn, 300>> x(77);
  fb::tensor<float, fb::shape<300>> w;
  x.fill_random(21);
  w.fill_random(22);
  auto fast = fb::compile(cols);
  const auto y = fast(fb::cuda::tensor<float, fb::shape<fb::dyn, 300>>(x), fb::cuda::tensor<float, fb::shape<300>>(w))
                     .to_host();
  std::vector<double> r(300, 0.0);
  for (std::size_t i = 0; i < 77; ++i)
    for (std::size_t j = 0; j < 300; ++j) r[j] += std::exp(static_cast<double>(x.flat(i * 300 + j))) * w.flat(j);
  CHECK(worst(y, r) < 1e-5);

  // Over the first axis of a rank-3 tensor (W4's sum over heads): every output element its thread.
  fb::tensor<float, fb::shape<5, 33, 70>> z;
  z.fill_random(23);
  const auto heads = fb::compile([](auto t) { return fb::sum(t, fb::axis<0>); })(fb::cuda::tensor<float, fb::shape<5, 33, 70>>(z))
                         .to_host();
  std::vector<double> rz(33 * 70, 0.0);
  for (std::size_t h = 0; h < 5; ++h)
    for (std::size_t e = 0; e < rz.size(); ++e) rz[e] += z.flat(h * rz.size() + e);
  CHECK(worst(heads, rz) < 1e-4);  // sums of five terms near zero: float rounding (1.2e-5 measured)

  // A known axis of 256 (W5's bias gradients): eight threads an output, each every eighth row,
  // combined in order; mean's finalize and max's combine over the partials; 333 outputs leave the
  // last block's tile partly empty.
  fb::tensor<float, fb::shape<256, 333>> u;
  u.fill_random(24);
  const fb::cuda::tensor<float, fb::shape<256, 333>> du(u);
  const auto mean = fb::compile([](auto t) { return fb::mean(t * t, fb::axis<0>); })(du).to_host();
  const auto top = fb::compile([](auto t) { return fb::max(t, fb::axis<0>); })(du).to_host();
  std::vector<double> rm(333, 0.0), rt(333, -1e300);
  for (std::size_t i = 0; i < 256; ++i)
    for (std::size_t j = 0; j < 333; ++j) {
      const double e = u.flat(i * 333 + j);
      rm[j] += e * e / 256.0;
      rt[j] = std::max(rt[j], e);
    }
  CHECK(worst(mean, rm) < 1e-5);
  CHECK(worst(top, rt) == 0.0);
}

TEST_CASE("CUDA: bfloat16 storage, float32 arithmetic: elementwise, row reductions, matmul", "[cuda][bf16]") {
  FUSEBOX_REQUIRE_GPU();
  using bf = fb::bfloat16;
  fb::tensor<float, fb::shape<fb::dyn, 256>> x(48);
  fb::tensor<float, fb::shape<256, 128>> m;
  fb::tensor<float, fb::shape<256>> w, b;
  fb::tensor<float, fb::shape<128>> c;
  x.fill_random(31);
  m.fill_random(32, -0.1f, 0.1f);
  w.fill_random(33, 0.5f, 1.5f);
  b.fill_random(34);
  c.fill_random(35);
  // The reference reads the inputs as the device holds them: rounded to bfloat16.
  auto round = [](float v) { return static_cast<double>(bf::from_float(v).to_float()); };
  const fb::cuda::tensor<bf, fb::shape<fb::dyn, 256>> dx(x);
  const fb::cuda::tensor<bf, fb::shape<256>> dw(w), db(b);
  const fb::cuda::tensor<bf, fb::shape<256, 128>> dm(m);
  const fb::cuda::tensor<bf, fb::shape<128>> dc(c);
  {
    auto fast = fb::compile(w1);
    const auto y = fast(dx, dw, db).to_host();
    std::vector<double> r(x.size());
    for (std::size_t i = 0; i < r.size(); ++i) {
      const double xv = round(x.flat(i)), u = xv * round(w.flat(i % 256)) + round(b.flat(i % 256));
      r[i] = gelu(u) / (1.0 + std::exp(-xv));
    }
    CHECK(worst(y, r) < 1e-2);  // one rounding of the result to bfloat16 (2^-8 relative)
  }
  {
    auto fast = fb::compile(mlp);
    const auto y = fast(dx, dm, dc).to_host();
    std::vector<double> r(48 * 128);
    for (std::size_t i = 0; i < 48; ++i)
      for (std::size_t j = 0; j < 128; ++j) {
        double s = round(c.flat(j));
        for (std::size_t k = 0; k < 256; ++k) s += round(x.flat(i * 256 + k)) * round(m.flat(k * 128 + j));
        r[i * 128 + j] = gelu(s);
      }
    double num = 0, den = 0;  // the product is rounded to bfloat16 before the epilogue: norm-wise
    for (std::size_t i = 0; i < r.size(); ++i) {
      num += (y.flat(i) - r[i]) * (y.flat(i) - r[i]);
      den += r[i] * r[i];
    }
    CHECK(std::sqrt(num / den) < 1e-2);
  }
}

namespace {
/// softmax(q·kᵀ/sqrt(E), causal) · v in double for [B, T, H, E] host tensors (bfloat16-rounded
/// values where `round`), every output element.
template <class Q, class K, class V, class R>
std::vector<double> attention_reference(const Q& q, const K& k, const V& v, bool causal, R round) {
  const auto qs = q.extents(), ks = k.extents(), vs = v.extents();
  const std::size_t B = qs[0], T = qs[1], H = qs[2], E = qs[3], TK = ks[1], EV = vs[3];
  std::vector<double> out(B * T * H * EV, 0.0);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        std::vector<double> s(TK, 0.0);
        double mx = -1e300, sum = 0;
        const std::size_t keys = causal ? i + 1 : TK;
        for (std::size_t j = 0; j < keys; ++j) {
          double d = 0;
          for (std::size_t e = 0; e < E; ++e)
            d += round(q.flat(((b * T + i) * H + h) * E + e)) * round(k.flat(((b * TK + j) * H + h) * E + e));
          s[j] = d / std::sqrt(static_cast<double>(E));
          mx = std::max(mx, s[j]);
        }
        for (std::size_t j = 0; j < keys; ++j) sum += s[j] = std::exp(s[j] - mx);
        for (std::size_t j = 0; j < keys; ++j)
          for (std::size_t e = 0; e < EV; ++e)
            out[((b * T + i) * H + h) * EV + e] += s[j] / sum * round(v.flat(((b * TK + j) * H + h) * EV + e));
      }
  return out;
}

/// Names of the device steps of one call (profile device timing).
template <class F>
std::vector<std::string> device_steps(F&& call) {
  fb::profile::start();
  fb::profile::set_device_timing(true);
  call();
  fb::cuda::synchronize();
  fb::profile::set_device_timing(false);
  fb::profile::stop();
  std::vector<std::string> names;
  for (const auto& e : fb::profile::events())
    if (e.category == "device") names.push_back(e.name);
  return names;
}

/// Largest |y - r| over max |r|: attention's outputs are averages of v, so the error is judged
/// against v's scale, not element by element (an output near 0 has no relative precision).
template <class Y>
double scaled_error(const Y& y, const std::vector<double>& r) {
  REQUIRE(y.size() == r.size());
  double num = 0, den = 1e-30;
  for (std::size_t i = 0; i < r.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(y.flat(i)) - r[i]));
    den = std::max(den, std::fabs(r[i]));
  }
  return num / den;
}
}  // namespace

TEST_CASE("CUDA: attention, flash kernel on tensor cores for bfloat16 and float16; generic for float32 and odd "
          "head dims", "[cuda][attention]") {
  FUSEBOX_REQUIRE_GPU();
  using bf = fb::bfloat16;
  auto round_bf = [](float v) { return static_cast<double>(bf::from_float(v).to_float()); };
  auto exact = [](float v) { return static_cast<double>(v); };
  auto full = [](auto q, auto k, auto v) { return fb::attention(q, k, v); };
  auto masked = [](auto q, auto k, auto v) { return fb::attention(q, k, v, fb::causal); };
  // 200 tokens: a partial last tile of 64 queries and of 64 keys.
  constexpr std::size_t T = 200, H = 3, E = 64;
  fb::tensor<float, fb::shape<fb::dyn, T, H, E>> q(2), k(2), v(2);
  q.fill_random(61, -2.0f, 2.0f), k.fill_random(62, -2.0f, 2.0f), v.fill_random(63);
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "full"));
    const auto want_bf = attention_reference(q, k, v, causal, round_bf);
    const fb::cuda::tensor<bf, fb::shape<fb::dyn, T, H, E>> dq(q), dk(k), dv(v);
    fb::cuda::tensor<bf, fb::shape<fb::dyn, T, H, E>> y(2);
    auto run = [&] { y = causal ? fb::compile(masked)(dq, dk, dv) : fb::compile(full)(dq, dk, dv); };
    const auto steps = device_steps(run);
    REQUIRE(steps.size() == 1);
    CHECK(steps[0].find("tensor cores") != std::string::npos);
    // P is rounded to bfloat16 for the P·V product (as flash attention does), and the output once.
    CHECK(scaled_error(y.to_host(), want_bf) < 1.5e-2);
    const fb::cuda::tensor<fb::float16, fb::shape<fb::dyn, T, H, E>> hq(q), hk(k), hv(v);
    auto round_h = [](float x) { return static_cast<double>(fb::float16::from_float(x).to_float()); };
    const auto yh = (causal ? fb::compile(masked)(hq, hk, hv) : fb::compile(full)(hq, hk, hv)).to_host();
    CHECK(scaled_error(yh, attention_reference(q, k, v, causal, round_h)) < 2e-3);
    const fb::cuda::tensor<float, fb::shape<fb::dyn, T, H, E>> fq(q), fk(k), fv(v);
    const auto yf = (causal ? fb::compile(masked)(fq, fk, fv) : fb::compile(full)(fq, fk, fv)).to_host();
    CHECK(scaled_error(yf, attention_reference(q, k, v, causal, exact)) < 1e-5);
  }
  // The tensor-core entry's other code paths, 130 tokens (a partial third tile): an odd number of
  // 16-wide head-dim steps for q·kᵀ (48: an ldmatrix of two matrices after those of four) and of
  // 8-wide ones for P·v (40); head dim 128 (one tile in flight, 16 keys a step); v much wider
  // than q (16 and 128).
  auto tensor_core_shape = [&](auto e_dims, auto ev_dims, bool causal) {
    constexpr std::size_t e = decltype(e_dims)::value, ev = decltype(ev_dims)::value, T3 = 130;
    INFO("head dims " << e << "/" << ev << (causal ? ", causal" : ""));
    fb::tensor<float, fb::shape<2, T3, 2, e>> q3, k3;
    fb::tensor<float, fb::shape<2, T3, 2, ev>> v3;
    q3.fill_random(e * 7 + ev, -2.0f, 2.0f), k3.fill_random(e * 11 + ev, -2.0f, 2.0f), v3.fill_random(e + ev);
    const fb::cuda::tensor<bf, fb::shape<2, T3, 2, e>> dq3(q3), dk3(k3);
    const fb::cuda::tensor<bf, fb::shape<2, T3, 2, ev>> dv3(v3);
    fb::cuda::tensor<bf, fb::shape<2, T3, 2, ev>> y3;
    const auto s3 = device_steps([&] { y3 = causal ? fb::compile(masked)(dq3, dk3, dv3) : fb::compile(full)(dq3, dk3, dv3); });
    REQUIRE(s3.size() == 1);
    CHECK(s3[0].find("tensor cores") != std::string::npos);
    CHECK(scaled_error(y3.to_host(), attention_reference(q3, k3, v3, causal, round_bf)) < 1.5e-2);
  };
  using dims48 = std::integral_constant<std::size_t, 48>;
  using dims40 = std::integral_constant<std::size_t, 40>;
  using dims128 = std::integral_constant<std::size_t, 128>;
  using dims16 = std::integral_constant<std::size_t, 16>;
  tensor_core_shape(dims48{}, dims40{}, true);
  tensor_core_shape(dims48{}, dims40{}, false);
  tensor_core_shape(dims128{}, dims128{}, true);
  tensor_core_shape(dims16{}, dims128{}, true);
  // Head dims 40 and 24 in bfloat16: the generic entry.
  fb::tensor<float, fb::shape<2, 33, 2, 40>> q2, k2;
  fb::tensor<float, fb::shape<2, 33, 2, 24>> v2;
  q2.fill_random(64, -2.0f, 2.0f), k2.fill_random(65, -2.0f, 2.0f), v2.fill_random(66);
  const fb::cuda::tensor<bf, fb::shape<2, 33, 2, 40>> dq2(q2), dk2(k2);
  const fb::cuda::tensor<bf, fb::shape<2, 33, 2, 24>> dv2(v2);
  fb::cuda::tensor<bf, fb::shape<2, 33, 2, 24>> y2;
  const auto steps = device_steps([&] { y2 = fb::compile(masked)(dq2, dk2, dv2); });
  REQUIRE(steps.size() == 1);
  CHECK(steps[0].find("tensor cores") == std::string::npos);
  CHECK(scaled_error(y2.to_host(), attention_reference(q2, k2, v2, true, round_bf)) < 1e-2);
}

TEST_CASE("CUDA: max_autotune times cuDNN's fused attention against fusebox's kernel once per problem; "
          "FUSEBOX_ATTENTION=cudnn and =own", "[cuda][attention][autotune]") {
  FUSEBOX_REQUIRE_GPU();
  using bf = fb::bfloat16;
  auto round_bf = [](float v) { return static_cast<double>(bf::from_float(v).to_float()); };
  auto masked = [](auto q, auto k, auto v) { return fb::attention(q, k, v, fb::causal); };
  // The attention case's types with a batch no other case uses: problems no chooser has seen.
  constexpr std::size_t T = 200, H = 3, E = 64;
  fb::tensor<float, fb::shape<fb::dyn, T, H, E>> q(5), k(5), v(5);
  q.fill_random(81, -2.0f, 2.0f), k.fill_random(82, -2.0f, 2.0f), v.fill_random(83);
  const auto want = attention_reference(q, k, v, true, round_bf);
  const fb::cuda::tensor<bf, fb::shape<fb::dyn, T, H, E>> dq(q), dk(k), dv(v);
  bool have_cudnn = true;
  try {
    fb::cuda::cudnn();
  } catch (const fb::backend_unavailable& e) {
    WARN("cuDNN is not installed: only fusebox's kernel can be chosen (" << e.what() << ")");
    have_cudnn = false;
  }
  auto& chooser = fb::jit::attention_chooser::instance();
  struct restore_env {
    ~restore_env() { ::unsetenv("FUSEBOX_ATTENTION"); }
  } restore;
  for (const char* policy : {"cudnn", "auto", "own"}) {
    INFO("FUSEBOX_ATTENTION=" << policy);
    ::setenv("FUSEBOX_ATTENTION", policy, 1);
    const auto decided0 = chooser.timed() + chooser.from_disk(), cudnn0 = chooser.cudnn_chosen();
    const auto graphs0 = fb::jit::counters().snapshot().graph_captures;
    auto tuned = fb::compile(masked, fb::options{.mode = fb::mode::max_autotune});
    for (int call = 0; call < 3; ++call) {
      INFO("call " << call);
      CHECK(scaled_error(tuned(dq, dk, dv).to_host(), want) < 1.5e-2);
    }
    CHECK(fb::jit::counters().snapshot().graph_captures > graphs0);  // replays run the same choice
    const std::string p = policy;
    if (p == "own") {
      CHECK(chooser.timed() + chooser.from_disk() == decided0);  // cuDNN not even asked
      CHECK(chooser.cudnn_chosen() == cudnn0);
    } else if (have_cudnn) {
      CHECK(chooser.timed() + chooser.from_disk() == decided0 + 1);  // one problem, decided once
      if (p == "cudnn") CHECK(chooser.cudnn_chosen() == cudnn0 + 1);
    }
  }
  ::setenv("FUSEBOX_ATTENTION", "sometimes", 1);
  CHECK_THROWS_WITH(fb::compile(masked, fb::options{.mode = fb::mode::max_autotune})(dq, dk, dv),
                    Catch::Matchers::Contains("FUSEBOX_ATTENTION='sometimes'"));
}

TEST_CASE("CUDA: a GPT-2 attention half in bfloat16: projections, attention on their views, output projection",
          "[cuda][attention]") {
  FUSEBOX_REQUIRE_GPU();
  using bf = fb::bfloat16;
  constexpr std::size_t B = 2, T = 96, H = 4, E = 64, D = H * E;
  using heads = fb::shape<B, T, H, E>;
  auto block = [](auto x, auto wq, auto wk, auto wv, auto wo) {
    auto q = fb::reshape<heads>(fb::matmul(x, wq));
    auto k = fb::reshape<heads>(fb::matmul(x, wk));
    auto v = fb::reshape<heads>(fb::matmul(x, wv));
    return x + fb::matmul(fb::reshape<fb::shape<B * T, D>>(fb::attention(q, k, v, fb::causal)), wo);
  };
  fb::tensor<float, fb::shape<B * T, D>> x;
  fb::tensor<float, fb::shape<D, D>> wq, wk, wv, wo;
  x.fill_random(71), wq.fill_random(72, -0.1f, 0.1f), wk.fill_random(73, -0.1f, 0.1f);
  wv.fill_random(74, -0.1f, 0.1f), wo.fill_random(75, -0.1f, 0.1f);
  auto round = [](float v) { return static_cast<double>(bf::from_float(v).to_float()); };
  const fb::cuda::tensor<bf, fb::shape<B * T, D>> dx(x);
  const fb::cuda::tensor<bf, fb::shape<D, D>> dq(wq), dk(wk), dv(wv), dwo(wo);
  fb::cuda::tensor<bf, fb::shape<B * T, D>> y;
  const auto steps = device_steps([&] { y = fb::compile(block)(dx, dq, dk, dv, dwo); });
  CHECK(steps.size() == 5);  // three projections, attention, the output projection with its epilogue
  const auto yh = y.to_host();
  // Reference: projections in double from the rounded inputs; the device rounds them to bfloat16.
  auto project = [&](const auto& w) {
    fb::tensor<float, heads> p;
    for (std::size_t r = 0; r < B * T; ++r)
      for (std::size_t c = 0; c < D; ++c) {
        double s = 0;
        for (std::size_t i = 0; i < D; ++i) s += round(x.flat(r * D + i)) * round(w.flat(i * D + c));
        p.flat(r * D + c) = static_cast<float>(s);
      }
    return p;
  };
  const auto att = attention_reference(project(wq), project(wk), project(wv), true, round);
  std::vector<double> want(B * T * D);
  for (std::size_t r = 0; r < B * T; ++r)
    for (std::size_t c = 0; c < D; ++c) {
      double s = round(x.flat(r * D + c));
      for (std::size_t i = 0; i < D; ++i) s += att[r * D + i] * round(wo.flat(i * D + c));
      want[r * D + c] = s;
    }
  CHECK(scaled_error(yh, want) < 2e-2);

  // The same block with one packed [D, 3D] projection (GPT-2's c_attn): q, k and v are slices of
  // its product read in place, so one GEMM replaces three.
  auto packed = [](auto x, auto wqkv, auto wo) {
    auto qkv = fb::matmul(x, wqkv);
    auto q = fb::reshape<heads>(fb::slice<1, 0, D>(qkv));
    auto k = fb::reshape<heads>(fb::slice<1, D, 2 * D>(qkv));
    auto v = fb::reshape<heads>(fb::slice<1, 2 * D, 3 * D>(qkv));
    return x + fb::matmul(fb::reshape<fb::shape<B * T, D>>(fb::attention(q, k, v, fb::causal)), wo);
  };
  fb::tensor<float, fb::shape<D, 3 * D>> wqkv;
  for (std::size_t i = 0; i < D; ++i)
    for (std::size_t c = 0; c < D; ++c) {
      wqkv(i, c) = wq(i, c);
      wqkv(i, D + c) = wk(i, c);
      wqkv(i, 2 * D + c) = wv(i, c);
    }
  const fb::cuda::tensor<bf, fb::shape<D, 3 * D>> dqkv(wqkv);
  const auto packed_steps = device_steps([&] { y = fb::compile(packed)(dx, dqkv, dwo); });
  CHECK(packed_steps.size() == 3);  // one projection, attention, the output projection
  REQUIRE(!packed_steps.empty());
  CHECK(packed_steps[1].find("tensor cores") != std::string::npos);  // rendered for them ...
  CHECK(packed_steps[1].find("generic entry") == std::string::npos);  // ... and the slices were aligned for them
  CHECK(scaled_error(y.to_host(), want) < 2e-2);
}

TEST_CASE("CUDA: compile(value_and_grad) runs forward and backward on the device, against a double backprop",
          "[cuda][autodiff]") {
  FUSEBOX_REQUIRE_GPU();
  constexpr std::size_t B = 24, I = 40, H = 72, O = 12;
  auto loss = [](const auto& x, const auto& w1, const auto& b1, const auto& w2, const auto& b2, const auto& t) {
    const auto e = fb::matmul(fb::gelu(fb::matmul(x, w1) + b1), w2) + b2 - t;
    return fb::mean(fb::mean(e * e));
  };
  fb::tensor<float, fb::shape<B, I>> x;
  fb::tensor<float, fb::shape<I, H>> w1;
  fb::tensor<float, fb::shape<H>> b1;
  fb::tensor<float, fb::shape<H, O>> w2;
  fb::tensor<float, fb::shape<O>> b2;
  fb::tensor<float, fb::shape<B, O>> t;
  x.fill_random(81), w1.fill_random(82, -0.3f, 0.3f), b1.fill_random(83), w2.fill_random(84, -0.3f, 0.3f);
  b2.fill_random(85), t.fill_random(86);
  // Backprop by hand in double: e = gelu(x w1 + b1) w2 + b2 - t, L = mean(e^2).
  std::vector<double> u(B * H), h(B * H), e(B * O), dh(B * H);
  std::vector<double> dw1(I * H, 0.0), db1(H, 0.0), dw2(H * O, 0.0), db2(O, 0.0);
  double l = 0;
  for (std::size_t r = 0; r < B; ++r) {
    for (std::size_t j = 0; j < H; ++j) {
      double s = b1(j);
      for (std::size_t k = 0; k < I; ++k) s += static_cast<double>(x(r, k)) * w1(k, j);
      u[r * H + j] = s;
      h[r * H + j] = gelu(s);
    }
    for (std::size_t o = 0; o < O; ++o) {
      double s = static_cast<double>(b2(o)) - t(r, o);
      for (std::size_t j = 0; j < H; ++j) s += h[r * H + j] * w2(j, o);
      e[r * O + o] = s;
      l += s * s / (B * O);
    }
  }
  for (std::size_t r = 0; r < B; ++r)
    for (std::size_t o = 0; o < O; ++o) {
      const double de = 2.0 * e[r * O + o] / (B * O);
      db2[o] += de;
      for (std::size_t j = 0; j < H; ++j) {
        dw2[j * O + o] += h[r * H + j] * de;
        dh[r * H + j] += de * w2(j, o);
      }
    }
  for (std::size_t r = 0; r < B; ++r)
    for (std::size_t j = 0; j < H; ++j) {
      const double v = u[r * H + j];
      const double d = dh[r * H + j] * (0.5 * (1.0 + std::erf(v / std::sqrt(2.0))) +
                                        v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * 3.141592653589793));
      db1[j] += d;
      for (std::size_t k = 0; k < I; ++k) dw1[k * H + j] += static_cast<double>(x(r, k)) * d;
    }
  using fb::cuda::tensor;
  const tensor<float, fb::shape<B, I>> dx(x);
  const tensor<float, fb::shape<I, H>> dw1_in(w1);
  const tensor<float, fb::shape<H>> db1_in(b1);
  const tensor<float, fb::shape<H, O>> dw2_in(w2);
  const tensor<float, fb::shape<O>> db2_in(b2);
  const tensor<float, fb::shape<B, O>> dt(t);
  for (fb::mode m : {fb::mode::default_, fb::mode::reduce_overhead}) {
    auto step = fb::compile(fb::value_and_grad(loss, fb::wrt<1, 2, 3, 4>), fb::options{.mode = m});
    for (int call = 0; call < 2; ++call) {  // a reduce_overhead replay reads the same inputs anew
      INFO("mode " << static_cast<int>(m) << ", call " << call);
      auto [dl, grads] = step(dx, dw1_in, db1_in, dw2_in, db2_in, dt);
      auto& [g1, gb1, g2, gb2] = grads;
      CHECK(std::abs(dl.to_host().flat(0) - l) < 1e-5 * (1 + l));
      // Gradients: float sums over 24 rows against double, relative to max(|ref|, 1e-3); a wrong
      // rule is off by order 1.
      CHECK(worst(g1.to_host(), dw1) < 1e-3);
      CHECK(worst(gb1.to_host(), db1) < 1e-3);
      CHECK(worst(g2.to_host(), dw2) < 1e-3);
      CHECK(worst(gb2.to_host(), db2) < 1e-3);
    }
  }
  // A tensor the loss captures is host memory: refused on the device, by name.
  auto captured = [&t](const auto& xx, const auto& w) { return fb::mean(fb::mean(fb::matmul(xx, w) - t)); };
  auto bad = fb::compile(fb::grad(captured, fb::wrt<1>));
  const tensor<float, fb::shape<I, O>> wio(fb::tensor<float, fb::shape<I, O>>{});
  CHECK_THROWS_WITH(bad(dx, wio), Catch::Contains("captures a tensor"));
}

// ---- conv2d, pooling, embedding and pad on the device (backend/cuda/spatial_kernels.hpp) ----

/// A host tensor's elements as doubles, row-major.
template <class H>
std::vector<double> doubles(const H& h) {
  std::vector<double> v(h.size());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = h.flat(i);
  return v;
}

/// conv2d (stride s, padding p) of x [N,C,H,W] with w [O,C,KH,KW] plus b, in double, and the
/// gradients of sum(y * r) w.r.t. x, w and b.
struct conv_reference {
  std::vector<double> y, dx, dw, db;
  conv_reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                 const std::vector<double>& r, std::size_t N, std::size_t C, std::size_t H, std::size_t W, std::size_t O,
                 std::size_t KH, std::size_t KW, int s, int p) {
    const std::size_t OH = (H + 2 * p - KH) / s + 1, OW = (W + 2 * p - KW) / s + 1;
    y.assign(N * O * OH * OW, 0.0), dx.assign(x.size(), 0.0), dw.assign(w.size(), 0.0), db.assign(O, 0.0);
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t o = 0; o < O; ++o)
        for (std::size_t i = 0; i < OH; ++i)
          for (std::size_t j = 0; j < OW; ++j) {
            const std::size_t at = ((n * O + o) * OH + i) * OW + j;
            double acc = b[o];
            db[o] += r[at];
            for (std::size_t c = 0; c < C; ++c)
              for (std::size_t u = 0; u < KH; ++u)
                for (std::size_t v = 0; v < KW; ++v) {
                  const long ih = static_cast<long>(i) * s - p + static_cast<long>(u);
                  const long iw = static_cast<long>(j) * s - p + static_cast<long>(v);
                  if (ih < 0 || iw < 0 || ih >= static_cast<long>(H) || iw >= static_cast<long>(W)) continue;
                  const std::size_t xi = ((n * C + c) * H + static_cast<std::size_t>(ih)) * W + static_cast<std::size_t>(iw);
                  const std::size_t wi = ((o * C + c) * KH + u) * KW + v;
                  acc += x[xi] * w[wi];
                  dx[xi] += r[at] * w[wi];
                  dw[wi] += r[at] * x[xi];
                }
            y[at] = acc;
          }
  }
};

/// Max or average pooling (window k, stride s, padding p) in double: y, and the gradient of
/// sum(y * r) w.r.t. x (max: to the first maximum of each window in row-major order).
struct pool_reference {
  std::vector<double> y, dx;
  pool_reference(const std::vector<double>& x, const std::vector<double>& r, std::size_t planes, std::size_t H,
                 std::size_t W, int k, int s, int p, bool is_max) {
    const std::size_t OH = (H + 2 * p - k) / s + 1, OW = (W + 2 * p - k) / s + 1;
    y.assign(planes * OH * OW, 0.0), dx.assign(x.size(), 0.0);
    for (std::size_t q = 0; q < planes; ++q)
      for (std::size_t i = 0; i < OH; ++i)
        for (std::size_t j = 0; j < OW; ++j) {
          const std::size_t at = (q * OH + i) * OW + j;
          double m = -INFINITY, sum = 0;
          std::size_t arg = 0;
          bool first = true;
          for (long u = 0; u < k; ++u)
            for (long v = 0; v < k; ++v) {
              const long ih = static_cast<long>(i) * s - p + u, iw = static_cast<long>(j) * s - p + v;
              if (ih < 0 || iw < 0 || ih >= static_cast<long>(H) || iw >= static_cast<long>(W)) continue;
              const std::size_t xi = (q * H + static_cast<std::size_t>(ih)) * W + static_cast<std::size_t>(iw);
              sum += x[xi];
              if (first || x[xi] > m) m = x[xi], arg = xi, first = false;
            }
          if (is_max) {
            y[at] = m;
            dx[arg] += r[at];
          } else {
            y[at] = sum / (k * k);
            for (long u = 0; u < k; ++u)
              for (long v = 0; v < k; ++v) {
                const long ih = static_cast<long>(i) * s - p + u, iw = static_cast<long>(j) * s - p + v;
                if (ih < 0 || iw < 0 || ih >= static_cast<long>(H) || iw >= static_cast<long>(W)) continue;
                dx[(q * H + static_cast<std::size_t>(ih)) * W + static_cast<std::size_t>(iw)] += r[at] / (k * k);
              }
          }
        }
  }
};

/// Absolute error of y against r scaled by the reference's largest magnitude (and 1).
template <class H>
double scaled_worst(const H& y, const std::vector<double>& r) {
  REQUIRE(y.size() == r.size());
  double big = 1, e = 0;
  for (double v : r) big = std::max(big, std::fabs(v));
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double d = std::fabs(y.flat(i) - r[i]) / big;
    if (!(d <= e)) e = d;
  }
  return e;
}

template <class H1, class H2>
bool bitwise_equal(const H1& a, const H2& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a.flat(i), &b.flat(i), sizeof a.flat(i)) != 0) return false;
  return a.size() == b.size();
}

template <std::size_t N, std::size_t C, std::size_t H, std::size_t W, std::size_t O, std::size_t K, int S, int P>
void check_conv_on_device(std::uint64_t seed) {
  fb::tensor<float, fb::shape<N, C, H, W>> x;
  fb::tensor<float, fb::shape<O, C, K, K>> w;
  fb::tensor<float, fb::shape<O>> b;
  constexpr std::size_t OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
  fb::tensor<float, fb::shape<N, O, OH, OW>> r;
  x.fill_random(seed), w.fill_random(seed + 1, -0.5f, 0.5f), b.fill_random(seed + 2), r.fill_random(seed + 3);
  const conv_reference ref(doubles(x), doubles(w), doubles(b), doubles(r), N, C, H, W, O, K, K, S, P);
  using fb::cuda::tensor;
  const tensor<float, fb::shape<N, C, H, W>> dx(x);
  const tensor<float, fb::shape<O, C, K, K>> dw(w);
  const tensor<float, fb::shape<O>> db(b);
  const tensor<float, fb::shape<N, O, OH, OW>> dr(r);
  INFO("conv2d<stride<" << S << ">, padding<" << P << ">> of [" << N << ", " << C << ", " << H << ", " << W << "] with [" << O << ", " << C
                 << ", " << K << ", " << K << "]");
  // Forward with the bias and relu epilogue (the generated kernel after the conv, in place).
  auto fwd = [](const auto& u, const auto& v, const auto& c) { return fb::relu(fb::conv2d<fb::stride<S>, fb::padding<P>>(u, v, c)); };
  const auto y = fb::compile(fwd)(dx, dw, db).to_host();
  std::vector<double> want = ref.y;
  for (double& v : want) v = std::max(v, 0.0);
  CHECK(scaled_worst(y, want) < 1e-5);
  // Gradients of sum(conv(x, w, b) * r): the input gradient, the weight gradient (split over the
  // batch when its K is long), the bias's sum.
  auto loss = [](const auto& u, const auto& v, const auto& c, const auto& q) {
    return fb::sum(fb::sum(fb::sum(fb::sum(fb::conv2d<fb::stride<S>, fb::padding<P>>(u, v, c) * q))));
  };
  auto step = fb::compile(fb::grad(loss, fb::wrt<0, 1, 2>));
  const auto [gx, gw, gb] = step(dx, dw, db, dr);
  const auto hx = gx.to_host(), hw = gw.to_host(), hb = gb.to_host();
  CHECK(scaled_worst(hx, ref.dx) < 1e-5);
  CHECK(scaled_worst(hw, ref.dw) < 1e-5);
  CHECK(scaled_worst(hb, ref.db) < 1e-5);
  // The same bits on a second call (no atomics anywhere).
  const auto [gx2, gw2, gb2] = step(dx, dw, db, dr);
  CHECK(bitwise_equal(gx2.to_host(), hx));
  CHECK(bitwise_equal(gw2.to_host(), hw));
}

TEST_CASE("CUDA: conv2d and its input and weight gradients on the device against a double reference (stride 2, "
          "padding 1, odd sizes; a long batch splits the weight gradient)",
          "[cuda][spatial]") {
  FUSEBOX_REQUIRE_GPU();
  check_conv_on_device<3, 5, 11, 9, 7, 3, 2, 1>(901);    // odd sizes, stride 2, padding 1
  check_conv_on_device<2, 3, 7, 8, 70, 5, 1, 2>(911);    // more out channels than a tile, 5x5 kernel
  check_conv_on_device<8, 3, 20, 20, 4, 3, 1, 1>(921);   // K = 3200 for the weight gradient: split in 3
}

template <int K, int S, int P, std::size_t H, std::size_t W>
void check_pool_on_device(std::uint64_t seed) {
  constexpr std::size_t N = 2, C = 3, OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
  fb::tensor<float, fb::shape<N, C, H, W>> x;
  fb::tensor<float, fb::shape<N, C, OH, OW>> r;
  x.fill_random(seed), r.fill_random(seed + 1);
  for (std::size_t i = 0; i < x.size(); ++i) x.flat(i) = std::round(x.flat(i) * 3.0f) / 3.0f;  // 7 values: many ties
  using fb::cuda::tensor;
  const tensor<float, fb::shape<N, C, H, W>> dx(x);
  const tensor<float, fb::shape<N, C, OH, OW>> dr(r);
  for (bool is_max : {true, false}) {
    INFO((is_max ? "max" : "avg") << "_pool2d<" << K << ", stride<" << S << ">, padding<" << P << ">> of [2, 3, " << H << ", " << W << "]");
    const pool_reference ref(doubles(x), doubles(r), N * C, H, W, K, S, P, is_max);
    if (is_max) {
      const auto y = fb::compile([](const auto& u) { return fb::max_pool2d<K, fb::stride<S>, fb::padding<P>>(u); })(dx).to_host();
      CHECK(scaled_worst(y, ref.y) == 0.0);  // a maximum is one of the inputs
      auto loss = [](const auto& u, const auto& q) { return fb::sum(fb::sum(fb::sum(fb::sum(fb::max_pool2d<K, fb::stride<S>, fb::padding<P>>(u) * q)))); };
      const auto g = fb::compile(fb::grad(loss, fb::wrt<0>))(dx, dr).to_host();
      CHECK(scaled_worst(g, ref.dx) < 1e-6);  // a tie's gradient at another element is off by order 1
    } else {
      const auto y = fb::compile([](const auto& u) { return fb::avg_pool2d<K, fb::stride<S>, fb::padding<P>>(u); })(dx).to_host();
      CHECK(scaled_worst(y, ref.y) < 1e-6);
      auto loss = [](const auto& u, const auto& q) { return fb::sum(fb::sum(fb::sum(fb::sum(fb::avg_pool2d<K, fb::stride<S>, fb::padding<P>>(u) * q)))); };
      const auto g = fb::compile(fb::grad(loss, fb::wrt<0>))(dx, dr).to_host();
      CHECK(scaled_worst(g, ref.dx) < 1e-6);
    }
  }
}

TEST_CASE("CUDA: max and average pooling and their gradients on the device, ties to the first maximum", "[cuda][spatial]") {
  FUSEBOX_REQUIRE_GPU();
  check_pool_on_device<2, 2, 0, 8, 6>(931);   // T2's pooling
  check_pool_on_device<3, 2, 1, 9, 7>(941);   // overlapping windows with padding, odd sizes
  check_pool_on_device<3, 1, 1, 5, 6>(951);   // stride 1: every pixel in up to 9 windows
}

TEST_CASE("CUDA: embedding and its scatter-add gradient on the device: repeated ids, same bits every call and as "
          "the host; a bad id is an error after the call",
          "[cuda][gather]") {
  FUSEBOX_REQUIRE_GPU();
  auto run = [&]<std::size_t V, std::size_t D, std::size_t B, std::size_t T>(std::integral_constant<std::size_t, V>,
                                                                           std::integral_constant<std::size_t, D>,
                                                                           std::integral_constant<std::size_t, B>,
                                                                           std::integral_constant<std::size_t, T>,
                                                                           std::uint64_t seed, std::size_t distinct) {
    INFO("V " << V << ", D " << D << ", ids [" << B << ", " << T << "], " << distinct << " distinct ids");
    fb::tensor<float, fb::shape<V, D>> w;
    fb::tensor<float, fb::shape<B, T>> ids;
    fb::tensor<float, fb::shape<B, T, D>> r;
    w.fill_random(seed), r.fill_random(seed + 1);
    for (std::size_t i = 0; i < ids.size(); ++i) ids.flat(i) = static_cast<float>((i * 7 + i / 3) % distinct);
    std::vector<double> y(B * T * D), dw(V * D, 0.0);
    for (std::size_t i = 0; i < B * T; ++i)
      for (std::size_t e = 0; e < D; ++e) {
        const std::size_t v = static_cast<std::size_t>(ids.flat(i));
        y[i * D + e] = w(v, e);
        dw[v * D + e] += r.flat(i * D + e);
      }
    using fb::cuda::tensor;
    const tensor<float, fb::shape<V, D>> dwt(w);
    const tensor<float, fb::shape<B, T>> dids(ids);
    const tensor<float, fb::shape<B, T, D>> dr(r);
    auto fwd = [](const auto& a, const auto& i) { return fb::embedding(a, i); };
    CHECK(scaled_worst(fb::compile(fwd)(dwt, dids).to_host(), y) == 0.0);  // a copy
    auto loss = [](const auto& a, const auto& i, const auto& q) { return fb::sum(fb::sum(fb::sum(fb::embedding(a, i) * q))); };
    auto step = fb::compile(fb::grad(loss, fb::wrt<0>));
    const auto g = step(dwt, dids, dr).to_host();
    CHECK(scaled_worst(g, dw) < 1e-6);
    CHECK(bitwise_equal(step(dwt, dids, dr).to_host(), g));  // no atomics in the sums
    // The host kernel adds each row's gradients in increasing position too: the same bits.
    CHECK(bitwise_equal(fb::compile(fb::grad(loss, fb::wrt<0>))(w, ids, r), g));
    // An id out of range: a zero row, and an error naming it once the call is done.
    fb::tensor<float, fb::shape<B, T>> bad = ids;
    bad.flat(5) = static_cast<float>(V);
    const tensor<float, fb::shape<B, T>> dbad(bad);
    CHECK_THROWS_WITH(fb::compile(fwd)(dwt, dbad), Catch::Contains("out of range") && Catch::Contains("element 5"));
    bad.flat(5) = 1.5f;
    const tensor<float, fb::shape<B, T>> dbad2(bad);
    CHECK_THROWS_WITH(step(dwt, dbad2, dr), Catch::Contains("1.5"));
  };
  using std::integral_constant;
  run(integral_constant<std::size_t, 50>{}, integral_constant<std::size_t, 33>{}, integral_constant<std::size_t, 4>{},
      integral_constant<std::size_t, 37>{}, 961, 10);  // 148 ids over 10 rows; 40 rows never named
  run(integral_constant<std::size_t, 7>{}, integral_constant<std::size_t, 1100>{}, integral_constant<std::size_t, 3>{},
      integral_constant<std::size_t, 300>{}, 971, 5);  // rows wider than 1024, ids past one 256-step
}

TEST_CASE("CUDA: the gradient of a C x 1 x 1 bias broadcast over NCHW (a reduction over N, H and W)", "[cuda][spatial]") {
  FUSEBOX_REQUIRE_GPU();
  fb::tensor<float, fb::shape<3, 7, 6, 5>> x, r;
  fb::tensor<float, fb::shape<7>> b;
  x.fill_random(1001), r.fill_random(1002), b.fill_random(1003);
  auto loss = [](const auto& u, const auto& c, const auto& q) {
    return fb::sum(fb::sum(fb::sum(fb::sum((u + fb::reshape<fb::shape<7, 1, 1>>(c)) * q))));
  };
  std::vector<double> want(7, 0.0);
  for (std::size_t i = 0; i < r.size(); ++i) want[i / 30 % 7] += r.flat(i);
  const auto g = fb::compile(fb::grad(loss, fb::wrt<1>))(fb::cuda::tensor<float, fb::shape<3, 7, 6, 5>>(x),
                                                          fb::cuda::tensor<float, fb::shape<7>>(b),
                                                          fb::cuda::tensor<float, fb::shape<3, 7, 6, 5>>(r));
  CHECK(scaled_worst(g.to_host(), want) < 1e-5);
  CHECK(scaled_worst(fb::compile(fb::grad(loss, fb::wrt<1>))(x, b, r), want) < 1e-5);  // the host, for comparison
}

TEST_CASE("CUDA: pad (a slice's gradient) on the device", "[cuda][pad]") {
  FUSEBOX_REQUIRE_GPU();
  fb::tensor<float, fb::shape<5, 12, 7>> x;
  fb::tensor<float, fb::shape<5, 4, 7>> r;
  x.fill_random(981), r.fill_random(982);
  auto loss = [](const auto& u, const auto& q) { return fb::sum(fb::sum(fb::sum(fb::slice<1, 3, 7>(u) * q))); };
  const fb::cuda::tensor<float, fb::shape<5, 12, 7>> dx(x);
  const fb::cuda::tensor<float, fb::shape<5, 4, 7>> dr(r);
  const auto g = fb::compile(fb::grad(loss, fb::wrt<0>))(dx, dr).to_host();
  std::vector<double> want(x.size(), 0.0);
  for (std::size_t a = 0; a < 5; ++a)
    for (std::size_t b = 3; b < 7; ++b)
      for (std::size_t c = 0; c < 7; ++c) want[(a * 12 + b) * 7 + c] = r(a, b - 3, c);
  CHECK(scaled_worst(g, want) == 0.0);
}

TEST_CASE("CUDA: compile(value_and_grad) of a small CNN on the device matches the host's", "[cuda][spatial][autodiff]") {
  FUSEBOX_REQUIRE_GPU();
  constexpr std::size_t N = 6;
  auto loss = [](const auto& x, const auto& w1, const auto& b1, const auto& w2, const auto& b2, const auto& wl,
                 const auto& t) {
    const auto h = fb::max_pool2d<2>(fb::relu(fb::conv2d<fb::padding<1>>(x, w1, b1)));  // [N, 4, 6, 6]
    const auto g = fb::avg_pool2d<2>(fb::relu(fb::conv2d<fb::stride<2>, fb::padding<1>>(h, w2, b2)));  // [N, 5, 3, 3] -> [N, 5, 1, 1]
    const auto e = fb::matmul(fb::reshape<fb::shape<N, 5>>(g), wl) - t;      // [N, 3]
    return fb::mean(fb::mean(e * e));
  };
  fb::tensor<float, fb::shape<N, 2, 12, 12>> x;
  fb::tensor<float, fb::shape<4, 2, 3, 3>> w1;
  fb::tensor<float, fb::shape<4>> b1;
  fb::tensor<float, fb::shape<5, 4, 3, 3>> w2;
  fb::tensor<float, fb::shape<5>> b2;
  fb::tensor<float, fb::shape<5, 3>> wl;
  fb::tensor<float, fb::shape<N, 3>> t;
  x.fill_random(991), w1.fill_random(992, -0.5f, 0.5f), b1.fill_random(993, 0.0f, 0.2f), w2.fill_random(994, -0.3f, 0.3f);
  b2.fill_random(995, 0.0f, 0.2f), wl.fill_random(996), t.fill_random(997);
  auto step = [&](const auto&... a) { return fb::compile(fb::value_and_grad(loss, fb::wrt<1, 2, 3, 4, 5>))(a...); };
  const auto [hl, hg] = step(x, w1, b1, w2, b2, wl, t);
  using fb::cuda::tensor;
  const auto [dl, dg] = step(tensor<float, fb::shape<N, 2, 12, 12>>(x), tensor<float, fb::shape<4, 2, 3, 3>>(w1),
                             tensor<float, fb::shape<4>>(b1), tensor<float, fb::shape<5, 4, 3, 3>>(w2),
                             tensor<float, fb::shape<5>>(b2), tensor<float, fb::shape<5, 3>>(wl),
                             tensor<float, fb::shape<N, 3>>(t));
  CHECK(std::abs(dl.to_host().flat(0) - hl.flat(0)) < 1e-5 * (1 + std::abs(hl.flat(0))));
  const auto& [h1, hb1, h2, hb2, hwl] = hg;
  const auto& [g1, gb1, g2, gb2, gwl] = dg;
  CHECK(scaled_worst(g1.to_host(), doubles(h1)) < 1e-4);
  CHECK(scaled_worst(gb1.to_host(), doubles(hb1)) < 1e-4);
  CHECK(scaled_worst(g2.to_host(), doubles(h2)) < 1e-4);
  CHECK(scaled_worst(gb2.to_host(), doubles(hb2)) < 1e-4);
  CHECK(scaled_worst(gwl.to_host(), doubles(hwl)) < 1e-4);
}

TEST_CASE("CUDA: explain() on device tensors reports the kernels as the GPU runs them, with bytes and flops, and "
          "the modes on the GPU",
          "[cuda][explain]") {
  FUSEBOX_REQUIRE_GPU();
  constexpr std::size_t K = 72, C = 56, rows = 31;
  auto model = [](auto x, auto m, auto b) { return fb::relu(fb::matmul(fb::softmax(x), m) + b); };
  const layer_params<K, C> w(81, 0.3f, 2.0f);
  const auto& [m, b, dm, db] = w;
  fb::tensor<float, fb::shape<fb::dyn, K>> x(rows);
  x.fill_random(82, -3.0f, 3.0f);
  const fb::cuda::tensor<float, fb::shape<fb::dyn, K>> dx(x);
  const std::string plan = fb::explain_text(model, fb::options{.mode = fb::mode::reduce_overhead}, dx, dm, db);
  INFO(plan);
  auto has = [&](const char* part) { return plan.find(part) != std::string::npos; };
  CHECK(has("run-time path on the cuda (dyn extents)"));
  CHECK(has("[rows] max, sub, exp, sum, div"));
  CHECK(has("NVRTC: "));
  CHECK(has("gemm [31, 72] x [72, 56] -> [31, 56]; cuBLASLt with its epilogue's bias"));
  CHECK(has("moves "));
  CHECK(has("flop"));
  CHECK(has("modes on the GPU:"));
  CHECK(has("reduce_overhead (this compile)"));
  // The model explained computes the right thing on the device.
  std::vector<double> r(rows * C);
  for (std::size_t i = 0; i < rows; ++i) {
    double mx = -1e300, s = 0;
    for (std::size_t k = 0; k < K; ++k) mx = std::max(mx, static_cast<double>(x.flat(i * K + k)));
    std::vector<double> p(K);
    for (std::size_t k = 0; k < K; ++k) s += p[k] = std::exp(x.flat(i * K + k) - mx);
    for (std::size_t j = 0; j < C; ++j) {
      double acc = b.flat(j);
      for (std::size_t k = 0; k < K; ++k) acc += p[k] / s * m.flat(k * C + j);
      r[i * C + j] = std::max(acc, 0.0);
    }
  }
  CHECK(worst(fb::compile(model)(dx, dm, db).to_host(), r) < 1e-4);
}

TEST_CASE("CUDA: a model that returns one value twice fills both results, in every mode", "[cuda]") {
  FUSEBOX_REQUIRE_GPU();
  // Both results are one node (identical subtrees merge); the program computes it into the first,
  // and the second is a copy queued after it (it was left unwritten before the call pipeline).
  auto model = [](auto x) { return std::make_tuple(fb::exp(x) * 0.5f, fb::exp(x) * 0.5f); };
  fb::tensor<float, fb::shape<fb::dyn, 40>> x(9);
  x.fill_random(91, -2.0f, 2.0f);
  const fb::cuda::tensor<float, fb::shape<fb::dyn, 40>> dx(x);
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = 0.5 * std::exp(static_cast<double>(x.flat(i)));
  for (fb::mode md : {fb::mode::default_, fb::mode::reduce_overhead}) {
    auto f = fb::compile(model, fb::options{.mode = md});
    for (int call = 0; call < 3; ++call) {  // reduce_overhead: a recording, then replays
      INFO("mode " << static_cast<int>(md) << ", call " << call);
      const auto [a, c] = f(dx);
      CHECK(worst(a.to_host(), r) < 1e-6);
      CHECK(worst(c.to_host(), r) < 1e-6);
    }
  }
}
