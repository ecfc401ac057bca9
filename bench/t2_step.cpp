// bench_t2_step: T2's compiled training step (examples/fashion_cnn.hpp: forward, loss, backward;
// then the AdamW update), kernel by kernel. Each kernel of the step's plan runs inside a
// fusebox::profile span; after a warm-up, the spans of N steps give each kernel's median time,
// printed with the kernel's kind (with --explain, the plan the indices refer to; the update comes
// last), so a change to one kernel is seen next to the others in the same run. The input is one
// fixed random batch: the times do not depend on the values.
//
//   bench_t2_step [--threads=2] [--steps=300] [--explain] [--out=results.jsonl]
//
// One JSON object per kernel ({"workload":"T2_step","kernel":K,"kind":...,"median_us":...}) and one
// for the step (the sum of the medians and the median wall time of a step, update included).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>
#include <fusebox/profile.hpp>

#include "../examples/fashion_cnn.hpp"

namespace fb = fusebox;
namespace nn = fusebox::nn;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 2;
  int steps = 300;
  bool explain = false;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--threads=", 0) == 0) threads = static_cast<unsigned>(std::atoi(a.c_str() + 10));
    else if (a.rfind("--steps=", 0) == 0) steps = std::atoi(a.c_str() + 8);
    else if (a == "--explain") explain = true;
    else if (a.rfind("--out=", 0) == 0) out = a.substr(6);
    else {
      std::fprintf(stderr, "usage: bench_t2_step [--threads=2] [--steps=300] [--explain] [--out=results.jsonl]\n");
      return 2;
    }
  }
  if (steps < 1 || threads < 1) {
    std::fprintf(stderr, "bench_t2_step: --steps and --threads must be at least 1\n");
    return 2;
  }
  constexpr std::size_t batch = 128;
  using net_t = fb::examples::fashion_cnn_model::network;
  net_t net(1);
  auto params = net.parameters();
  fb::optim::adamw adam(params, {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  auto step = nn::compile_step(net, nn::cross_entropy_loss{}, nn::train, fb::options{.threads = threads}, 1);
  fb::tensor<float, fb::shape<batch, 1, 28, 28>> x;
  x.fill_random(3, 0.0f, 1.0f);
  fb::tensor<float, fb::shape<batch, 10>> y;
  y.fill(0.0f);
  for (std::size_t i = 0; i < batch; ++i) y(i, i % 10) = 1.0f;
  if (explain)
    std::apply([&](const auto&... p) { std::fputs(step.function().describe(x, y, p...).c_str(), stdout); },
               net.param_refs());

  for (int i = 0; i < 20; ++i) {
    auto [loss, grads] = step(x, y);
    adam.step(grads);
  }
  std::vector<double> wall;
  fb::profile::start();
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fb::profile::scoped_span s("step", "step");
    auto [loss, grads] = step(x, y);
    {
      fb::profile::scoped_span u("adamw update", "optim");
      adam.step(grads);
    }
    wall.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  fb::profile::stop();

  // A step's kernel spans, in the order they began, follow its "step" span's start.
  auto events = fb::profile::events();
  std::sort(events.begin(), events.end(), [](const auto& a, const auto& b) { return a.start_us < b.start_us; });
  std::vector<std::string> kinds;
  std::vector<std::vector<double>> times;
  std::size_t k = 0;
  for (const auto& e : events) {
    if (e.name == "step") {
      k = 0;
      continue;
    }
    if (k == kinds.size()) {
      kinds.push_back(e.name);
      times.emplace_back();
    }
    times[k++].push_back(e.duration_us);
  }

  std::ofstream file;
  if (!out.empty()) file.open(out, std::ios::app);
  auto emit = [&](const std::string& line) {
    std::puts(line.c_str());
    if (file) file << line << '\n';
  };
  double sum = 0;
  char buf[256];
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const double m = median(times[i]);
    sum += m;
    std::snprintf(buf, sizeof buf,
                  "{\"workload\":\"T2_step\",\"system\":\"fusebox\",\"mode\":\"compiled\",\"threads\":%u,\"kernel\":%zu,"
                  "\"kind\":\"%s\",\"median_us\":%.1f}",
                  threads, i, kinds[i].c_str(), m);
    emit(buf);
  }
  std::snprintf(buf, sizeof buf,
                "{\"workload\":\"T2_step\",\"system\":\"fusebox\",\"mode\":\"compiled\",\"threads\":%u,"
                "\"kernels_median_sum_us\":%.1f,\"median_us\":%.1f,\"steps\":%d}",
                threads, sum, median(wall), steps);
  emit(buf);
  return 0;
}
