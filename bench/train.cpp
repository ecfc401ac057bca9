// bench/train.cpp: W5c of BENCHMARKS.md on fusebox: the W3 MLP (Linear 1024 -> 4096, GELU,
// 4096 -> 4096, GELU, 4096 -> 1024, biases; torch's [out, in] weight layout) at batch 64, MSE
// against a random target, forward + backward as one compiled program (nn::compile_step) and the
// AdamW step as one fused pass (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01). Also the
// same step run eagerly (op by op), and the two halves of the compiled step timed apart.
// The libtorch side is bench/peers/torch_train_fashion_mnist.cpp --w5c.
//
//   bench_train [--threads 2] [--steps 30]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "w5c.hpp"

namespace fb = fusebox;
namespace nn = fusebox::nn;

namespace {

using bench_w5c::batch;
using bench_w5c::clock_type;
using bench_w5c::median;
using bench_w5c::us_since;
using bench_w5c::w3;

template <class Step>
void run(const char* mode, Step& step, w3& model, unsigned threads, int steps) {
  auto params = model.parameters();
  fb::optim::adamw adam(params, {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  const auto x = fb::random_tensor<float, fb::shape<batch, 1024>>(11);
  const auto t = fb::random_tensor<float, fb::shape<batch, 1024>>(12);
  std::vector<double> total, grad_us, update_us;
  double loss0 = 0, loss1 = 0;
  for (int s = 0; s < steps + 5; ++s) {
    const auto t0 = clock_type::now();
    auto [loss, grads] = step(x, t);
    const double g = us_since(t0);
    const auto t1 = clock_type::now();
    adam.step(grads);
    const double u = us_since(t1);
    const double all = us_since(t0);
    if (s == 0) loss0 = loss.flat(0);
    loss1 = loss.flat(0);
    if (s >= 5) total.push_back(all), grad_us.push_back(g), update_us.push_back(u);
  }
  std::printf("{\"workload\":\"W5c\",\"system\":\"fusebox\",\"mode\":\"%s\",\"threads\":%u,\"median_us\":%.1f,"
              "\"floor_us\":%.1f,\"grad_median_us\":%.1f,\"adamw_median_us\":%.1f,\"steps\":%d,\"loss_first\":%.5f,"
              "\"loss_last\":%.5f}\n",
              mode, threads, median(total), *std::min_element(total.begin(), total.end()), median(grad_us),
              median(update_us), steps, loss0, loss1);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 2;
  int steps = 30;
  bool eager = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-eager") eager = false;
    else if (i + 1 < argc && a == "--threads") threads = static_cast<unsigned>(std::atoi(argv[++i]));
    else if (i + 1 < argc && a == "--steps") steps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_train [--threads N] [--steps N] [--no-eager]\n");
      return 2;
    }
  }
  fb::set_default_threads(threads);
  {
    w3 model(5);
    auto step = nn::compile_step(model, nn::mse_loss_fn{}, nn::train, {.threads = threads});
    run("compiled", step, model, threads, steps);
  }
  if (eager) {
    w3 model(5);
    auto step = nn::eager_step(model, nn::mse_loss_fn{});
    run("eager", step, model, threads, steps);
  }
}
