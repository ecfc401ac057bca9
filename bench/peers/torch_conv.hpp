// bench/peers/torch_conv.hpp: the libtorch eager peer of bench/conv.cpp (T2's conv layers), declared
// without libtorch's headers so the fusebox translation unit never sees them.
// Depends on: the C++ standard library.
#pragma once

#include <functional>
#include <string>

namespace fusebox::bench {

/// One T2 conv block: y = max_pool2d(relu(conv2d(x, w, b, stride 1, padding)), 2), NCHW / OIHW.
struct conv_block_problem {
  const float *x, *w, *b;
  int n, c, h, wd, o, k, pad;
  float* y;  ///< [n, o, OH/2, OW/2]: where the peer's result is copied for the check
};

/// A call of the block in libtorch eager (InferenceMode, at::set_num_threads(threads)), or an
/// empty function where the peer is not built; `config` says how it was set up.
std::function<void()> torch_conv_block(const conv_block_problem& p, unsigned threads, std::string& config);
/// Forward + backward of the block against sum(y * r): libtorch autograd (grads of x, w, b).
std::function<void()> torch_conv_block_train(const conv_block_problem& p, const float* r, unsigned threads,
                                             std::string& config);

}  // namespace fusebox::bench
