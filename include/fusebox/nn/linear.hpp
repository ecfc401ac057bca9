// nn/linear.hpp: y = x W^T + b (torch.nn.Linear), W stored [out, in] as torch stores it, so
// weights move to and from PyTorch (safetensors) without a transpose. The product reads W through
// a transposed view (ops/layout.hpp); the GEMM takes the strides, nothing is copied.
// Initialisation as torch's: W and b uniform in +-1/sqrt(in) (kaiming_uniform with a = sqrt(5)).
// Depends on: nn/{module,parameters}.hpp, ops/{matmul,layout}.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>

#include "fusebox/core/tensor.hpp"
#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"
#include "fusebox/ops/elementwise.hpp"
#include "fusebox/ops/layout.hpp"
#include "fusebox/ops/matmul.hpp"

namespace fusebox::nn {

template <std::size_t In, std::size_t Out, class T = float>
struct linear {
  using value_type = T;
  static constexpr std::size_t in_features = In, out_features = Out;
  static constexpr std::size_t param_count = 2;
  template <class Mode>
  static constexpr std::size_t random_count = 0;

  tensor<T, shape<Out, In>> weight;
  tensor<T, shape<Out>> bias;

  explicit linear(seeded s = {}) { reset_parameters(s.seed); }
  void reset_parameters(std::uint64_t seed) {
    const T bound = static_cast<T>(1 / std::sqrt(static_cast<double>(In)));
    weight.fill_random(seed * 2 + 1, -bound, bound);
    bias.fill_random(seed * 2 + 2, -bound, bound);
  }

  auto param_refs() { return std::tie(weight, bias); }
  void collect(parameter_list<T>& out, const std::string& prefix) {
    out.add(prefix + "weight", weight);
    out.add(prefix + "bias", bias);
  }
  template <class Mode, std::size_t Batch>
  std::tuple<> make_randoms(std::uint64_t, std::uint64_t, std::uint64_t) const {
    return {};
  }

  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P& p, const R&) {
    return fusebox::linear(x, std::get<0>(p), std::get<1>(p));
  }
};

}  // namespace fusebox::nn
