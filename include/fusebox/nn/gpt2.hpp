// nn/gpt2.hpp: the GPT-2 block of BENCHMARKS.md (W4), as nanoGPT writes it:
//
//   x = x + attn(ln_1(x))                   causal multi-head self-attention (nn/attention.hpp)
//   x = x + mlp(ln_2(x))                    mlp = c_proj(gelu_tanh(c_fc(x))), c_fc: d -> 4d
//
// pre-LayerNorm (eps 1e-5), GELU with the tanh approximation (GPT-2's "gelu_new"), no dropout.
// Parameters named as the state_dict of nanoGPT's Block (and of Hugging Face's GPT2Block, whose
// Conv1D weights are stored transposed): ln_1.weight, ln_1.bias, attn.c_attn.weight,
// attn.c_attn.bias, attn.c_proj.weight, attn.c_proj.bias, ln_2.weight, ln_2.bias,
// mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_proj.weight, mlp.c_proj.bias. Prefix them with
// "transformer.h.<i>." for a whole model's file. x is [B, T, d] or token rows [B*T, d]; inside,
// everything works on token rows (each Linear one GEMM).
//
//   nn::gpt2_block<768, 12, 256> block(seed);                        // d, heads, T
//   auto step = nn::compile_step(block, nn::mse_loss_fn{});           // x [8, 256, 768]
//   nn::gpt2_block<768, 12, fb::dyn> any(seed);   // T = dyn: x [B, T, d], T (and B) per call; the
//                                                 // compiled step runs on the run-time path, each
//                                                 // Linear a batched product (nn/attention.hpp)
// Depends on: nn/{module,parameters,linear,layer_norm,attention}.hpp, ops/elementwise.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "fusebox/nn/attention.hpp"
#include "fusebox/nn/layer_norm.hpp"
#include "fusebox/nn/linear.hpp"
#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"
#include "fusebox/ops/elementwise.hpp"

namespace fusebox::nn {

/// GPT-2's MLP: c_proj(gelu_tanh(c_fc(x))), 4x wide.
template <std::size_t D, class TT = float>
struct gpt2_mlp {
  using value_type = TT;
  static constexpr std::size_t param_count = 4;
  template <class Mode>
  static constexpr std::size_t random_count = 0;

  linear<D, 4 * D, TT> c_fc;
  linear<4 * D, D, TT> c_proj;

  explicit gpt2_mlp(seeded s = {}) : c_fc(seeded{s.seed * 2 + 1}), c_proj(seeded{s.seed * 2 + 2}) {}

  auto param_refs() { return std::tuple_cat(c_fc.param_refs(), c_proj.param_refs()); }
  void collect(parameter_list<TT>& out, const std::string& prefix) {
    c_fc.collect(out, prefix + "c_fc.");
    c_proj.collect(out, prefix + "c_proj.");
  }
  template <class Mode, std::size_t Batch>
  std::tuple<> make_randoms(std::uint64_t, std::uint64_t, std::uint64_t) const {
    return {};
  }

  template <class Mode, class X, class P, class R>
  static auto forward(Mode m, const X& x, const P& p, const R&) {
    const auto h = gelu_tanh(linear<D, 4 * D, TT>::forward(m, x, nn::detail::sub_tuple<0, 2>(p), std::tuple<>{}));
    return linear<4 * D, D, TT>::forward(m, h, nn::detail::sub_tuple<2, 2>(p), std::tuple<>{});
  }
};

template <std::size_t D, std::size_t Heads, std::size_t T, class TT = float>
struct gpt2_block {
  using value_type = TT;
  static constexpr std::size_t param_count = 12;
  template <class Mode>
  static constexpr std::size_t random_count = 0;

  layer_norm<D, TT> ln_1;
  causal_self_attention<D, Heads, T, TT> attn;
  layer_norm<D, TT> ln_2;
  gpt2_mlp<D, TT> mlp;

  explicit gpt2_block(std::uint64_t seed = 0) : gpt2_block(seeded{seed}) {}
  explicit gpt2_block(seeded s) : attn(seeded{s.seed * 4 + 1}), mlp(seeded{s.seed * 4 + 3}) {}

  auto param_refs() {
    return std::tuple_cat(ln_1.param_refs(), attn.param_refs(), ln_2.param_refs(), mlp.param_refs());
  }
  void collect(parameter_list<TT>& out, const std::string& prefix) {
    ln_1.collect(out, prefix + "ln_1.");
    attn.collect(out, prefix + "attn.");
    ln_2.collect(out, prefix + "ln_2.");
    mlp.collect(out, prefix + "mlp.");
  }
  /// Every parameter, named as torch names them.
  parameter_list<TT> parameters() {
    parameter_list<TT> out;
    collect(out, "");
    return out;
  }
  template <class Mode, std::size_t Batch>
  std::tuple<> make_randoms(std::uint64_t, std::uint64_t, std::uint64_t = 0) const {
    return {};
  }

  template <class Mode, class X, class P, class R>
  static auto forward(Mode m, const X& x, const P& p, const R&) {
    using nn::detail::sub_tuple;
    const auto r = detail::as_token_rows<D, T>(x);
    const auto h = r + causal_self_attention<D, Heads, T, TT>::rows(
                           m, layer_norm<D, TT>::forward(m, r, sub_tuple<0, 2>(p), std::tuple<>{}), sub_tuple<2, 4>(p));
    const auto y = h + gpt2_mlp<D, TT>::forward(m, layer_norm<D, TT>::forward(m, h, sub_tuple<6, 2>(p), std::tuple<>{}),
                                                sub_tuple<8, 4>(p), std::tuple<>{});
    return detail::like_input<X>(y);
  }
};

}  // namespace fusebox::nn
