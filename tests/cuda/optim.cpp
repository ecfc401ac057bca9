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
