// train_fashion_mnist: BENCHMARKS.md's T1 (and T2 with --model cnn) on the CPU. T1: an MLP 784 -> 256 -> 128 -> 10 (ReLU) trained
// with AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01: torch's defaults), batch 128,
// cross-entropy, 10 epochs, on Fashion-MNIST from Debian's dataset-fashion-mnist package. Prints per
// epoch the mean training loss, the test accuracy and the seconds the epoch's training took (and
// the test pass's), then one JSON line per epoch and a summary line (BENCHMARKS.md's fields).
//
//   train_fashion_mnist [--epochs 10] [--model mlp] [--threads N] [--data DIR] [--seed S]
//                       [--train-subset N] [--test-subset N] [--save FILE.safetensors] [--min-accuracy A]
//                       [--lr 1e-3] [--weight-decay 0.01] [--schedule constant|cosine]
//
// --schedule cosine anneals the learning rate per epoch from --lr to 0 over --epochs
// (optim::cosine_annealing_lr{t_max = epochs}, stepped after each epoch as torch's CosineAnnealingLR
// is in a per-epoch loop); the default is a constant lr (T1's recipe).
//
// The step is one compiled program (forward, loss, backward: nn::compile_step), the update one
// fused AdamW pass; batches come from fusebox::data::loader (shuffled per epoch, seeded, the last
// partial batch dropped so every step has the compiled batch size). The test pass is a compiled
// eval-mode forward at batch 500.
//
// --model selects the network: `mlp` is T1; `cnn` is T2 (conv 5x5 32, ReLU, max-pool 2, conv 5x5 64,
// ReLU, max-pool 2, linear 1024 -> 10: examples/fashion_cnn.hpp). A model is a struct with three
// members (the network type, its input shape per batch, its name); the loop takes any such model
// unchanged (the loader's [B, 784] batch is reshaped to the model's input shape as a view).
//
// Exit codes: 0 done (and --min-accuracy met), 1 accuracy below --min-accuracy, 2 bad arguments,
// 77 data set not installed (CTest's skip code).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fusebox/data/fashion_mnist.hpp>
#include <fusebox/data/loader.hpp>
#include <fusebox/data/progress.hpp>
#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>

#include "fashion_cnn.hpp"

namespace fb = fusebox;
namespace nn = fusebox::nn;

namespace {

constexpr std::size_t batch = 128, eval_batch = 500, classes = 10, pixels = 784;

namespace models {
struct mlp {
  using network = nn::sequential<nn::linear<784, 256>, nn::relu_layer, nn::linear<256, 128>, nn::relu_layer,
                                 nn::linear<128, 10>>;
  template <std::size_t B>
  using input_shape = fb::shape<B, 784>;
  static constexpr const char* name = "mlp";
};
}  // namespace models

struct options {
  int epochs = 10;
  std::string model = "mlp";
  unsigned threads = 0;
  std::string data = fb::data::fashion_mnist_default_dir;
  std::uint64_t seed = 1;
  std::size_t train_subset = 0, test_subset = 0;  // 0: all
  std::string save;
  double min_accuracy = -1;
  double lr = 1e-3, weight_decay = 0.01;
  std::string schedule = "constant";
};

/// One batch: images [B, 784] and one-hot labels [B, 10], ready for the compiled step.
struct batch_t {
  fb::tensor<float, fb::shape<batch, pixels>> x;
  fb::tensor<float, fb::shape<batch, classes>> y;
};
struct collate {
  batch_t operator()(std::vector<std::pair<std::span<const float>, std::int32_t>>&& samples) const {
    if (samples.size() != batch)
      throw fb::invalid_argument("train_fashion_mnist: a batch of " + std::to_string(samples.size()) +
                                 " samples; the compiled step takes " + std::to_string(batch) + " (drop_last)");
    batch_t b;
    b.y.fill(0.0f);
    for (std::size_t i = 0; i < batch; ++i) {
      std::copy(samples[i].first.begin(), samples[i].first.end(), b.x.data() + i * pixels);
      b.y(i, static_cast<std::size_t>(samples[i].second)) = 1.0f;
    }
    return b;
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class Model>
int train(const options& opt, fb::data::fashion_mnist& data) {
  using net_t = typename Model::network;
  net_t net(opt.seed);
  auto params = net.parameters();
  fb::optim::adamw adam(params, {.lr = opt.lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = opt.weight_decay});
  // t_max = epochs: epoch e (from 0) trains at lr0 (1 + cos(pi e / E)) / 2. The scheduler sets lr0 at
  // construction; a constant schedule never steps it.
  const bool cosine = opt.schedule == "cosine";
  fb::optim::scheduler sched(adam, fb::optim::cosine_annealing_lr{.t_max = static_cast<std::size_t>(std::max(opt.epochs, 1))});
  const fb::options copts{.threads = opt.threads};
  auto step = nn::compile_step(net, nn::cross_entropy_loss{}, nn::train, copts, opt.seed);
  auto infer = nn::compile_forward(net, nn::eval, copts);

  const std::size_t train_n = data.train.size(), test_n = data.test.size() / eval_batch * eval_batch;
  fb::data::loader<const fb::data::image_set&, collate> batches(
      data.train, {.batch_size = batch, .shuffle = true, .drop_last = true, .seed = opt.seed});
  fb::data::progress_bar bar(train_n / batch * batch);
  const char* workload = std::string(Model::name) == "cnn" ? "T2" : "T1";
  std::printf("%s Fashion-MNIST, model %s (%zu parameters), AdamW lr %g (%s) wd %g, batch %zu, seed %llu, %zu train / "
              "%zu test samples, %u thread(s)\n",
              workload, Model::name, params.numel(), opt.lr, opt.schedule.c_str(), opt.weight_decay, batch,
              static_cast<unsigned long long>(opt.seed), train_n, test_n, fb::default_threads());
  std::printf("%5s  %10s  %9s  %9s  %8s\n", "epoch", "train loss", "test acc", "train s", "test s");

  std::vector<double> epoch_seconds;
  double accuracy = 0;
  for (int epoch = 0; epoch < opt.epochs; ++epoch) {
    bar.start_epoch(static_cast<std::uint64_t>(epoch));
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::size_t steps = 0;
    for (auto& b : batches) {
      const auto x = b.x.template reshape<typename Model::template input_shape<batch>>();
      auto [loss, grads] = step(x, b.y);
      adam.step(grads);
      loss_sum += loss.flat(0);
      ++steps;
      bar.update(steps * batch, loss_sum / static_cast<double>(steps));
    }
    const double train_s = seconds_since(t0);
    epoch_seconds.push_back(train_s);
    if (cosine) sched.step();

    const auto t1 = std::chrono::steady_clock::now();
    std::size_t correct = 0;
    for (std::size_t start = 0; start < test_n; start += eval_batch) {
      fb::tensor<float, fb::shape<eval_batch, pixels>> x;
      std::copy_n(data.test.images.data() + start * pixels, eval_batch * pixels, x.data());
      const auto logits = infer(x.template reshape<typename Model::template input_shape<eval_batch>>());
      for (std::size_t i = 0; i < eval_batch; ++i) {
        std::size_t best = 0;
        for (std::size_t c = 1; c < classes; ++c)
          if (logits(i, c) > logits(i, best)) best = c;
        correct += static_cast<std::int32_t>(best) == data.test.labels[start + i];
      }
    }
    const double test_s = seconds_since(t1);
    accuracy = test_n ? static_cast<double>(correct) / static_cast<double>(test_n) : 0;
    const double mean_loss = steps ? loss_sum / static_cast<double>(steps) : 0;
    std::printf("%5d  %10.4f  %8.2f%%  %9.2f  %8.2f\n", epoch + 1, mean_loss, 100 * accuracy, train_s, test_s);
    std::printf("{\"workload\":\"%s\",\"system\":\"fusebox\",\"mode\":\"compiled\",\"threads\":%u,\"epoch\":%d,"
                "\"seconds\":%.4f,\"test_seconds\":%.4f,\"loss\":%.6f,\"accuracy\":%.4f}\n",
                workload, fb::default_threads(), epoch + 1, train_s, test_s, mean_loss, accuracy);
    std::fflush(stdout);
  }
  // Median of the epochs after the first (the first pays for first-touch allocations).
  std::vector<double> later(epoch_seconds.begin() + (epoch_seconds.size() > 1 ? 1 : 0), epoch_seconds.end());
  std::sort(later.begin(), later.end());
  const double median = later.empty() ? 0 : later[later.size() / 2];
  std::printf("{\"workload\":\"%s\",\"system\":\"fusebox\",\"mode\":\"compiled\",\"threads\":%u,\"epochs\":%d,"
              "\"median_epoch_s\":%.4f,\"accuracy\":%.4f}\n",
              workload, fb::default_threads(), opt.epochs, median, accuracy);
  if (!opt.save.empty()) {
    fb::io::save_safetensors(opt.save, params);
    std::printf("parameters saved to %s\n", opt.save.c_str());
  }
  if (opt.min_accuracy >= 0 && accuracy < opt.min_accuracy) {
    std::fprintf(stderr, "test accuracy %.4f is below --min-accuracy %.4f\n", accuracy, opt.min_accuracy);
    return 1;
  }
  return 0;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "train_fashion_mnist: %s\nusage: train_fashion_mnist [--epochs N] [--model mlp|cnn] [--threads N] "
               "[--data DIR] [--seed S] [--train-subset N] [--test-subset N] [--save FILE] [--min-accuracy A] [--lr LR] "
               "[--weight-decay WD] [--schedule constant|cosine]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    if (a == "--epochs") opt.epochs = std::atoi(v);
    else if (a == "--model") opt.model = v;
    else if (a == "--threads") opt.threads = static_cast<unsigned>(std::atoi(v));
    else if (a == "--data") opt.data = v;
    else if (a == "--seed") opt.seed = std::strtoull(v, nullptr, 10);
    else if (a == "--train-subset") opt.train_subset = std::strtoull(v, nullptr, 10);
    else if (a == "--test-subset") opt.test_subset = std::strtoull(v, nullptr, 10);
    else if (a == "--save") opt.save = v;
    else if (a == "--min-accuracy") opt.min_accuracy = std::atof(v);
    else if (a == "--lr") opt.lr = std::atof(v);
    else if (a == "--weight-decay") opt.weight_decay = std::atof(v);
    else if (a == "--schedule") opt.schedule = v;
    else return usage(("unknown option " + a).c_str());
  }
  if (opt.schedule != "constant" && opt.schedule != "cosine") return usage("--schedule takes constant or cosine");
  if (opt.threads) fb::set_default_threads(opt.threads);

  fb::data::fashion_mnist data;
  try {
    data = fb::data::load_fashion_mnist(opt.data);
  } catch (const fb::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 77;
  }
  auto keep = [](fb::data::image_set& s, std::size_t n) {
    if (n == 0 || n >= s.count) return;
    s.count = n;
    s.images.resize(n * s.rows * s.cols);
    s.labels.resize(n);
  };
  keep(data.train, opt.train_subset);
  keep(data.test, opt.test_subset);

  if (opt.model == "mlp") return train<models::mlp>(opt, data);
  if (opt.model == "cnn") return train<fb::examples::fashion_cnn_model>(opt, data);
  return usage(("unknown model '" + opt.model + "' (mlp, cnn)").c_str());
}
