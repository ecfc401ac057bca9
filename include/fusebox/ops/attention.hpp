// ops/attention.hpp: scaled dot-product attention, one fused op.
//
//   auto o = attention(q, k, v);          // softmax(q·kᵀ / sqrt(E)) · v
//   auto o = attention(q, k, v, causal);  // key j > query i masked out
//
// q [B, Tq, H, E], k [B, Tk, H, E], v [B, Tk, H, Ev] → [B, Tq, H, Ev]: flash-attn's layout
// (flash_attn_func, xformers' BMHK), in which a projection's output [B*T, H*E] reshaped is q as it
// is and the result reshaped to [B*T, H*Ev] is the heads concatenated, ready for the output
// projection: no transposes, no copies. For PyTorch's [B, H, T, E] tensors pass transpose<1, 2>
// views. The scale is 1/sqrt(E) as in torch's scaled_dot_product_attention; scale q for another.
// The scores are never stored: the CUDA backend runs one flash-attention kernel (tensor cores
// for 16-bit storage), the CPU an online softmax per query row.
// Derivative: at the end of this file (two gradient kernels, expr/grad_nodes.hpp).
// Depends on: ops/operand.hpp, ops/layout.hpp, autodiff/rule.hpp, expr/grad_nodes.hpp.
#pragma once

#include <source_location>

#include "fusebox/autodiff/rule.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/expr/grad_nodes.hpp"
#include "fusebox/ops/layout.hpp"
#include "fusebox/ops/operand.hpp"

namespace fusebox {

/// The causal mask flag of attention(); part of the node's type (another kernel).
struct causal_t {
  explicit constexpr causal_t() = default;
};
inline constexpr causal_t causal{};

namespace detail {
template <bool Causal, class Q, class K, class V>
auto make_attention(const Q& q, const K& k, const V& v, const std::source_location& loc) {
  using T = typename common_element<Q>::type;
  using EQ = decltype(as_expr<T>(q));
  using EK = decltype(as_expr<T>(k));
  using EV = decltype(as_expr<T>(v));
  attention_node<EQ, EK, EV, Causal> e{{}, as_expr<T>(q), as_expr<T>(k), as_expr<T>(v)};
  if constexpr (!EQ::desc.shape.is_static() || !EK::desc.shape.is_static() || !EV::desc.shape.is_static()) {
    const dims sq = runtime_shape(e.q), sk = runtime_shape(e.k), sv = runtime_shape(e.v);
    const auto r = attention_shape(sq, sk, sv, Causal);
    if (!r.rank_ok || !r.extents_ok || !r.causal_ok)
      FUSEBOX_THROW(shape_error("attention: q is " + to_string(sq) + ", k is " + to_string(sk) + ", v is " + to_string(sv) +
                                    "; need [batch, tokens, heads, head dim] with equal batch and heads, k and v the same "
                                    "tokens, q and k the same head dim" +
                                    (r.causal_ok ? "" : ", and as many queries as keys for the causal mask"),
                                loc));
  }
  return finish(e);
}
}  // namespace detail

template <array_operand Q, array_operand K, array_operand V>
auto attention(const Q& q, const K& k, const V& v, std::source_location loc = std::source_location::current()) {
  return detail::make_attention<false>(q, k, v, loc);
}

template <array_operand Q, array_operand K, array_operand V>
auto attention(const Q& q, const K& k, const V& v, causal_t, std::source_location loc = std::source_location::current()) {
  return detail::make_attention<true>(q, k, v, loc);
}

// ---- derivative (autodiff/rule.hpp): G the incoming gradient, Y the attention node ----
// With as many queries as keys and E == Ev (self-attention), one gradient kernel writes dq, dk
// and dv as [B, T, 3, H, E]; each operand's gradient is a view of it (slice, reshape). That is
// the layout of a packed projection's output: for GPT-2's q | k | v sliced from [B*T, 3C], the
// reshape and slice rules pass these views on without copies and the reverse pass joins the
// three slices' pads into one kernel (ops/layout.hpp, autodiff/backward.hpp). Otherwise one
// kernel writes dq and another dk | dv. The kernels recompute the softmax from q and k
// (backend/cpu/attention.hpp): nothing of size T x T is saved or stored.
namespace autodiff {
template <class Q, class K, class V, bool Causal>
struct derivative<attention_node<Q, K, V, Causal>> {
  template <int Part, class G, class Y>
  using part = attention_backward_node<Part, Causal, operand<Y, 0>, operand<Y, 1>, operand<Y, 2>, Y, exact<G, Y>>;
  static constexpr std::size_t e = Q::desc.shape.extent[3], ev = V::desc.shape.extent[3];
  static constexpr bool fused = Q::desc.shape.extent[1] == K::desc.shape.extent[1] && e == ev;
  // fused: [B, T, 3, H, E], operand I at index I of dimension 2, that dimension dropped: by a
  // reshape to the operand's shape, or with a dyn extent (a shape reshape cannot name) by merging
  // the sliced [1] into the heads (flatten<2, 3>), which the run-time path recomputes per call.
  template <class S>
  using drop_part_axis = std::conditional_t<Q::desc.shape.is_static() && K::desc.shape.is_static() &&
                                                V::desc.shape.is_static(),
                                            ops::reshape_view<S>, ops::flatten_view<2, 3>>;
  template <std::size_t I, class G, class Y>
  struct pick {
    using type = view_node<drop_part_axis<shape_of_t<operand<Y, I>>>, view_node<ops::slice_view<2, I, I + 1>, part<3, G, Y>>>;
  };
  template <std::size_t I, class G, class Y>
    requires(!fused)
  struct pick<I, G, Y> {  // dq; dk | dv
    using type = std::conditional_t<I == 0, part<1, G, Y>,
                                    view_node<ops::slice_view<3, I == 1 ? 0 : e, I == 1 ? e : e + ev>, part<2, G, Y>>>;
  };
  template <std::size_t I, class G, class Y, class Ctx>
  using vjp = typename pick<I, G, Y>::type;
};
}  // namespace autodiff

}  // namespace fusebox
