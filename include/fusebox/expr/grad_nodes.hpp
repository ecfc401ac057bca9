// expr/grad_nodes.hpp: node types that only derivative rules build (autodiff/rule.hpp): attention's
// backward and the zero padding that is a slice's gradient. A model never names them.
//
//   attention_backward_node<3, C, Q, K, V, O, G>  dq, dk, dv    [B, T, 3, H, E]    (Tq == Tk, E == Ev)
//   attention_backward_node<1, C, Q, K, V, O, G>  dq            [B, Tq, H, E]      (otherwise)
//   attention_backward_node<2, C, Q, K, V, O, G>  dk | dv       [B, Tk, H, E + Ev] (otherwise)
//     of o = attention(q, k, v[, causal]) (O is the forward node, G the gradient at o); the rule
//     reads each gradient as a slice (views). Part 3's layout is a packed projection's: a token's
//     row holds its q, k and v gradients head after head, so the gradient of GPT-2's [B*T, 3C]
//     c_attn output is this buffer's memory (ops/attention.hpp). All are node_kind::attention (the
//     planner's attention family: operands and result in memory, one kernel), told apart by
//     desc.variant; the kernels recompute the softmax (backend/cpu/attention.hpp). Part 3 computes all
//     three gradients in one pass over the (query, key) pairs of a (batch, head), so every product
//     is computed once; when a query row and a key row are not the same rows (Tq != Tk) the
//     gradients are two kernels (each recomputing what it needs), so no task writes another's rows.
//   pad_node<Axis, Begin, Total, G...>            the operands side by side along dimension Axis
//     (a concatenation), from Begin on, in a zero tensor whose extent there is Total
//     (node_kind::pad, kernel backend/cpu/attention.hpp's pad()). One operand: a slice's gradient; the
//     reverse pass joins the pads of adjacent slices (q | k | v of one projection) into one.
// Depends on: expr/node.hpp.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <tuple>

#include "fusebox/expr/node.hpp"

namespace fusebox {

namespace detail {
constexpr dims attention_backward_shape(int part, const dims& q, const dims& k, const dims& v) {
  if (part == 1) return q;
  if (part == 2) return dims{4, {k.extent[0], k.extent[1], k.extent[2], k.extent[3] + v.extent[3]}};
  return dims{5, {q.extent[0], q.extent[1], 3, q.extent[2], q.extent[3]}};
}
}  // namespace detail

template <int Part, bool Causal, class Q, class K, class V, class O, class G>
struct attention_backward_node : expr_base {
  static_assert(Part >= 1 && Part <= 3, "fusebox internal: attention_backward part is 1 (dq), 2 (dk|dv) or 3 (all)");
  static_assert(Part != 3 || (Q::desc.shape.extent[1] == K::desc.shape.extent[1] &&
                              Q::desc.shape.extent[3] == V::desc.shape.extent[3]),
                "fusebox internal: attention_backward part 3 needs as many queries as keys and E == Ev");
  static_assert(O::desc.shape == G::desc.shape, "fusebox internal: attention_backward: gradient and output differ in shape");
  using value_type = typename Q::value_type;
  using children = meta::type_list<Q, K, V, O, G>;
  static constexpr bool causal = Causal;
  static constexpr std::size_t keys = K::desc.shape.extent[1], head = Q::desc.shape.extent[3];
  static constexpr node_desc desc = [] {
    node_desc d{node_kind::attention,
                Part == 1 ? "attention_backward_dq" : Part == 2 ? "attention_backward_dkv" : "attention_backward",
                detail::attention_backward_shape(Part, Q::desc.shape, K::desc.shape, V::desc.shape), -1,
                false, keys == dyn || head == dyn ? 0 : static_cast<int>(10 * keys * head)};
    d.variant = Part;
    d.causal = Causal;
    return d;
  }();
  static constexpr bool has_payload =
      Q::has_payload || K::has_payload || V::has_payload || O::has_payload || G::has_payload;
  static constexpr bool symbolic = Q::symbolic || K::symbolic || V::symbolic || O::symbolic || G::symbolic;
  static constexpr bool fullgraph = Q::fullgraph || K::fullgraph || V::fullgraph || O::fullgraph || G::fullgraph;
  Q q;
  K k;
  V v;
  O o;
  G g;

  template <std::size_t I>
  const auto& child() const {
    if constexpr (I == 0) return q;
    else if constexpr (I == 1) return k;
    else if constexpr (I == 2) return v;
    else if constexpr (I == 3) return o;
    else return g;
  }
};

namespace detail {
template <std::size_t Axis, std::size_t Total>
constexpr dims padded_shape(dims d) {
  d.extent[Axis] = Total;
  return d;
}
/// Do the operands fit side by side from Begin (same rank and extents but along Axis, static
/// along Axis; another dimension may be dyn: the run-time path checks it, ir/specialize.hpp)?
template <std::size_t Axis, std::size_t Begin, std::size_t Total, class G0, class... G>
constexpr bool pad_fits() {
  const dims d0 = G0::desc.shape;
  if (Axis >= d0.rank || !is_known_extent(Total)) return false;
  std::size_t end = Begin;
  bool ok = true;
  const dims all[] = {G0::desc.shape, G::desc.shape...};  // a named array: nvcc's host pass mangles a braced range
  for (const dims& d : all) {
    if (d.rank != d0.rank || !is_known_extent(d.extent[Axis])) return false;
    for (std::size_t k = 0; k < d.rank; ++k) ok = ok && (k == Axis || d.extent[k] == d0.extent[k]);
    end += d.extent[Axis];
  }
  return ok && end <= Total;
}
}  // namespace detail

template <std::size_t Axis, std::size_t Begin, std::size_t Total, class... G>
struct pad_node : expr_base {
  static_assert(sizeof...(G) >= 1 && detail::pad_fits<Axis, Begin, Total, G...>(),
                "fusebox internal: pad<Axis, Begin, Total>(g...): the operands do not fit side by side");
  using value_type = typename meta::at_t<0, meta::type_list<G...>>::value_type;
  using children = meta::type_list<G...>;
  /// Where the operands end along Axis.
  static constexpr std::size_t end = Begin + (std::size_t{0} + ... + G::desc.shape.extent[Axis]);
  static constexpr node_desc desc{node_kind::pad,
                                  "pad",
                                  detail::padded_shape<Axis, Total>(meta::at_t<0, meta::type_list<G...>>::desc.shape),
                                  static_cast<int>(Axis),
                                  false,
                                  0,
                                  0,
                                  -1,
                                  -1,
                                  "",
                                  {},
                                  Begin};
  static constexpr bool has_payload = (G::has_payload || ...), symbolic = (G::symbolic || ...),
                        fullgraph = (G::fullgraph || ...);
  std::tuple<G...> args;

  template <std::size_t I>
  const auto& child() const { return std::get<I>(args); }
};

}  // namespace fusebox
