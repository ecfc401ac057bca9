// train_fashion_mnist: BENCHMARKS.md's T1 (and T2 with --model cnn) on the CPU, or on the GPU (--device). T1: an MLP 784 -> 256 -> 128 -> 10 (ReLU) trained
// with AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01: torch's defaults), batch 128,
// cross-entropy, 10 epochs, on Fashion-MNIST from Debian's dataset-fashion-mnist package. Prints per
// epoch the mean training loss, the test accuracy and the seconds the epoch's training took (and
// the test pass's), then one JSON line per epoch and a summary line (BENCHMARKS.md's fields).
//
//   train_fashion_mnist [--epochs 10] [--model mlp] [--threads N] [--data DIR] [--seed S]
//                       [--train-subset N] [--test-subset N] [--save FILE.safetensors] [--min-accuracy A]
//                       [--lr 1e-3] [--weight-decay 0.01] [--schedule constant|cosine]
//                       [--device auto|cpu|cuda]
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
// --device cuda (auto, the default, picks it when fb::cuda::available()) runs the same recipe with
// the same seeds on the GPU: the parameters are uploaded once (the same initial values), the loader
// collates each batch into page-locked memory (pin_memory: the library's recycling pinned pool) on
// one worker thread, and a cuda::uploader copies batch k + 1 into the second of two device slots
// on its own stream while step k runs (double buffering), the step is the same objective compiled
// with device tensors
// (compile(value_and_grad) on the CUDA backend), the update is optim::cuda_adamw, and the test set
// is uploaded once and run through a compiled eval forward on the device; the [500, 10] logits are
// downloaded and their argmax taken on the host. Each step reads its loss back (as the CPU loop
// does), which waits for the step. conv2d, pooling and their gradients run on the GPU too
// (backend/cuda/spatial_kernels.hpp); should T2's device step still fail on its probe call (a zero batch,
// before training), the example says why and trains on the CPU. JSON lines gain "device", "gpu"
// and "samples_per_s".
//
// --model selects the network: `mlp` is T1; `cnn` is T2 (conv 5x5 32, ReLU, max-pool 2, conv 5x5 64,
// ReLU, max-pool 2, linear 1024 -> 10: examples/fashion_cnn.hpp). A model is a struct with three
// members (the network type, its input shape per batch, its name); the loop takes any such model
// unchanged (the loader's [B, 784] batch is reshaped to the model's input shape as a view).
//
// Exit codes: 0 done (and --min-accuracy met), 1 accuracy below --min-accuracy, 2 bad arguments
// (--device cuda without a usable GPU included), 77 data set not installed (CTest's skip code).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fusebox/backend/cuda/uploader.hpp>
#include <fusebox/data/fashion_mnist.hpp>
#include <fusebox/data/loader.hpp>
#include <fusebox/data/progress.hpp>
#include <fusebox/fusebox.hpp>
#include <fusebox/nn/nn.hpp>
#include <fusebox/optim/cuda_adamw.hpp>

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
  std::string device = "auto";
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

// --- The GPU path (--device cuda) ------------------------------------------------------------

/// One batch in page-locked memory: images [batch, 784] and one-hot labels [batch, 10], row-major.
struct pinned_batch {
  fb::storage_ptr x, y;
};
struct pinned_collate {
  pinned_batch operator()(std::vector<std::pair<std::span<const float>, std::int32_t>>&& samples,
                          const fb::data::batch_allocator& allocate) const {
    if (samples.size() != batch)
      throw fb::invalid_argument("train_fashion_mnist: a batch of " + std::to_string(samples.size()) +
                                 " samples; the compiled step takes " + std::to_string(batch) + " (drop_last)");
    pinned_batch b{allocate(batch * pixels * sizeof(float)), allocate(batch * classes * sizeof(float))};
    auto* x = reinterpret_cast<float*>(b.x.get());
    auto* y = reinterpret_cast<float*>(b.y.get());
    std::fill_n(y, batch * classes, 0.0f);
    for (std::size_t i = 0; i < batch; ++i) {
      std::copy(samples[i].first.begin(), samples[i].first.end(), x + i * pixels);
      y[i * classes + static_cast<std::size_t>(samples[i].second)] = 1.0f;
    }
    return b;
  }
};

/// Device copies of a model's parameters (the same values, uploaded once).
template <class Refs>
auto upload_parameters(const Refs& host) {
  return std::apply(
      [](const auto&... h) {
        return std::make_tuple(fb::cuda::tensor<float, typename std::remove_cvref_t<decltype(h)>::shape_type>(h)...);
      },
      host);
}

enum class device_result { done, below_accuracy, no_device_step };

/// T1 (or T2) with device tensors; no_device_step when the device step cannot run (T2 today).
template <class Model>
device_result train_cuda(const options& opt, fb::data::fashion_mnist& data) {
  using net_t = typename Model::network;
  static_assert(net_t::template random_count<nn::train_mode> == 0,
                "train_fashion_mnist --device cuda: the model takes random inputs (dropout); not wired here");
  const char* workload = std::string(Model::name) == "cnn" ? "T2" : "T1";
  const auto& gpu = fb::cuda::current_device();
  net_t net(opt.seed);  // the CPU path's initial parameters, then uploaded
  const auto params = net.parameters();
  auto dparams = upload_parameters(net.param_refs());

  // The objective and the inference function nn::compile_step / compile_forward compile on the
  // host, here called with device tensors: (x, one-hot target, parameters...).
  using objective = nn::detail::objective<net_t, nn::train_mode, nn::cross_entropy_loss>;
  constexpr auto wrt_params = nn::detail::wrt_from<2>(std::make_index_sequence<net_t::param_count>{});
  const fb::options copts{.threads = opt.threads};
  auto step = fb::compile(fb::value_and_grad(objective{nn::cross_entropy_loss{}}, wrt_params), copts);
  auto infer = fb::compile(nn::detail::inference<net_t, nn::eval_mode>{}, copts);

  using x_t = fb::cuda::tensor<float, typename Model::template input_shape<batch>>;
  using y_t = fb::cuda::tensor<float, fb::shape<batch, classes>>;
  x_t dx[2];  // two slots: batch k + 1 is copied into one while step k reads the other
  y_t dy[2];
  auto run_step = [&](std::size_t slot) {
    return std::apply([&](const auto&... p) { return step(dx[slot], dy[slot], p...); }, dparams);
  };

  // Probe: one step on a zero batch (nothing is updated) compiles the device program, or says why
  // there is none.
  try {
    fb::cuda::fill_bytes(reinterpret_cast<fb::cuda::CUdeviceptr>(dx[0].data()), 0, dx[0].size() * sizeof(float));
    fb::cuda::fill_bytes(reinterpret_cast<fb::cuda::CUdeviceptr>(dy[0].data()), 0, dy[0].size() * sizeof(float));
    auto [l, g] = run_step(0);
    (void)l.to_host();
  } catch (const std::exception& e) {
    if (std::string(workload) != "T2") throw;
    std::printf("%s on the GPU: the device step failed; running on the CPU (device step: %s)\n", workload,
                e.what());
    std::fflush(stdout);
    return device_result::no_device_step;
  }

  std::vector<fb::nn::named_parameter<float>> dnamed;
  std::size_t k = 0;
  std::apply([&](auto&... p) { (dnamed.push_back(fb::optim::device_parameter(params[k++].name, p)), ...); }, dparams);
  fb::optim::cuda_adamw adam(std::move(dnamed),
                             {.lr = opt.lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = opt.weight_decay});
  const bool cosine = opt.schedule == "cosine";
  const fb::optim::cosine_annealing_lr schedule{.t_max = static_cast<std::size_t>(std::max(opt.epochs, 1))};

  // The test set on the device once, in eval batches.
  const std::size_t train_n = data.train.size(), test_n = data.test.size() / eval_batch * eval_batch;
  using eval_x = fb::tensor<float, typename Model::template input_shape<eval_batch>>;
  std::vector<fb::cuda::tensor<float, typename Model::template input_shape<eval_batch>>> test_x;
  for (std::size_t start = 0; start < test_n; start += eval_batch) {
    eval_x x;
    std::copy_n(data.test.images.data() + start * pixels, eval_batch * pixels, x.data());
    test_x.emplace_back(x);
  }

  fb::data::loader<const fb::data::image_set&, pinned_collate> batches(
      data.train, {.batch_size = batch, .shuffle = true, .drop_last = true, .num_workers = 1, .seed = opt.seed,
                   .pin_memory = true});
  fb::cuda::uploader uploader;
  auto upload = [&](const pinned_batch& b, std::size_t slot) {
    uploader.copy(dy[slot], b.y);
    return uploader.copy(dx[slot], b.x);  // the later ticket: use() of it covers both copies
  };
  fb::data::progress_bar bar(train_n / batch * batch);
  std::printf("%s Fashion-MNIST on %s (%s, %d SMs), model %s (%zu parameters), AdamW lr %g (%s) wd %g, batch %zu, "
              "seed %llu, %zu train / %zu test samples\n",
              workload, gpu.name.c_str(), gpu.arch.c_str(), gpu.sm_count, Model::name, params.numel(), opt.lr,
              opt.schedule.c_str(), opt.weight_decay, batch, static_cast<unsigned long long>(opt.seed), train_n, test_n);
  std::printf("%5s  %10s  %9s  %9s  %8s  %10s\n", "epoch", "train loss", "test acc", "train s", "test s", "samples/s");

  std::vector<double> epoch_seconds;
  double accuracy = 0, rate = 0;
  for (int epoch = 0; epoch < opt.epochs; ++epoch) {
    if (cosine) adam.options().lr = schedule(opt.lr, static_cast<std::size_t>(epoch));
    bar.start_epoch(static_cast<std::uint64_t>(epoch));
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::size_t steps = 0;
    auto it = batches.begin();
    fb::cuda::uploader::ticket next{};
    if (it != batches.end()) next = upload(*it, 0);
    while (it != batches.end()) {
      const std::size_t slot = steps % 2;
      uploader.use(next);  // step `steps` starts after its batch's copy
      ++it;
      // Queued before the step, on the uploader's stream: overlaps it (and waits for the step
      // that last read the other slot, queued before).
      if (it != batches.end()) next = upload(*it, 1 - slot);
      auto [loss, grads] = run_step(slot);
      adam.step(grads);
      loss_sum += loss.to_host().flat(0);  // waits for the step
      ++steps;
      bar.update(steps * batch, loss_sum / static_cast<double>(steps));
    }
    fb::cuda::synchronize();
    const double train_s = seconds_since(t0);
    epoch_seconds.push_back(train_s);
    rate = static_cast<double>(steps * batch) / train_s;

    const auto t1 = std::chrono::steady_clock::now();
    std::size_t correct = 0;
    for (std::size_t j = 0; j < test_x.size(); ++j) {
      const auto logits = std::apply([&](const auto&... p) { return infer(test_x[j], p...); }, dparams).to_host();
      for (std::size_t i = 0; i < eval_batch; ++i) {
        std::size_t best = 0;
        for (std::size_t c = 1; c < classes; ++c)
          if (logits(i, c) > logits(i, best)) best = c;
        correct += static_cast<std::int32_t>(best) == data.test.labels[j * eval_batch + i];
      }
    }
    const double test_s = seconds_since(t1);
    accuracy = test_n ? static_cast<double>(correct) / static_cast<double>(test_n) : 0;
    const double mean_loss = steps ? loss_sum / static_cast<double>(steps) : 0;
    std::printf("%5d  %10.4f  %8.2f%%  %9.2f  %8.2f  %10.0f\n", epoch + 1, mean_loss, 100 * accuracy, train_s, test_s,
                rate);
    std::printf("{\"workload\":\"%s\",\"system\":\"fusebox\",\"mode\":\"compiled\",\"device\":\"cuda\",\"gpu\":\"%s\","
                "\"epoch\":%d,\"seconds\":%.4f,\"test_seconds\":%.4f,\"samples_per_s\":%.0f,\"loss\":%.6f,"
                "\"accuracy\":%.4f}\n",
                workload, gpu.name.c_str(), epoch + 1, train_s, test_s, rate, mean_loss, accuracy);
    std::fflush(stdout);
  }
  std::vector<double> later(epoch_seconds.begin() + (epoch_seconds.size() > 1 ? 1 : 0), epoch_seconds.end());
  std::sort(later.begin(), later.end());
  const double median = later.empty() ? 0 : later[later.size() / 2];
  std::printf("{\"workload\":\"%s\",\"system\":\"fusebox\",\"mode\":\"compiled\",\"device\":\"cuda\",\"gpu\":\"%s\","
              "\"epochs\":%d,\"median_epoch_s\":%.4f,\"samples_per_s\":%.0f,\"accuracy\":%.4f}\n",
              workload, gpu.name.c_str(), opt.epochs, median,
              median > 0 ? static_cast<double>(train_n / batch * batch) / median : 0.0, accuracy);
  if (!opt.save.empty()) {
    // Downloaded into the host model's tensors, saved under the same names as the CPU path's.
    auto host = net.param_refs();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((void)[&](auto& h, const auto& d) {
         const auto down = d.to_host();
         std::copy_n(down.data(), down.size(), h.data());
       }(std::get<I>(host), std::get<I>(dparams)),
       ...);
    }(std::make_index_sequence<net_t::param_count>{});
    fb::io::save_safetensors(opt.save, params);
    std::printf("parameters saved to %s\n", opt.save.c_str());
  }
  if (opt.min_accuracy >= 0 && accuracy < opt.min_accuracy) {
    std::fprintf(stderr, "test accuracy %.4f is below --min-accuracy %.4f\n", accuracy, opt.min_accuracy);
    return device_result::below_accuracy;
  }
  return device_result::done;
}

/// --device: cuda when asked (or, with auto, when a GPU is there), else the CPU loop above.
template <class Model>
int train_on(const options& opt, fb::data::fashion_mnist& data) {
  const bool cuda = opt.device == "cuda" || (opt.device == "auto" && fb::cuda::available());
  if (!cuda) return train<Model>(opt, data);
  switch (train_cuda<Model>(opt, data)) {
    case device_result::done: return 0;
    case device_result::below_accuracy: return 1;
    case device_result::no_device_step: break;
  }
  return train<Model>(opt, data);
}

int usage(const char* why) {
  std::fprintf(stderr,
               "train_fashion_mnist: %s\nusage: train_fashion_mnist [--epochs N] [--model mlp|cnn] [--threads N] "
               "[--data DIR] [--seed S] [--train-subset N] [--test-subset N] [--save FILE] [--min-accuracy A] [--lr LR] "
               "[--weight-decay WD] [--schedule constant|cosine] [--device auto|cpu|cuda]\n",
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
    else if (a == "--device") opt.device = v;
    else return usage(("unknown option " + a).c_str());
  }
  if (opt.schedule != "constant" && opt.schedule != "cosine") return usage("--schedule takes constant or cosine");
  if (opt.device != "auto" && opt.device != "cpu" && opt.device != "cuda") return usage("--device takes auto, cpu or cuda");
  if (opt.device == "cuda" && !fb::cuda::available()) {
    try {
      fb::cuda::current_device();
    } catch (const std::exception& e) {
      return usage((std::string("--device cuda: ") + e.what()).c_str());
    }
  }
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

  if (opt.model == "mlp") return train_on<models::mlp>(opt, data);
  if (opt.model == "cnn") return train_on<fb::examples::fashion_cnn_model>(opt, data);
  return usage(("unknown model '" + opt.model + "' (mlp, cnn)").c_str());
}
