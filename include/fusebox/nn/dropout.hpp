// nn/dropout.hpp: torch.nn.Dropout(p) over [batch, F] activations, seeded and deterministic.
//
// In train mode the layer multiplies by a mask that is an *input* of the compiled step, made on
// the host before the call: mask[i] = (u(i) >= p) / (1 - p), so a kept activation is scaled as
// torch scales it and the model's math stays one multiply (fused into its neighbours). u(i) is a
// counter-based generator: a pure function of (seed, step counter, layer stream, element index)
// (splitmix64's finaliser over the mixed key), so a mask depends on nothing else: not on the
// thread count, not on earlier calls, not on the standard library. In eval mode the layer is the
// identity and takes no mask (a different program: the mode is part of the step's type).
// Depends on: nn/{module,parameters}.hpp, core/{tensor,errors}.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "fusebox/core/errors.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"
#include "fusebox/ops/elementwise.hpp"

namespace fusebox::nn {

/// Uniform in [0, 1) from a key and an index: splitmix64's finaliser over key + index * golden.
inline double counter_uniform(std::uint64_t key, std::uint64_t index) noexcept {
  std::uint64_t z = key + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}
/// The key of one mask: seed, step counter and layer stream mixed so that neighbours differ.
inline std::uint64_t dropout_key(std::uint64_t seed, std::uint64_t counter, std::uint64_t stream) noexcept {
  std::uint64_t k = seed ^ 0x6A09E667F3BCC909ull;
  k = (k ^ (counter * 0xD1B54A32D192ED03ull)) * 0x9E3779B97F4A7C15ull;
  k = (k ^ (stream * 0xABC98388FB8FAC03ull)) * 0xBF58476D1CE4E5B9ull;
  return k ^ (k >> 29);
}

template <std::size_t F, class T = float>
struct dropout {
  using value_type = T;
  static constexpr std::size_t param_count = 0;
  template <class Mode>
  static constexpr std::size_t random_count = is_train_v<Mode> ? 1 : 0;

  double p = 0.5;

  explicit dropout(double prob = 0.5, std::source_location loc = std::source_location::current()) : p(prob) {
    if (!(prob >= 0 && prob <= 1))
      FUSEBOX_THROW(invalid_argument("fusebox::nn::dropout: probability " + std::to_string(prob) + " is outside [0, 1] (at " +
                                     where(loc) + ")"));
  }

  std::tuple<> param_refs() { return {}; }
  void collect(parameter_list<T>&, const std::string&) {}

  /// The mask of one step: [Batch, F] values 0 or 1 / (1 - p).
  template <std::size_t Batch>
  tensor<T, shape<Batch, F>> mask(std::uint64_t seed, std::uint64_t counter, std::uint64_t stream) const {
    tensor<T, shape<Batch, F>> m;
    const std::uint64_t key = dropout_key(seed, counter, stream);
    const T keep = p < 1 ? static_cast<T>(1 / (1 - p)) : T(0);
    for (std::size_t i = 0; i < Batch * F; ++i) m.data()[i] = counter_uniform(key, i) >= p ? keep : T(0);
    return m;
  }
  template <class Mode, std::size_t Batch>
  auto make_randoms(std::uint64_t seed, std::uint64_t counter, std::uint64_t stream) const {
    if constexpr (is_train_v<Mode>) return std::make_tuple(mask<Batch>(seed, counter, stream));
    else return std::tuple<>{};
  }

  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P&, const R& r) {
    if constexpr (is_train_v<Mode>) return x * std::get<0>(r);
    else return x;
  }
};

}  // namespace fusebox::nn
