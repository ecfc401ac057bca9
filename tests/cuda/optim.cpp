// tests/cuda/optim.cpp: include/fusebox/optim/cuda_adamw.hpp. Everywhere NVRTC is installed (CI
// has no GPU): the kernel's source compiles for compute_90. On a GPU: five steps of the device
// AdamW on fresh random gradients against the host AdamW (tests/optim/optim.cpp checks that one
// against torch's formulas in double), every element of the parameters and both moments; and
// mismatched gradients are refused naming the shapes.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include <fusebox/core/tensor.hpp>
#include <fusebox/optim/adamw.hpp>
#include <fusebox/optim/cuda_adamw.hpp>

#include "../support/check.hpp"

namespace fb = fusebox;

TEST_CASE("cuda_adamw: the kernel compiles with NVRTC (no GPU needed)", "[cuda][codegen]") {
  if (!fb::cuda::nvrtc_available()) {
    WARN("NVRTC not found: skipped");
    return;
  }
  const std::string log = fb::cuda::nvrtc_check(fb::optim::cuda_adamw_source(), "fusebox_adamw.cu", "compute_90",
                                                {"--fmad=false"});
  INFO("NVRTC log: " << log);
  CHECK(log.find("warning") == std::string::npos);
}

TEST_CASE("cuda_adamw: five steps on the device match the host AdamW element by element", "[cuda]") {
  if (!fb::cuda::available()) {
    WARN("no CUDA device: skipped (the CUDA backend is unavailable here)");
    return;
  }
  fb::tensor<float, fb::shape<37, 19>> a;
  fb::tensor<float, fb::shape<3, 5501>> b;  // two chunks
  fbt::fill_signed(a, 1, 0.1, 1.0);
  fbt::fill_signed(b, 2, 0.1, 1.0);
  fb::cuda::tensor<float, fb::shape<37, 19>> da(a);
  fb::cuda::tensor<float, fb::shape<3, 5501>> db(b);
  const fb::optim::adamw_options o{.lr = 1e-2, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1};
  fb::nn::parameter_list<float> host;
  host.add("a", a);
  host.add("b", b);
  fb::optim::adamw cpu(host, o);
  fb::optim::cuda_adamw gpu({fb::optim::device_parameter("a", da), fb::optim::device_parameter("b", db)}, o);
  for (int t = 0; t < 5; ++t) {
    std::tuple<fb::tensor<float, fb::shape<37, 19>>, fb::tensor<float, fb::shape<3, 5501>>> g;
    fbt::fill_signed(std::get<0>(g), 10 + static_cast<std::uint64_t>(t), 0.01, 2.0);
    fbt::fill_signed(std::get<1>(g), 20 + static_cast<std::uint64_t>(t), 0.01, 2.0);
    const fb::cuda::tensor<float, fb::shape<37, 19>> dga(std::get<0>(g));
    const fb::cuda::tensor<float, fb::shape<3, 5501>> dgb(std::get<1>(g));
    cpu.step(g);
    gpu.step(std::tie(dga, dgb));
  }
  auto compare = [](const std::string& what, const float* got, const float* ref, std::size_t n) {
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < n; ++i)
      if (!(std::fabs(got[i] - ref[i]) <= 1e-6 + 1e-5 * std::fabs(ref[i])) && bad++ == 0)
        first = "element " + std::to_string(i) + ": device " + std::to_string(got[i]) + ", host " + std::to_string(ref[i]);
    INFO(what << ": " << bad << " of " << n << " elements differ; first: " << first);
    CHECK(bad == 0);
  };
  const auto ha = da.to_host();
  const auto hb = db.to_host();
  compare("a", ha.data(), a.data(), a.size());
  compare("b", hb.data(), b.data(), b.size());
  compare("exp_avg of b", gpu.moment(0, 1).data(), cpu.state(0, 1), b.size());
  compare("exp_avg_sq of b", gpu.moment(1, 1).data(), cpu.state(1, 1), b.size());
  // A gradient of the wrong shape: refused before anything is queued.
  const fb::cuda::tensor<float, fb::shape<19, 37>> wrong(fb::tensor<float, fb::shape<19, 37>>{});
  CHECK_THROWS_WITH(gpu.step(std::tie(wrong, db)), Catch::Contains("gradient 0 is [19, 37] but parameter 0 ('a') is [37, 19]"));
}

TEST_CASE("cuda_adamw: the chunk table is uploaded again only when a gradient moves; an unaligned parameter "
          "updates one element at a time", "[cuda]") {
  if (!fb::cuda::available()) {
    WARN("no CUDA device: skipped (the CUDA backend is unavailable here)");
    return;
  }
  // a: four chunks, the last 10851 elements (not a multiple of four: the 16-byte path's tail).
  // u: elements 1..1000 of a device tensor, so 4 bytes past an aligned address (the scalar path).
  fb::tensor<float, fb::shape<3, 20001>> a;
  fb::tensor<float, fb::shape<1001>> u_all;
  fb::tensor<float, fb::shape<1000>> u;
  fbt::fill_signed(a, 3, 0.1, 1.0);
  fbt::fill_signed(u_all, 4, 0.1, 1.0);
  for (std::size_t i = 0; i < 1000; ++i) u.data()[i] = u_all.data()[i + 1];
  fb::cuda::tensor<float, fb::shape<3, 20001>> da(a);
  fb::cuda::tensor<float, fb::shape<1001>> du(u_all);
  const fb::optim::adamw_options o{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-7, .weight_decay = 0.05};
  fb::nn::parameter_list<float> host;
  host.add("a", a);
  host.add("u", u);
  fb::optim::adamw cpu(host, o);
  fb::optim::cuda_adamw gpu({fb::optim::device_parameter("a", da),
                             fb::nn::named_parameter<float>{"u", du.data() + 1, fb::dims{1, {1000}}}},
                            o);
  // Two sets of gradient tensors, each refilled in place: steps 0-2 use set 0 (one upload), then
  // the sets alternate (an upload every step).
  fb::cuda::tensor<float, fb::shape<3, 20001>> ga[2];
  fb::cuda::tensor<float, fb::shape<1000>> gu[2];
  for (int t = 0; t < 6; ++t) {
    const int set = t < 3 ? 0 : t % 2;
    std::tuple<fb::tensor<float, fb::shape<3, 20001>>, fb::tensor<float, fb::shape<1000>>> g;
    fbt::fill_signed(std::get<0>(g), 30 + static_cast<std::uint64_t>(t), 0.01, 2.0);
    fbt::fill_signed(std::get<1>(g), 40 + static_cast<std::uint64_t>(t), 0.01, 2.0);
    ga[set].upload(std::get<0>(g));
    gu[set].upload(std::get<1>(g));
    cpu.step(g);
    gpu.step(std::tie(ga[set], gu[set]));
  }
  CHECK(gpu.table_uploads() == 4);
  const auto ha = da.to_host();
  const auto hu = du.to_host();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) bad += !(std::fabs(ha.data()[i] - a.data()[i]) <= 1e-6 + 1e-5 * std::fabs(a.data()[i]));
  for (std::size_t i = 0; i < u.size(); ++i)
    bad += !(std::fabs(hu.data()[i + 1] - u.data()[i]) <= 1e-6 + 1e-5 * std::fabs(u.data()[i]));
  CHECK(bad == 0);
  CHECK(hu.data()[0] == u_all.data()[0]);  // the element before the parameter is not touched
}
