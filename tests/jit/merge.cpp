// The run-time path's value numbering (include/fusebox/ir/merge.hpp): a subtree that a
// composite copies, holding the model's scalars, is computed once when the scalars are equal;
// subtrees of one type with different scalars stay apart; a call whose equal values change
// recompiles with a reason.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "../support/private_cache.hpp"

namespace fb = fusebox;

namespace {

void cache() { fbt::use_private_cache("fusebox-merge-"); }

constexpr std::size_t K = 24, N = 10;
using X = fb::tensor<float, fb::shape<fb::dyn, K>>;
using W = fb::tensor<float, fb::shape<K, N>>;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// x·w in double, row r.
std::vector<double> product_row(const X& x, const W& w, std::size_t r) {
  std::vector<double> out(N, 0.0);
  for (std::size_t k = 0; k < K; ++k)
    for (std::size_t j = 0; j < N; ++j) out[j] += static_cast<double>(x.flat(r * K + k)) * w.flat(k * N + j);
  return out;
}

}  // namespace

TEST_CASE("softmax of a product of a scaled input: the product runs once, not once per use", "[jit][merge]") {
  cache();
  // softmax uses its operand four times; the operand holds the scalar 0.5, so the build-time
  // lowering keeps four copies of the product. Equal at run time, they merge into one gemm.
  auto model = [](auto x, auto w) { return fb::softmax(fb::matmul(x * 0.5f, w)); };
  X x(7);
  W w;
  x.fill_random(11);
  w.fill_random(12, -0.5f, 0.5f);
  const std::string plan = fb::explain_text(model, x, w);
  INFO(plan);
  CHECK(count(plan, "gemm") == 1);
  auto fast = fb::compile(model);
  const auto y = fast(x, w);
  for (std::size_t r = 0; r < 7; ++r) {
    auto s = product_row(x, w, r);
    double mx = -1e300, sum = 0;
    for (double& v : s) mx = std::max(mx, v *= 0.5);
    for (double& v : s) sum += v = std::exp(v - mx);
    for (std::size_t j = 0; j < N; ++j) REQUIRE(y.flat(r * N + j) == Approx(s[j] / sum).epsilon(1e-5));
  }
}

TEST_CASE("one subtree type holding different scalars is not merged", "[jit][merge]") {
  cache();
  // x * 0.5 and x * 0.7 have one type; merging them would compute 2 * 0.5 * x·w.
  auto model = [](auto x, auto w) { return fb::matmul(x * 0.5f, w) + fb::matmul(x * 0.7f, w); };
  X x(5);
  W w;
  x.fill_random(21);
  w.fill_random(22, -0.5f, 0.5f);
  const std::string plan = fb::explain_text(model, x, w);
  INFO(plan);
  CHECK(count(plan, "gemm") == 2);
  const auto y = fb::compile(model)(x, w);
  for (std::size_t r = 0; r < 5; ++r) {
    const auto s = product_row(x, w, r);
    for (std::size_t j = 0; j < N; ++j) REQUIRE(y.flat(r * N + j) == Approx(1.2 * s[j]).epsilon(1e-5).margin(1e-6));
  }
}

TEST_CASE("scalar arguments equal, then different: the merged specialisation is not reused", "[jit][merge]") {
  cache();
  auto model = [](auto x, auto w, float a, float b) { return fb::matmul(x * a, w) - fb::matmul(x * b, w) * 3.0f; };
  X x(6);
  W w;
  x.fill_random(31);
  w.fill_random(32, -0.5f, 0.5f);
  auto fast = fb::compile(model);
  auto check = [&](const fb::tensor<float, fb::shape<fb::dyn, N>>& y, double a, double b) {
    for (std::size_t r = 0; r < 6; ++r) {
      const auto s = product_row(x, w, r);
      for (std::size_t j = 0; j < N; ++j)
        REQUIRE(y.flat(r * N + j) == Approx((a - 3 * b) * s[j]).epsilon(1e-5).margin(1e-6));
    }
  };
  check(fast(x, w, 0.25f, 0.25f), 0.25, 0.25);  // equal: one product
  CHECK(count(fb::explain_text(model, x, w, 0.25f, 0.25f), "gemm") == 1);
  const auto before = fb::jit::counters().snapshot();
  check(fast(x, w, 0.25f, 0.75f), 0.25, 0.75);  // no longer equal: its own specialisation
  const auto after = fb::jit::counters().snapshot();
  CHECK(fast.recompiles() == 1);
  REQUIRE(after.recompile_reasons.size() > before.recompile_reasons.size());
  CHECK(after.recompile_reasons.back().find("now differs") != std::string::npos);
  check(fast(x, w, 0.5f, 0.5f), 0.5, 0.5);  // equal again: the first specialisation serves it
  CHECK(fast.recompiles() == 1);
}

TEST_CASE("a captured tensor used in two copies merges; two different captured tensors do not", "[jit][merge]") {
  cache();
  fb::tensor<float, fb::shape<K>> c1, c2;  // per-column scales of x, captured by the models
  c1.fill_random(41, 0.5f, 1.5f);
  c2.fill_random(42, 0.5f, 1.5f);
  X x(4);
  W w;
  x.fill_random(43);
  w.fill_random(44, -0.5f, 0.5f);
  // softmax copies its operand: the same captured tensor in each copy, one product. c1 and c2
  // have one type but different memory: two products.
  auto same = [&](auto xx, auto ww) { return fb::softmax(fb::matmul(xx * c1, ww)); };
  auto different = [&](auto xx, auto ww) { return fb::matmul(xx * c1, ww) * fb::matmul(xx * c2, ww); };
  CHECK(count(fb::explain_text(same, x, w), "gemm") == 1);
  CHECK(count(fb::explain_text(different, x, w), "gemm") == 2);
  const auto y = fb::compile(different)(x, w);
  for (std::size_t r = 0; r < 4; ++r) {
    std::vector<double> p1(N, 0.0), p2(N, 0.0);
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t j = 0; j < N; ++j) {
        const double xw = static_cast<double>(x.flat(r * K + k)) * w.flat(k * N + j);
        p1[j] += xw * c1.flat(k);
        p2[j] += xw * c2.flat(k);
      }
    for (std::size_t j = 0; j < N; ++j) REQUIRE(y.flat(r * N + j) == Approx(p1[j] * p2[j]).epsilon(1e-5).margin(1e-6));
  }
}
