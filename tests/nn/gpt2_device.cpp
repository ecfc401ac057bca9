// tests/nn/gpt2_device.cpp: the GPT-2 block's training step with a dyn sequence length on the
// GPU (nn::to_device, attention's gradient kernel) against the host's compiled step. Part of the
// nn.gpt2 test; skips, saying so, without a GPU.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/device.hpp>
#include <fusebox/nn/nn.hpp>

#include "../support/gpu.hpp"
#include "gpt2_reference.hpp"

TEST_CASE("nn: gpt2_block with a dyn sequence length: compile_step on the device equals the host's compiled step",
          "[cuda]") {
  // The GPT-2 block's training step with every kernel on the GPU, attention's gradient included
  // (backend/cuda/attention_backward_kernel.hpp): nn::to_device's parameters, device x and targets.
  FUSEBOX_REQUIRE_GPU();
  using block_f = nn::gpt2_block<D, H, fb::dyn, float>;
  using X = fb::tensor<float, fb::shape<B, fb::dyn, D>>;
  using DX = fb::cuda::tensor<float, fb::shape<B, fb::dyn, D>>;
  block_f m(13);
  randomise(m, 140);
  auto gpu = nn::to_device(m);
  auto host_step = nn::compile_step(m, nn::mse_loss_fn{});
  auto device_step = nn::compile_step(gpu, nn::mse_loss_fn{});
  for (std::size_t L : {5u, 13u, 8u}) {
    X x(L), t(L);
    fbt::fill_signed(x, 160 + L, 0.1, 1.0);
    fbt::fill_signed(t, 170 + L, 0.1, 1.0);
    const auto [lh, gh] = host_step(x, t);
    const auto [ld, gd] = device_step(DX(x), DX(t));
    INFO("B " << B << ", T " << L << ", d " << D << ", heads " << H);
    const double loss_d = ld.to_host().flat(0), loss_h = lh.flat(0);
    INFO("loss: device " << loss_d << ", host " << loss_h);
    CHECK(std::fabs(loss_d - loss_h) <= 1e-5 * (1 + std::fabs(loss_h)));
    [&]<std::size_t... P>(std::index_sequence<P...>) {
      (([&] {
         const auto got = std::get<P>(gd).to_host();
         const auto& want = std::get<P>(gh);
         REQUIRE(got.size() == want.size());
         std::size_t bad = 0, first = 0;
         double worst = 0;
         for (std::size_t k = 0; k < want.size(); ++k) {
           const double d = std::fabs(static_cast<double>(got.flat(k)) - want.flat(k));
           worst = std::max(worst, d / (1 + std::fabs(want.flat(k))));
           if (!(d <= 1e-4 * (1 + std::fabs(want.flat(k)))) && bad++ == 0) first = k;
         }
         INFO("parameter " << P << " (nanoGPT's order): " << bad << " of " << want.size()
                           << " elements differ; worst scaled difference " << worst << "; first bad flat index "
                           << first << ": device " << got.flat(first) << ", host " << want.flat(first));
         CHECK(bad == 0);
       }()),
       ...);
    }(std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(gh)>>>{});
  }
}
