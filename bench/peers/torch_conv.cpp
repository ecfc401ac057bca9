// bench/peers/torch_conv.cpp: libtorch eager (Debian's libtorch 1.13) for bench/conv.cpp: at::conv2d
// with bias, at::relu, at::max_pool2d, as a PyTorch user writes T2's layers; inputs wrap the bench's
// arrays (at::from_blob, no copies); under c10::InferenceMode for the forward, with autograd for
// the training step. Threads: at::set_num_threads (ATen's OpenMP; libtorch's CPU conv is mkldnn /
// its own im2col + BLAS, whichever this build chooses).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/torch.h>

#include <cstring>
#include <memory>

#include "torch_conv.hpp"

namespace fusebox::bench {
namespace {
at::Tensor wrap(const float* p, std::vector<int64_t> sizes) {
  return at::from_blob(const_cast<float*>(p), sizes, at::TensorOptions().dtype(at::kFloat));
}
}  // namespace

std::function<void()> torch_conv_block(const conv_block_problem& p, unsigned threads, std::string& config) {
  at::set_num_threads(static_cast<int>(threads));
  config = "libtorch " + std::string(TORCH_VERSION) + " eager, InferenceMode, at::set_num_threads(" +
           std::to_string(threads) + "), mkldnn " + (at::hasMKLDNN() ? "on" : "off");
  auto x = wrap(p.x, {p.n, p.c, p.h, p.wd});
  auto w = wrap(p.w, {p.o, p.c, p.k, p.k});
  auto b = wrap(p.b, {p.o});
  auto keep = std::make_shared<at::Tensor>();
  const conv_block_problem q = p;
  return [x, w, b, keep, q] {
    c10::InferenceMode guard;
    *keep = at::max_pool2d(at::relu(at::conv2d(x, w, b, 1, q.pad)), 2);
    std::memcpy(q.y, keep->contiguous().data_ptr<float>(), keep->numel() * sizeof(float));
  };
}

std::function<void()> torch_conv_block_train(const conv_block_problem& p, const float* r, unsigned threads,
                                             std::string& config) {
  at::set_num_threads(static_cast<int>(threads));
  config = "libtorch " + std::string(TORCH_VERSION) + " eager autograd, at::set_num_threads(" + std::to_string(threads) +
           ")";
  auto x = wrap(p.x, {p.n, p.c, p.h, p.wd}).clone().requires_grad_(true);
  auto w = wrap(p.w, {p.o, p.c, p.k, p.k}).clone().requires_grad_(true);
  auto b = wrap(p.b, {p.o}).clone().requires_grad_(true);
  const int oh = p.h + 2 * p.pad - p.k + 1, ow = p.wd + 2 * p.pad - p.k + 1;
  auto rr = wrap(r, {p.n, p.o, oh / 2, ow / 2});
  const conv_block_problem q = p;
  return [x, w, b, rr, q]() mutable {
    x.mutable_grad() = at::Tensor();
    w.mutable_grad() = at::Tensor();
    b.mutable_grad() = at::Tensor();
    auto y = at::max_pool2d(at::relu(at::conv2d(x, w, b, 1, q.pad)), 2);
    (y * rr).sum().backward();
  };
}

}  // namespace fusebox::bench
