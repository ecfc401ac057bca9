// nn/sequential.hpp: torch.nn.Sequential: layers applied in order, parameters named as torch names
// them ("0.weight", "0.bias", "2.weight", ... by layer index), so a state dict saved by either side
// loads in the other. A sequential is itself a module (nn/module.hpp), so stacks nest.
//
//   nn::sequential<nn::linear<784, 256>, nn::relu_layer, nn::linear<256, 10>> mlp(seed);
//   mlp.parameters();                       // parameter_list<float>: 0.weight, 0.bias, 2.weight, 2.bias
//   mlp.layer<0>().weight                   // a layer's tensors
// Layers are constructed from the seed (seed + layer index), or passed in.
// Depends on: nn/{module,parameters}.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"

namespace fusebox::nn {

template <class... Layers>
class sequential {
  static_assert(sizeof...(Layers) >= 1, "fusebox::nn::sequential: give at least one layer");
  static constexpr std::size_t n = sizeof...(Layers);
  template <std::size_t I>
  using layer_t = std::tuple_element_t<I, std::tuple<Layers...>>;

  static constexpr std::array<std::size_t, n + 1> param_offsets = [] {
    std::array<std::size_t, n + 1> o{};
    const std::size_t counts[] = {Layers::param_count...};
    for (std::size_t i = 0; i < n; ++i) o[i + 1] = o[i] + counts[i];
    return o;
  }();
  template <class Mode>
  static constexpr std::array<std::size_t, n + 1> random_offsets = [] {
    std::array<std::size_t, n + 1> o{};
    const std::size_t counts[] = {Layers::template random_count<Mode>...};
    for (std::size_t i = 0; i < n; ++i) o[i + 1] = o[i] + counts[i];
    return o;
  }();

 public:
  static constexpr std::size_t param_count = param_offsets[n];
  template <class Mode>
  static constexpr std::size_t random_count = random_offsets<Mode>[n];

  /// Each layer with parameters from `seed + its index`; the others default-constructed.
  explicit sequential(std::uint64_t seed = 0) : layers_(make_layers(seed, std::index_sequence_for<Layers...>{})) {}
  explicit sequential(Layers... layers) : layers_(std::move(layers)...) {}

  template <std::size_t I>
  auto& layer() { return std::get<I>(layers_); }
  template <std::size_t I>
  const auto& layer() const { return std::get<I>(layers_); }

  auto param_refs() {
    return std::apply([](auto&... l) { return std::tuple_cat(l.param_refs()...); }, layers_);
  }
  template <class T>
  void collect(parameter_list<T>& out, const std::string& prefix) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (std::get<I>(layers_).collect(out, prefix + std::to_string(I) + "."), ...);
    }(std::index_sequence_for<Layers...>{});
  }
  /// Every parameter, named as torch names them.
  template <class T = float>
  parameter_list<T> parameters() {
    parameter_list<T> out;
    collect(out, "");
    return out;
  }

  /// The random inputs of one step (dropout masks), each layer its own stream.
  template <class Mode, std::size_t Batch>
  auto make_randoms(std::uint64_t seed, std::uint64_t counter, std::uint64_t stream = 0) const {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple_cat(std::get<I>(layers_).template make_randoms<Mode, Batch>(seed, counter, stream * 64 + I)...);
    }(std::index_sequence_for<Layers...>{});
  }

  template <class Mode, class X, class P, class R>
  static auto forward(Mode m, const X& x, const P& p, const R& r) {
    return apply<0>(m, x, p, r);
  }

 private:
  template <std::size_t... I>
  static std::tuple<Layers...> make_layers(std::uint64_t seed, std::index_sequence<I...>) {
    return std::tuple<Layers...>(make_layer<Layers>(seed + I)...);
  }
  template <class L>
  static L make_layer(std::uint64_t seed) {
    if constexpr (std::is_constructible_v<L, seeded>) return L(seeded{seed});
    else return L{};
  }
  template <std::size_t I, class Mode, class X, class P, class R>
  static auto apply(Mode m, const X& x, const P& p, const R& r) {
    using L = layer_t<I>;
    auto y = L::forward(m, x, detail::sub_tuple<param_offsets[I], L::param_count>(p),
                        detail::sub_tuple<random_offsets<Mode>[I], L::template random_count<Mode>>(r));
    if constexpr (I + 1 == n) return y;
    else return apply<I + 1>(m, y, p, r);
  }

  std::tuple<Layers...> layers_;
};

}  // namespace fusebox::nn
