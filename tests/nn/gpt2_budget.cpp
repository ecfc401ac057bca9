// tests/nn/gpt2_budget.cpp: the GPT-2 block (nn/gpt2.hpp) under activation memory budgets 0.5
// and 0 (autodiff/remat.hpp): gradients equal budget 1's, memory falls, the report names what is
// recomputed, central differences through the recomputed regions. Part of the nn.gpt2 test.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "../autodiff/check_grad.hpp"
#include "../autodiff/memory_budget.hpp"
#include "gpt2_reference.hpp"

TEST_CASE("nn: gpt2_block under an activation memory budget (0.5, 0): gradients equal budget 1's; memory falls") {
  // The block's budget-1 program is the one compile_step above uses; 0.5 and 0 are rewrites of it.
  block_t m(3);
  randomise(m, 40);
  const auto x = fbt::signed_tensor<fb::shape<B, T, D>>(50);
  const auto t = fbt::signed_tensor<fb::shape<B, T, D>>(51);
  const auto vg = fb::value_and_grad(nn::detail::objective<block_t, nn::train_mode, nn::mse_loss_fn>{},
                                     fb::wrt<2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13>);
  auto c1 = fb::compile<fb::options{.threads = 1}>(vg);
  auto ch = fb::compile<fb::options{.threads = 1, .activation_memory_budget = 0.5f}>(vg);
  auto c0 = fb::compile<fb::options{.threads = 1, .activation_memory_budget = 0.0f}>(vg);
  auto args = std::apply([&](auto&... p) { return std::make_tuple(x, t, p...); }, m.param_refs());

  const std::size_t p1 = std::apply([&](const auto&... a) { return fbt::measured_peak(c1, a...); }, args);
  const std::size_t ph = std::apply([&](const auto&... a) { return fbt::measured_peak(ch, a...); }, args);
  const std::size_t p0 = std::apply([&](const auto&... a) { return fbt::measured_peak(c0, a...); }, args);
  const fb::memory_report r1 = std::apply([&](const auto&... a) { return c1.memory(a...); }, args);
  const fb::memory_report rh = std::apply([&](const auto&... a) { return ch.memory(a...); }, args);
  const fb::memory_report r0 = std::apply([&](const auto&... a) { return c0.memory(a...); }, args);
  INFO(r1.table() << rh.table() << r0.table() << "measured peaks: " << p1 << ", " << ph << ", " << p0 << " B");
  CHECK(r1.recomputed.empty());
  CHECK_FALSE(r0.recomputed.empty());
  CHECK(rh.saved_bytes <= r1.saved_bytes);
  CHECK(r0.saved_bytes <= rh.saved_bytes);
  CHECK(r0.saved_bytes < r1.saved_bytes);
  CHECK(ph <= p1);
  CHECK(p0 <= ph);
  CHECK(p0 < p1);

  auto [l1, g1] = std::apply(c1, args);
  auto [lh, gh] = std::apply(ch, args);
  auto [l0, g0] = std::apply(c0, args);
  CHECK(std::fabs(lh.flat(0) - l1.flat(0)) <= 1e-14 * std::fabs(l1.flat(0)));
  CHECK(std::fabs(l0.flat(0) - l1.flat(0)) <= 1e-14 * std::fabs(l1.flat(0)));
  std::size_t differ = 0;
  [&]<std::size_t... G>(std::index_sequence<G...>) {
    ((differ += fbt::check_equal("budget 0.5, gradient " + std::to_string(G), std::get<G>(gh), std::get<G>(g1))), ...);
    ((differ += fbt::check_equal("budget 0, gradient " + std::to_string(G), std::get<G>(g0), std::get<G>(g1))), ...);
  }(std::make_index_sequence<12>{});
  std::printf("memory budget, GPT-2 block: %zu gradient elements not bit-equal to budget 1's\n", differ);
  // Central differences of budget 0's own loss through the recomputed regions (the layer norms,
  // gelu): every gradient element equals budget 1's above, whose differences nn/gpt2.cpp checks.
  fbt::check_fd<2>("budget 0, ln_1.weight", c0, args, std::get<0>(g0));
  fbt::check_fd<8>("budget 0, ln_2.weight", c0, args, std::get<6>(g0));
  fbt::check_fd<11>("budget 0, mlp.c_fc.bias", c0, args, std::get<9>(g0));
}
