// autodiff/remat.hpp: the activation memory budget on a joint forward+backward graph, and its
// memory report.
//
//   auto step = fb::compile<fb::options{.activation_memory_budget = 0.5f}>(fb::value_and_grad(loss, fb::wrt<1, 2>));
//   auto [l, g] = step(x, w, b);
//   std::cout << step.memory_summary(x, w, b);   // saved bytes, arena, workspace, what is recomputed
//
// How: the planner plans the joint graph as it is (budget 1) and plan/recompute.hpp chooses the
// forward values to compute again; then the gradients' types are rewritten so that every
// backward read of a chosen value X reads `sym::recomputed<X'>` instead: X's op over X's operands
// (themselves rewritten: a chosen operand is recomputed too, the others are the forward's own
// values), a type of its own, so the lowering gives it a node of its own, which the planner fuses
// into its backward consumers only (node_desc::recompute). The forward is untouched; the rewritten
// graph is planned again like any model, on every backend that takes the joint graph (the CPU
// executor, the CUDA target of the run-time path). Budget 1 is the plain joint graph, unchanged.
// Rewritten graphs compute the same ops on the same values, so gradients equal budget 1's (bit
// for bit where the same kernels compute them).
// Depends on: autodiff/{sym,dag}.hpp, plan/recompute.hpp, backend/cpu/report.hpp (cpu::program, human_bytes).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusebox/autodiff/dag.hpp"
#include "fusebox/autodiff/sym.hpp"
#include "fusebox/backend/cpu/report.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/plan/recompute.hpp"

namespace fusebox {

/// Where the memory of one compiled gradient call goes (static shapes: every figure is a constant
/// of the program). Print it with table().
struct memory_report {
  float budget = 1;                   ///< options::activation_memory_budget
  std::size_t saved_bytes = 0;        ///< forward values the backward reads from memory, at this budget
  std::size_t saved_bytes_full = 0;   ///< the same at budget 1
  int saved_values = 0, saved_values_full = 0;
  std::size_t arena_bytes = 0;        ///< intermediates of forward + backward (saved values included)
  std::size_t arena_bytes_full = 0;   ///< the same at budget 1
  std::size_t forward_arena_bytes = 0;  ///< intermediates of the forward alone
  std::size_t workspace_bytes = 0;    ///< row scratch and GEMM packing for the call's threads
  std::size_t output_bytes = 0;       ///< the loss and the gradients
  std::size_t peak_bytes = 0;         ///< arena + workspace + outputs: the most one call holds beyond its arguments
  int kernels = 0, kernels_full = 0;
  std::vector<std::string> recomputed;  ///< forward nodes the backward computes again: "gelu_tanh [512, 1024] (node 17)"
  std::vector<std::string> saved;       ///< forward nodes the backward reads from memory, likewise
  std::string table() const;
};

inline std::string memory_report::table() const {
  using plan::detail::human_bytes;
  auto row = [](const char* what, const std::string& now, const std::string& full) {
    std::string s = std::string("  ") + what;
    s.resize(30, ' ');
    s += now;
    s.resize(46, ' ');
    return s + full + "\n";
  };
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", static_cast<double>(budget));
  std::string s = std::string("fusebox memory summary (activation_memory_budget ") + b + ")\n";
  s += row("", "this budget", "budget 1");
  s += row("saved activations", human_bytes(static_cast<double>(saved_bytes)) + " (" + std::to_string(saved_values) + ")",
           human_bytes(static_cast<double>(saved_bytes_full)) + " (" + std::to_string(saved_values_full) + ")");
  s += row("arena (fwd + bwd)", human_bytes(static_cast<double>(arena_bytes)), human_bytes(static_cast<double>(arena_bytes_full)));
  s += row("kernels", std::to_string(kernels), std::to_string(kernels_full));
  s += "  forward arena alone        " + human_bytes(static_cast<double>(forward_arena_bytes)) + "\n";
  s += "  workspace                  " + human_bytes(static_cast<double>(workspace_bytes)) + "\n";
  s += "  outputs (loss, gradients)  " + human_bytes(static_cast<double>(output_bytes)) + "\n";
  s += "  peak of a call             " + human_bytes(static_cast<double>(peak_bytes)) +
       " (arena + workspace + outputs, beyond the arguments)\n";
  s += "  recomputed in the backward (" + std::to_string(recomputed.size()) + "):";
  for (const auto& r : recomputed) s += "\n    " + r;
  s += recomputed.empty() ? " none\n" : "\n";
  s += "  saved for the backward (" + std::to_string(saved.size()) + "):";
  for (const auto& r : saved) s += "\n    " + r;
  s += saved.empty() ? " none\n" : "\n";
  return s;
}

namespace autodiff {

/// A valid budget: a number in [0, 1] (NaN is not).
constexpr bool valid_memory_budget(float b) { return b >= 0.0f && b <= 1.0f; }

/// The run-time check of options::activation_memory_budget (the template form is a build error).
inline void check_memory_budget(float b, const std::source_location& loc) {
  if (!valid_memory_budget(b))
    FUSEBOX_THROW(invalid_argument("fusebox::compile(grad(...)): options::activation_memory_budget is " + std::to_string(b) +
                                   "; it must be a number in [0, 1] (1: keep every value the backward reads, 0: recompute "
                                   "every elementwise and reduction value) (called at " + where(loc) + ")"));
  if (b != 1.0f)
    FUSEBOX_THROW(invalid_argument("fusebox::compile(grad(...)): options::activation_memory_budget " + std::to_string(b) +
                                   " given at run time; the budget decides the program's type (its graph is rewritten and "
                                   "planned at build time). Fix: give the options as a template argument, "
                                   "fb::compile<fb::options{.activation_memory_budget = " + std::to_string(b) +
                                   "f}>(vg) (called at " + where(loc) + ")"));
}

namespace sym {
/// E computed again in the backward: E's op, operands and facts, a type (so a node) of its own,
/// and a desc that tells the planner to fuse it into its consumers only.
template <class E>
struct recomputed : E {
  static constexpr node_desc desc = [] {
    node_desc d = E::desc;
    d.recompute = true;
    return d;
  }();
};
}  // namespace sym

namespace detail {

// ---- E's template with other operands ----
template <class E, class Kids>
struct rebuild;
// Templates over types whose operands are the last parameters: pointwise<Op, A...>,
// matmul<A, B>, view_node<V, A>, spatial<Op, A...>, gather<Op, A, Ids>, custom<Op, A...>.
template <template <class...> class Tpl, class... Ps, class... K>
struct rebuild<Tpl<Ps...>, meta::type_list<K...>> {
  template <std::size_t... I>
  static auto make(std::index_sequence<I...>) -> Tpl<meta::at_t<I, meta::type_list<Ps...>>..., K...>;
  using type = decltype(make(std::make_index_sequence<sizeof...(Ps) - sizeof...(K)>{}));
};
template <class Op, int Axis, bool Keep, class A, class K>
struct rebuild<sym::reduction<Op, Axis, Keep, A>, meta::type_list<K>> {
  using type = sym::reduction<Op, Axis, Keep, K>;
};
template <class Q, class K, class V, bool Causal, class Q2, class K2, class V2>
struct rebuild<sym::attention<Q, K, V, Causal>, meta::type_list<Q2, K2, V2>> {
  using type = sym::attention<Q2, K2, V2, Causal>;
};
template <int Part, bool Causal, class... A, class... K>
struct rebuild<sym::attention_backward<Part, Causal, A...>, meta::type_list<K...>> {
  using type = sym::attention_backward<Part, Causal, K...>;
};
template <std::size_t Axis, std::size_t Begin, std::size_t Total, class... G, class... K>
struct rebuild<sym::pad<Axis, Begin, Total, G...>, meta::type_list<K...>> {
  using type = sym::pad<Axis, Begin, Total, K...>;
};

// ---- the rewrite ----
// Ctx: `forward` (the forward's node types), `joint` (the budget-1 joint graph's node types) and
// `recompute(i)` (is joint node i chosen).
template <class E, class Ctx>
struct remat;
template <class E, class Ctx>
using remat_t = typename remat<E, Ctx>::type;

template <class E, class Ctx, class Kids = typename E::children>
struct remat_children;
template <class E, class Ctx, class... C>
struct remat_children<E, Ctx, meta::type_list<C...>> {
  using kids = meta::type_list<remat_t<C, Ctx>...>;
  using type = typename std::conditional_t<std::is_same_v<kids, meta::type_list<C...>>, std::type_identity<E>,
                                           rebuild<E, kids>>::type;
};

// 0: kept as it is (a forward value, or a leaf); 1: operands rewritten (backward nodes, and
// forward views of a recomputed value); 2: recomputed.
template <class E, class Ctx>
constexpr int remat_action() {
  constexpr bool forward = index_in<E>(typename Ctx::forward{}) != npos;
  if constexpr (E::children::size == 0) return 0;
  else if constexpr (!forward) return 1;
  else if constexpr (Ctx::recompute(index_in<E>(typename Ctx::joint{}))) return 2;
  else return E::desc.kind == node_kind::view ? 1 : 0;
}
template <class E, class Ctx, int Action = remat_action<E, Ctx>()>
struct remat_by {
  using type = E;
};
template <class E, class Ctx>
struct remat_by<E, Ctx, 1> {
  using type = typename remat_children<E, Ctx>::type;
};
template <class E, class Ctx>
struct remat_by<E, Ctx, 2> {
  using type = sym::recomputed<typename remat_children<E, Ctx>::type>;
};
template <class E, class Ctx>
struct remat {
  using type = typename remat_by<E, Ctx>::type;
};

/// forward[i]: joint node i is one of the forward's (by type).
template <class Joint, class Forward>
constexpr std::array<bool, Joint::N> forward_mask() {
  std::array<bool, Joint::N> m{};
  for (std::size_t i = 0; i < Joint::N; ++i)
    for (std::size_t j = 0; j < Forward::N; ++j)
      if (Joint::nodes[i].type == Forward::nodes[j].type) m[i] = true;
  return m;
}

}  // namespace detail

/// The joint program of (Root, Grads...) under activation memory budget Budget.
template <class T, float Budget, class Root, class... Grads>
struct budgeted {
  static_assert(valid_memory_budget(Budget),
                "fusebox::compile<options{.activation_memory_budget = b}>(grad(...)): b must be a number in [0, 1] "
                "(1: keep every value the backward reads, 0: recompute every elementwise and reduction value)");
  using full = cpu::program<T, Root, Grads...>;
  using forward = cpu::program<T, Root>;

  template <bool Rewrite, class = void>
  struct pick {
    using type = full;
  };
  template <class Void>
  struct pick<true, Void> {
    static constexpr auto choice = plan::choose_recompute(full::nodes, full::plan, detail::forward_mask<full, forward>(),
                                                          sizeof(T), static_cast<double>(Budget));
    struct ctx {
      using forward = typename budgeted::forward::graph::node_types;
      using joint = typename full::graph::node_types;
      static constexpr bool recompute(std::size_t i) { return choice.recompute[i]; }
    };
    using type = std::conditional_t<choice.count == 0, full, cpu::program<T, Root, detail::remat_t<Grads, ctx>...>>;
  };
  using program = typename pick<(Budget < 1.0f)>::type;

  template <class E>
  static constexpr std::size_t buffer_bytes() {
    return (shape_of_t<E>::size * sizeof(T) + storage_alignment - 1) / storage_alignment * storage_alignment;
  }

  /// The memory figures of one call with `threads` threads.
  static memory_report report(unsigned threads) {
    memory_report r;
    r.budget = Budget;
    auto fill = [&]<class P>(std::size_t& saved_bytes, int& saved_n, std::size_t& arena, int& kernels, bool names) {
      constexpr auto mask = detail::forward_mask<P, forward>();
      constexpr auto s = plan::saved_values(P::nodes, P::plan, mask, sizeof(T));
      saved_bytes = s.bytes;
      saved_n = s.count;
      arena = P::arena_bytes;
      kernels = P::plan.n_kernels;
      if (!names) return;
      auto label = [](std::size_t i) {
        return std::string(P::nodes[i].desc.name) + " " + to_string(P::nodes[i].desc.shape) + " (node " +
               std::to_string(i) + ")";
      };
      for (std::size_t i = 0; i < P::N; ++i) {
        if (P::nodes[i].desc.recompute) r.recomputed.push_back(label(i));
        if (s.saved[i]) r.saved.push_back(label(i));
      }
    };
    fill.template operator()<program>(r.saved_bytes, r.saved_values, r.arena_bytes, r.kernels, true);
    fill.template operator()<full>(r.saved_bytes_full, r.saved_values_full, r.arena_bytes_full, r.kernels_full, false);
    r.forward_arena_bytes = forward::arena_bytes;
    r.workspace_bytes = program::workspace_bytes(threads);
    r.output_bytes = (buffer_bytes<Root>() + ... + buffer_bytes<Grads>());
    r.peak_bytes = r.arena_bytes + r.workspace_bytes + r.output_bytes;
    return r;
  }
};

}  // namespace autodiff
}  // namespace fusebox
