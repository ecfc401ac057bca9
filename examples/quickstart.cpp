// quickstart: two small models, run eagerly and compiled, with what compile() made of them and an
// A/B measurement of each; where a GPU is present, the MLP again on the CUDA backend, checked
// against the CPU result. `make demo` builds and runs this.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fusebox/fusebox.hpp>

namespace fb = fusebox;

int main() {
  std::printf("fusebox %s quickstart, %u thread(s)\n\n", fb::version_string, fb::default_threads());

  // 1. A two-layer MLP: the bias and GELU ride on the first matmul as its epilogue.
  auto mlp = [](auto x, auto w1, auto b1, auto w2, auto b2) {
    auto h = fb::gelu(fb::matmul(x, w1) + b1);
    return fb::matmul(h, w2) + b2;
  };
  fb::tensor<float, fb::shape<256, 784>> x;
  fb::tensor<float, fb::shape<784, 512>> w1;
  fb::tensor<float, fb::shape<512>> b1;
  fb::tensor<float, fb::shape<512, 10>> w2;
  fb::tensor<float, fb::shape<10>> b2;
  x.fill_random(1);
  w1.fill_random(2, -0.05f, 0.05f);
  b1.fill_random(3);
  w2.fill_random(4, -0.05f, 0.05f);
  b2.fill_random(5);

  std::printf("== MLP 784 -> 512 -> 10, batch 256 ==\n");
  fb::explain(mlp, x, w1, b1, w2, b2);
  auto mlp_fast = fb::compile(mlp);
  std::printf("%s\n", fb::ab(fb::eager(mlp), mlp_fast, x, w1, b1, w2, b2).table().c_str());

  // 2. softmax then layer_norm: one kernel, every row reduced four times while it sits in cache.
  auto block = [](auto x, auto gamma, auto beta) { return fb::layer_norm(fb::softmax(x), gamma, beta, 1e-5f); };
  fb::tensor<float, fb::shape<1024, 1024>> xs;
  fb::tensor<float, fb::shape<1024>> gamma, beta;
  xs.fill_random(6);
  gamma.fill_random(7);
  beta.fill_random(8);

  std::printf("== layer_norm(softmax(x)), x [1024, 1024] ==\n");
  fb::explain(block, xs, gamma, beta);
  auto block_fast = fb::compile(block);
  std::printf("%s\n", fb::ab(fb::eager(block), block_fast, xs, gamma, beta).table().c_str());

  std::printf("arena of the compiled MLP: %zu bytes, fixed at build time\n",
              decltype(mlp_fast)::arena_bytes<decltype(x), decltype(w1), decltype(b1), decltype(w2), decltype(b2)>());

  // 3. The same MLP on the GPU: the same call with device tensors (CUDA kernels from NVRTC,
  //    matmuls through cuBLASLt). Without a GPU this says why and the demo ends here.
  if (!fb::cuda::available()) {
    std::printf("\nno CUDA device here: the GPU part of the demo is skipped (the CPU results above stand)\n");
    return 0;
  }
  std::printf("\n== the MLP on %s ==\n", fb::cuda::current_device().name.c_str());
  const fb::cuda::tensor<float, fb::shape<256, 784>> dx(x);
  const fb::cuda::tensor<float, fb::shape<784, 512>> dw1(w1);
  const fb::cuda::tensor<float, fb::shape<512>> db1(b1);
  const fb::cuda::tensor<float, fb::shape<512, 10>> dw2(w2);
  const fb::cuda::tensor<float, fb::shape<10>> db2(b2);
  auto gpu = fb::compile(mlp);
  const auto t0 = std::chrono::steady_clock::now();
  const auto y_gpu = gpu(dx, dw1, db1, dw2, db2).to_host();
  const double first = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto y_cpu = mlp_fast(x, w1, b1, w2, b2);
  double worst = 0;
  for (std::size_t i = 0; i < y_cpu.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(y_gpu.flat(i) - y_cpu.flat(i))));
  std::printf("first call %.3f s (NVRTC compile included); max |GPU - CPU| = %.2e\n", first, worst);
  return worst < 1e-3 ? 0 : 1;
}
