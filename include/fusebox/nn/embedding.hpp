// nn/embedding.hpp: torch.nn.Embedding: a table of V rows of D numbers, y = weight[ids].
//
//   nn::embedding<50257, 768> wte(seed);                   // weight [V, D], normal(0, 1) as torch's init
//   nn::sequential<nn::embedding<V, D>, nn::linear<D, C>> m(seed);   // x: ids [B, T] or [N]
//
// The ids are a tensor in the weight's element type holding exact integers in [0, V) (ops/
// embedding.hpp: fusebox has no integer tensors yet; float ids are exact below 2^24). The
// parameter is named `weight` and stored [num_embeddings, embedding_dim] as torch stores it, so
// safetensors files move to and from PyTorch as they are (GPT-2's wte and wpe). Its gradient is a
// deterministic scatter-add (backend/cpu/gather.hpp). No padding_idx, max_norm or sparse gradients.
// Depends on: nn/{module,parameters}.hpp, ops/embedding.hpp.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

#include "fusebox/core/tensor.hpp"
#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"
#include "fusebox/ops/embedding.hpp"

namespace fusebox::nn {

/// Standard normal numbers from splitmix64 (Box-Muller), reproducible from the seed.
template <class T, class S>
void fill_normal(tensor<T, S>& t, std::uint64_t seed, double mean = 0, double std = 1) {
  fusebox::detail::splitmix64 g{seed};
  constexpr double two_pi = 6.283185307179586476925286766559;
  for (std::size_t i = 0; i < t.size(); i += 2) {
    const double u1 = 1.0 - g.uniform(), u2 = g.uniform();  // u1 in (0, 1]: log(u1) is finite
    const double r = std::sqrt(-2.0 * std::log(u1));
    t.flat(i) = static_cast<T>(mean + std * r * std::cos(two_pi * u2));
    if (i + 1 < t.size()) t.flat(i + 1) = static_cast<T>(mean + std * r * std::sin(two_pi * u2));
  }
}

template <std::size_t NumEmbeddings, std::size_t EmbeddingDim, class T = float>
struct embedding {
  static_assert(NumEmbeddings >= 1 && EmbeddingDim >= 1, "fusebox::nn::embedding<V, D>: need V >= 1 and D >= 1");
  using value_type = T;
  static constexpr std::size_t num_embeddings = NumEmbeddings, embedding_dim = EmbeddingDim;
  static constexpr std::size_t param_count = 1;
  template <class Mode>
  static constexpr std::size_t random_count = 0;

  tensor<T, shape<NumEmbeddings, EmbeddingDim>> weight;

  explicit embedding(seeded s = {}) { reset_parameters(s.seed); }
  /// torch.nn.Embedding's reset_parameters: weight ~ normal(0, 1).
  void reset_parameters(std::uint64_t seed) { fill_normal(weight, seed * 2 + 1); }

  auto param_refs() { return std::tie(weight); }
  void collect(parameter_list<T>& out, const std::string& prefix) { out.add(prefix + "weight", weight); }
  parameter_list<T> parameters() {
    parameter_list<T> out;
    collect(out, "");
    return out;
  }
  template <class Mode, std::size_t Batch>
  std::tuple<> make_randoms(std::uint64_t, std::uint64_t, std::uint64_t) const {
    return {};
  }

  /// x: the ids, any shape; the result is x's shape plus [EmbeddingDim].
  template <class Mode, class X, class P, class R>
  static auto forward(Mode, const X& x, const P& p, const R&) {
    return fusebox::embedding(std::get<0>(p), x);
  }
};

}  // namespace fusebox::nn
