// backend/cpu/evaluate.hpp: evaluating an expression now. This is what eager mode runs for every op (a
// one-node graph through the same executor), and what a graph break runs during capture (the
// part of the model before the break, as its own compiled segment).
// Elementwise ops and reductions of tensors (eager mode's common case) run shape-generic kernels
// instead (backend/cpu/eager_kernels.hpp): one instantiation per op and element type, not per
// op and shape, which is what eager mode costs a program's build (issue 22).
// Also holds the per-thread settings of eager mode and the capture context of a compiled call.
// Depends on: backend/cpu/invoke.hpp, backend/cpu/eager_kernels.hpp, expr/node.hpp, ops/fast_math.hpp.
#pragma once

#include <functional>
#include <source_location>
#include <string>
#include <vector>

#include "fusebox/backend/cpu/eager_kernels.hpp"
#include "fusebox/backend/cpu/invoke.hpp"
#include "fusebox/expr/node.hpp"
#include "fusebox/ops/fast_math.hpp"

namespace fusebox {

namespace detail {
inline unsigned& default_threads_ref() {
  static unsigned n = cpu::hardware_threads();
  return n;
}
}  // namespace detail

/// Threads used by eager ops and by compile() when options.threads is 0.
inline unsigned default_threads() { return detail::default_threads_ref(); }
inline void set_default_threads(unsigned n) { detail::default_threads_ref() = n ? n : 1; }

namespace detail {

/// A graph break seen while capturing a compiled call, for explain() and fullgraph.
struct break_record {
  std::string what;
  std::source_location loc;
  std::function<std::string()> segment_report;  // the plan of the segment evaluated at the break
};

/// Set by a compiled call while the model runs on symbolic inputs.
struct capture_context {
  bool fullgraph = false;
  std::vector<break_record>* breaks = nullptr;  // non-null when explain() records
  cpu::runtime* rt = nullptr;
  bool device = false;  // the call's tensors are device memory: a front end must not read their values
};
inline capture_context*& current_capture() {
  thread_local capture_context* c = nullptr;
  return c;
}

/// The eager runtime of this thread (its buffers grow once, then are reused).
inline cpu::runtime& eager_runtime() {
  thread_local cpu::runtime rt;
  rt.pool = &cpu::shared_pool(default_threads());
  return rt;
}

/// Fills `table[I]` with the bound view of every input leaf I reachable from e.
template <class E, class T>
void collect_bound_inputs(const E& e, strided<const T>* table) {
  if constexpr (E::desc.kind == node_kind::input) table[E::desc.input_index] = e.bound;
  else for_each_child(e, [&](const auto& c) { collect_bound_inputs(c, table); });
}

template <class E>
constexpr std::size_t max_input_index() {
  std::size_t m = 0;
  for (const auto& n : ir::graph<E>::nodes)
    if (n.desc.kind == node_kind::input && n.desc.input_index + 1 > m) m = n.desc.input_index + 1;
  return m;
}

/// A tuple-like view of bound inputs, so bind_inputs can read `std::get<I>(args).view()`.
template <class T, std::size_t M>
struct bound_inputs {
  std::array<strided<const T>, M> views;
  struct item {
    strided<const T> v;
    strided<const T> view() const { return v; }
  };
};
}  // namespace detail

}  // namespace fusebox

template <class T, std::size_t M>
struct std::tuple_size<fusebox::detail::bound_inputs<T, M>> : std::integral_constant<std::size_t, M> {};

namespace fusebox::detail {
template <std::size_t I, class T, std::size_t M>
typename bound_inputs<T, M>::item get(const bound_inputs<T, M>& b) {
  return {b.views[I]};
}
}  // namespace fusebox::detail

namespace fusebox {

namespace detail {
/// A tensor or a number operand of an eager op (not an input of a compiled call).
template <class C>
inline constexpr bool eager_operand_v = C::desc.kind == node_kind::tensor || C::desc.kind == node_kind::scalar;
template <class C>
strided<const typename C::value_type> eager_view(const C& c) {
  if constexpr (C::desc.kind == node_kind::tensor) return c.view;
  else return {&c.value, dims{}, {}};
}
template <class E, class = typename E::children>
struct shape_generic;
template <class E, class... C>
struct shape_generic<E, meta::type_list<C...>> {
  using T = typename E::value_type;
  static constexpr bool value = std::is_floating_point_v<T> && (eager_operand_v<C> && ...) &&
                                (E::desc.kind == node_kind::pointwise ||
                                 ((E::desc.kind == node_kind::reduce || E::desc.kind == node_kind::matmul) &&
                                  ((C::desc.kind == node_kind::tensor) && ...)));
};
/// Whether evaluate() runs e by a shape-generic eager kernel (backend/cpu/eager_kernels.hpp):
/// elementwise ops, reductions and matmuls whose operands are tensors (or numbers).
template <class E>
inline constexpr bool shape_generic_v = shape_generic<E>::value;

/// e (an elementwise op, a reduction or a matmul of eager operands) by its shape-generic kernel.
template <class E>
auto evaluate_shape_generic(const E& e, cpu::runtime& rt) {
  using T = typename E::value_type;
  profile::scoped_span span(E::desc.name, "kernel", E::desc.kind == node_kind::matmul ? "matmul" : "rows");
  if constexpr (E::desc.kind == node_kind::pointwise) {
    using Op = ops::math_op_t<false, typename E::op>;
    const auto in = std::apply([](const auto&... c) { return std::array{eager_view(c)...}; }, e.args);
    dims d = E::desc.shape;
    if constexpr (!E::desc.shape.is_static()) {
      d = in[0].shape;
      for (const auto& v : in) d = broadcast(d, v.shape).out;
    }
    tensor<T, shape_of_t<E>> out(d, detail::internal_site);
    cpu::eager::pointwise<Op>(in, out.view(), *rt.pool);
    return out;
  } else if constexpr (E::desc.kind == node_kind::matmul) {
    dims d = E::desc.shape;
    if constexpr (!E::desc.shape.is_static()) d = matmul_shape(e.a.view.shape, e.b.view.shape).out;
    tensor<T, shape_of_t<E>> out(d, detail::internal_site);
    cpu::eager::matmul<T>(e.a.view, e.b.view, out.view(), rt.workspace, *rt.pool);
    return out;
  } else {
    using Op = ops::math_op_t<false, typename E::op>;
    const strided<const T> in = e.arg.view;
    dims d = in.shape;
    if (E::desc.keepdim) d[E::desc.axis] = 1;
    else {
      for (std::size_t k = static_cast<std::size_t>(E::desc.axis); k + 1 < d.rank; ++k) d[k] = d[k + 1];
      --d.rank;
    }
    tensor<T, shape_of_t<E>> out(d, detail::internal_site);
    cpu::eager::reduce<Op>(in, static_cast<std::size_t>(E::desc.axis), out.view(), *rt.pool);
    return out;
  }
}
}  // namespace detail

template <class E>
auto evaluate_by_program(const E& e, cpu::runtime& rt);

/// Runs expression e now and returns its value as a new tensor. Inputs of a compiled call are read
/// through their bound views (graph breaks); eager operands are tensor leaves.
template <class E>
auto evaluate(const E& e, cpu::runtime& rt) {
  if constexpr (detail::shape_generic_v<E>) return detail::evaluate_shape_generic(e, rt);
  else return evaluate_by_program(e, rt);
}

/// e as a static program of its own (the one-node graph through the executor).
template <class E>
auto evaluate_by_program(const E& e, cpu::runtime& rt) {
  using T = typename E::value_type;
  using P = cpu::program<T, E>;
  static_assert(P::all_static || P::plan.n_kernels <= 1,
                "fusebox: evaluating a multi-kernel expression with dyn extents needs the run-time path");
  typename P::frame_t f;
  constexpr std::size_t M = detail::max_input_index<E>();
  detail::bound_inputs<T, (M > 0 ? M : 1)> inputs{};
  if constexpr (M > 0) detail::collect_bound_inputs(e, inputs.views.data());
  const auto roots = std::tie(e);
  using std::get;
  cpu::bind_inputs<P>(f, roots, inputs);
  const dims d = P::all_static ? E::desc.shape : f.loc[P::graph::outputs[0]].shape;
  tensor<T, shape_of_t<E>> out(d, detail::internal_site);
  auto outs = std::tie(out);
  cpu::bind_and_run<P>(f, outs, rt);
  return out;
}

}  // namespace fusebox
