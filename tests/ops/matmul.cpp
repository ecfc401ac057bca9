// tests/ops/matmul.cpp: matmul (include/fusebox/ops/matmul.hpp) run through the CPU executor and
// cpu::gemm: 2-D, batched, batch-1 broadcast and a shared rank-2 operand, transposed operands as
// views (fb::transpose in the model, and tensor::transpose() views passed in), odd sizes (1, 3, 17,
// 100), and in compiled mode the epilogues the planner fuses (bias + relu, bias + gelu, residual
// add). Eager, compiled and a double reference agree.
//
// Tolerance: every C[i][j] is a sum of K products, whatever order gemm adds them in, within
// K u sum_k |a_ik b_kj| of the exact value (u = eps / 2); the check allows (K + 2) eps times that sum.
// An epilogue adds its own op's tolerance on top. Eager and compiled run the same gemm path on the
// same shapes (gemm.hpp: one fma chain per element, independent of threads), and the epilogue
// applies the same ops to the same values as eager's separate kernels, so they must agree bit for
// bit.
//
// Built once per element type, as tests/ops/elementwise.cpp (FUSEBOX_TEST_ELEMENT: float, double).
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/check.hpp"

#ifndef FUSEBOX_TEST_ELEMENT
#define FUSEBOX_TEST_ELEMENT float
#endif
#define FBT_STR2(x) #x
#define FBT_STR(x) FBT_STR2(x)
#define FBT_TYPE " (" FBT_STR(FUSEBOX_TEST_ELEMENT) ")"

namespace fb = fusebox;
using T = FUSEBOX_TEST_ELEMENT;
using fbt::coord;

namespace {

constexpr double eps = std::numeric_limits<T>::epsilon();

/// The element (i, j) of batch b of a matrix operand of rank 2 or 3 (rank 2: shared by all
/// batches; batch extent 1: broadcast).
template <class X>
double mat_at(const X& x, std::size_t b, std::size_t i, std::size_t j) {
  coord c{};
  if (x.extents().rank == 3) {
    c = {x.extent(0) == 1 ? 0 : b, i, j};
    return fbt::at(x, c, 3);
  }
  c = {i, j};
  return fbt::at(x, c, 2);
}

/// The product at output coordinate o (rank 2 or 3) and the bound on its rounding error.
template <class A, class B>
std::pair<double, double> product(const A& a, const B& b, const coord& o, std::size_t out_rank) {
  const std::size_t batch = out_rank == 3 ? o[0] : 0;
  const std::size_t i = o[out_rank - 2], j = o[out_rank - 1];
  const std::size_t k_extent = a.extent(a.extents().rank - 1);
  double s = 0, mag = 0;
  for (std::size_t k = 0; k < k_extent; ++k) {
    const double p = mat_at(a, batch, i, k) * mat_at(b, batch, k, j);
    s += p;
    mag += std::fabs(p);
  }
  return {s, static_cast<double>(k_extent + 2) * eps * mag};
}

/// Checks c == epi(a b) with epi applied to the double product; epi_tol is the epilogue's own
/// relative tolerance (0 for exact ops: +, relu).
template <class C, class A, class B, class Epi>
void check_product(const C& c, const A& a, const B& b, Epi epi, double epi_tol, const std::string& what) {
  const std::size_t r = c.extents().rank;
  const std::size_t ra = a.extents().rank, rb = b.extents().rank;
  INFO(what);
  REQUIRE(c.extent(r - 2) == a.extent(ra - 2));
  REQUIRE(c.extent(r - 1) == b.extent(rb - 1));
  fbt::check_bounded(
      c, [&](const coord& o) { return epi(product(a, b, o, r).first, o); },
      [&](const coord& o) {
        const auto [v, bound] = product(a, b, o, r);
        // The epilogues used here change the product's error by a factor of at most 1.2 (gelu'
        // is within [-0.13, 1.13]), then round once more.
        return 1.2 * bound + (epi_tol + eps) * std::fabs(epi(v, o)) + 1e-30;
      },
      what);
}

template <class S>
fb::tensor<T, S> input(std::uint64_t seed) {
  fb::tensor<T, S> x;
  fbt::fill_signed(x, seed, 0.05, 1.0);
  return x;
}

auto plain = [](double v, const coord&) { return v; };

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
constexpr double gelu_rel = std::is_same_v<T, float> ? 1e-6 : 1e-14;

/// Static sizes for this element type: (M, K, N).
struct mkn {
  static constexpr std::size_t M = std::is_same_v<T, float> ? 3 : 17;
  static constexpr std::size_t K = std::is_same_v<T, float> ? 17 : 100;
  static constexpr std::size_t N = std::is_same_v<T, float> ? 100 : 3;
};

}  // namespace

TEST_CASE("2-D matmul of odd sizes, eager on dyn extents, against the reference" FBT_TYPE, "[ops][matmul][dyn]") {
  // One instantiation covers every size: gemm's small-M "stream" paths, the M == 1 gemv paths and
  // the blocked path for larger M, with K and N that leave tails in every register block.
  auto model = [](auto a, auto b) { return fb::matmul(a, b); };
  for (std::size_t m : {1u, 2u, 3u, 17u, 100u})
    for (std::size_t k : {1u, 3u, 17u, 100u})
      for (std::size_t n : {1u, 3u, 17u, 100u}) {
        fb::tensor<T, fb::shape<fb::dyn, fb::dyn>> a(m, k), b(k, n), bt_storage(n, k);
        fbt::fill_signed(a, m * 10000 + k * 100 + n, 0.05, 1.0);
        fbt::fill_signed(b, m * 10000 + k * 100 + n + 1, 0.05, 1.0);
        fbt::fill_signed(bt_storage, m * 10000 + k * 100 + n + 2, 0.05, 1.0);
        const std::string w = "[" + std::to_string(m) + ", " + std::to_string(k) + "] x [" + std::to_string(k) + ", " +
                              std::to_string(n) + "]";
        check_product(fb::eager(model)(a, b), a, b, plain, 0, "eager " + w);
        // B stored [N, K] and passed as a transposed view (a PyTorch Linear weight).
        const auto bt = bt_storage.transpose();
        CHECK(bt.stride(0) == 1);
        check_product(fb::eager(model)(a, bt), a, bt, plain, 0, "eager, b a transposed view, " + w);
      }
}

TEST_CASE("compiled matmul with fused epilogues matches eager and the reference" FBT_TYPE,
          "[ops][matmul][epilogue]") {
  constexpr std::size_t M = mkn::M, K = mkn::K, N = mkn::N;
  const auto x = input<fb::shape<M, K>>(1);
  const auto w = input<fb::shape<K, N>>(2);
  const auto bias = input<fb::shape<N>>(3);
  const auto res = input<fb::shape<M, N>>(4);
  const auto xd = fbt::to_dyn(x), wd = fbt::to_dyn(w), resd = fbt::to_dyn(res);
  const auto biasd = fbt::to_dyn(bias);
  auto bias_at = [&](const coord& o) { return fbt::at(bias, o, 2); };

  SECTION("no epilogue") {
    auto model = [](auto x, auto w) { return fb::matmul(x, w); };
    const auto c = fb::compile(model)(x, w);
    check_product(c, x, w, plain, 0, "compiled");
    fbt::check_identical(c, fb::eager(model)(xd, wd), "eager == compiled");
  }
  SECTION("bias + relu") {
    auto model = [](auto x, auto w, auto b) { return fb::relu(fb::matmul(x, w) + b); };
    const auto c = fb::compile(model)(x, w, bias);
    auto epi = [&](double v, const coord& o) { return std::max(v + bias_at(o), 0.0); };
    check_product(c, x, w, epi, eps, "compiled relu(x w + b)");
    fbt::check_identical(c, fb::eager(model)(xd, wd, biasd), "eager == compiled");
    CHECK(fb::explain_text(model, x, w, bias).find("matmul + epilogue(add, relu)") != std::string::npos);
  }
  SECTION("bias + gelu") {
    auto model = [](auto x, auto w, auto b) { return fb::gelu(fb::matmul(x, w) + b); };
    const auto c = fb::compile(model)(x, w, bias);
    auto epi = [&](double v, const coord& o) { return gelu_ref(v + bias_at(o)); };
    check_product(c, x, w, epi, gelu_rel + eps, "compiled gelu(x w + b)");
    fbt::check_identical(c, fb::eager(model)(xd, wd, biasd), "eager == compiled");
  }
  SECTION("residual add") {
    auto model = [](auto x, auto w, auto r) { return fb::matmul(x, w) + r; };
    const auto c = fb::compile(model)(x, w, res);
    auto epi = [&](double v, const coord& o) { return v + fbt::at(res, o, 2); };
    check_product(c, x, w, epi, eps, "compiled x w + r");
    fbt::check_identical(c, fb::eager(model)(xd, wd, resd), "eager == compiled");
    CHECK(fb::explain_text(model, x, w, res).find("matmul + epilogue(add)") != std::string::npos);
  }
}

TEST_CASE("transposed operands are views, in the model and as arguments" FBT_TYPE, "[ops][matmul][views]") {
  constexpr std::size_t M = mkn::M, K = mkn::K, N = mkn::N;
  const auto a = input<fb::shape<M, K>>(11);
  const auto at = input<fb::shape<K, M>>(12);   // A stored transposed
  const auto wt = input<fb::shape<N, K>>(13);   // a PyTorch Linear weight: [out, in]
  const auto bias = input<fb::shape<N>>(14);
  auto bias_at = [&](const coord& o) { return fbt::at(bias, o, 2); };

  SECTION("matmul(x, transpose(w)) + b, w [N, K] (fb::transpose of an input)") {
    auto model = [](auto x, auto w, auto b) { return fb::matmul(x, fb::transpose(w)) + b; };
    const auto c = fb::compile(model)(a, wt, bias);
    const auto wview = wt.transpose();
    check_product(c, a, wview, [&](double v, const coord& o) { return v + bias_at(o); }, eps, "compiled");
    fbt::check_identical(c, fb::eager(model)(fbt::to_dyn(a), fbt::to_dyn(wt), fbt::to_dyn(bias)), "eager == compiled");
  }
  SECTION("matmul(transpose(a), w), a [K, M]") {
    const auto w = input<fb::shape<K, N>>(15);
    auto model = [](auto a, auto w) { return fb::matmul(fb::transpose(a), w); };
    const auto c = fb::compile(model)(at, w);
    check_product(c, at.transpose(), w, plain, 0, "compiled");
    fbt::check_identical(c, fb::eager(model)(fbt::to_dyn(at), fbt::to_dyn(w)), "eager == compiled");
  }
  SECTION("tensor::transpose() views passed as arguments") {
    auto model = [](auto x, auto w) { return fb::matmul(x, w); };
    const auto av = at.transpose();  // [M, K], strides (1, M)
    const auto wv = wt.transpose();  // [K, N], strides (1, K)
    REQUIRE_FALSE(av.contiguous());
    REQUIRE(av.owner() == at.owner());
    const auto c = fb::compile(model)(av, wv);
    check_product(c, av, wv, plain, 0, "compiled, both operands strided views");
    // Not bitwise against contiguous copies in general: B's layout picks gemm's path, and for
    // M <= 4 with B stored [N, K] that path sums partial dot products (backend/cpu/gemm.hpp, case 3).
    check_product(fb::compile(model)(av.clone(), wv.clone()), av, wv, plain, 0, "compiled, contiguous copies");
  }
}

namespace {
/// Elements of c = a b that differ from the fma chain c = fma(a[i][k], b[k][j], c), k = 0 .. K-1.
template <class C, class A, class B>
std::size_t off_chain(const C& c, const A& a, const B& b) {
  const std::size_t M = a.extent(0), K = a.extent(1), N = b.extent(1);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      T acc = 0;
      for (std::size_t k = 0; k < K; ++k) acc = std::fma(a(i, k), b(k, j), acc);
      bad += c(i, j) != acc;
    }
  return bad;
}
}  // namespace

TEST_CASE("matmul keeps gemm's numerical contract: one fma chain in increasing k" FBT_TYPE,
          "[ops][matmul][contract]") {
  // backend/cpu/gemm.hpp: every output element is fma(a[k], b[k], c) for k = 0 .. K-1 from c = 0, on every
  // path but M <= 4 with B stored [N, K] (partial dot products). So for M > 4 the result is known
  // bit for bit, whatever the layout of B: B stored [N, K] takes the "stream B^T" path, B row-major
  // the "gemv rows" (M <= 8) or the blocked path.
  auto model = [](auto x, auto w) { return fb::matmul(x, w); };
  SECTION("compiled, static shapes") {
    constexpr std::size_t M = std::is_same_v<T, float> ? 6 : 17, K = mkn::K, N = mkn::N;
    const auto a = input<fb::shape<M, K>>(41);
    const auto b = input<fb::shape<K, N>>(42);
    const auto bt_storage = input<fb::shape<N, K>>(43);
    const auto bt = bt_storage.transpose();  // [K, N] stored [N, K]
    CHECK(off_chain(fb::compile(model)(a, b), a, b) == 0);
    CHECK(off_chain(fb::compile(model)(a, bt), a, bt) == 0);
  }
  SECTION("eager, dyn extents: every row count of a register tile") {
    for (std::size_t m : {5u, 6u, 8u, 9u, 17u})
      for (std::size_t k : {2u, 3u, 17u})
        for (std::size_t n = 1; n <= 17; ++n) {
          fb::tensor<T, fb::shape<fb::dyn, fb::dyn>> a(m, k), b(k, n), bt_storage(n, k);
          fbt::fill_signed(a, 1000 * m + 100 * k + n, 0.05, 1.0);
          fbt::fill_signed(b, 1000 * m + 100 * k + n + 1, 0.05, 1.0);
          fbt::fill_signed(bt_storage, 1000 * m + 100 * k + n + 2, 0.05, 1.0);
          const auto bt = bt_storage.transpose();
          INFO("[" << m << ", " << k << "] x [" << k << ", " << n << "]");
          CHECK(off_chain(fb::eager(model)(a, b), a, b) == 0);
          CHECK(off_chain(fb::eager(model)(a, bt), a, bt) == 0);
        }
  }
}

TEST_CASE("batched matmul: equal batches, batch 1 broadcast, shared rank-2 operand" FBT_TYPE,
          "[ops][matmul][batched]") {
  constexpr std::size_t B = 3, M = mkn::M, K = mkn::K, N = mkn::N;
  const auto a3 = input<fb::shape<B, M, K>>(21);
  const auto b3 = input<fb::shape<B, K, N>>(22);
  const auto a1 = input<fb::shape<1, M, K>>(23);
  const auto w2 = input<fb::shape<K, N>>(24);
  const auto x2 = input<fb::shape<M, K>>(25);
  const auto bias = input<fb::shape<N>>(26);
  auto model = [](auto a, auto b) { return fb::matmul(a, b); };

  SECTION("[B, M, K] x [B, K, N]") {
    const auto c = fb::compile(model)(a3, b3);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, a3, b3, plain, 0, "compiled");
    fbt::check_identical(c, fb::eager(model)(fbt::to_dyn(a3), fbt::to_dyn(b3)), "eager == compiled");
  }
  SECTION("[1, M, K] x [B, K, N]: batch 1 broadcasts") {
    const auto c = fb::compile(model)(a1, b3);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, a1, b3, plain, 0, "compiled");
    fbt::check_identical(c, fb::eager(model)(fbt::to_dyn(a1), fbt::to_dyn(b3)), "eager == compiled");
  }
  SECTION("[B, M, K] x [K, N] + bias: a shared weight, with an epilogue") {
    auto lin = [](auto a, auto w, auto b) { return fb::matmul(a, w) + b; };
    const auto c = fb::compile(lin)(a3, w2, bias);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, a3, w2, [&](double v, const coord& o) { return v + fbt::at(bias, o, 3); }, eps, "compiled");
    fbt::check_identical(c, fb::eager(lin)(fbt::to_dyn(a3), fbt::to_dyn(w2), fbt::to_dyn(bias)), "eager == compiled");
  }
  SECTION("[M, K] x [B, K, N]: a shared left operand") {
    const auto c = fb::compile(model)(x2, b3);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, x2, b3, plain, 0, "compiled");
    fbt::check_identical(c, fb::eager(model)(fbt::to_dyn(x2), fbt::to_dyn(b3)), "eager == compiled");
  }
  SECTION("batched transpose: [B, M, K] x transpose([B, N, K])") {
    const auto bt = input<fb::shape<B, N, K>>(27);
    auto attn = [](auto q, auto k) { return fb::matmul(q, fb::transpose(k)); };
    const auto c = fb::compile(attn)(a3, bt);
    check_product(c, a3, bt.transpose(), plain, 0, "compiled");
    fbt::check_identical(c, fb::eager(attn)(fbt::to_dyn(a3), fbt::to_dyn(bt)), "eager == compiled");
  }
}

TEST_CASE("matmul results do not depend on the thread count" FBT_TYPE, "[ops][matmul][threads]") {
  // Large enough for gemm to split M and N over threads (gemm.hpp: threads never split K).
  const auto x = input<fb::shape<100, 64>>(31);
  const auto w = input<fb::shape<64, 100>>(32);
  const auto b = input<fb::shape<100>>(33);
  auto model = [](auto x, auto w, auto b) { return fb::gelu(fb::matmul(x, w) + b); };
  const auto c1 = fb::compile(model, {.threads = 1})(x, w, b);
  const auto c2 = fb::compile(model, {.threads = 2})(x, w, b);
  const auto c4 = fb::compile(model, {.threads = 4})(x, w, b);
  fbt::check_identical(c1, c2, "1 thread == 2 threads");
  fbt::check_identical(c1, c4, "1 thread == 4 threads");
  check_product(c1, x, w, [&](double v, const coord& o) { return gelu_ref(v + fbt::at(b, o, 2)); }, gelu_rel + eps,
                "compiled, 1 thread");
}

// Issue 20, item 7: at capture an argument's extents are bound (7) and a computed operand's are
// `dyn`; the batch rule compared the two and refused the model, which eager and the static path
// accept. Every such pairing, on the run-time path, against the reference.
TEST_CASE("batched matmul on dyn extents: an argument times a computed operand, either side" FBT_TYPE,
          "[ops][matmul][batched][dyn]") {
  constexpr std::size_t B = 7, M = 4, K = 3, N = 5;
  const auto x = fbt::to_dyn(input<fb::shape<B, M, K>>(41));
  const auto y = fbt::to_dyn(input<fb::shape<B, K, N>>(42));
  const auto x1 = fbt::to_dyn(input<fb::shape<1, M, K>>(43));
  // 2 y and 2 x, exactly (a power of two scales without rounding).
  auto twice = [](const auto& from) {
    auto t = from.clone();  // a copy of a tensor shares its storage
    for (std::size_t i = 0; i < t.size(); ++i) t.flat(i) = 2 * t.flat(i);
    return t;
  };
  const auto y2 = twice(y), x2 = twice(x);
  SECTION("matmul(x, y * 2): the computed operand on the right") {
    auto model = [](const auto& a, const auto& b) { return fb::matmul(a, b * T(2)); };
    const auto c = fb::compile(model)(x, y);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, x, y2, plain, 0, "compiled, run-time path");
    fbt::check_identical(c, fb::eager(model)(x, y), "eager == compiled");
  }
  SECTION("matmul(x * 2, y): the computed operand on the left") {
    auto model = [](const auto& a, const auto& b) { return fb::matmul(a * T(2), b); };
    const auto c = fb::compile(model)(x, y);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, x2, y, plain, 0, "compiled, run-time path");
  }
  SECTION("matmul(x1, y * 2): a batch-1 argument broadcasts over a computed batch") {
    auto model = [](const auto& a, const auto& b) { return fb::matmul(a, b * T(2)); };
    const auto c = fb::compile(model)(x1, y);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, x1, y2, plain, 0, "compiled, run-time path");
  }
  SECTION("matmul(x * 2, transpose(yt)): a computed operand times a view of an argument") {
    const auto yt = fbt::to_dyn(input<fb::shape<B, N, K>>(44));
    auto model = [](const auto& a, const auto& b) { return fb::matmul(a * T(2), fb::transpose(b)); };
    const auto c = fb::compile(model)(x, yt);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, x2, yt.transpose(), plain, 0, "compiled, run-time path");
  }
  SECTION("a dyn batch times a captured [7, K, N] weight: the rule in the node's type") {
    const auto w = input<fb::shape<B, K, N>>(45);
    auto model = [&w](const auto& a) { return fb::matmul(a * T(2), w); };
    const auto c = fb::compile(model)(x);
    REQUIRE(c.extents() == fb::dims{3, {B, M, N}});
    check_product(c, x2, w, plain, 0, "compiled, run-time path");
  }
  SECTION("batches that clash are still refused, on the call's extents") {
    const auto y3 = fbt::to_dyn(input<fb::shape<3, K, N>>(46));
    auto model = [](const auto& a, const auto& b) { return fb::matmul(a, b * T(2)); };
    CHECK_THROWS_AS(fb::compile(model)(x, y3), fb::shape_error);
  }
}
