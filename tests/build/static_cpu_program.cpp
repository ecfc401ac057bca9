// tests/build/static_cpu_program.cpp: a program of static shapes on the CPU built from the
// <fusebox/cpu.hpp> entry header (issue 22): an MLP and a layer_norm(softmax(x)) block, each
// compiled, explained and checked against eager with ab(), and a compiled gradient. The test
// build.static_cpu_links_no_runtime runs it (its exit status says whether every result was within
// tolerance) and then reads its symbols (tests/cmake/check-static-symbols.cmake): the binary must
// hold no run-time path (generated kernels, host compiler, disk cache), no CUDA back end and no
// dlopen or std::filesystem code, and it must not parse the CUDA back end (the static_asserts below).
#include <fusebox/cpu.hpp>

#include <cstdio>

namespace fb = fusebox;

// cpu.hpp names the CUDA back end's types (pipeline/targets.hpp) but reads none of its headers:
// a compiled call's CUDA branches refer to them only when the arguments select them.
static_assert(!fb::pipeline::defined_here<fb::cuda::tensor<float, fb::shape<1>>>,
              "<fusebox/cpu.hpp> must not include backend/cuda/tensor.hpp (the CUDA driver layer)");
static_assert(!fb::pipeline::defined_here<fb::backends::cuda_backend>,
              "<fusebox/cpu.hpp> must not include backend/cuda.hpp");

int main() {
  auto mlp = [](auto x, auto w1, auto b1, auto w2, auto b2) {
    return fb::matmul(fb::gelu(fb::matmul(x, w1) + b1), w2) + b2;
  };
  fb::tensor<float, fb::shape<16, 32>> x;
  fb::tensor<float, fb::shape<32, 24>> w1;
  fb::tensor<float, fb::shape<24>> b1;
  fb::tensor<float, fb::shape<24, 8>> w2;
  fb::tensor<float, fb::shape<8>> b2;
  x.fill_random(1);
  w1.fill_random(2, -0.2f, 0.2f);
  b1.fill_random(3);
  w2.fill_random(4, -0.2f, 0.2f);
  b2.fill_random(5);
  const std::string plan = fb::explain_text(mlp, x, w1, b1, w2, b2);
  const auto mlp_check = fb::ab(fb::eager(mlp), fb::compile(mlp), x, w1, b1, w2, b2);

  auto block = [](auto x, auto gamma, auto beta) { return fb::layer_norm(fb::softmax(x), gamma, beta, 1e-5f); };
  fb::tensor<float, fb::shape<12, 40>> xs;
  fb::tensor<float, fb::shape<40>> gamma, beta;
  xs.fill_random(6);
  gamma.fill_random(7);
  beta.fill_random(8);
  const auto block_check = fb::ab(fb::eager(block), fb::compile(block), xs, gamma, beta);

  // A compiled gradient of static shapes against the eager one.
  auto loss = [](const auto& x, const auto& w) { return fb::mean(fb::mean(fb::relu(fb::matmul(x, w)))); };
  const auto g_eager = fb::grad(loss, fb::wrt<1>)(x, w1);
  auto compiled_grad = fb::compile(fb::grad(loss, fb::wrt<1>));
  const auto g = compiled_grad(x, w1);
  double worst = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double d = static_cast<double>(g.flat(i)) - static_cast<double>(g_eager.flat(i));
    worst = d > worst ? d : -d > worst ? -d : worst;
  }

  std::printf("%s%s\n%s\nmax |compiled grad - eager grad| = %.3g\n", plan.c_str(), mlp_check.table().c_str(),
              block_check.table().c_str(), worst);
  return mlp_check.ok && block_check.ok && worst < 1e-6 && plan.find("kernel 0") != std::string::npos ? 0 : 1;
}
