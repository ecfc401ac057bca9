// tests/compile/composite.cpp: compile() (include/fusebox/compile.hpp) on whole models: the reference
// workload structures at small sizes (W1c gelu(x w + b) sigmoid(x), W2c layer_norm(softmax(x)), W3c a
// three-layer GELU MLP), multi-output models, inputs that are strided views, run(out, ...) into a
// preallocated output, and shape errors on dyn extents. Random compositions of ops are in
// tests/compile/compositions.cpp; explain(), graph breaks and ab() in explain.cpp, graph_break.cpp
// and ab.cpp beside this file.
//
// Every model is checked three ways: compiled against eager (run on dyn copies of the inputs, the
// op-by-op path), and both against the same model run eagerly in double on the same values (the
// reference). Compiled results must be bitwise identical for 1, 2 and 4 threads: each row is
// computed by one thread and gemm never splits K (backend/cpu/executor.hpp, backend/cpu/gemm.hpp).
// Norm-wise tolerance (max |a - b| / max |b|): 2e-6 for float against the double reference, 1e-6
// between float paths. The double run shares the ops' code with the paths under test, so it finds
// fusion and scheduling errors, not op errors: those are tested against independent references in
// tests/ops/.
#include <cmath>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;
using fbt::coord;

namespace {

using fbt::rel_diff;
using fbt::to_double_dyn;

/// compiled == eager == double reference for a single-output model; threads 1, 2, 4 identical.
template <class Model, class... X>
void check_model(Model model, const std::string& what, const X&... x) {
  INFO(what);
  const auto c1 = fb::compile(model, {.threads = 1})(x...);
  const auto c2 = fb::compile(model, {.threads = 2})(x...);
  const auto c4 = fb::compile(model, {.threads = 4})(x...);
  fbt::check_identical(c1, c2, what + ": 1 thread == 2 threads");
  fbt::check_identical(c1, c4, what + ": 1 thread == 4 threads");
  const auto e = fb::eager(model)(fbt::to_dyn(x)...);
  const auto ref = fb::eager(model)(to_double_dyn(x)...);
  CHECK(rel_diff(c1, e) <= 1e-6);
  CHECK(rel_diff(c1, ref) <= 2e-6);
  CHECK(rel_diff(e, ref) <= 2e-6);
}

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// W1c, W2c, W3c structures (BENCHMARKS.md), small sizes.
auto w1c = [](auto x, auto w, auto b) { return fb::gelu(x * w + b) * fb::sigmoid(x); };
auto w2c = [](auto x, auto gamma, auto beta) { return fb::layer_norm(fb::softmax(x), gamma, beta, 1e-5); };
auto w3c = [](auto x, auto w1, auto b1, auto w2, auto b2, auto w3, auto b3) {
  const auto h1 = fb::gelu(fb::matmul(x, w1) + b1);
  const auto h2 = fb::gelu(fb::matmul(h1, w2) + b2);
  return fb::matmul(h2, w3) + b3;
};

}  // namespace

TEST_CASE("W1c structure: gelu(x * w + b) * sigmoid(x)", "[compile][composite]") {
  // 400 rows of 100: several tasks, so the thread counts really split the work.
  fb::tensor<float, fb::shape<400, 100>> x;
  fb::tensor<float, fb::shape<100>> w, b;
  fbt::fill_signed(x, 1, 0.05, 3.0);
  fbt::fill_signed(w, 2, 0.05, 1.0);
  fbt::fill_signed(b, 3, 0.05, 1.0);
  check_model(w1c, "W1c", x, w, b);
  // And element by element against the formula, in double.
  const auto c = fb::compile(w1c)(x, w, b);
  fbt::check_all(
      c,
      [&](const coord& i) {
        const double xv = fbt::at(x, i, 2);
        const double h = static_cast<float>(xv * fbt::at(w, i, 2)) + fbt::at(b, i, 2);
        return gelu_ref(h) / (1 + std::exp(-xv));
      },
      {1e-7, 2e-6}, "W1c against the formula");
  // One fused kernel.
  const std::string plan = fb::explain_text(w1c, x, w, b);
  CHECK(contains(plan, "kernel 0 [rows] mul, add, gelu, sigmoid, mul"));
  CHECK_FALSE(contains(plan, "kernel 1"));
}

TEST_CASE("W2c structure: layer_norm(softmax(x), gamma, beta, 1e-5)", "[compile][composite]") {
  fb::tensor<float, fb::shape<200, 256>> x;
  fb::tensor<float, fb::shape<256>> gamma, beta;
  fbt::fill_signed(x, 4, 0.05, 3.0);
  fbt::fill_uniform(gamma, 5, 0.5, 2.0);
  fbt::fill_signed(beta, 6, 0.05, 1.0);
  check_model(w2c, "W2c", x, gamma, beta);
  // One row kernel: max, sum, then layer_norm's variance (its mean is the sum's, rewritten below),
  // all while the row is in cache.
  const std::string plan = fb::explain_text(w2c, x, gamma, beta);
  CHECK(contains(plan, "kernel 0 [rows]"));
  CHECK(contains(plan, "3 reduction pass(es)"));
  CHECK_FALSE(contains(plan, "kernel 1"));
}

// layer_norm(exp(z) / sum(exp(z))) is rewritten to (e - s / n) rsqrt(var(e) + eps s^2) (ops/composite.hpp):
// one row pass and the per-element division fewer. The double reference runs op by op, where no
// rewrite happens (eager ops return tensors), so it checks the algebra, in three regimes: the row's
// variance below eps (W2c), far above it (a peaked softmax), and eps negligible.
TEST_CASE("layer_norm of a softmax drops the division and keeps the result", "[compile][composite]") {
  constexpr std::size_t rows = 37, cols = 300;  // not a multiple of any vector width
  fb::tensor<float, fb::shape<rows, cols>> x;
  fb::tensor<float, fb::shape<cols>> gamma, beta;
  fbt::fill_uniform(gamma, 31, 0.5, 2.0);
  fbt::fill_signed(beta, 32, 0.05, 1.0);
  fb::tensor<float, fb::shape<fb::dyn, cols>> x_rows(fb::dims{2, {rows, cols}});
  for (const double scale : {3.0, 30.0}) {
    for (const double eps : {1e-5, 1e-12}) {
      const std::string what = "x in +-[0.05, " + std::to_string(scale) + "], eps " + std::to_string(eps);
      INFO(what);
      fbt::fill_signed(x, 33 + static_cast<std::uint64_t>(scale), 0.05, scale);
      for (std::size_t i = 0; i < x.size(); ++i) x_rows.flat(i) = x.flat(i);
      auto model = [eps](auto x, auto g, auto b) { return fb::layer_norm(fb::softmax(x), g, b, eps); };
      const auto ref = fb::eager(model)(to_double_dyn(x), to_double_dyn(gamma), to_double_dyn(beta));
      const auto y = fb::compile(model)(x, gamma, beta);
      CHECK(rel_diff(y, ref) <= 2e-6);
      // The run-time path rewrites too when the row's extent is static, and not when it is dyn.
      CHECK(rel_diff(fb::compile(model)(x_rows, gamma, beta), ref) <= 2e-6);
      CHECK(rel_diff(fb::compile(model)(fbt::to_dyn(x), fbt::to_dyn(gamma), fbt::to_dyn(beta)), ref) <= 2e-6);
      CHECK(contains(fb::explain_text(model, x, gamma, beta), "3 reduction pass(es)"));
      CHECK(contains(fb::explain_text(model, x_rows, gamma, beta), "3 reduction pass(es)"));
      CHECK(contains(fb::explain_text(model, fbt::to_dyn(x), fbt::to_dyn(gamma), fbt::to_dyn(beta)), "4 reduction pass(es)"));
    }
  }
  // Not rewritten: x / sum(x) can sum to a negative number, where dividing by s is not a positive
  // rescaling (the rewrite would flip the sign of the whole row).
  fbt::fill_signed(x, 40, 0.05, 1.0);
  for (std::size_t c = 0; c < cols; ++c) x(0, c) = -std::abs(x(0, c));  // row 0 sums below 0
  auto ratio = [](auto x, auto g, auto b) { return fb::layer_norm(x / fb::sum(x, fb::axis<-1>, fb::keepdim), g, b, 1e-5); };
  const auto ref = fb::eager(ratio)(to_double_dyn(x), to_double_dyn(gamma), to_double_dyn(beta));
  CHECK(rel_diff(fb::compile(ratio)(x, gamma, beta), ref) <= 2e-6);
  CHECK(contains(fb::explain_text(ratio, x, gamma, beta), "3 reduction pass(es)"));  // sum, mean, variance
}

TEST_CASE("W3c structure: three-layer MLP with GELU", "[compile][composite]") {
  fb::tensor<float, fb::shape<33, 64>> x;
  fb::tensor<float, fb::shape<64, 96>> w1;
  fb::tensor<float, fb::shape<96>> b1;
  fb::tensor<float, fb::shape<96, 80>> w2;
  fb::tensor<float, fb::shape<80>> b2;
  fb::tensor<float, fb::shape<80, 10>> w3;
  fb::tensor<float, fb::shape<10>> b3;
  fbt::fill_signed(x, 7, 0.05, 1.0);
  fbt::fill_signed(w1, 8, 0.01, 0.2);
  fbt::fill_signed(b1, 9, 0.01, 0.5);
  fbt::fill_signed(w2, 10, 0.01, 0.2);
  fbt::fill_signed(b2, 11, 0.01, 0.5);
  fbt::fill_signed(w3, 12, 0.01, 0.2);
  fbt::fill_signed(b3, 13, 0.01, 0.5);
  check_model(w3c, "W3c", x, w1, b1, w2, b2, w3, b3);
  // Three matmul kernels, each with its bias (and GELU) as an epilogue.
  const std::string plan = fb::explain_text(w3c, x, w1, b1, w2, b2, w3, b3);
  CHECK(contains(plan, "kernel 0 [matmul] matmul + epilogue(add, gelu)"));
  CHECK(contains(plan, "kernel 1 [matmul] matmul + epilogue(add, gelu)"));
  CHECK(contains(plan, "kernel 2 [matmul] matmul + epilogue(add)"));
  CHECK_FALSE(contains(plan, "kernel 3"));
}

TEST_CASE("multi-output models return every output correctly", "[compile][multi_output]") {
  fb::tensor<float, fb::shape<17, 33>> x;
  fb::tensor<float, fb::shape<33>> w;
  fbt::fill_signed(x, 21, 0.05, 3.0);
  fbt::fill_signed(w, 22, 0.05, 1.0);
  const auto xd = fbt::to_dyn(x);
  const auto wd = fbt::to_dyn(w);

  SECTION("an intermediate, a consumer of it, and a row reduction of it") {
    auto model = [](auto x, auto w) {
      const auto h = x * w + 1.0;
      return std::make_tuple(h, fb::relu(h), fb::sum(h, fb::axis<-1>));
    };
    const auto [h, r, s] = fb::compile(model)(x, w);
    const auto [he, re, se] = fb::eager(model)(xd, wd);
    CHECK(rel_diff(h, he) <= 1e-6);
    CHECK(rel_diff(r, re) <= 1e-6);
    CHECK(rel_diff(s, se) <= 1e-6);
  }
  SECTION("an intermediate that also feeds a column reduction (axis 0)") {
    // exp(x) is both an output and the producer fused into the column reduction: the reduction's
    // kernel must also write it.
    auto model = [](auto x) { return std::make_tuple(fb::sum(fb::exp(x), fb::axis<0>), fb::exp(x)); };
    const auto [s, e] = fb::compile(model)(x);
    const auto [se, ee] = fb::eager(model)(xd);
    CHECK(rel_diff(s, se) <= 1e-6);
    CHECK(rel_diff(e, ee) <= 1e-6);
  }
  SECTION("the same expression returned twice") {
    // fb::exp(x) twice (and neg(x) and -x) are one node after identical subtrees merge; both
    // outputs must still be written.
    auto model = [](auto x) { return std::make_tuple(fb::exp(x), fb::neg(x), fb::exp(x), -x); };
    const auto [a, b, c, d] = fb::compile(model)(x);
    fbt::check_all(a, [&](const coord& i) { return std::exp(fbt::at(x, i, 2)); }, {1e-7, 1e-6}, "exp(x), first");
    fbt::check_all(c, [&](const coord& i) { return std::exp(fbt::at(x, i, 2)); }, {1e-7, 1e-6}, "exp(x), second");
    fbt::check_all(b, [&](const coord& i) { return -fbt::at(x, i, 2); }, fbt::exact, "neg(x)");
    fbt::check_all(d, [&](const coord& i) { return -fbt::at(x, i, 2); }, fbt::exact, "-x");
  }
  SECTION("an input, and a transposed view of an intermediate, as outputs") {
    auto model = [](auto x) { return std::make_tuple(x, fb::transpose(x * 2.0)); };
    const auto [same, t] = fb::compile(model)(x);
    fbt::check_identical(same, x, "input returned as is");
    CHECK(same.data() != x.data());  // a copy: the caller owns its outputs
    REQUIRE(t.extents() == fb::dims{2, {33, 17}});
    fbt::check_all(t, [&](const coord& i) { return 2 * x(i[1], i[0]); }, fbt::exact, "transpose(x * 2)");
  }
}

TEST_CASE("strided views as inputs give the same results as contiguous copies", "[compile][views]") {
  fb::tensor<float, fb::shape<100, 17>> xt;  // the transposed storage of x [17, 100]
  fb::tensor<float, fb::shape<100>> w, b;
  fbt::fill_signed(xt, 31, 0.05, 3.0);
  fbt::fill_signed(w, 32, 0.05, 1.0);
  fbt::fill_signed(b, 33, 0.05, 1.0);
  const auto xv = xt.transpose();  // [17, 100], strides (1, 17)
  REQUIRE_FALSE(xv.contiguous());
  const auto xc = xv.clone();
  REQUIRE(xc.contiguous());

  SECTION("elementwise (W1c)") {
    fbt::check_identical(fb::compile(w1c)(xv, w, b), fb::compile(w1c)(xc, w, b), "W1c on a view");
  }
  SECTION("row reductions (softmax) and column reductions") {
    auto model = [](auto x) { return fb::softmax(x) + fb::mean(x, fb::axis<0>, fb::keepdim); };
    const auto v = fb::compile(model)(xv);
    const auto c = fb::compile(model)(xc);
    CHECK(rel_diff(v, c) <= 1e-6);
    CHECK(rel_diff(v, fb::eager(model)(to_double_dyn(xc))) <= 2e-6);
  }
  SECTION("a slice (row offset, full stride) as an input") {
    fb::tensor<float, fb::shape<40, 100>> big;
    fbt::fill_signed(big, 34, 0.05, 3.0);
    const auto rows = big.slice<0, 5, 22>();  // [17, 100], offset 5 rows
    REQUIRE(rows.data() == big.data() + 500);
    fbt::check_identical(fb::compile(w1c)(rows, w, b), fb::compile(w1c)(rows.clone(), w, b), "W1c on a slice");
  }
}

TEST_CASE("run(out, ...) writes into a preallocated output", "[compile][run]") {
  fb::tensor<float, fb::shape<17, 100>> x;
  fb::tensor<float, fb::shape<100>> w, b;
  fbt::fill_signed(x, 41, 0.05, 3.0);
  fbt::fill_signed(w, 42, 0.05, 1.0);
  fbt::fill_signed(b, 43, 0.05, 1.0);
  auto c = fb::compile(w1c);
  fb::tensor<float, fb::shape<17, 100>> out;
  out.fill(-123.0f);
  const float* where_before = out.data();
  c.run(out, x, w, b);
  CHECK(out.data() == where_before);
  fbt::check_identical(out, c(x, w, b), "run(out) == operator()");
  // Again, after the arena exists: same storage, same values.
  out.fill(0.0f);
  c.run(out, x, w, b);
  CHECK(out.data() == where_before);
  fbt::check_identical(out, c(x, w, b), "second run(out)");

  SECTION("a non-contiguous output is refused by name") {
    fb::tensor<float, fb::shape<100, 17>> storage;
    auto view = storage.transpose();  // [17, 100], not contiguous
    REQUIRE_THROWS_AS(c.run(view, x, w, b), fb::invalid_argument);
    REQUIRE_THROWS_WITH(c.run(view, x, w, b), Catch::Contains("not contiguous"));
  }
}

TEST_CASE("shape mismatches on dyn extents throw shape_error naming op, shapes and call site", "[compile][errors]") {
  fb::tensor<float, fb::shape<fb::dyn, fb::dyn>> a(3, 4), m(5, 6);
  fb::tensor<float, fb::shape<fb::dyn>> b(5);
  a.fill(1);
  b.fill(1);
  m.fill(1);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const fb::shape_error& e) {
      return std::string(e.what());
    }
    FAIL("no fusebox::shape_error thrown");
    return std::string();
  };
  const std::string file = "composite.cpp";

  SECTION("a named elementwise op") {
    const std::string s = message([&] { (void)fb::add(a, b); });
    INFO(s);
    CHECK(contains(s, "add"));
    CHECK(contains(s, "[3, 4]"));
    CHECK(contains(s, "[5]"));
    CHECK(contains(s, file));
  }
  SECTION("inside an eager model") {
    auto model = [](auto x, auto y) { return fb::mul(fb::exp(x), y); };
    const std::string s = message([&] { (void)fb::eager(model)(a, b); });
    INFO(s);
    CHECK(contains(s, "mul"));
    CHECK(contains(s, "[3, 4]"));
    CHECK(contains(s, "[5]"));
    CHECK(contains(s, file));
  }
  SECTION("matmul") {
    const std::string s = message([&] { (void)fb::matmul(a, m); });
    INFO(s);
    CHECK(contains(s, "matmul"));
    CHECK(contains(s, "[3, 4]"));
    CHECK(contains(s, "[5, 6]"));
    CHECK(contains(s, file));
  }
  SECTION("an operator (no source line: the message says so)") {
    const std::string s = message([&] { (void)(a + b); });
    INFO(s);
    CHECK(contains(s, "add"));
    CHECK(contains(s, "[3, 4]"));
    CHECK(contains(s, "[5]"));
    CHECK(contains(s, "call the named function"));
  }
  SECTION("matching dyn shapes do not throw") {
    fb::tensor<float, fb::shape<fb::dyn>> row(4);
    row.fill(2);
    const auto r = fb::add(a, row);
    CHECK(r.extents() == fb::dims{2, {3, 4}});
    CHECK(r(2, 3) == 3.0f);
  }
}

