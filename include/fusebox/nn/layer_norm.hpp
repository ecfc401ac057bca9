// nn/layer_norm.hpp: torch.nn.LayerNorm over the last dimension (F features), with a weight
// (gamma, ones at first) and a bias (beta, zeros), eps 1e-5 by default. The math is
// ops/composite.hpp's layer_norm, which the planner fuses into one row kernel.
// Depends on: nn/{module,parameters}.hpp, ops/composite.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "fusebox/core/tensor.hpp"
#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"
#include "fusebox/ops/composite.hpp"

namespace fusebox::nn {

template <std::size_t F, class T = float>
struct layer_norm {
  using value_type = T;
  static constexpr std::size_t param_count = 2;
  template <class Mode>
  static constexpr std::size_t random_count = 0;
  /// eps is part of the type: a number inside the captured model would be a lifted input of its
  /// own, and two norms with equal structure must hold equal numbers (autodiff/lift.hpp).
  static constexpr T eps = T(1e-5);

  tensor<T, shape<F>> weight;
  tensor<T, shape<F>> bias;

  explicit layer_norm(seeded = {}) {
    weight.fill(T(1));
    bias.fill(T(0));
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
    return fusebox::layer_norm(x, std::get<0>(p), std::get<1>(p), eps);
  }
};

}  // namespace fusebox::nn
