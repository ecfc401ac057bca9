// bench/memory_budget.cpp: W5c's training step (bench/train.cpp: the W3 MLP at batch 64, MSE,
// forward + backward as one compiled program, then AdamW) under activation memory budgets 1, 0.5
// and 0 (options::activation_memory_budget, autodiff/remat.hpp): the peak bytes of a fresh
// compiled step's first call (fusebox's byte counters: arena, workspace, gradients), the planned
// figures (memory_summary) and the median step time.
//
//   bench_memory_budget [--threads 2] [--steps 30]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
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
using objective = nn::detail::objective<w3, nn::train_mode, nn::mse_loss_fn>;
const auto vg = fb::value_and_grad(objective{}, fb::wrt<2, 3, 4, 5, 6, 7>);

template <float Budget>
void run(unsigned threads, int steps) {
  w3 model(5);
  auto params = model.parameters();
  fb::optim::adamw adam(params, {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  const auto x = fb::random_tensor<float, fb::shape<batch, 1024>>(11);
  const auto t = fb::random_tensor<float, fb::shape<batch, 1024>>(12);
  auto step = fb::compile<fb::options{.threads = 0, .activation_memory_budget = Budget}>(vg);
  auto call = [&] { return std::apply([&](const auto&... p) { return step(x, t, p...); }, model.param_refs()); };

  fb::memory().reset_peak();
  const std::size_t before = fb::memory().live.load();
  { auto first = call(); }
  const std::size_t peak = fb::memory().peak.load() - before;
  const fb::memory_report r = std::apply([&](const auto&... p) { return step.memory(x, t, p...); }, model.param_refs());

  std::vector<double> total, grad_us;
  double loss0 = 0, loss1 = 0;
  for (int s = 0; s < steps + 5; ++s) {
    const auto t0 = clock_type::now();
    auto [loss, grads] = call();
    const double g = us_since(t0);
    adam.step(grads);
    const double all = us_since(t0);
    if (s == 0) loss0 = loss.flat(0);
    loss1 = loss.flat(0);
    if (s >= 5) total.push_back(all), grad_us.push_back(g);
  }
  std::printf("{\"workload\":\"W5c\",\"system\":\"fusebox\",\"mode\":\"compiled\",\"activation_memory_budget\":%.2f,"
              "\"threads\":%u,\"median_us\":%.1f,\"grad_median_us\":%.1f,\"peak_bytes\":%zu,\"planned_peak_bytes\":%zu,"
              "\"saved_bytes\":%zu,\"arena_bytes\":%zu,\"recomputed\":%zu,\"loss_first\":%.6f,\"loss_last\":%.6f}\n",
              static_cast<double>(Budget), threads, median(total), median(grad_us), peak, r.peak_bytes, r.saved_bytes,
              r.arena_bytes, r.recomputed.size(), loss0, loss1);
  std::printf("%s\n", r.table().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 2;
  int steps = 30;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--threads") threads = static_cast<unsigned>(std::atoi(argv[++i]));
    else if (i + 1 < argc && a == "--steps") steps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_memory_budget [--threads N] [--steps N]\n");
      return 2;
    }
  }
  fb::set_default_threads(threads);
  run<1.0f>(threads, steps);
  run<0.5f>(threads, steps);
  run<0.0f>(threads, steps);
}
