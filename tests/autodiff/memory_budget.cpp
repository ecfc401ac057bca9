// tests/autodiff/memory_budget.cpp: options::activation_memory_budget and the memory report
// (include/fusebox/autodiff/remat.hpp, plan/recompute.hpp). For an MLP (the GPT-2 block's case is
// in tests/nn/gpt2.cpp, which shares its budget-1 program), at
// budgets 1, 0.5 and 0: the loss and every gradient element equal budget 1's and the central
// finite differences of the budget's own compiled loss; the saved bytes, the planned peak and the
// peak measured by the byte counters on a fresh compiled function never grow as the budget falls
// and are strictly lower at 0; the report names what is recomputed (nothing at 1); an invalid
// budget is a clear error. Double precision, fresh random inputs.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>

#include "check_grad.hpp"
#include "memory_budget.hpp"

namespace fb = fusebox;

namespace {

// 16 x 8 -> 32 -> 32 -> 4, MSE; the activations are elementwise chains whose backward reads
// several values (silu written out, tanh(a) * gelu(a)): what a budget can recompute.
auto mlp_loss = [](const auto& x, const auto& w1, const auto& b1, const auto& w2, const auto& b2, const auto& w3,
                   const auto& b3, const auto& t) {
  const auto a1 = fb::matmul(x, w1) + b1;
  const auto h1 = a1 * fb::sigmoid(a1);
  const auto a2 = fb::matmul(h1, w2) + b2;
  const auto h2 = fb::tanh(a2) * fb::gelu(a2);
  const auto e = fb::matmul(h2, w3) + b3 - t;
  return fb::mean(fb::mean(e * e));
};

struct mlp_args {
  fb::tensor<double, fb::shape<16, 8>> x = fbt::signed_tensor<fb::shape<16, 8>>(11, 0.1, 1.0);
  fb::tensor<double, fb::shape<8, 32>> w1 = fbt::signed_tensor<fb::shape<8, 32>>(12, 0.05, 0.5);
  fb::tensor<double, fb::shape<32>> b1 = fbt::signed_tensor<fb::shape<32>>(13, 0.05, 0.3);
  fb::tensor<double, fb::shape<32, 32>> w2 = fbt::signed_tensor<fb::shape<32, 32>>(14, 0.02, 0.3);
  fb::tensor<double, fb::shape<32>> b2 = fbt::signed_tensor<fb::shape<32>>(15, 0.05, 0.3);
  fb::tensor<double, fb::shape<32, 4>> w3 = fbt::signed_tensor<fb::shape<32, 4>>(16, 0.05, 0.5);
  fb::tensor<double, fb::shape<4>> b3 = fbt::signed_tensor<fb::shape<4>>(17, 0.05, 0.3);
  fb::tensor<double, fb::shape<16, 4>> t = fbt::signed_tensor<fb::shape<16, 4>>(18, 0.1, 1.0);
  auto refs() { return std::tie(x, w1, b1, w2, b2, w3, b3, t); }
};

}  // namespace

TEST_CASE("memory budget: an MLP at budgets 1, 0.5, 0 gives budget 1's gradients with less saved memory") {
  mlp_args m;
  const auto vg = fb::value_and_grad(mlp_loss, fb::wrt<1, 2, 3, 4, 5, 6>);
  auto c1 = fb::compile<fb::options{.threads = 1}>(vg);
  auto ch = fb::compile<fb::options{.threads = 1, .activation_memory_budget = 0.5f}>(vg);
  auto c0 = fb::compile<fb::options{.threads = 1, .activation_memory_budget = 0.0f}>(vg);
  auto args = m.refs();

  const std::size_t p1 = std::apply([&](const auto&... a) { return fbt::measured_peak(c1, a...); }, args);
  const std::size_t ph = std::apply([&](const auto&... a) { return fbt::measured_peak(ch, a...); }, args);
  const std::size_t p0 = std::apply([&](const auto&... a) { return fbt::measured_peak(c0, a...); }, args);
  const fb::memory_report r1 = std::apply([&](const auto&... a) { return c1.memory(a...); }, args);
  const fb::memory_report rh = std::apply([&](const auto&... a) { return ch.memory(a...); }, args);
  const fb::memory_report r0 = std::apply([&](const auto&... a) { return c0.memory(a...); }, args);
  INFO(r1.table() << rh.table() << r0.table() << "measured peaks: " << p1 << ", " << ph << ", " << p0 << " B");

  // The planned figures are what a call allocates.
  CHECK(p1 == r1.peak_bytes);
  CHECK(ph == rh.peak_bytes);
  CHECK(p0 == r0.peak_bytes);
  // Budget 1 recomputes nothing; less budget, less memory; 0 strictly less.
  CHECK(r1.recomputed.empty());
  CHECK(r1.saved_bytes == r1.saved_bytes_full);
  CHECK(rh.saved_bytes <= r1.saved_bytes);
  CHECK(r0.saved_bytes <= rh.saved_bytes);
  CHECK(r0.saved_bytes < r1.saved_bytes);
  CHECK(rh.saved_bytes <= static_cast<std::size_t>(0.5 * static_cast<double>(r1.saved_bytes)) + 0);
  CHECK(ph <= p1);
  CHECK(p0 <= ph);
  CHECK(p0 < p1);
  // What is recomputed is named; the activations are relu's and gelu's, never a matmul.
  CHECK_FALSE(r0.recomputed.empty());
  std::string names;
  for (const auto& s : r0.recomputed) names += s + "; ";
  INFO("recomputed at 0: " << names);
  CHECK(names.find("sigmoid") != std::string::npos);
  CHECK(names.find("tanh") != std::string::npos);
  CHECK(names.find("matmul") == std::string::npos);
  CHECK(r0.table().find("recomputed in the backward") != std::string::npos);

  // Gradients: budget 1's, element by element, and central differences of each budget's loss.
  auto [l1, g1] = std::apply(c1, args);
  auto [lh, gh] = std::apply(ch, args);
  auto [l0, g0] = std::apply(c0, args);
  CHECK(lh.flat(0) == l1.flat(0));
  CHECK(l0.flat(0) == l1.flat(0));
  std::size_t differ = 0;
  [&]<std::size_t... G>(std::index_sequence<G...>) {
    ((differ += fbt::check_equal("budget 0.5, gradient " + std::to_string(G), std::get<G>(gh), std::get<G>(g1))), ...);
    ((differ += fbt::check_equal("budget 0, gradient " + std::to_string(G), std::get<G>(g0), std::get<G>(g1))), ...);
  }(std::make_index_sequence<6>{});
  std::printf("memory budget, MLP: %zu gradient elements not bit-equal to budget 1's\n", differ);
  fbt::check_fd<1>("budget 0", c0, args, std::get<0>(g0));
  fbt::check_fd<2>("budget 0", c0, args, std::get<1>(g0));
  fbt::check_fd<4>("budget 0.5", ch, args, std::get<3>(g0));
  fbt::check_fd<6>("budget 0.5", ch, args, std::get<5>(g0));
}


TEST_CASE("memory budget: an invalid or run-time budget is a clear error naming the option and the call") {
  const auto vg = fb::value_and_grad(mlp_loss, fb::wrt<1>);
  for (const float b : {-0.25f, 1.5f, std::nanf("")}) {
    INFO("budget " << b);
    try {
      (void)fb::compile(vg, fb::options{.activation_memory_budget = b});
      FAIL("no error");
    } catch (const fb::invalid_argument& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK(what.find("activation_memory_budget") != std::string::npos);
      CHECK(what.find("[0, 1]") != std::string::npos);
      CHECK(what.find("memory_budget.cpp") != std::string::npos);
    }
  }
  try {  // valid, but it decides the program: the template form is the one that can honour it
    (void)fb::compile(vg, fb::options{.activation_memory_budget = 0.5f});
    FAIL("no error");
  } catch (const fb::invalid_argument& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("template argument") != std::string::npos);
    CHECK(what.find("memory_budget.cpp") != std::string::npos);
  }
  CHECK_NOTHROW(fb::compile(vg, fb::options{.activation_memory_budget = 1.0f}));
}
