// nn/activation.hpp: parameter-free layers for a sequential stack: relu_layer, gelu_layer,
// tanh_layer (torch.nn.ReLU, GELU, Tanh). The math is the ops' own (ops/elementwise.hpp).
// Depends on: nn/{module,parameters}.hpp, ops/elementwise.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"
#include "fusebox/ops/elementwise.hpp"

namespace fusebox::nn {

namespace detail {
template <class Derived>
struct stateless {
  static constexpr std::size_t param_count = 0;
  template <class Mode>
  static constexpr std::size_t random_count = 0;
  std::tuple<> param_refs() { return {}; }
  template <class T>
  void collect(parameter_list<T>&, const std::string&) {}
  template <class Mode, std::size_t Batch>
  std::tuple<> make_randoms(std::uint64_t, std::uint64_t, std::uint64_t) const {
    return {};
  }
};
}  // namespace detail

struct relu_layer : detail::stateless<relu_layer> {
  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P&, const R&) {
    return fusebox::relu(x);
  }
};
struct gelu_layer : detail::stateless<gelu_layer> {
  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P&, const R&) {
    return fusebox::gelu(x);
  }
};
struct tanh_layer : detail::stateless<tanh_layer> {
  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P&, const R&) {
    return fusebox::tanh(x);
  }
};

}  // namespace fusebox::nn
