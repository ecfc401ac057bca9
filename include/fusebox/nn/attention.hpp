// nn/attention.hpp: multi-head causal self-attention as GPT-2 has it (nanoGPT's
// CausalSelfAttention): one packed projection c_attn (Linear d -> 3d) whose output is split into
// q | k | v, each viewed as [batch, tokens, heads, head dim], causal attention() (scale
// 1/sqrt(head dim)), and the output projection c_proj (Linear d -> d).
//
//   nn::causal_self_attention<768, 12, 256> attn(nn::seeded{1});   // d, heads, tokens per sequence
//   y = attn.forward(mode, x, params, randoms)   // x [B, T, d] or [B*T, d] (tokens as rows)
//   nn::causal_self_attention<768, 12, fb::dyn> any;   // T = dyn: x [B, T, d], T (and B) may be dyn,
//                                                      // compiled on the run-time path (issue 21)
//
// Parameters, named as torch's state_dict names them: c_attn.weight [3d, d], c_attn.bias [3d],
// c_proj.weight [d, d], c_proj.bias [d] (torch.nn.Linear's [out, in]; the same tensor as
// nn.MultiheadAttention's in_proj_weight. Hugging Face's GPT-2 keeps Conv1D weights as [in, out]:
// transpose them when loading). Everything between the two GEMMs is views: slice + reshape, so
// attention reads q, k, v in place and its result is the heads concatenated; the gradient of the
// three slices is one [B*T, 3d] gradient (ops/layout.hpp's slice rule), so c_attn gets one weight
// gradient. No dropout (nanoGPT's default, dropout = 0).
// Depends on: nn/{module,parameters,linear}.hpp, ops/{attention,layout}.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <tuple>

#include "fusebox/core/tensor.hpp"
#include "fusebox/nn/linear.hpp"
#include "fusebox/nn/module.hpp"
#include "fusebox/nn/parameters.hpp"
#include "fusebox/ops/attention.hpp"
#include "fusebox/ops/layout.hpp"

namespace fusebox::nn {

namespace detail {
/// The static shape of a model operand (a tensor, or an expression while captured).
template <class X>
struct operand_shape {
  using type = shape_of_t<X>;
};
template <class X>
  requires is_tensor_v<X>
struct operand_shape<X> {
  using type = typename X::shape_type;
};
template <class X>
using operand_shape_t = typename operand_shape<std::remove_cvref_t<X>>::type;

template <class XShape, std::size_t D, std::size_t T, bool Ok>
struct token_rows_check {
  static_assert(Ok, "fusebox::nn attention / gpt2_block: x (XShape above) must be [batch, T, D] or [batch * T, D] "
                    "with static extents, D the module's width and T its tokens per sequence (D, T above). Fix: "
                    "instantiate the module with x's width and sequence length (T = fb::dyn for a length known "
                    "per call), or reshape x");
  static constexpr bool value = Ok;
};

template <class XShape, std::size_t D, bool Ok>
struct sequences_check {
  static_assert(Ok, "fusebox::nn attention / gpt2_block with T = dyn: x (XShape above) must be [batch, tokens, D] "
                    "(either of the first two may be dyn), D the module's width (above). Fix: give x the module's "
                    "width, or pass token rows to a module with a static T");
  static constexpr bool value = Ok;
};

/// x as token rows [N, D]: x is [B, T, D] (viewed as rows) or already [N, D]. With T = dyn (a
/// sequence length known per call) x stays [B, T, D]: token rows would be one extent B * T, which
/// the run-time path's guards know nothing of, so each Linear is a batched product instead.
template <std::size_t D, std::size_t T, class X>
auto as_token_rows(const X& x) {
  using S = operand_shape_t<X>;
  if constexpr (T == dyn) {
    static_assert(sequences_check<S, D, S::rank == 3 && S::extents[2] == D>::value);
    return x;
  } else {
    static_assert(token_rows_check<S, D, T,
                                   (S::rank == 2 || S::rank == 3) && S::is_static && S::extents[S::rank - 1] == D &&
                                       (S::rank == 2 || S::extents[1] == T) && (S::size / D) % T == 0>::value);
    if constexpr (S::rank == 2) return x;
    else return reshape<shape<S::size / D, D>>(x);
  }
}
/// y (as_token_rows' layout) back in x's shape.
template <class X, class Y>
auto like_input(const Y& y) {
  using S = operand_shape_t<X>;
  if constexpr (S::rank == 2 || operand_shape_t<Y>::rank == 3) return y;
  else return reshape<S>(y);
}
}  // namespace detail

template <std::size_t D, std::size_t Heads, std::size_t T, class TT = float>
struct causal_self_attention {
  static_assert(Heads >= 1 && D % Heads == 0, "fusebox::nn::causal_self_attention<d, heads, T>: heads must divide d");
  using value_type = TT;
  static constexpr std::size_t width = D, heads = Heads, tokens = T, head_dim = D / Heads;
  static constexpr std::size_t param_count = 4;
  template <class Mode>
  static constexpr std::size_t random_count = 0;

  linear<D, 3 * D, TT> c_attn;
  linear<D, D, TT> c_proj;

  explicit causal_self_attention(seeded s = {}) : c_attn(seeded{s.seed * 2 + 1}), c_proj(seeded{s.seed * 2 + 2}) {}

  auto param_refs() { return std::tuple_cat(c_attn.param_refs(), c_proj.param_refs()); }
  void collect(parameter_list<TT>& out, const std::string& prefix) {
    c_attn.collect(out, prefix + "c_attn.");
    c_proj.collect(out, prefix + "c_proj.");
  }
  parameter_list<TT> parameters() {
    parameter_list<TT> out;
    collect(out, "");
    return out;
  }
  template <class Mode, std::size_t Batch>
  std::tuple<> make_randoms(std::uint64_t, std::uint64_t, std::uint64_t) const {
    return {};
  }

  /// Token rows [N, D] -> [N, D], N a multiple of T (what gpt2_block calls); with T = dyn,
  /// [B, T, D] -> [B, T, D], heads split and joined by unflatten / flatten (views that keep B and T).
  template <class Mode, class X, class P>
  static auto rows(Mode m, const X& x, const P& p) {
    const auto qkv = linear<D, 3 * D, TT>::forward(m, x, nn::detail::sub_tuple<0, 2>(p), std::tuple<>{});
    if constexpr (T == dyn) {
      using heads_of = shape<Heads, D / Heads>;
      const auto q = unflatten<2, heads_of>(slice<2, 0, D>(qkv));
      const auto k = unflatten<2, heads_of>(slice<2, D, 2 * D>(qkv));
      const auto v = unflatten<2, heads_of>(slice<2, 2 * D, 3 * D>(qkv));
      const auto y = flatten<2, 3>(attention(q, k, v, causal));
      return linear<D, D, TT>::forward(m, y, nn::detail::sub_tuple<2, 2>(p), std::tuple<>{});
    } else {
      constexpr std::size_t N = detail::operand_shape_t<X>::extents[0];
      using head_view = shape<N / T, T, Heads, D / Heads>;
      const auto q = reshape<head_view>(slice<1, 0, D>(qkv));
      const auto k = reshape<head_view>(slice<1, D, 2 * D>(qkv));
      const auto v = reshape<head_view>(slice<1, 2 * D, 3 * D>(qkv));
      const auto y = reshape<shape<N, D>>(attention(q, k, v, causal));
      return linear<D, D, TT>::forward(m, y, nn::detail::sub_tuple<2, 2>(p), std::tuple<>{});
    }
  }

  template <class Mode, class X, class P, class R>
  static auto forward(Mode m, const X& x, const P& p, const R&) {
    return detail::like_input<X>(rows(m, detail::as_token_rows<D, T>(x), p));
  }
};

}  // namespace fusebox::nn
