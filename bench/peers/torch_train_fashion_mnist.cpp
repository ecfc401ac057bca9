// bench/peers/torch_train_fashion_mnist.cpp: the libtorch (Debian's 1.13, eager) side of the
// training benchmarks, written as a PyTorch user writes them with the C++ frontend.
//
//   T1 (default): examples/train_fashion_mnist.cpp's model and loop: torch::nn::Sequential of
//       Linear(784, 256), ReLU, Linear(256, 128), ReLU, Linear(128, 10); torch::optim::AdamW (lr
//       1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01); cross_entropy on int64 labels; batch
//       128, shuffled each epoch (torch::randperm), last partial batch dropped; the test pass under
//       NoGradGuard at batch 500. Same data (read with fusebox's IDX reader, which only loads the
//       files: torch's MNIST reader does not take the .gz files Debian ships), same JSON fields.
//   --model cnn: T2, examples/fashion_cnn.hpp's network: Sequential of Conv2d(1, 32, 5), ReLU,
//       MaxPool2d(2), Conv2d(32, 64, 5), ReLU, MaxPool2d(2), Flatten, Linear(1024, 10) (padding 0),
//       input [128, 1, 28, 28]; the same optimizer, loop and test pass as T1. --schedule cosine
//       steps torch::optim's per-epoch cosine (lr0 (1 + cos(pi e / E)) / 2 set on the group before
//       epoch e, as fusebox's optim::cosine_annealing_lr does; libtorch 1.13's C++ frontend has
//       no CosineAnnealingLR); --lr and --weight-decay as in train_fashion_mnist.
//   --w5c: W5c of BENCHMARKS.md: the W3 MLP (Linear 1024 -> 4096, GELU, 4096 -> 4096, GELU,
//       4096 -> 1024) at batch 64, MSE against a random target, backward, AdamW step; median of
//       timed steps after warm-up.
//
// Configuration: at::set_num_threads(threads) and openblas_set_num_threads(threads) (this libtorch
// calls OpenBLAS for float GEMM); run with OMP_WAIT_POLICY=passive and the glibc malloc tunables
// of bench/run_all (see docs/benchmarks.md) as the other libtorch peers are.
//
//   torch_train_fashion_mnist [--epochs 10] [--threads 2] [--data DIR] [--model mlp|cnn] [--lr 1e-3]
//                             [--weight-decay 0.01] [--schedule constant|cosine] [--w5c] [--steps 30]
#include <torch/torch.h>

#include <cmath>
#include <numbers>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fusebox/data/fashion_mnist.hpp>

#if FUSEBOX_BENCH_HAVE_OPENBLAS
extern "C" void openblas_set_num_threads(int);
#endif

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct recipe {
  bool cnn = false;
  double lr = 1e-3, weight_decay = 0.01;
  bool cosine = false;
};

int t1(int epochs, unsigned threads, const std::string& dir, const recipe& r) {
  const auto data = fusebox::data::load_fashion_mnist(dir);
  const auto n = static_cast<int64_t>(data.train.count), nt = static_cast<int64_t>(data.test.count);
  const torch::Tensor train_x =
      torch::from_blob(const_cast<float*>(data.train.images.data()), {n, 784}, torch::kFloat).clone();
  std::vector<int64_t> labels(data.train.labels.begin(), data.train.labels.end());
  const torch::Tensor train_y = torch::from_blob(labels.data(), {n}, torch::kInt64).clone();
  const torch::Tensor test_x = torch::from_blob(const_cast<float*>(data.test.images.data()), {nt, 784}, torch::kFloat).clone();
  std::vector<int64_t> test_labels(data.test.labels.begin(), data.test.labels.end());
  const torch::Tensor test_y = torch::from_blob(test_labels.data(), {nt}, torch::kInt64).clone();

  torch::manual_seed(1);
  torch::nn::Sequential model =
      r.cnn ? torch::nn::Sequential(torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {1, 28, 28})),
                                    torch::nn::Conv2d(1, 32, 5), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
                                    torch::nn::Conv2d(32, 64, 5), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
                                    torch::nn::Flatten(), torch::nn::Linear(1024, 10))
            : torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 128),
                                    torch::nn::ReLU(), torch::nn::Linear(128, 10));
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(r.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(r.weight_decay));
  constexpr int64_t batch = 128, eval_batch = 500;
  const char* workload = r.cnn ? "T2" : "T1";
  std::printf("%s Fashion-MNIST, libtorch %s eager, AdamW lr %g (%s) wd %g, batch %lld, %lld train / %lld test samples, "
              "%u thread(s)\n",
              workload, TORCH_VERSION, r.lr, r.cosine ? "cosine" : "constant", r.weight_decay,
              static_cast<long long>(batch), static_cast<long long>(n), static_cast<long long>(nt), threads);
  std::printf("%5s  %10s  %9s  %9s  %8s\n", "epoch", "train loss", "test acc", "train s", "test s");
  std::vector<double> secs;
  double accuracy = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    if (r.cosine)
      static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[0].options())
          .lr(r.lr * (1 + std::cos(std::numbers::pi * epoch / epochs)) / 2);
    const auto t0 = std::chrono::steady_clock::now();
    model->train();
    const torch::Tensor perm = torch::randperm(n, torch::kInt64);
    double loss_sum = 0;
    int64_t steps = 0;
    for (int64_t s = 0; s + batch <= n; s += batch) {
      const torch::Tensor idx = perm.slice(0, s, s + batch);
      const torch::Tensor x = train_x.index_select(0, idx), y = train_y.index_select(0, idx);
      opt.zero_grad();
      const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      opt.step();
      loss_sum += loss.item<double>();
      ++steps;
    }
    const double train_s = seconds_since(t0);
    secs.push_back(train_s);
    const auto t1 = std::chrono::steady_clock::now();
    int64_t correct = 0;
    {
      torch::NoGradGuard no_grad;
      model->eval();
      for (int64_t s = 0; s + eval_batch <= nt; s += eval_batch) {
        const torch::Tensor pred = model->forward(test_x.slice(0, s, s + eval_batch)).argmax(1);
        correct += pred.eq(test_y.slice(0, s, s + eval_batch)).sum().item<int64_t>();
      }
    }
    const double test_s = seconds_since(t1);
    accuracy = static_cast<double>(correct) / static_cast<double>(nt / eval_batch * eval_batch);
    const double mean_loss = loss_sum / static_cast<double>(steps);
    std::printf("%5d  %10.4f  %8.2f%%  %9.2f  %8.2f\n", epoch + 1, mean_loss, 100 * accuracy, train_s, test_s);
    std::printf("{\"workload\":\"%s\",\"system\":\"libtorch\",\"mode\":\"eager\",\"threads\":%u,\"epoch\":%d,"
                "\"seconds\":%.4f,\"test_seconds\":%.4f,\"loss\":%.6f,\"accuracy\":%.4f}\n",
                workload, threads, epoch + 1, train_s, test_s, mean_loss, accuracy);
    std::fflush(stdout);
  }
  const std::vector<double> later(secs.begin() + (secs.size() > 1 ? 1 : 0), secs.end());
  std::printf("{\"workload\":\"%s\",\"system\":\"libtorch\",\"mode\":\"eager\",\"threads\":%u,\"epochs\":%d,"
              "\"median_epoch_s\":%.4f,\"accuracy\":%.4f}\n",
              workload, threads, epochs, median(later), accuracy);
  return 0;
}

int w5c(int steps, unsigned threads) {
  torch::manual_seed(5);
  constexpr int64_t batch = 64;
  torch::nn::Sequential model(torch::nn::Linear(1024, 4096), torch::nn::GELU(), torch::nn::Linear(4096, 4096),
                              torch::nn::GELU(), torch::nn::Linear(4096, 1024));
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(1e-3).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01));
  const torch::Tensor x = torch::randn({batch, 1024}), t = torch::randn({batch, 1024});
  std::vector<double> us;
  for (int s = 0; s < steps + 5; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    const torch::Tensor loss = torch::mse_loss(model->forward(x), t);
    loss.backward();
    opt.step();
    (void)loss.item<float>();
    if (s >= 5) us.push_back(seconds_since(t0) * 1e6);
  }
  std::printf("{\"workload\":\"W5c\",\"system\":\"libtorch\",\"mode\":\"eager\",\"threads\":%u,\"median_us\":%.1f,"
              "\"floor_us\":%.1f,\"steps\":%d}\n",
              threads, median(us), *std::min_element(us.begin(), us.end()), steps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 10, steps = 30;
  unsigned threads = 2;
  bool do_w5c = false;
  recipe r;
  std::string dir = fusebox::data::fashion_mnist_default_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--w5c") do_w5c = true;
    else if (i + 1 < argc && a == "--epochs") epochs = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--steps") steps = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--threads") threads = static_cast<unsigned>(std::atoi(argv[++i]));
    else if (i + 1 < argc && a == "--data") dir = argv[++i];
    else if (i + 1 < argc && a == "--model" && (argv[i + 1] == std::string("cnn") || argv[i + 1] == std::string("mlp")))
      r.cnn = argv[++i] == std::string("cnn");
    else if (i + 1 < argc && a == "--lr") r.lr = std::atof(argv[++i]);
    else if (i + 1 < argc && a == "--weight-decay") r.weight_decay = std::atof(argv[++i]);
    else if (i + 1 < argc && a == "--schedule" && (argv[i + 1] == std::string("cosine") || argv[i + 1] == std::string("constant")))
      r.cosine = argv[++i] == std::string("cosine");
    else {
      std::fprintf(stderr,
                   "usage: torch_train_fashion_mnist [--epochs N] [--threads N] [--data DIR] [--model mlp|cnn] [--lr LR] "
                   "[--weight-decay WD] [--schedule constant|cosine] [--w5c] [--steps N]\n");
      return 2;
    }
  }
  at::set_num_threads(static_cast<int>(threads));
#if FUSEBOX_BENCH_HAVE_OPENBLAS
  openblas_set_num_threads(static_cast<int>(threads));
#endif
  return do_w5c ? w5c(steps, threads) : t1(epochs, threads, dir, r);
}
