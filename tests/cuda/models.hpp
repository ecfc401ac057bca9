// tests/cuda/models.hpp: the reference workloads' structures that the CUDA tests compile
// (compiled.cpp on a device, codegen.cpp's NVRTC builds without one).
#pragma once

#include <fusebox/fusebox.hpp>

#include "../support/gelu_sigmoid.hpp"

namespace fbt::cuda_models {

namespace fb = fusebox;

/// W1: elementwise with row broadcasts, gelu(x * w + b) * sigmoid(x).
inline constexpr auto w1 = fbt::gelu_sigmoid;
/// W2: softmax then layer_norm along rows.
inline constexpr auto w2 = [](auto x, auto g, auto b) { return fb::layer_norm(fb::softmax(x), g, b, 1e-5f); };
/// W3's layer: matmul + bias + GELU.
inline constexpr auto mlp = [](auto x, auto m, auto b) { return fb::gelu(fb::matmul(x, m) + b); };
/// A column reduction.
inline constexpr auto cols = [](auto x, auto w) { return fb::sum(fb::exp(x) * w, fb::axis<0>); };

}  // namespace fbt::cuda_models
