// bench/compile/two_models_fusebox.cpp: issue 22's build-cost program. Two small models, each
// compiled, explained and checked against eager (ab): an MLP 256 -> 512 -> 32 and a
// layer_norm(softmax(x)) block. What it costs to build is the figure (bench/compile/build_cost.sh);
// two_models_eigen.cpp is the same work written with Eigen 3.4. A program of static shapes on the
// CPU includes <fusebox/cpu.hpp>; FUSEBOX_TWO_MODELS_UMBRELLA builds it from <fusebox/fusebox.hpp>.
#include <cstdio>

#if defined(FUSEBOX_TWO_MODELS_UMBRELLA)
#include <fusebox/fusebox.hpp>
#else
#include <fusebox/cpu.hpp>
#endif

namespace fb = fusebox;

int main() {
  auto mlp = [](auto x, auto w1, auto b1, auto w2, auto b2) {
    return fb::matmul(fb::gelu(fb::matmul(x, w1) + b1), w2) + b2;
  };
  fb::tensor<float, fb::shape<64, 256>> x;
  fb::tensor<float, fb::shape<256, 512>> w1;
  fb::tensor<float, fb::shape<512>> b1;
  fb::tensor<float, fb::shape<512, 32>> w2;
  fb::tensor<float, fb::shape<32>> b2;
  x.fill_random(1);
  w1.fill_random(2, -0.05f, 0.05f);
  b1.fill_random(3);
  w2.fill_random(4, -0.05f, 0.05f);
  b2.fill_random(5);
  fb::explain(mlp, x, w1, b1, w2, b2);
  auto mlp_fast = fb::compile(mlp);
  const auto mlp_check = fb::ab(fb::eager(mlp), mlp_fast, x, w1, b1, w2, b2);
  std::printf("%s\n", mlp_check.table().c_str());

  auto block = [](auto x, auto gamma, auto beta) { return fb::layer_norm(fb::softmax(x), gamma, beta, 1e-5f); };
  fb::tensor<float, fb::shape<256, 512>> xs;
  fb::tensor<float, fb::shape<512>> gamma, beta;
  xs.fill_random(6);
  gamma.fill_random(7);
  beta.fill_random(8);
  fb::explain(block, xs, gamma, beta);
  auto block_fast = fb::compile(block);
  const auto block_check = fb::ab(fb::eager(block), block_fast, xs, gamma, beta);
  std::printf("%s\n", block_check.table().c_str());
  return mlp_check.ok && block_check.ok ? 0 : 1;
}
