// backend/cpu/evaluate.hpp: evaluating an expression now. This is what eager mode runs for every op (a
// one-node graph through the same executor), and what a graph break runs during capture (the
// part of the model before the break, as its own compiled segment).
// Also holds the per-thread settings of eager mode and the capture context of a compiled call.
// Depends on: backend/cpu/invoke.hpp, expr/node.hpp.
#pragma once

#include <functional>
#include <source_location>
#include <string>
#include <thread>
#include <vector>

#include "fusebox/backend/cpu/invoke.hpp"
#include "fusebox/expr/node.hpp"

namespace fusebox {

namespace detail {
inline unsigned& default_threads_ref() {
  static unsigned n = std::max(1u, std::thread::hardware_concurrency());
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

/// Runs expression e now and returns its value as a new tensor. Inputs of a compiled call are read
/// through their bound views (graph breaks); eager operands are tensor leaves.
template <class E>
auto evaluate(const E& e, cpu::runtime& rt) {
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
  tensor<T, shape_of_t<E>> out(d);
  auto outs = std::tie(out);
  cpu::bind_and_run<P>(f, outs, rt);
  return out;
}

}  // namespace fusebox
