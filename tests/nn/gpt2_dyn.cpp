// tests/nn/gpt2_dyn.cpp: gpt2_block<d, heads, dyn> (issue 21): with a dyn sequence length, compiled
// value_and_grad and training step, and with a dyn batch too, the training step, against the
// eager steps of static blocks and the double reference (gpt2_reference.hpp), and the recompiles
// they make. One unit: the two share the block's gradient (as two, 80 + 100 CPU-s against 141).
// Part of the nn.gpt2 test.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "gpt2_reference.hpp"

TEST_CASE("nn: gpt2_block with a dyn sequence length: compiled value_and_grad and step equal the eager gradients; "
          "recompiles as the forward's") {
  // The model's T is dyn: x is [B, T, d] with T per call, so the joint graph runs on the run-time
  // path (each Linear a batched product, heads split by unflatten, attention's gradient kernel).
  using X = fb::tensor<double, fb::shape<B, fb::dyn, D>>;
  dyn_block_t m(11);
  randomise(m, 80);
  auto vg = fb::compile(fb::value_and_grad(dyn_objective{}, fb::wrt<2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13>));
  auto step = nn::compile_step(m, nn::mse_loss_fn{});
  std::uint64_t recompiles[2] = {};  // value_and_grad, step
  auto counted = [&](int which, auto&& call) {
    const auto before = fb::jit::counters().snapshot().recompiles;
    auto r = call();
    recompiles[which] += fb::jit::counters().snapshot().recompiles - before;
    return r;
  };
  const auto run_vg = [&](const X& x, const X& t) {
    return counted(0, [&] { return std::apply([&](const auto&... p) { return vg(x, t, p...); }, m.param_refs()); });
  };
  const auto run_step = [&](const X& x, const X& t) { return counted(1, [&] { return step(x, t); }); };
  const auto calls = [&]<std::size_t L>() {
    check_dyn_call<X, B, L>(m, std::pair{"compiled value_and_grad", run_vg}, std::pair{"compiled step", run_step});
  };
  calls.template operator()<5>();
  calls.template operator()<8>();
  calls.template operator()<13>();
  calls.template operator()<5>();
  // As compile() of a forward under the default policy (automatic; capability matrix row 8):
  // specialised to T 5 first, then T symbolic from 8 on, which 13 and 5 reuse: one recompile
  // each. (compile() of this block's own forward is past max_expanded_nodes: its layer norms'
  // eps are payloads, which only the gradient's lifting merges; docs/architecture.md.)
  INFO("recompiles: value_and_grad " << recompiles[0] << ", step " << recompiles[1]);
  CHECK(recompiles[0] == 1);
  CHECK(recompiles[1] == 1);
}

TEST_CASE("nn: gpt2_block with a dyn batch and sequence length: the compiled step equals the eager gradients") {
  using X = fb::tensor<double, fb::shape<fb::dyn, fb::dyn, D>>;
  dyn_block_t m(12);
  randomise(m, 120);
  auto step = nn::compile_step(m, nn::mse_loss_fn{});
  const auto before = fb::jit::counters().snapshot().recompiles;
  const auto run = [&](const X& x, const X& t) { return step(x, t); };
  check_dyn_call<X, 2, 5>(m, std::pair{"compiled step", run});
  check_dyn_call<X, 3, 8>(m, std::pair{"compiled step", run});
  check_dyn_call<X, 3, 5>(m, std::pair{"compiled step", run});
  check_dyn_call<X, 2, 13>(m, std::pair{"compiled step", run});
  // [2, 5] exactly, then both dimensions symbolic from [3, 8] on: one recompile.
  CHECK(fb::jit::counters().snapshot().recompiles - before == 1);
}
