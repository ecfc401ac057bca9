// expr/gather.hpp: the node type of row gathers (embedding) and their scatter-add gradient, and
// their shape rule.
//
// One node type for the family, `gather_node<Op, W, Ids>` (like spatial_node<Op, Args...>): Op is
// a small struct in ops/embedding.hpp with a `name` and a `variant`; every stage that does not
// know op types (the planner, the run-time path, autodiff's storage-free types) handles the family
// once, by `node_kind::gather` and `desc.variant`.
//
//   variant 0  embedding           (w [V, D], ids [...])    -> [..., D]   out[i, :] = w[ids[i], :]
//   variant 1  embedding_backward  (g [..., D], ids [...])  -> [V, D]     dw[v, :] = sum of g[i, :] over ids[i] == v
//                                                                         (V is desc.vocab)  
// Ids are carried in the weight's element type (float or double tensors holding exact integers;
// see docs/architecture.md, "Embedding"): the IR has one element type per program.
// A `dyn` extent is carried through and checked when it is known.
// Depends on: expr/node.hpp.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include "fusebox/expr/node.hpp"

namespace fusebox {

namespace detail {
struct gather_shape_result {
  dims out{};
  bool ok = true;
};
/// variant 0: a = w [V, D], b = ids; variant 1: a = g [ids..., D], b = ids, rows = V.
constexpr gather_shape_result gather_shape(int variant, std::size_t rows, const dims& a, const dims& b) {
  gather_shape_result r;
  if (variant == 0) {
    if (a.rank != 2 || b.rank + 1 > max_rank) {
      r.ok = false;
      return r;
    }
    r.out = b;
    r.out.extent[r.out.rank++] = a.extent[1];
    return r;
  }
  if (a.rank != b.rank + 1) {
    r.ok = false;
    return r;
  }
  for (std::size_t d = 0; d < b.rank; ++d) r.ok = r.ok && same_extent(a.extent[d], b.extent[d]);
  r.out = dims{2, {rows, a.extent[a.rank - 1]}};
  return r;
}

inline std::string gather_error_text(int variant, const dims& a, const dims& b) {
  if (variant == 0)
    return "embedding(weight, ids): weight is " + to_string(a) + ", ids is " + to_string(b) +
           "; need weight [num_embeddings, embedding_dim] (rank 2) and ids of rank at most " +
           std::to_string(max_rank - 1);
  return "embedding_backward(g, ids): g is " + to_string(a) + ", ids is " + to_string(b) +
         "; g must be ids' shape plus the embedding dimension";
}
}  // namespace detail

namespace static_check {
template <class WeightShape, class IdsShape, bool Ok>
struct embedding_shapes {
  static_assert(Ok, "fusebox: embedding(weight, ids): weight must be [num_embeddings, embedding_dim] (rank 2) and "
                    "ids of rank at most max_rank - 1; the two shapes are the template arguments above");
  static constexpr bool value = Ok;
};
}  // namespace static_check

/// A row gather or its scatter-add gradient (see the header comment).
template <class Op, class A, class Ids>
struct gather_node : expr_base {
  static constexpr auto rule = detail::gather_shape(Op::variant, Op::rows, A::desc.shape, Ids::desc.shape);
  static_assert(static_check::embedding_shapes<detail::shape_type_of<A>, detail::shape_type_of<Ids>, rule.ok>::value);
  static_assert(std::is_same_v<typename A::value_type, typename Ids::value_type>,
                "fusebox: embedding(weight, ids): ids are carried in the weight's element type (a float or double "
                "tensor holding exact integers); convert them to that type");
  using value_type = typename A::value_type;
  using children = meta::type_list<A, Ids>;
  using op = Op;
  static constexpr node_desc desc = [] {
    node_desc d{node_kind::gather, Op::name, rule.out, -1, false, Op::variant == 0 ? 0 : 1};
    d.vocab = Op::rows;
    d.variant = Op::variant;
    return d;
  }();
  static constexpr bool has_payload = A::has_payload || Ids::has_payload;
  static constexpr bool symbolic = A::symbolic || Ids::symbolic;
  static constexpr bool fullgraph = A::fullgraph || Ids::fullgraph;
  A a;
  Ids ids;

  template <std::size_t I>
  const auto& child() const {
    if constexpr (I == 0) return a;
    else return ids;
  }
};

}  // namespace fusebox
