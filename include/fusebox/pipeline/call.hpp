// pipeline/call.hpp: the one call pipeline, below capture, for every entry point (compile()'s
// functions, compiled gradients and the nn step, explain()) and every back end:
//   capture and bind     the entry point: the model on symbolic inputs, the frame's inputs bound
//   guard and select     static kernels from the build, or the run-time path's specialisation
//                        that accepts the call (guards, recompiles: pipeline/dynamic_function.hpp)
//   specialise, plan,    once per specialisation, inside select (pipeline/dynamic_function.hpp: the one
//   schedule, compile    planner, the schedule for the back end's caps, the back end's compiler)
//   shapes               the call's node shapes, computed once (kept per call signature in
//                        reduce_overhead and max_autotune)
//   outputs              allocated at those shapes; the entry point's last look (before_run)
//   run                  the back end (backend/backend.hpp: run_static or run_dynamic)
// `function_state` is what a compiled function keeps between calls.
// The run-time path (pipeline/dynamic_function.hpp) and the CUDA back end (backend/cuda.hpp) are
// named here through pipeline/targets.hpp only: a call instantiates them when its argument types
// need them, and a unit that makes such calls includes them (fusebox/jit.hpp, fusebox/cuda.hpp).
// Depends on: backend/{backend,cpu}.hpp, backend/cpu/evaluate.hpp (default_threads),
// pipeline/targets.hpp, runtime/{counters,guard}.hpp, options.hpp.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusebox/backend/backend.hpp"
#include "fusebox/backend/cpu.hpp"
#include "fusebox/backend/cpu/evaluate.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/meta/type_list.hpp"
#include "fusebox/options.hpp"
#include "fusebox/pipeline/targets.hpp"
#include "fusebox/runtime/counters.hpp"
#include "fusebox/runtime/guard.hpp"

namespace fusebox::pipeline {

/// compiled::cudagraph_sizes: record CUDA graphs only for calls whose argument `arg` has
/// dimension `dim` in `sizes`.
struct graph_size_rule {
  std::size_t arg, dim;
  std::vector<std::size_t> sizes;
};

/// What one compiled function keeps between calls: its options, hints and graph rules, each back
/// end's state, and the run-time path's state per expression type and back end.
class function_state {
 public:
  explicit function_state(options o) : opts(o) {
    if (opts.pool) caller_pool_ = std::make_shared<cpu::thread_pool>(*opts.pool);
    backend_state<backends::cpu_backend>().rt.pool =
        caller_pool_ ? caller_pool_.get() : &cpu::shared_pool(opts.threads ? opts.threads : default_threads());
  }

  options opts;
  std::vector<dim_hint> hints;
  std::vector<graph_size_rule> graph_sizes;

  /// Back end B's state: the CPU's is made with the function, another's at its first call (held
  /// type-erased, so this class needs no other back end's definition).
  template <class B>
  typename B::state& backend_state() {
    if constexpr (std::is_same_v<B, backends::cpu_backend>) {
      return cpu_;
    } else {
      const void* tag = &meta::type_tag<B>;
      for (auto& [t, st] : other_backends_)
        if (t == tag) return *static_cast<typename B::state*>(st.get());
      auto st = std::make_shared<typename B::state>();
      other_backends_.emplace_back(tag, st);
      return *st;
    }
  }
  /// The CPU's state, read-only (other back ends' states are made on first use, so only by a call).
  template <class B>
  const typename B::state& backend_state() const {
    static_assert(std::is_same_v<B, backends::cpu_backend>, "fusebox internal: a const function_state has the CPU's state only");
    return cpu_;
  }
  unsigned threads() const { return backend_state<backends::cpu_backend>().threads(); }

  /// The run-time path's state of one expression type on one back end (D: jit::dynamic_function).
  template <class D>
  D& dynamic_for() {
    const void* tag = &meta::type_tag<D>;
    for (auto& [t, d] : dynamic_)
      if (t == tag) return *static_cast<D*>(d.get());
    auto d = std::make_shared<D>();
    dynamic_.emplace_back(tag, d);
    recompile_counts_.push_back([d] { return d->recompiles(); });
    return *d;
  }
  /// Recompiles so far, over every expression type and back end.
  int recompiles() const {
    int n = 0;
    for (const auto& count : recompile_counts_) n += count();
    return n;
  }

  /// Whether a call with these facts may be recorded as a CUDA graph (every graph_size_rule passes).
  bool graph_size_allowed(const jit::call_facts& facts) const {
    for (const graph_size_rule& r : graph_sizes) {
      if (r.arg >= facts.extents.size() || r.dim >= facts.extents[r.arg].rank)
        FUSEBOX_THROW(invalid_argument("fusebox: cudagraph_sizes names argument " + std::to_string(r.arg) + " dimension " +
                                       std::to_string(r.dim) + ", but the call's argument has shape " +
                                       (r.arg < facts.extents.size() ? to_string(facts.extents[r.arg]) : std::string("(none)"))));
      if (std::find(r.sizes.begin(), r.sizes.end(), facts.extents[r.arg].extent[r.dim]) == r.sizes.end()) return false;
    }
    return true;
  }

 private:
  backends::cpu_backend::state cpu_;
  std::shared_ptr<cpu::thread_pool> caller_pool_;  // options::pool, wrapped; the CPU state points at it
  std::vector<std::pair<const void*, std::shared_ptr<void>>> other_backends_;
  std::vector<std::pair<const void*, std::shared_ptr<void>>> dynamic_;
  std::vector<std::function<int()>> recompile_counts_;
};

/// Outs (a tuple of tensors) allocated at the node shapes `shapes` of Prog's outputs.
template <class Outs, class Prog, class Shapes>
Outs outputs_at(const Shapes& shapes) {
  return [&]<std::size_t... R>(std::index_sequence<R...>) {
    return Outs{std::tuple_element_t<R, Outs>(shapes[Prog::graph::outputs[R]].desc.shape, fusebox::detail::internal_site)...};
  }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
}

/// Whether a program takes the back end's static kernels. Compiled gradients pass
/// `static_kernels = false` on the CUDA back end: nvcc's static path has not been tested on joint
/// graphs, so they keep the run-time path there.
template <backends::Backend B, class Prog, bool StaticKernels = true>
inline constexpr bool takes_static_kernels = StaticKernels && B::template has_static_kernels<Prog>;

/// One call of program Prog on back end B, the frame's inputs bound: select, the call's shapes,
/// outputs (tuple Outs of B's tensors) allocated at them, `before_run(shapes, outs)` (the entry
/// point's last look: a gradient's constants and extent checks), run. Empty when the run-time path
/// declines the call (past the recompile limit, or its code failed to compile): the entry point
/// then runs the model eagerly or says why it cannot. `who` names the caller in logs.
template <backends::Backend B, class Prog, class Outs, bool StaticKernels = true, class BeforeRun>
std::optional<Outs> run(function_state& st, typename Prog::frame_t& f, std::size_t n_args, const char* who,
                        BeforeRun&& before_run) {
  if constexpr (takes_static_kernels<B, Prog, StaticKernels>) {
    Outs outs = outputs_at<Outs, Prog>(Prog::nodes);
    before_run(Prog::nodes, outs);
    B::template run_static<Prog>(f, outs, st.backend_state<B>(), st.opts);
    return outs;
  } else {
    using D = jit::dynamic_function<Prog, typename B::target>;
    static_assert(defined_here<D>, "fusebox: this call takes the run-time path (dyn extents, or a back end whose kernels "
                                   "are generated at run time): #include <fusebox/jit.hpp> (the CPU), "
                                   "<fusebox/cuda.hpp> (CUDA) or <fusebox/fusebox.hpp>");
    using entry_t = typename D::fast_entry;
    D& fn = st.dynamic_for<D>();
    jit::call_facts facts = D::facts(f, n_args);
    // reduce_overhead (and max_autotune, which includes it): an exact repeat of a call signature
    // skips the guards and the specialisation (jit::dynamic_function::fast), and where the back
    // end records graphs (CUDA) the call may be recorded (compiled::cudagraph_sizes decides).
    const bool remembers = st.opts.mode != mode::default_;
    const bool record_graph = B::records_graphs && remembers && st.graph_size_allowed(facts);
    std::shared_ptr<const entry_t> kept = remembers ? fn.fast(facts) : nullptr;
    std::optional<entry_t> local;
    if (kept) {
      if (!st.hints.empty()) jit::check_hints(facts, st.hints);
      jit::counters().fast_path_calls.fetch_add(1, std::memory_order_relaxed);
    } else {
      auto prog = fn.select(facts, st.opts, st.hints, who);
      if (!prog) return std::nullopt;
      if (remembers) kept = fn.remember(std::move(facts), std::move(prog));
      else local.emplace(std::move(facts), std::move(prog));  // the call's shapes, made in place
    }
    const entry_t& e = kept ? *kept : *local;
    Outs outs = outputs_at<Outs, Prog>(e.concrete);
    before_run(e.concrete, outs);
    B::template run_dynamic<D>(e, f, outs, st.backend_state<B>(), st.opts, record_graph);
    return outs;
  }
}

/// explain()'s part of the pipeline for one call: the kernels of the program it would run, with
/// the call's shapes, as back end B runs them; on the run-time path first the policy and the
/// guards of every specialisation so far (selecting, so compiling, this call's if needed).
template <backends::Backend B, class Prog, bool StaticKernels = true>
std::string describe(function_state& st, typename Prog::frame_t& f, std::size_t n_args) {
  if constexpr (takes_static_kernels<B, Prog, StaticKernels>) {
    return B::template describe_static<Prog>(st.backend_state<B>());
  } else {
    using D = jit::dynamic_function<Prog, typename B::target>;
    D& fn = st.dynamic_for<D>();
    jit::call_facts facts = D::facts(f, n_args);
    auto prog = fn.select(facts, st.opts, st.hints, "explain");
    const fusebox::dynamic policy = st.opts.dynamic;
    const char* policy_name = policy == fusebox::dynamic::automatic ? "automatic"
                              : policy == fusebox::dynamic::always  ? "always"
                                                                    : "never";
    std::string s = std::string("  run-time path on the ") + B::name + " (" +
                    (Prog::all_static ? "static extents, kernels generated at run time" : "dyn extents") +
                    "), policy " + policy_name + "; guards of the specialisations (sN: symbolic):\n";
    for (const auto& g : fn.guards()) s += "    " + g.text() + "\n";
    if (!prog) return s + "  this call runs eagerly (recompile limit reached or its code failed to compile)\n";
    const typename D::fast_entry e(std::move(facts), prog);
    return s + B::template describe_dynamic<D>(*prog, e.concrete, st.backend_state<B>());
  }
}

}  // namespace fusebox::pipeline
