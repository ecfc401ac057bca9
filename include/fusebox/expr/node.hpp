// expr/node.hpp: expression nodes, the types a model is captured as.
//
// An expression node only holds its operands and names its op (Eigen's TensorExpr rule); what it
// means to compute one lives in the op struct (ops/), how the graph is cut into kernels in plan/,
// and how loops run in backend/cpu/. Every node type exposes the same static facts, combined bottom-up
// from its children: `desc` (kind, name, static shape, axis...), `value_type`, `has_payload`
// (holds a run-time value: a scalar, a tensor pointer, a user function), `symbolic` (reaches an
// input of a compiled function) and `fullgraph` (captured under fullgraph: graph breaks are build
// errors).
//
// Cases: input leaves (argument I of a compiled call), tensor leaves (a concrete tensor: eager
// operands, weights a model closes over), scalar leaves, pointwise<Op, Args...> (any arity, NumPy
// broadcasting), reduction<Op, Axis, Keepdim, Arg>, matmul_node<A, B>, view_node<View, Arg>
// (strides only) and opaque_node<Fn, Arg, Out> (a user function: a graph break). Windowed NCHW
// ops (conv2d, pooling, their gradients) are spatial_node<Op, Args...> in expr/spatial.hpp; ops that
// bring their own kernels (cumsum) are custom_node<Op, Args...> in expr/custom.hpp.
// Depends on: core/, meta/type_list.hpp, expr/static_checks.hpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

#include "fusebox/core/shape.hpp"
#include "fusebox/core/tensor.hpp"
#include "fusebox/expr/static_checks.hpp"
#include "fusebox/expr/window.hpp"
#include "fusebox/meta/type_list.hpp"

namespace fusebox {

enum class node_kind : std::uint8_t { input, tensor, scalar, pointwise, reduce, matmul, view, opaque, attention, spatial, pad,
                                      gather, custom };

struct custom_kernels;  // expr/custom.hpp: a custom op's shape rule and kernels

// What each kind means to the stages below capture (fused or not, its kernel, its memory): one row
// per kind in ir/node_kinds.hpp.

/// What every stage needs to know about a node, as a constexpr value.
struct node_desc {
  node_kind kind = node_kind::pointwise;
  const char* name = "";
  dims shape{};
  int axis = -1;                ///< reductions: the reduced dimension (normalised, >= 0); slice views and pad:
                                ///< the sliced or padded dimension (-1 for other views)
  bool keepdim = false;         ///< reductions
  int flops = 0;                ///< per output element, for reports and fusion heuristics
  std::size_t input_index = 0;  ///< input leaves: which argument
  int view_a = -1, view_b = -1; ///< views: the two swapped dimensions of a transpose; -1 for reshape
  const char* device = "";      ///< pointwise and reduce: the op's CUDA spelling (ops/), "" if it has none
  window win{};                 ///< spatial nodes (conv2d, pooling): op, window, stride, padding (expr/window.hpp)
  std::size_t view_start = 0;   ///< slice views: the first element kept along `axis`; pad: where the operand
                                ///< starts; flatten: the first dimension merged
  int variant = 0;              ///< attention: 0 the forward; its gradient kernels: 1 dq, 2 dk|dv, 3 dq|dk|dv (expr/grad_nodes.hpp);
                                ///< gather: 0 embedding, 1 its scatter-add gradient (expr/gather.hpp)
  bool causal = false;          ///< attention and its gradient kernels: the causal mask
  std::size_t vocab = 0;        ///< gather variant 1 (embedding_backward): the weight's rows V
  bool recompute = false;       ///< a forward value the backward computes again (activation memory budget,
                                ///< autodiff/remat.hpp): the planner fuses it into its consumers, never its producers
  const custom_kernels* custom = nullptr;  ///< custom nodes: the op's shape rule and kernels (expr/custom.hpp)
};

/// An op's CUDA spelling (its `device` member), or "" for an op without one (the CUDA code
/// generator then refuses the kernel by the op's name).
template <class Op>
constexpr const char* device_spelling() {
  if constexpr (requires { Op::device; }) return Op::device;
  else return "";
}

/// Base of all expression types, so operators can be constrained to them.
struct expr_base {};

template <class E>
inline constexpr bool is_expr_v = std::is_base_of_v<expr_base, std::remove_cvref_t<E>>;

// ---------------------------------------------------------------------------------------------
// Leaves

/// Argument I of a compiled call, seen symbolically.
template <std::size_t I, class T, class Shape, bool FullGraph = false>
struct input_leaf : expr_base {
  using value_type = T;
  using children = meta::type_list<>;
  static constexpr node_desc desc{node_kind::input, "input", dims_of(Shape{}), -1, false, 0, I};
  static constexpr bool has_payload = false, symbolic = true, fullgraph = FullGraph;
  /// The tensor bound to the argument in this call; read only when a graph break evaluates part of
  /// the model during capture (every occurrence of input I holds the same view, so merging is safe).
  strided<const T> bound{};
};

/// A concrete tensor inside an expression (eager operands; weights a model closes over).
template <class T, class Shape>
struct tensor_leaf : expr_base {
  using value_type = T;
  using children = meta::type_list<>;
  static constexpr node_desc desc{node_kind::tensor, "tensor", dims_of(Shape{})};
  static constexpr bool has_payload = true, symbolic = false, fullgraph = false;
  strided<const T> view;
};

/// A run-time scalar operand (rank 0, broadcasts anywhere).
template <class T>
struct scalar_leaf : expr_base {
  using value_type = T;
  using children = meta::type_list<>;
  static constexpr node_desc desc{node_kind::scalar, "scalar", dims{}};
  static constexpr bool has_payload = true, symbolic = false, fullgraph = false;
  T value;
};

// ---------------------------------------------------------------------------------------------
// Interior nodes

namespace detail {
/// The static shape of expression E as a shape<> type (for error messages and result types).
template <class E>
struct shape_holder {
  static constexpr dims value = E::desc.shape;
};
template <class E>
using shape_type_of = shape_from_dims_t<shape_holder<E>>;

template <class Op, class... Args>
constexpr dims pointwise_shape() {
  dims out{};
  bool ok = true;
  ((ok = ok && broadcast(out, Args::desc.shape).ok, out = broadcast(out, Args::desc.shape).out), ...);
  return out;
}
template <class Op, class A, class... Rest>
constexpr bool check_pointwise() {
  // Pairwise against the running result, so the error names the two shapes that clash.
  dims acc = A::desc.shape;
  bool ok = true;
  (([&] {
     const auto r = broadcast(acc, Rest::desc.shape);
     ok = ok && r.ok;
     acc = r.out;
   }()),
   ...);
  return ok;
}
template <class Op, class A, class B>
struct check_pair {
  static constexpr bool ok = broadcast(A::desc.shape, B::desc.shape).ok;
  static constexpr bool value =
      static_check::cannot_broadcast<Op, shape_type_of<A>, shape_type_of<B>, ok>::value &&
      static_check::mixed_element_types<typename A::value_type, typename B::value_type,
                                        std::is_same_v<typename A::value_type, typename B::value_type>>::value;
};
}  // namespace detail

/// Op applied elementwise to its operands, broadcast NumPy-style.
template <class Op, class... Args>
struct pointwise : expr_base {
  static_assert(sizeof...(Args) >= 1 && sizeof...(Args) <= 3, "fusebox: pointwise ops take 1 to 3 operands");
  using value_type = typename meta::at_t<0, meta::type_list<Args...>>::value_type;
  using children = meta::type_list<Args...>;
  using op = Op;
  static constexpr node_desc desc{node_kind::pointwise, Op::name, detail::pointwise_shape<Op, Args...>(), -1, false,
                                  Op::flops, 0, -1, -1, device_spelling<Op>()};
  static constexpr bool has_payload = (Args::has_payload || ...);
  static constexpr bool symbolic = (Args::symbolic || ...);
  static constexpr bool fullgraph = (Args::fullgraph || ...);
  std::tuple<Args...> args;

  template <std::size_t I>
  const auto& child() const { return std::get<I>(args); }
};

namespace detail {
constexpr dims reduced_shape(dims in, int axis, bool keepdim) {
  const auto a = static_cast<std::size_t>(axis);
  if (keepdim) {
    in.extent[a] = 1;
    return in;
  }
  for (std::size_t d = a; d + 1 < in.rank; ++d) in.extent[d] = in.extent[d + 1];
  in.extent[--in.rank] = 0;
  return in;
}
}  // namespace detail

/// Reduction of one axis (normalised, >= 0) with Op's combine.
template <class Op, int Axis, bool Keepdim, class Arg>
struct reduction : expr_base {
  static_assert(Axis >= 0 && static_cast<std::size_t>(Axis) < Arg::desc.shape.rank, "fusebox: reduction axis out of range");
  using value_type = typename Arg::value_type;
  using children = meta::type_list<Arg>;
  using op = Op;
  static constexpr node_desc desc{node_kind::reduce, Op::name, detail::reduced_shape(Arg::desc.shape, Axis, Keepdim),
                                  Axis, Keepdim, Op::flops, 0, -1, -1, device_spelling<Op>()};
  static constexpr bool has_payload = Arg::has_payload, symbolic = Arg::symbolic, fullgraph = Arg::fullgraph;
  Arg arg;

  template <std::size_t>
  const auto& child() const { return arg; }
};

namespace detail {
/// Shape rule of matmul: [M, K] x [K, N], or batched [B, M, K] x [B or 1, K, N] (either side rank 2).
struct matmul_shape_result {
  dims out{};
  bool rank_ok = true, inner_ok = true;
};
constexpr matmul_shape_result matmul_shape(const dims& a, const dims& b) {
  matmul_shape_result r;
  if (a.rank < 2 || b.rank < 2 || a.rank > 3 || b.rank > 3) {
    r.rank_ok = false;
    return r;
  }
  // An extent that is not a number (dyn at capture, a symbol when specialising) meets anything, as
  // in broadcast(): capture may compare a bound argument's extent (7) with a computed operand's
  // dyn one, and the run-time path checks them again on the call's extents (ir/specialize.hpp).
  const std::size_t ka = a.back(0), kb = b.back(1);
  r.inner_ok = ka == kb || !is_known_extent(ka) || !is_known_extent(kb);
  const std::size_t ba = a.rank == 3 ? a.extent[0] : 1, bb = b.rank == 3 ? b.extent[0] : 1;
  if (ba != bb && ba != 1 && bb != 1 && is_known_extent(ba) && is_known_extent(bb)) r.rank_ok = false;
  // The batch is the side's that is not 1; of a number and an unknown, the number.
  const std::size_t batch = ba == 1 ? bb : bb == 1 ? ba : is_known_extent(ba) ? ba : bb;
  const bool batched = a.rank == 3 || b.rank == 3;
  r.out.rank = batched ? 3 : 2;
  std::size_t d = 0;
  if (batched) r.out.extent[d++] = batch;
  r.out.extent[d++] = a.back(1);
  r.out.extent[d++] = b.back(0);
  return r;
}
}  // namespace detail

/// Matrix product with matmul's shape rule (above); the planner gives it an elementwise epilogue.
template <class A, class B>
struct matmul_node : expr_base {
  static constexpr auto rule = detail::matmul_shape(A::desc.shape, B::desc.shape);
  static_assert(static_check::matmul_rank<detail::shape_type_of<A>, detail::shape_type_of<B>,
                                          rule.rank_ok>::value);
  static_assert(static_check::matmul_inner_mismatch<detail::shape_type_of<A>,
                                                    detail::shape_type_of<B>, rule.inner_ok>::value);
  static_assert(std::is_same_v<typename A::value_type, typename B::value_type>,
                "fusebox: matmul(a, b): a and b must hold the same element type");
  using value_type = typename A::value_type;
  using children = meta::type_list<A, B>;
  static constexpr std::size_t k_extent = A::desc.shape.back(0);
  static constexpr node_desc desc{node_kind::matmul, "matmul", rule.out, -1, false,
                                  k_extent == dyn ? 0 : static_cast<int>(2 * k_extent)};
  static constexpr bool has_payload = A::has_payload || B::has_payload;
  static constexpr bool symbolic = A::symbolic || B::symbolic;
  static constexpr bool fullgraph = A::fullgraph || B::fullgraph;
  A a;
  B b;

  template <std::size_t I>
  const auto& child() const {
    if constexpr (I == 0) return a;
    else return b;
  }
};

namespace detail {
struct attention_shape_result {
  dims out{};
  bool rank_ok = true;     // q, k, v all rank 4: [batch, tokens, heads, head dim]
  bool extents_ok = true;  // batch and heads equal, k and v the same tokens, q and k the same head dim
  bool causal_ok = true;   // causal: as many queries as keys
};
constexpr bool same_extent(std::size_t a, std::size_t b) { return a == b || !is_known_extent(a) || !is_known_extent(b); }
constexpr attention_shape_result attention_shape(const dims& q, const dims& k, const dims& v, bool causal) {
  attention_shape_result r;
  if (q.rank != 4 || k.rank != 4 || v.rank != 4) {
    r.rank_ok = false;
    return r;
  }
  r.extents_ok = same_extent(q.extent[0], k.extent[0]) && same_extent(q.extent[0], v.extent[0]) &&
                 same_extent(q.extent[2], k.extent[2]) && same_extent(q.extent[2], v.extent[2]) &&
                 same_extent(k.extent[1], v.extent[1]) && same_extent(q.extent[3], k.extent[3]);
  r.causal_ok = !causal || same_extent(q.extent[1], k.extent[1]);
  r.out = dims{4, {q.extent[0], q.extent[1], q.extent[2], v.extent[3]}};
  return r;
}
}  // namespace detail

/// Scaled dot-product attention over [batch, tokens, heads, head dim] operands (flash-attn's
/// layout: heads next to each other in a token's row, so a projection's output is q as it is, and
/// the result is the concatenated heads): softmax(q·kᵀ / sqrt(head dim), causal mask) · v per
/// batch and head, in one kernel (the scores are never stored). Causal is part of the type.
template <class Q, class K, class V, bool Causal>
struct attention_node : expr_base {
  static constexpr auto rule = detail::attention_shape(Q::desc.shape, K::desc.shape, V::desc.shape, Causal);
  static_assert(static_check::attention_shapes<detail::shape_type_of<Q>, detail::shape_type_of<K>,
                                               detail::shape_type_of<V>, rule.rank_ok && rule.extents_ok>::value);
  static_assert(static_check::attention_causal<detail::shape_type_of<Q>, detail::shape_type_of<K>, rule.causal_ok>::value);
  static_assert(std::is_same_v<typename Q::value_type, typename K::value_type> &&
                    std::is_same_v<typename Q::value_type, typename V::value_type>,
                "fusebox: attention(q, k, v): q, k and v must hold the same element type");
  using value_type = typename Q::value_type;
  using children = meta::type_list<Q, K, V>;
  static constexpr bool causal = Causal;
  static constexpr std::size_t keys = K::desc.shape.rank == 4 ? K::desc.shape.extent[1] : 0;
  static constexpr std::size_t head = Q::desc.shape.rank == 4 ? Q::desc.shape.extent[3] : 0;
  static constexpr node_desc desc = [] {
    node_desc d{node_kind::attention, "attention", rule.out, -1, false,
                keys == dyn || head == dyn ? 0 : static_cast<int>(4 * keys * head)};
    d.causal = Causal;
    return d;
  }();
  static constexpr bool has_payload = Q::has_payload || K::has_payload || V::has_payload;
  static constexpr bool symbolic = Q::symbolic || K::symbolic || V::symbolic;
  static constexpr bool fullgraph = Q::fullgraph || K::fullgraph || V::fullgraph;
  Q q;
  K k;
  V v;

  template <std::size_t I>
  const auto& child() const {
    if constexpr (I == 0) return q;
    else if constexpr (I == 1) return k;
    else return v;
  }
};

/// A change of strides only (transpose, reshape, static slice).
/// View must offer `static constexpr dims shape(dims)`, `static strided<T> apply(strided<T>)` and
/// the facts the run-time path rebuilds it from (`swapped_a/b`, `sliced_axis`, `slice_start`).
template <class View, class Arg>
struct view_node : expr_base {
  using value_type = typename Arg::value_type;
  using children = meta::type_list<Arg>;
  using view = View;
  static constexpr node_desc desc{node_kind::view, View::name,     View::shape(Arg::desc.shape),
                                  View::sliced_axis, false,        0,
                                  0,                 View::swapped_a, View::swapped_b,
                                  "",                {},              View::slice_start};
  static constexpr bool has_payload = Arg::has_payload, symbolic = Arg::symbolic, fullgraph = Arg::fullgraph;
  Arg arg;

  template <std::size_t>
  const auto& child() const { return arg; }
};

/// A number per capture of a user function, shared by the copies of that capture: composites
/// copy their operand (softmax four times) and the user may read one result twice, and those
/// copies are one call of the function; two opaque() calls are two, even on equal arguments
/// (the function may count, log or draw random numbers). Value numbering (ir/value_numbers.hpp)
/// compares these, since functions cannot be compared.
inline std::uint64_t next_capture_id() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

/// What every opaque node has whatever its function: the capture it comes from. A non-template
/// base, so code that knows only that a payload is an opaque node can read it.
struct opaque_base : expr_base {
  std::uint64_t capture_id = next_capture_id();
};

/// A user function run on a concrete tensor: a graph break inside a compiled model.
/// Out is the tensor type Fn returns.
template <class Fn, class Arg, class Out>
struct opaque_node : opaque_base {
  using value_type = typename Out::value_type;
  using children = meta::type_list<Arg>;
  using result_type = Out;
  static constexpr node_desc desc{node_kind::opaque, "opaque", dims_of(typename Out::shape_type{})};
  static constexpr bool has_payload = true, symbolic = Arg::symbolic, fullgraph = Arg::fullgraph;
  Fn fn;
  Arg arg;
  std::source_location loc;

  template <std::size_t>
  const auto& child() const { return arg; }
};

/// Applies f to each child of node e, in order.
template <class E, class F>
constexpr void for_each_child(const E& e, F&& f) {
  constexpr std::size_t n = E::children::size;
  // The guard is for nvcc's front end, which looks up child<I> even for an empty pack.
  if constexpr (n > 0)
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f(e.template child<I>()), ...); }(std::make_index_sequence<n>{});
}

/// Static shape of an expression as a shape<> type.
template <class E>
using shape_of_t = detail::shape_type_of<std::remove_cvref_t<E>>;

}  // namespace fusebox
