// bench/edge_models.hpp: issue 23's two batch-1 float32 models as plain data, shared by
// edge_latency.cpp (fusebox, the double reference, the timing) and its peers (peers/xnnpack_cpu.cpp,
// peers/eigen_edge.cpp), so every system is built from the same bytes:
//
//   T2 CNN  [1,1,28,28] -> conv 5x5 32 + bias -> relu -> max-pool 2 -> [1,32,12,12]
//                       -> conv 5x5 64 + bias -> relu -> max-pool 2 -> [1,64,4,4]
//                       -> flatten 1024 -> linear 10 + bias
//   MLP     x [1,784] @ W1 [784,512] + b1 -> relu -> @ W2 [512,10] + b2
//
// Parameters are given in fusebox's layouts (NCHW activations, OIHW conv weights, linear weights
// [in, out]); a peer that wants another layout converts them once, when it builds its model.
// Depends on: the C++ standard library.
#pragma once

#include <cstddef>

namespace fusebox::bench::edge {

/// The T2 CNN's parameters (stride 1, no padding; pools 2x2 stride 2).
struct t2_cnn_params {
  static constexpr std::size_t side = 28, kernel = 5, c1 = 32, c2 = 64, classes = 10;
  static constexpr std::size_t side1 = side - kernel + 1;      // 24: conv1's output
  static constexpr std::size_t pooled1 = side1 / 2;            // 12
  static constexpr std::size_t side2 = pooled1 - kernel + 1;   // 8: conv2's output
  static constexpr std::size_t pooled2 = side2 / 2;            // 4
  static constexpr std::size_t features = c2 * pooled2 * pooled2;  // 1024
  static constexpr std::size_t inputs = side * side, outputs = classes;

  const float* w1;  ///< [32, 1, 5, 5]
  const float* b1;  ///< [32]
  const float* w2;  ///< [64, 32, 5, 5]
  const float* b2;  ///< [64]
  const float* w3;  ///< [1024, 10]; row f is feature f of the NCHW flatten: f = (c * 4 + h) * 4 + w
  const float* b3;  ///< [10]
};

/// The MLP's parameters.
struct mlp_params {
  static constexpr std::size_t inputs = 784, hidden = 512, outputs = 10;

  const float* w1;  ///< [784, 512]
  const float* b1;  ///< [512]
  const float* w2;  ///< [512, 10]
  const float* b2;  ///< [10]
};

/// A peer's model, built once from the parameters (which it may copy: it need not keep them).
/// run() computes one forward pass of one sample: `in` has the model's `inputs` floats and
/// `input_slack_bytes` readable bytes after them (XNNPACK's kernels read past the end of their
/// inputs), `out` receives its `outputs` floats.
class runner {
 public:
  static constexpr std::size_t input_slack_bytes = 16;
  virtual ~runner() = default;
  virtual void run(const float* in, float* out) = 0;
};

}  // namespace fusebox::bench::edge
