// tests/compile/capability_matrix.cpp: what compile() offers, one capability (a row) at a time, on
// each of the four execution paths (the columns), so that a capability missing on one path shows
// as a named cell rather than as an absence nobody notices:
//
//   static CPU     host tensors, every extent static: the program planned while this unit was
//                  compiled (backend/cpu/executor.hpp)
//   run-time CPU   host tensors with a dyn extent: the run-time path, kernels generated and built
//                  by the host compiler per specialisation (pipeline/dynamic_function.hpp)
//   static CUDA    cuda::tensor arguments of static shapes
//   run-time CUDA  cuda::tensor arguments with a dyn extent
//
// Both CUDA columns run through the run-time NVRTC path here: this is not an nvcc translation unit,
// so compile.hpp's static CUDA path (backend/cuda/static_kernels.cuh, tested by tests/cuda/static_nvcc.cu)
// is not compiled in, and static extents are baked into the NVRTC source like known dyn ones.
//
// The CUDA cells are tagged [cuda]. Without a GPU each one says it is skipped; where something can
// be checked without one, it is: the CUDA program the run-time path would build for the model is
// planned, its kernels rendered and checked by NVRTC's front end (NVRTC needs no GPU; tests/cuda/
// compiled.cpp takes such kernels down to PTX), or the clear error a GPU-less call gives is checked.
//
// Rows: 1 explain, 2 ab, 3 graph breaks and fullgraph, 4 value numbering, 5 dimension merging,
// 6 cached rows, 7 matmul epilogues, 8 value_and_grad on dyn extents, 9 the nn training step on a
// dyn batch, 10 profile spans, 11 modes. Each cell compares every output element against a double
// reference on fresh random inputs (never zeros), and checks what it observes of the capability.
// Every cell is a real check today (the last GAP cells closed on 2026-11-27); a cell that
// becomes a gap again says so where it stands, marked GAP.
//
// Few model types (each is instantiated for up to four argument types): linear_relu serves rows
// 1, 2, 7, 10 and 11.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "../support/check.hpp"
#include "../support/gpu.hpp"
#include "../support/mse_relu.hpp"
#include "../support/planned_guard.hpp"
#include "../support/profile_spans.hpp"
#include "../support/private_cache.hpp"

namespace fb = fusebox;
namespace nn = fusebox::nn;
using fbt::coord;

namespace {

void cache() { fbt::use_private_cache("fusebox-matrix-"); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

int count(const std::string& s, const std::string& part) {
  int n = 0;
  for (auto at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// A CUDA cell that needs a GPU to run the model.
/// A device copy of a host tensor, of the same shape type.
template <class A>
auto device(const A& a) {
  return fb::cuda::tensor<typename A::value_type, typename A::shape_type>(a);
}

/// The same values with a dyn first (batch) extent.
template <class T, std::size_t B, std::size_t... C>
fb::tensor<T, fb::shape<fb::dyn, C...>> dyn_batch(const fb::tensor<T, fb::shape<B, C...>>& t) {
  fb::tensor<T, fb::shape<fb::dyn, C...>> d(B);
  for (std::size_t i = 0; i < t.size(); ++i) d.flat(i) = t.flat(i);
  return d;
}

/// A fresh random tensor of a dyn batch.
template <class S>
fb::tensor<float, S> random_batch(std::size_t batch, std::uint64_t seed, double lo = 0.05, double hi = 1.0) {
  fb::tensor<float, S> t(batch);
  fbt::fill_signed(t, seed, lo, hi);
  return t;
}

/// Flat row-major index of a multi-coord in extents d.
std::size_t flat_of(const coord& idx, const fb::dims& d) {
  std::size_t f = 0;
  for (std::size_t k = 0; k < d.rank; ++k) f = f * d.extent[k] + idx[k];
  return f;
}

/// Every element of y within |ref| * rel + abs of the row-major reference.
template <class Y>
void check_values(const Y& y, const std::vector<double>& ref, fbt::tol t, const std::string& what) {
  INFO(what);
  REQUIRE(y.size() == ref.size());
  const fb::dims d = y.extents();
  fbt::check_all(y, [&](const coord& i) { return ref[flat_of(i, d)]; }, t, what);
}

/// Every element of y within its own bound (sums: the bound scales with the sum of magnitudes).
template <class Y>
void check_bounded(const Y& y, const std::vector<double>& ref, const std::vector<double>& bound, const std::string& what) {
  INFO(what);
  REQUIRE(y.size() == ref.size());
  const fb::dims d = y.extents();
  fbt::check_bounded(y, [&](const coord& i) { return ref[flat_of(i, d)]; },
                     [&](const coord& i) { return bound[flat_of(i, d)]; }, what);
}

using fbt::kernel_spans;
using fbt::profiled;

int spans_with(const std::vector<std::string>& names, const std::string& part) {
  int n = 0;
  for (const auto& s : names) n += contains(s, part);
  return n;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += "'" + n + "' ";
  return s;
}

// ---- without a GPU: the CUDA program the run-time path would build, compiled by NVRTC ----------

/// The CUDA program of expression type E as the run-time path plans it, every dyn extent set to
/// `rows` (0: symbolic, as after a second batch size), for a call whose payloads of one type hold
/// equal values (the models here hold literal scalars): `inspect(program, kernels)` reads its plan
/// and its generated kernels as rendered, which NVRTC then checks, front end only (it needs no
/// GPU; fbt::nvrtc_front_end_only: tests/cuda/compiled.cpp takes the models' kernels down to PTX).
template <class Prog, class Inspect>
void cuda_program_of_prog(std::size_t rows, const char* name, Inspect&& inspect) {
  using D = fb::jit::dynamic_function<Prog, fb::jit::cuda_target>;
  typename D::program_t p;
  D::specialise_into(p, fbt::planned_guard<Prog>(rows));
  std::vector<fb::jit::rendered_cuda_kernel> kernels;
  for (int k = 0; k < p.plan.n_kernels; ++k)
    if (D::generated(p.plan.kernels[k]))
      kernels.push_back(fb::jit::render_cuda_kernel(p.nodes, p.plan, k, fb::dtype::f32, p.unit_inner, p.sched));
  inspect(p, kernels);
  REQUIRE(!kernels.empty());
  for (const auto& k : kernels) CHECK(contains(k.source, "fusebox_kernel_v1("));
  try {
    fb::cuda::nvrtc_check(fb::jit::make_cuda_unit(kernels).source, name, "compute_90", fbt::nvrtc_front_end_only);
  } catch (const fb::cuda::nvrtc_error& e) {
    FAIL(e.what());
  }
}

template <class E, class Inspect>
void cuda_program_of(std::size_t rows, const char* name, Inspect&& inspect) {
  cuda_program_of_prog<fb::cpu::program<float, E>>(rows, name, std::forward<Inspect>(inspect));
}

/// The no-GPU form of a CUDA cell: false (and says so) where NVRTC is missing too.
bool nvrtc_here() {
  if (fb::cuda::nvrtc_available()) {
    WARN("no CUDA device: the model does not run here; its CUDA kernels are planned and compiled by NVRTC instead");
    return true;
  }
  WARN("no CUDA device and no NVRTC: skipped");
  return false;
}

// ---- row models -----------------------------------------------------------------------------

constexpr std::size_t R = 24, K = 32, N = 16;  // linear_relu: x [R, K], w [K, N], b [N]
using lx_static = fb::tensor<float, fb::shape<R, K>>;
using lx_dyn = fb::tensor<float, fb::shape<fb::dyn, K>>;
using lw = fb::tensor<float, fb::shape<K, N>>;
using lb = fb::tensor<float, fb::shape<N>>;

/// relu(x w + b): a matmul with an epilogue. Rows 1, 2, 7, 10, 11.
const auto linear_relu = [](const auto& x, const auto& w, const auto& b) { return fb::relu(fb::matmul(x, w) + b); };

struct linear_case {
  lx_static x;
  lw w;
  lb b;
  linear_case() {
    fbt::fill_signed(x, 11, 0.05, 1.0);
    fbt::fill_signed(w, 12, 0.05, 1.0);
    fbt::fill_signed(b, 13, 0.05, 1.0);
  }
  /// relu(x w + b) in double for x of any batch, and each element's bound: `rel` times the sum of
  /// the magnitudes that make it (float sums of K products).
  template <class X>
  std::pair<std::vector<double>, std::vector<double>> reference(const X& xs, double rel) const {
    const std::size_t rows = xs.extents().extent[0];
    std::vector<double> ref(rows * N), bound(rows * N);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        double s = b.flat(j), a = std::fabs(static_cast<double>(b.flat(j)));
        for (std::size_t k = 0; k < K; ++k) {
          const double p = static_cast<double>(xs.flat(i * K + k)) * w.flat(k * N + j);
          s += p;
          a += std::fabs(p);
        }
        ref[i * N + j] = s > 0 ? s : 0;
        bound[i * N + j] = rel * a + 1e-30;
      }
    return {ref, bound};
  }
  template <class Y, class X>
  void check(const Y& y, const X& xs, double rel, const std::string& what) const {
    const auto [ref, bound] = reference(xs, rel);
    check_bounded(y, ref, bound, what);
  }
};

// Float sums of K = 32 products: 1e-6 of the sum of magnitudes on the CPU (gemm's fma chains); the
// GPU's cuBLASLt may sum in another order and with TF32 off still differs in the last bits.
constexpr double cpu_rel = 1e-6, gpu_rel = 1e-5;

/// A user function (a graph break inside a compiled model), counting its calls. Rows 3, 4.
int user_calls = 0;
const auto doubled = [](const auto& t) {
  ++user_calls;
  auto r = t.clone();
  for (std::size_t i = 0; i < r.size(); ++i) r.flat(i) = 2 * t.flat(i);
  return r;
};
// clang-format off
const int break_line = __LINE__; const auto break_model = [](const auto& x) { return fb::softmax(fb::opaque(doubled, x)); };
// clang-format on
constexpr std::size_t BC = 19;  // break_model's columns: vector lanes and a scalar tail
using bx_static = fb::tensor<float, fb::shape<6, BC>>;
using bx_dyn = fb::tensor<float, fb::shape<fb::dyn, BC>>;

/// softmax along the rows of `scale` * x, in double.
template <class X>
std::vector<double> softmax_rows(const X& x, double scale) {
  const std::size_t cols = x.extents().extent[x.extents().rank - 1], rows = x.size() / cols;
  std::vector<double> v(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (std::size_t c = 0; c < cols; ++c) m = std::max(m, scale * x.flat(r * cols + c));
    for (std::size_t c = 0; c < cols; ++c) s += v[r * cols + c] = std::exp(scale * x.flat(r * cols + c) - m);
    for (std::size_t c = 0; c < cols; ++c) v[r * cols + c] /= s;
  }
  return v;
}

/// softmax(x/2 w): softmax copies its operand into each of its passes, and the copies hold the
/// scalar 0.5, so the build-time lowering keeps four products; equal at the call, value numbering
/// merges them into one (ir/merge.hpp). Row 4 on CUDA (where opaque() is refused, row 3).
const auto softmax_product = [](const auto& x, const auto& w) { return fb::softmax(fb::matmul(x * 0.5f, w)); };

/// relu(x) * y + 0.5 over [batch, 64, 4, 4]: every operand walks the four dimensions as one, so
/// the elementwise kernel's space merges into one row (T2's relu mask shape). Row 5.
const auto merge_model = [](const auto& x, const auto& y) { return fb::relu(x) * y + 0.5f; };
using m_static = fb::tensor<float, fb::shape<128, 64, 4, 4>>;
using m_dyn = fb::tensor<float, fb::shape<fb::dyn, 64, 4, 4>>;

template <class X>
std::vector<double> merge_reference(const X& x, const X& y) {
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = std::max(static_cast<double>(x.flat(i)), 0.0) * y.flat(i) + 0.5;
  return r;
}

/// softmax(gelu(x)): gelu's value is needed by softmax's max pass, its sum pass and its output
/// pass; it costs enough to keep in a per-row scratch rather than recompute. Row 6.
const auto cached_model = [](const auto& x) { return fb::softmax(fb::gelu(x)); };
constexpr std::size_t CC = 40;
using c_static = fb::tensor<float, fb::shape<12, CC>>;
using c_dyn = fb::tensor<float, fb::shape<fb::dyn, CC>>;

template <class X>
std::vector<double> cached_reference(const X& x) {
  const std::size_t rows = x.size() / CC;
  std::vector<double> v(x.size());
  for (std::size_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (std::size_t c = 0; c < CC; ++c) {
      const double u = x.flat(r * CC + c);
      v[r * CC + c] = 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
      m = std::max(m, v[r * CC + c]);
    }
    for (std::size_t c = 0; c < CC; ++c) s += v[r * CC + c] = std::exp(v[r * CC + c] - m);
    for (std::size_t c = 0; c < CC; ++c) v[r * CC + c] /= s;
  }
  return v;
}

/// mean((relu(x w + b) - t)^2): mean's 1 / n depends on the batch. Row 8.
using fbt::mse_relu;
constexpr std::size_t GI = 16, GO = 8;

/// The loss and every gradient element of one call against the double reference.
template <class L, class G, class X, class W, class B, class T>
void check_grads(const L& loss, const G& grads, const X& x, const W& w, const B& b, const T& t, double rel,
                 const std::string& what) {
  const fbt::mse_relu_reference want = fbt::mse_relu_expected(x, w, b, t);
  const auto& [dx, dw, db] = grads;
  INFO(what);
  CHECK(std::fabs(static_cast<double>(loss.flat(0)) - want.loss) <= rel * want.loss);
  CHECK(dx.extents() == x.extents());
  check_values(dx, want.dx, {1e-7, rel}, what + ": dx");
  check_values(dw, want.dw, {1e-7, rel}, what + ": dw");
  check_values(db, want.db, {1e-7, rel}, what + ": db");
}

/// A small network for the nn training step (row 9): linear, relu, linear, eval mode (no dropout
/// masks, so the batch may be dyn).
template <class T>
using net = nn::sequential<nn::linear<6, 8, T>, nn::relu_layer, nn::linear<8, 4, T>>;

/// The network in double with every parameter a float value (so the float copy holds the same
/// numbers), layers seeded.
net<double> make_net() {
  net<double> m(3);
  auto p = m.parameters<double>();
  for (std::size_t i = 0; i < p.size(); ++i)
    for (std::size_t k = 0; k < p[i].size(); ++k) p[i].data[k] = static_cast<float>(p[i].data[k]);
  return m;
}

/// x [B, 6] and t [B, 4] in double, static batch: the eager step's inputs.
template <std::size_t B>
std::pair<fb::tensor<double, fb::shape<B, 6>>, fb::tensor<double, fb::shape<B, 4>>> step_inputs(std::uint64_t seed) {
  std::pair<fb::tensor<double, fb::shape<B, 6>>, fb::tensor<double, fb::shape<B, 4>>> in;
  fbt::fill_signed(in.first, seed, 0.1, 1.0);
  fbt::fill_signed(in.second, seed + 1, 0.1, 1.0);
  // Float values, so a float copy on the device holds the same numbers.
  for (std::size_t i = 0; i < in.first.size(); ++i) in.first.flat(i) = static_cast<float>(in.first.flat(i));
  for (std::size_t i = 0; i < in.second.size(); ++i) in.second.flat(i) = static_cast<float>(in.second.flat(i));
  return in;
}

/// Loss and every gradient of a step against the eager step's, |got - want| <= rel (1 + |want|).
template <class LA, class GA, class LB, class GB>
void check_step(const LA& la, const GA& ga, const LB& lb, const GB& gb, double rel, const std::string& what) {
  INFO(what);
  CHECK(std::fabs(static_cast<double>(la.flat(0)) - lb.flat(0)) <= rel * (1 + std::fabs(lb.flat(0))));
  [&]<std::size_t... P>(std::index_sequence<P...>) {
    (([&] {
       const auto& got = std::get<P>(ga);
       const auto& want = std::get<P>(gb);
       REQUIRE(got.size() == want.size());
       std::size_t bad = 0;
       for (std::size_t k = 0; k < want.size(); ++k)
         bad += !(std::fabs(static_cast<double>(got.flat(k)) - want.flat(k)) <= rel * (1 + std::fabs(want.flat(k))));
       INFO("parameter " << P << ": " << bad << " of " << want.size() << " gradient elements differ");
       CHECK(bad == 0);
     }()),
     ...);
  }(std::make_index_sequence<std::tuple_size_v<std::decay_t<GB>>>{});
}

}  // namespace

// ================================================================================================
// Row 1. explain: the report lists each kernel, with its loop, bytes moved and flops.
// ================================================================================================

TEST_CASE("capability matrix, row 1: explain lists kernels with bytes and flops (CPU)", "[compile][matrix]") {
  cache();
  const linear_case in;
  // Both CPU paths give the same report of the same plan (plan/report.hpp), at the call's extents:
  // x and w (24*32 + 32*16 floats), the bias (16) and the output (24*16) make 6720 B; the product
  // 2*24*16*32 flops, add and relu one each on 24*16 elements: 25344.
  auto common = [](const std::string& plan) {
    CHECK(contains(plan, "1 segment(s), 0 graph break(s)"));
    CHECK(count(plan, "  kernel ") == 1);
    CHECK(contains(plan, "kernel 0 [matmul] matmul + epilogue(add, relu)\n"));
    CHECK(contains(plan, "loop: gemm [24, 32] x [32, 16] -> [24, 16]"));
    CHECK(count(plan, "moves ") == 1);
    CHECK(contains(plan, "moves 6.6 KiB, 25.3 kflop\n"));
    CHECK(contains(plan, "arena:"));
  };
  SECTION("explain / static CPU") {
    const std::string plan = fb::explain_text(linear_relu, in.x, in.w, in.b);
    INFO(plan);
    common(plan);
    CHECK(contains(plan, "vector width "));
    CHECK(contains(plan, "(constexpr)"));  // the arena is a constant of the program
  }
  SECTION("explain / run-time CPU") {
    const lx_dyn xd = dyn_batch(in.x);
    const std::string plan = fb::explain_text(linear_relu, xd, in.w, in.b);
    INFO(plan);
    // Bytes and flops on this path came with the report shared by every path; before it the
    // run-time path named its kernels and ops only.
    common(plan);
    CHECK(contains(plan, "run-time path"));
    CHECK(contains(plan, "(dyn extents)"));
    CHECK(contains(plan, "guards of the specialisations"));
    CHECK(contains(plan, "[24, 32] [32, 16] [16]"));  // the guard: this call's extents
  }
}

TEST_CASE("capability matrix, row 1: explain lists kernels with bytes and flops (CUDA)", "[compile][matrix][cuda]") {
  cache();
  const linear_case in;
  // Device arguments: the CUDA back end's report of the same plan (pipeline::describe), each
  // kernel as the GPU runs it; bytes and flops as on the CPU paths. Without a GPU a device tensor
  // cannot be made, and the cells skip.
  auto cell = [&](const auto& x, const char* extents) {
    FUSEBOX_REQUIRE_GPU();
    const auto dx = device(x);
    const auto dw = device(in.w);
    const auto db = device(in.b);
    const std::string plan = fb::explain_text(linear_relu, fb::options{}, dx, dw, db);
    INFO(plan);
    CHECK(count(plan, "  kernel ") == 1);
    CHECK(contains(plan, "kernel 0 [matmul] matmul + epilogue(add, relu)\n"));
    CHECK(contains(plan, "loop: gemm [24, 32] x [32, 16] -> [24, 16]; cuBLASLt with its epilogue's bias"));
    CHECK(contains(plan, "moves 6.6 KiB, 25.3 kflop\n"));
    CHECK(contains(plan, "run-time path on the cuda (" + std::string(extents) + ")"));
    CHECK(contains(plan, "modes on the GPU:"));
    in.check(fb::compile(linear_relu)(dx, dw, db).to_host(), x, gpu_rel, "relu(x w + b)");
  };
  // Not an nvcc unit: static extents take the run-time NVRTC path as well, and the report says so.
  SECTION("explain / static CUDA") { cell(in.x, "static extents, kernels generated at run time"); }
  SECTION("explain / run-time CUDA") { cell(dyn_batch(in.x), "dyn extents"); }
}

// ================================================================================================
// Row 2. ab: A/B against eager gives a verdict, which passes for a correct model.
// ================================================================================================

namespace {
const fb::ab_config quick_ab{.warmup = 1, .min_iters = 3, .min_seconds = 0, .tolerance = 1e-4};

void check_verdict(const fb::ab_result& r, std::size_t elements) {
  INFO(r.table());
  CHECK(r.ok);
  CHECK(r.elements == elements);
  CHECK(r.nonfinite_mismatch == 0);
  CHECK(r.max_rel_err <= 1e-5);
  CHECK(contains(r.verdict, "within tolerance"));
  CHECK(r.compiled.iters >= 3);
  CHECK(r.eager.iters >= 3);
}
}  // namespace

TEST_CASE("capability matrix, row 2: ab() verdict passes for a correct model (CPU)", "[compile][matrix]") {
  cache();
  const linear_case in;
  SECTION("ab / static CPU") {
    auto f = fb::compile(linear_relu);
    check_verdict(fb::ab_with(quick_ab, fb::eager(linear_relu), f, in.x, in.w, in.b), R * N);
    in.check(f(in.x, in.w, in.b), in.x, cpu_rel, "compiled side");
  }
  SECTION("ab / run-time CPU") {
    const lx_dyn xd = dyn_batch(in.x);
    auto f = fb::compile(linear_relu);
    check_verdict(fb::ab_with(quick_ab, fb::eager(linear_relu), f, xd, in.w, in.b), R * N);
    in.check(f(xd, in.w, in.b), xd, cpu_rel, "compiled side");
  }
}

// ab() compares host tensors, and eager runs on the host: the GPU side is compiled with
// options{.backend = backend::cuda} at build time, which uploads host arguments, runs on the GPU and
// downloads the results (compile.hpp); the device arguments are then of the host arguments' shapes.
TEST_CASE("capability matrix, row 2: ab() verdict passes for a correct model (CUDA)", "[compile][matrix][cuda]") {
  cache();
  const linear_case in;
  auto on_gpu = fb::compile<fb::options{.backend = fb::backend::cuda}>(linear_relu);
  auto cell = [&](const auto& x) {
    if (!fb::cuda::available()) {
      // What a machine without a GPU can check: the call refuses, naming what was tried and the fix.
      WARN("no CUDA device: the GPU side does not run here; its refusal is checked instead");
      CHECK_THROWS_AS(on_gpu(x, in.w, in.b), fb::backend_unavailable);
      CHECK_THROWS_WITH(on_gpu(x, in.w, in.b),
                        Catch::Contains("options{.backend = backend::cuda}") && Catch::Contains("backend::automatic"));
      return;
    }
    check_verdict(fb::ab_with(quick_ab, fb::eager(linear_relu), on_gpu, x, in.w, in.b), R * N);
    in.check(on_gpu(x, in.w, in.b), x, gpu_rel, "GPU side");
  };
  SECTION("ab / static CUDA") { cell(in.x); }
  SECTION("ab / run-time CUDA") { cell(dyn_batch(in.x)); }
}

// ================================================================================================
// Row 3. graph breaks and fullgraph: opaque() is a break on the CPU paths, counted by explain;
// fullgraph refuses it (the build-time form is tests/compile_fail/opaque_fullgraph.cpp; here the
// run-time option); the CUDA backend refuses a break with an error naming it.
// ================================================================================================

TEST_CASE("capability matrix, row 3: graph breaks and fullgraph (CPU)", "[compile][matrix]") {
  cache();
  const std::string site = std::string(__FILE__) + ":" + std::to_string(break_line);
  auto cell = [&](const auto& x) {
    auto f = fb::compile(break_model);
    user_calls = 0;
    const auto y = f(x);
    CHECK(user_calls == 1);
    check_values(y, softmax_rows(x, 2.0), {1e-7, 2e-6}, "softmax(opaque(2 x))");
    const std::string plan = fb::explain_text(break_model, x);
    INFO(plan);
    CHECK(contains(plan, "1 graph break(s)"));
    CHECK(contains(plan, "graph break: opaque() at " + site));
    CHECK(contains(plan, "opaque (user function: graph break)"));
    auto strict = fb::compile(break_model, {.fullgraph = true});
    CHECK_THROWS_AS(strict(x), fb::graph_break);
    CHECK_THROWS_WITH(strict(x), Catch::Contains("opaque() under fullgraph") && Catch::Contains(site));
  };
  SECTION("graph breaks / static CPU") {
    bx_static x;
    fbt::fill_signed(x, 31, 0.05, 2.0);
    cell(x);
  }
  SECTION("graph breaks / run-time CPU") {
    for (std::size_t n : {6u, 11u}) {
      INFO("batch " << n);
      cell(random_batch<bx_dyn::shape_type>(n, 32 + n, 0.05, 2.0));
    }
  }
}

TEST_CASE("capability matrix, row 3: graph breaks and fullgraph (CUDA)", "[compile][matrix][cuda]") {
  cache();
  // The segments run on the device, the user function on the host between them (its operand and
  // result copied: pipeline/dynamic_function.hpp run_breaks). Without a GPU the cells skip: the
  // segments' programs are built from the call's own extents, which only a call has.
  const std::string site = std::string(__FILE__) + ":" + std::to_string(break_line);
  auto cell = [&](const auto& x) {
    FUSEBOX_REQUIRE_GPU();
    auto f = fb::compile(break_model);
    const auto dx = device(x);
    for (int call = 0; call < 2; ++call) {
      user_calls = 0;
      const auto y = f(dx).to_host();
      CHECK(user_calls == 1);
      check_values(y, softmax_rows(x, 2.0), {1e-6, 1e-5}, "softmax(opaque(2 x)) on the GPU");
    }
    auto strict = fb::compile(break_model, {.fullgraph = true});
    CHECK_THROWS_AS(strict(dx), fb::graph_break);
    CHECK_THROWS_WITH(strict(dx), Catch::Contains("opaque() under fullgraph") && Catch::Contains(site));
  };
  bx_static x;
  fbt::fill_signed(x, 33, 0.05, 2.0);
  SECTION("graph breaks / static CUDA") { cell(x); }
  SECTION("graph breaks / run-time CUDA") {
    for (std::size_t n : {6u, 11u}) {
      INFO("batch " << n);
      cell(random_batch<bx_dyn::shape_type>(n, 32 + n, 0.05, 2.0));
    }
  }
}

// ================================================================================================
// Row 4. value numbering: a value the model's code computes once is computed once per call, though
// softmax copies it into each of its passes. CPU: a user function's calls, counted (row 3 counts
// them on the GPU too); CUDA: a product's cuBLASLt calls.
// ================================================================================================

TEST_CASE("capability matrix, row 4: value numbering computes a copied value once (CPU)", "[compile][matrix]") {
  cache();
  SECTION("value numbering / static CPU") {
    bx_static x;
    fbt::fill_signed(x, 41, 0.05, 2.0);
    auto f = fb::compile(break_model);
    for (int call = 0; call < 2; ++call) {
      user_calls = 0;
      const auto y = f(x);
      CHECK(user_calls == 1);  // softmax reads opaque()'s result in four places
      check_values(y, softmax_rows(x, 2.0), {1e-7, 2e-6}, "softmax(opaque(2 x))");
    }
    // explain lists the user function once, and its three copies as that kernel.
    const std::string plan = fb::explain_text(break_model, x);
    INFO(plan);
    CHECK(count(plan, "[opaque] opaque") == 1);
    CHECK(count(plan, "[opaque] = kernel") == 3);
  }
  SECTION("value numbering / run-time CPU") {
    auto f = fb::compile(break_model);
    for (std::size_t n : {6u, 11u, 6u}) {
      INFO("batch " << n);
      const bx_dyn x = random_batch<bx_dyn::shape_type>(n, 42 + n, 0.05, 2.0);
      user_calls = 0;
      const auto y = f(x);
      CHECK(user_calls == 1);
      check_values(y, softmax_rows(x, 2.0), {1e-7, 2e-6}, "softmax(opaque(2 x))");
    }
  }
}

TEST_CASE("capability matrix, row 4: value numbering computes a copied product once (CUDA)", "[compile][matrix][cuda]") {
  cache();
  fb::tensor<float, fb::shape<9, K>> x;
  lw w;
  fbt::fill_signed(x, 43, 0.05, 1.0);
  fbt::fill_signed(w, 44, 0.05, 0.5);
  // softmax(x/2 w) in double (halving is exact in float).
  std::vector<double> xw(9 * N, 0.0);
  for (std::size_t i = 0; i < 9; ++i)
    for (std::size_t j = 0; j < N; ++j)
      for (std::size_t k = 0; k < K; ++k) xw[i * N + j] += static_cast<double>(x.flat(i * K + k)) * w.flat(k * N + j);
  fb::tensor<double, fb::shape<9, N>> xwt;
  for (std::size_t i = 0; i < xw.size(); ++i) xwt.flat(i) = xw[i];
  const std::vector<double> ref = softmax_rows(xwt, 0.5);
  auto cell = [&](const auto& xs, auto shape_tag) {
    if (!fb::cuda::available()) {
      if (!nvrtc_here()) return;
      using X = fb::input_leaf<0, float, typename decltype(shape_tag)::type>;
      using W = fb::input_leaf<1, float, fb::shape<K, N>>;
      cuda_program_of<decltype(softmax_product(X{}, W{}))>(xs.extents().extent[0], "matrix_value_numbering",
                                                           [](const auto& p, const auto&) {
                                                             int products = 0;
                                                             for (int k = 0; k < p.plan.n_kernels; ++k)
                                                               products += p.plan.kernels[k].kind == fb::plan::kernel_kind::matmul;
                                                             CHECK(products == 1);  // four copies, one product
                                                           });
      return;
    }
    auto f = fb::compile(softmax_product);
    const auto dx = device(xs);
    const auto dw = device(w);
    (void)f(dx, dw).to_host();  // built
    const auto spans = profiled([&] { check_values(f(dx, dw).to_host(), ref, {1e-6, 1e-4}, "softmax(x/2 w)"); });
    INFO(joined(spans));
    CHECK(spans_with(spans, "cuBLASLt matmul") == 1);  // four copies, one product, read by every pass
  };
  SECTION("value numbering / static CUDA") { cell(x, std::type_identity<fb::shape<9, K>>{}); }
  SECTION("value numbering / run-time CUDA") { cell(dyn_batch(x), std::type_identity<fb::shape<fb::dyn, K>>{}); }
}

// ================================================================================================
// Row 5. dimension merging: relu(x) * y + 0.5 over [128, 64, 4, 4] walks one row of 131072
// elements, not 32768 rows of 4 (schedule/merge_dims.hpp).
// ================================================================================================

TEST_CASE("capability matrix, row 5: dimension merging of an elementwise kernel (CPU)", "[compile][matrix]") {
  cache();
  SECTION("dimension merging / static CPU") {
    m_static x, y;
    fbt::fill_signed(x, 51, 0.05, 2.0);
    fbt::fill_signed(y, 52, 0.05, 2.0);
    check_values(fb::compile(merge_model)(x, y), merge_reference(x, y), {1e-7, 1e-6}, "relu(x) * y + 0.5");
    // The static program's schedule merges its one kernel's space from the first dimension on (the
    // merge itself is made at bind time, with the call's strides), and explain says so.
    using E = decltype(merge_model(fb::input_leaf<0, float, m_static::shape_type>{},
                                   fb::input_leaf<1, float, m_static::shape_type>{}));
    using P = fb::cpu::program<float, E>;
    STATIC_REQUIRE(P::plan.n_kernels == 1);
    CHECK(P::sched.kernels[0].merge_from == 0);
    const std::string plan = fb::explain_text(merge_model, x, y);
    INFO(plan);
    CHECK(contains(plan, "rows over [128, 64, 4, 4]"));
    CHECK(contains(plan, "dimensions from 0 merged per call"));
  }
  SECTION("dimension merging / run-time CPU") {
    auto f = fb::compile(merge_model);
    for (std::size_t n : {128u, 3u}) {
      INFO("batch " << n);
      const m_dyn x = random_batch<m_dyn::shape_type>(n, 53 + n, 0.05, 2.0);
      const m_dyn y = random_batch<m_dyn::shape_type>(n, 54 + n, 0.05, 2.0);
      check_values(f(x, y), merge_reference(x, y), {1e-7, 1e-6}, "relu(x) * y + 0.5");
      const std::string plan = fb::explain_text(merge_model, x, y);
      INFO(plan);
      CHECK(contains(plan, "rows over [" + std::to_string(n) + ", 64, 4, 4]"));
      CHECK(contains(plan, "dimensions merged per call"));
    }
  }
}

TEST_CASE("capability matrix, row 5: dimension merging of an elementwise kernel (CUDA)", "[compile][matrix][cuda]") {
  cache();
  auto cell = [&](const auto& x, const auto& y, auto shape_tag) {
    if (!fb::cuda::available()) {
      if (!nvrtc_here()) return;
      using S = typename decltype(shape_tag)::type;
      cuda_program_of<decltype(merge_model(fb::input_leaf<0, float, S>{}, fb::input_leaf<1, float, S>{}))>(
          x.extents().extent[0], "matrix_merge", [](const auto&, const auto& kernels) {
            REQUIRE(kernels.size() == 1);
            CHECK(kernels[0].merged_space);
            CHECK(contains(kernels[0].summary, "dimensions merged per call"));
          });
      return;
    }
    auto f = fb::compile(merge_model);
    const auto dx = device(x), dy = device(y);
    (void)f(dx, dy).to_host();  // built
    const auto spans = profiled([&] { check_values(f(dx, dy).to_host(), merge_reference(x, y), {1e-7, 1e-6}, "relu(x) * y + 0.5"); });
    INFO(joined(spans));
    CHECK(spans_with(spans, "dimensions merged per call") == 1);
  };
  m_static x, y;
  fbt::fill_signed(x, 55, 0.05, 2.0);
  fbt::fill_signed(y, 56, 0.05, 2.0);
  SECTION("dimension merging / static CUDA") { cell(x, y, std::type_identity<m_static::shape_type>{}); }
  SECTION("dimension merging / run-time CUDA") {
    cell(dyn_batch(x), dyn_batch(y), std::type_identity<m_dyn::shape_type>{});
  }
}

// ================================================================================================
// Row 6. cached rows: in softmax(gelu(x)) the row kernel's three passes read gelu(x); it is
// computed in the first and kept in a per-row scratch (plan/row_cache.hpp).
// ================================================================================================

TEST_CASE("capability matrix, row 6: a costly value reused by several passes is kept per row (CPU)",
          "[compile][matrix]") {
  cache();
  SECTION("cached rows / static CPU") {
    c_static x;
    fbt::fill_signed(x, 61, 0.05, 3.0);
    check_values(fb::compile(cached_model)(x), cached_reference(x), {1e-7, 2e-6}, "softmax(gelu(x))");
    const std::string plan = fb::explain_text(cached_model, x);
    INFO(plan);
    CHECK(count(plan, "  kernel ") == 1);
    CHECK(contains(plan, "reduction pass(es) + output pass per row"));
    CHECK(contains(plan, "row(s) kept in scratch"));
  }
  SECTION("cached rows / static CPU: a quotient several passes read") {
    // layer_norm after x / sum(x): its two passes and its output read the quotient. A division
    // counts 8 in the row cache's cost (plan/row_cache.hpp), so the quotient is kept, not divided in
    // each pass. (After a softmax, layer_norm is rewritten without the division: ops/composite.hpp.)
    using X = fb::input_leaf<0, float, c_static::shape_type>;
    using G = fb::input_leaf<1, float, fb::shape<CC>>;
    using E = decltype(fb::layer_norm(X{} / fb::sum(X{}, fb::axis<-1>, fb::keepdim), G{}, G{}, 1e-5f));
    using P = fb::cpu::program<float, E>;
    constexpr auto quotient_kept = [] {
      for (std::size_t i = 0; i < P::nodes.size(); ++i)
        if (std::string_view(P::nodes[i].desc.name) == "div") return P::plan.cache_slot[i] >= 0;
      return false;
    };
    STATIC_REQUIRE(P::plan.n_kernels == 1);
    STATIC_REQUIRE(quotient_kept());
  }
  SECTION("cached rows / run-time CPU") {
    auto f = fb::compile(cached_model);
    for (std::size_t n : {12u, 5u}) {
      INFO("batch " << n);
      const c_dyn x = random_batch<c_dyn::shape_type>(n, 62 + n, 0.05, 3.0);
      check_values(f(x), cached_reference(x), {1e-7, 2e-6}, "softmax(gelu(x))");
      const std::string plan = fb::explain_text(cached_model, x);
      INFO(plan);
      CHECK(count(plan, "  kernel ") == 1);
      CHECK(contains(plan, "rows over [" + std::to_string(n) + ", 40], 2 reduction pass(es) + output pass per row"));
      CHECK(contains(plan, "row(s) kept in scratch"));
    }
  }
}

TEST_CASE("capability matrix, row 6: a costly value reused by several passes is kept per row (CUDA)",
          "[compile][matrix][cuda]") {
  cache();
  auto cell = [&](const auto& x, auto shape_tag) {
    if (!fb::cuda::available()) {
      if (!nvrtc_here()) return;
      using S = typename decltype(shape_tag)::type;
      cuda_program_of<decltype(cached_model(fb::input_leaf<0, float, S>{}))>(
          x.extents().extent[0], "matrix_cached_rows", [](const auto& p, const auto& kernels) {
            REQUIRE(p.plan.n_kernels == 1);
            CHECK(p.plan.kernels[0].cached >= 1);  // the plan the CUDA kernel renders keeps gelu(x)
            REQUIRE(kernels.size() == 1);
            CHECK(kernels[0].block_per_row);
          });
      return;
    }
    check_values(fb::compile(cached_model)(device(x)).to_host(), cached_reference(x), {1e-6, 1e-5}, "softmax(gelu(x))");
  };
  c_static x;
  fbt::fill_signed(x, 63, 0.05, 3.0);
  SECTION("cached rows / static CUDA") { cell(x, std::type_identity<c_static::shape_type>{}); }
  SECTION("cached rows / run-time CUDA") { cell(dyn_batch(x), std::type_identity<c_dyn::shape_type>{}); }
}

// ================================================================================================
// Row 7. matmul epilogues: relu(x w + b) is one kernel, the product with add and relu fused after it.
// ================================================================================================

TEST_CASE("capability matrix, row 7: matmul + bias + relu is one kernel with an epilogue (CPU)", "[compile][matrix]") {
  cache();
  const linear_case in;
  SECTION("matmul epilogues / static CPU") {
    in.check(fb::compile(linear_relu)(in.x, in.w, in.b), in.x, cpu_rel, "relu(x w + b)");
    const std::string plan = fb::explain_text(linear_relu, in.x, in.w, in.b);
    INFO(plan);
    CHECK(count(plan, "  kernel ") == 1);
    CHECK(contains(plan, "[matmul] matmul + epilogue(add, relu)"));
  }
  SECTION("matmul epilogues / run-time CPU") {
    auto f = fb::compile(linear_relu);
    for (std::size_t n : {R, std::size_t{9}}) {
      INFO("batch " << n);
      const lx_dyn x = random_batch<lx_dyn::shape_type>(n, 71 + n);
      in.check(f(x, in.w, in.b), x, cpu_rel, "relu(x w + b)");
      const std::string plan = fb::explain_text(linear_relu, x, in.w, in.b);
      INFO(plan);
      CHECK(count(plan, "  kernel ") == 1);
      CHECK(contains(plan, "[matmul] matmul + epilogue(add, relu)"));
    }
  }
}

TEST_CASE("capability matrix, row 7: matmul + bias + relu is one kernel with an epilogue (CUDA)",
          "[compile][matrix][cuda]") {
  cache();
  const linear_case in;
  auto cell = [&](const auto& x, auto shape_tag) {
    if (!fb::cuda::available()) {
      if (!nvrtc_here()) return;
      using S = typename decltype(shape_tag)::type;
      using E = decltype(linear_relu(fb::input_leaf<0, float, S>{}, fb::input_leaf<1, float, lw::shape_type>{},
                                     fb::input_leaf<2, float, lb::shape_type>{}));
      // The epilogue kernel is rendered and compiled too (it runs where cuBLASLt does not take the
      // epilogue whole).
      cuda_program_of<E>(x.extents().extent[0], "matrix_epilogue", [](const auto& p, const auto&) {
        REQUIRE(p.plan.n_kernels == 1);
        CHECK(p.plan.kernels[0].kind == fb::plan::kernel_kind::matmul);
        CHECK(p.plan.kernels[0].group >= 0);  // add and relu are the product's kernel's epilogue
      });
      return;
    }
    auto f = fb::compile(linear_relu);
    const auto dx = device(x);
    const auto dw = device(in.w);
    const auto db = device(in.b);
    (void)f(dx, dw, db).to_host();  // built
    const auto spans = profiled([&] { in.check(f(dx, dw, db).to_host(), x, gpu_rel, "relu(x w + b)"); });
    INFO(joined(spans));
    // bias and relu in cuBLASLt's epilogue: one library call, no epilogue kernel after it.
    CHECK(spans_with(spans, "cuBLASLt matmul + bias + relu") == 1);
    CHECK(spans.size() == 1);
  };
  SECTION("matmul epilogues / static CUDA") { cell(in.x, std::type_identity<lx_static::shape_type>{}); }
  SECTION("matmul epilogues / run-time CUDA") { cell(dyn_batch(in.x), std::type_identity<lx_dyn::shape_type>{}); }
}

// ================================================================================================
// Row 8. value_and_grad: compile(value_and_grad(loss, wrt<x, w, b>)) on static shapes and on a dyn
// batch that varies, every gradient element against a double backprop by hand.
// ================================================================================================

namespace {
using gx_dyn = fb::tensor<float, fb::shape<fb::dyn, GI>>;
using gt_dyn = fb::tensor<float, fb::shape<fb::dyn, GO>>;
struct grad_case {
  fb::tensor<float, fb::shape<GI, GO>> w;
  fb::tensor<float, fb::shape<GO>> b;
  grad_case() {
    fbt::fill_signed(w, 81, 0.05, 0.5);
    fbt::fill_signed(b, 82, 0.05, 0.3);
  }
};
}  // namespace

TEST_CASE("capability matrix, row 8: compiled value_and_grad, static shapes and a dyn batch (CPU)", "[compile][matrix]") {
  cache();
  const grad_case in;
  auto vg = fb::compile(fb::value_and_grad(mse_relu, fb::wrt<0, 1, 2>));
  SECTION("value_and_grad / static CPU") {
    fb::tensor<float, fb::shape<32, GI>> x;
    fb::tensor<float, fb::shape<32, GO>> t;
    fbt::fill_signed(x, 83, 0.1, 1.0);
    fbt::fill_signed(t, 84, 0.1, 1.0);
    const auto [loss, grads] = vg(x, in.w, in.b, t);
    check_grads(loss, grads, x, in.w, in.b, t, 1e-4, "static [32, 16]");
  }
  SECTION("value_and_grad / run-time CPU") {
    const auto before = fb::jit::counters().snapshot();
    for (const std::size_t batch : {32u, 17u, 5u, 32u}) {
      const gx_dyn x = random_batch<gx_dyn::shape_type>(batch, 100 + batch, 0.1, 1.0);
      const gt_dyn t = random_batch<gt_dyn::shape_type>(batch, 200 + batch, 0.1, 1.0);
      const auto [loss, grads] = vg(x, in.w, in.b, t);
      check_grads(loss, grads, x, in.w, in.b, t, 1e-4, "batch " + std::to_string(batch));
    }
    // The first specialisation (32), then one with the batch symbolic (17), which 5 reuses, and 32
    // the first: one recompile, as compile() of the forward alone.
    const auto after = fb::jit::counters().snapshot();
    CHECK(after.recompiles - before.recompiles <= 1);
    CHECK(after.compiles - before.compiles <= 2);
  }
}

TEST_CASE("capability matrix, row 8: compiled value_and_grad, static shapes and a dyn batch (CUDA)",
          "[compile][matrix][cuda]") {
  cache();
  const grad_case in;
  auto vg = fb::compile(fb::value_and_grad(mse_relu, fb::wrt<0, 1, 2>));
  // Without a GPU: the joint program (forward and backward in one plan) planned for the GPU, its
  // kernels rendered and compiled by NVRTC; its plan holds the forward's product and the two
  // gradient products (x's and w's).
  using W = fb::tensor<float, fb::shape<GI, GO>>;
  using Bv = fb::tensor<float, fb::shape<GO>>;
  auto planned = [](const auto& p, const auto&) {
    int products = 0;
    for (int k = 0; k < p.plan.n_kernels; ++k) products += p.plan.kernels[k].kind == fb::plan::kernel_kind::matmul;
    CHECK(products == 3);
  };
  SECTION("value_and_grad / static CUDA") {
    if (!fb::cuda::available()) {
      if (!nvrtc_here()) return;
      using P = typename decltype(vg)::template program_type<fb::tensor<float, fb::shape<32, GI>>, W, Bv,
                                                             fb::tensor<float, fb::shape<32, GO>>>;
      cuda_program_of_prog<P>(0, "matrix_grad_static", planned);
      return;
    }
    fb::tensor<float, fb::shape<32, GI>> x;
    fb::tensor<float, fb::shape<32, GO>> t;
    fbt::fill_signed(x, 85, 0.1, 1.0);
    fbt::fill_signed(t, 86, 0.1, 1.0);
    const auto [loss, grads] = vg(device(x), device(in.w), device(in.b), device(t));
    const auto& [dx, dw, db] = grads;
    check_grads(loss.to_host(), std::make_tuple(dx.to_host(), dw.to_host(), db.to_host()), x, in.w, in.b, t, 1e-4,
                "static [32, 16]");
  }
  SECTION("value_and_grad / run-time CUDA") {
    if (!fb::cuda::available()) {
      if (!nvrtc_here()) return;
      using P = typename decltype(vg)::template program_type<gx_dyn, W, Bv, gt_dyn>;
      cuda_program_of_prog<P>(17, "matrix_grad_dyn", planned);
      cuda_program_of_prog<P>(0, "matrix_grad_symbolic", planned);
      return;
    }
    const auto dw = device(in.w);
    const auto db = device(in.b);
    const auto before = fb::jit::counters().snapshot();
    for (const std::size_t batch : {32u, 17u, 5u, 32u}) {
      const gx_dyn x = random_batch<gx_dyn::shape_type>(batch, 300 + batch, 0.1, 1.0);
      const gt_dyn t = random_batch<gt_dyn::shape_type>(batch, 400 + batch, 0.1, 1.0);
      const auto [loss, grads] = vg(device(x), dw, db, device(t));
      const auto& [gx, gw, gb] = grads;
      check_grads(loss.to_host(), std::make_tuple(gx.to_host(), gw.to_host(), gb.to_host()), x, in.w, in.b, t, 1e-4,
                  "batch " + std::to_string(batch));
    }
    CHECK(fb::jit::counters().snapshot().recompiles - before.recompiles <= 1);
  }
}

// ================================================================================================
// Row 9. the nn training step on a dyn batch (nn::compile_step, eval mode: no dropout masks) equals
// the eager step on static copies of the same rows.
// ================================================================================================

TEST_CASE("capability matrix, row 9: the nn training step on a dyn batch equals the eager step (CPU)",
          "[compile][matrix]") {
  cache();
  net<double> m = make_net();
  auto compiled = nn::compile_step(m, nn::mse_loss_fn{}, nn::eval);
  auto eager = nn::eager_step(m, nn::mse_loss_fn{}, nn::eval);
  SECTION("nn step / static CPU") {
    const auto [x, t] = step_inputs<7>(91);
    auto [la, ga] = compiled(x, t);
    auto [lb, gb] = eager(x, t);
    check_step(la, ga, lb, gb, 1e-12, "static batch 7");
  }
  SECTION("nn step / run-time CPU") {
    auto one = [&]<std::size_t B>(std::uint64_t seed) {
      const auto [xs, ts] = step_inputs<B>(seed);
      auto [la, ga] = compiled(dyn_batch(xs), dyn_batch(ts));
      auto [lb, gb] = eager(xs, ts);
      check_step(la, ga, lb, gb, 1e-12, "dyn batch " + std::to_string(B));
    };
    const auto before = fb::jit::counters().snapshot();
    one.template operator()<7>(92);
    one.template operator()<3>(93);
    one.template operator()<7>(94);
    CHECK(fb::jit::counters().snapshot().recompiles - before.recompiles <= 1);
  }
}

// The nn step on the GPU: nn::to_device(model) uploads the parameters once and compile_step over it
// takes device x and targets (nn/device.hpp); compared with the eager step of the double model (the
// same numbers: make_net rounds them to float).
TEST_CASE("capability matrix, row 9: the nn training step on a dyn batch equals the eager step (CUDA)",
          "[compile][matrix][cuda]") {
  cache();
  net<double> md = make_net();
  net<float> mf;
  {
    auto pd = md.parameters<double>();
    auto pf = mf.parameters<float>();
    REQUIRE(pd.size() == pf.size());
    for (std::size_t i = 0; i < pd.size(); ++i)
      for (std::size_t k = 0; k < pd[i].size(); ++k) pf[i].data[k] = static_cast<float>(pd[i].data[k]);
  }
  auto eager = nn::eager_step(md, nn::mse_loss_fn{}, nn::eval);
  auto to_float = [](const auto& t) {
    fb::tensor<float, typename std::remove_cvref_t<decltype(t)>::shape_type> f(t.extents());
    for (std::size_t i = 0; i < t.size(); ++i) f.flat(i) = static_cast<float>(t.flat(i));
    return f;
  };
  // Built only where a GPU is (uploading needs one); the step is made once per cell.
  auto run = [&](auto& step, const auto& x, const auto& t) {
    auto [l, g] = step(device(to_float(x)), device(to_float(t)));
    auto host = std::apply([](const auto&... gi) { return std::make_tuple(gi.to_host()...); }, g);
    return std::make_pair(l.to_host(), host);
  };
  SECTION("nn step / static CUDA") {
    FUSEBOX_REQUIRE_GPU();
    auto gpu = nn::to_device(mf);
    auto step = nn::compile_step(gpu, nn::mse_loss_fn{}, nn::eval);
    const auto [x, t] = step_inputs<7>(95);
    const auto [la, ga] = run(step, x, t);
    auto [lb, gb] = eager(x, t);
    check_step(la, ga, lb, gb, 1e-5, "static batch 7");
  }
  SECTION("nn step / run-time CUDA") {
    FUSEBOX_REQUIRE_GPU();
    auto gpu = nn::to_device(mf);
    auto step = nn::compile_step(gpu, nn::mse_loss_fn{}, nn::eval);
    auto one = [&]<std::size_t B>(std::uint64_t seed) {
      const auto [xs, ts] = step_inputs<B>(seed);
      const auto [la, ga] = run(step, dyn_batch(xs), dyn_batch(ts));
      auto [lb, gb] = eager(xs, ts);
      check_step(la, ga, lb, gb, 1e-5, "dyn batch " + std::to_string(B));
    };
    const auto before = fb::jit::counters().snapshot();
    one.template operator()<7>(96);
    one.template operator()<3>(97);
    one.template operator()<7>(98);
    CHECK(fb::jit::counters().snapshot().recompiles - before.recompiles <= 1);
  }
}

// ================================================================================================
// Row 10. profile: kernel spans are named by the ops they fuse.
// ================================================================================================

TEST_CASE("capability matrix, row 10: profile spans named by their fused ops (CPU)", "[compile][matrix]") {
  cache();
  const linear_case in;
  SECTION("profile / static CPU") {
    auto f = fb::compile(linear_relu);
    (void)f(in.x, in.w, in.b);  // warm: arena allocated
    const auto spans = profiled([&] { in.check(f(in.x, in.w, in.b), in.x, cpu_rel, "relu(x w + b)"); });
    INFO(joined(spans));
    REQUIRE(spans.size() == 1);
    CHECK(spans[0] == "matmul + epilogue(add, relu)");
    // The same words as explain's kernel line.
    CHECK(contains(fb::explain_text(linear_relu, in.x, in.w, in.b), "] " + spans[0] + "\n"));
  }
  SECTION("profile / run-time CPU") {
    const lx_dyn xd = dyn_batch(in.x);
    auto f = fb::compile(linear_relu);
    (void)f(xd, in.w, in.b);  // built
    const auto spans = profiled([&] { in.check(f(xd, in.w, in.b), xd, cpu_rel, "relu(x w + b)"); });
    INFO(joined(spans));
    REQUIRE(spans.size() == 1);
    // Named as on the static path (the generated kernel's summary is the span's detail), and as
    // explain's kernel line on this path says.
    CHECK(spans[0] == "matmul + epilogue(add, relu)");
    CHECK(contains(fb::explain_text(linear_relu, xd, in.w, in.b), "] " + spans[0] + "\n"));
  }
}

TEST_CASE("capability matrix, row 10: profile spans named by their fused ops (CUDA)", "[compile][matrix][cuda]") {
  cache();
  const linear_case in;
  // Spans are recorded where kernels are enqueued: without a GPU nothing runs, and the cells skip.
  auto cell = [&](const auto& x) {
    FUSEBOX_REQUIRE_GPU();
    auto f = fb::compile(linear_relu);
    const auto dx = device(x);
    const auto dw = device(in.w);
    const auto db = device(in.b);
    (void)f(dx, dw, db).to_host();  // built
    const auto spans = profiled([&] { in.check(f(dx, dw, db).to_host(), x, gpu_rel, "relu(x w + b)"); });
    INFO(joined(spans));
    REQUIRE(spans.size() == 1);
    CHECK(spans[0] == "cuBLASLt matmul + bias + relu");
  };
  SECTION("profile / static CUDA") { cell(in.x); }
  SECTION("profile / run-time CUDA") { cell(dyn_batch(in.x)); }
}

// ================================================================================================
// Row 11. modes: default_, reduce_overhead and max_autotune give the reference's results on every
// path, and each other's within the same bound.
// ================================================================================================

namespace {
constexpr fb::mode all_modes[] = {fb::mode::default_, fb::mode::reduce_overhead, fb::mode::max_autotune};
const char* mode_name(fb::mode m) {
  return m == fb::mode::default_ ? "default_" : m == fb::mode::reduce_overhead ? "reduce_overhead" : "max_autotune";
}
}  // namespace

TEST_CASE("capability matrix, row 11: every mode gives the same results (CPU)", "[compile][matrix]") {
  cache();
  const linear_case in;
  auto cell = [&](const auto& x, bool dyn) {
    std::vector<std::vector<float>> results;
    for (fb::mode m : all_modes) {
      INFO("mode " << mode_name(m));
      auto f = fb::compile(linear_relu, {.mode = m});
      const auto fast0 = fb::jit::counters().snapshot().fast_path_calls;
      const auto y1 = f(x, in.w, in.b);
      const auto y2 = f(x, in.w, in.b);  // a repeat: reduce_overhead's fast path on the run-time path
      in.check(y1, x, cpu_rel, "first call");
      in.check(y2, x, cpu_rel, "second call");
      const auto fast = fb::jit::counters().snapshot().fast_path_calls - fast0;
      CHECK(fast == (dyn && m != fb::mode::default_ ? 1u : 0u));
      if (m == fb::mode::max_autotune) CHECK(fb::cpu::autotune::known() >= 1);  // the gemm's timed choice
      results.emplace_back(y1.data(), y1.data() + y1.size());
    }
    // Each mode within the reference's bound of the others (max_autotune's gemm may sum in another
    // order).
    const auto [ref, bound] = in.reference(x, cpu_rel);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      INFO("element " << i);
      REQUIRE(std::fabs(results[1][i] - results[0][i]) <= 2 * bound[i]);
      REQUIRE(std::fabs(results[2][i] - results[0][i]) <= 2 * bound[i]);
    }
  };
  SECTION("modes / static CPU") { cell(in.x, false); }
  SECTION("modes / run-time CPU") { cell(dyn_batch(in.x), true); }
}

TEST_CASE("capability matrix, row 11: every mode gives the same results (CUDA)", "[compile][matrix][cuda]") {
  cache();
  const linear_case in;
  // Without a GPU the modes have nothing to run (CUDA graphs and cuBLASLt's timing): the cells skip.
  auto cell = [&](const auto& x) {
    FUSEBOX_REQUIRE_GPU();
    const auto dx = device(x);
    const auto dw = device(in.w);
    const auto db = device(in.b);
    std::vector<std::vector<float>> results;
    for (fb::mode m : all_modes) {
      INFO("mode " << mode_name(m));
      auto f = fb::compile(linear_relu, {.mode = m});
      const auto graphs0 = fb::jit::counters().snapshot();
      const auto y1 = f(dx, dw, db).to_host();
      const auto y2 = f(dx, dw, db).to_host();  // reduce_overhead and max_autotune: a CUDA graph
      in.check(y1, x, gpu_rel, "first call");
      in.check(y2, x, gpu_rel, "second call");
      const auto graphs = fb::jit::counters().snapshot();
      const auto recorded = graphs.graph_captures + graphs.graph_replays - graphs0.graph_captures - graphs0.graph_replays;
      if (m == fb::mode::default_) CHECK(recorded == 0);
      else CHECK(recorded >= 1);
      results.emplace_back(y1.data(), y1.data() + y1.size());
    }
    const auto [ref, bound] = in.reference(x, gpu_rel);
    for (std::size_t i = 0; i < ref.size(); ++i) {
      INFO("element " << i);
      REQUIRE(std::fabs(results[1][i] - results[0][i]) <= 2 * bound[i]);
      REQUIRE(std::fabs(results[2][i] - results[0][i]) <= 2 * bound[i]);
    }
  };
  SECTION("modes / static CUDA") { cell(in.x); }
  SECTION("modes / run-time CUDA") { cell(dyn_batch(in.x)); }
}
