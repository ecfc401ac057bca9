// compile.hpp: compile(model, options) and eager(model). The public entry points.
//
// compile() returns a callable. Each call captures the model on symbolic inputs bound to the call's
// tensors (a few dozen bytes on the stack: no graph is built at run time), and runs the program of
// the captured expression type, whose plan was made by the one planner while this translation
// unit was compiled. Intermediates live in an arena whose size is a constant of the program
// (`arena_bytes<Args...>`); it and the workspace are allocated on the first call and reused, so
// `run(out, args...)` allocates nothing in steady state. `operator()` allocates only its result.
//
// eager() runs the model op by op (each op materialises its result): the A/B baseline.
// Depends on: cpu/, ops/, options.hpp, graph_break.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusebox/cpu/evaluate.hpp"
#include "fusebox/cuda/tensor.hpp"
#include "fusebox/cpu/invoke.hpp"
#include "fusebox/cpu/report.hpp"
#include "fusebox/graph_break.hpp"
#include "fusebox/jit/cpu_autotune.hpp"
#include "fusebox/jit/dynamic.hpp"
#include "fusebox/options.hpp"
#if defined(__CUDACC__)
#include "fusebox/cuda/static_kernels.cuh"  // nvcc units: kernels for static shapes instantiated at build time
#endif

namespace fusebox {

namespace detail {

template <class X>
struct is_tuple : std::false_type {};
template <class... X>
struct is_tuple<std::tuple<X...>> : std::true_type {};

template <class X>
auto as_root(const X& x) {
  if constexpr (is_expr_v<X>) return x;
  else return tensor_leaf<typename X::value_type, typename X::shape_type>{{}, x.view()};
}

/// A model result as a tuple of expressions (a tensor result becomes a tensor leaf).
template <class R>
auto as_roots(const R& r) {
  if constexpr (is_tuple<R>::value) {
    return std::apply([](const auto&... x) { return std::make_tuple(as_root(x)...); }, r);
  } else {
    return std::make_tuple(as_root(r));
  }
}

/// FastMath: options::fast_math given at build time (compile<options{.fast_math = true}>).
template <class Tuple, bool FastMath = false>
struct program_of;
template <class... Roots, bool FastMath>
struct program_of<std::tuple<Roots...>, FastMath> {
  using type =
      cpu::basic_program<FastMath, typename std::tuple_element_t<0, std::tuple<Roots...>>::value_type, Roots...>;
  using outputs = std::tuple<tensor<typename Roots::value_type, shape_of_t<Roots>>...>;
  using device_outputs = std::tuple<cuda::tensor<typename Roots::value_type, shape_of_t<Roots>>...>;
};

template <class A>
inline constexpr bool is_any_tensor_v = is_tensor_v<A> || cuda::is_tensor_v<A>;

/// Argument I as the model sees it while capturing: tensors become input leaves.
template <std::size_t I, bool FullGraph, class A>
auto symbolic_arg(const A& a) {
  if constexpr (is_any_tensor_v<A>)
    return input_leaf<I, typename A::value_type, typename A::shape_type, FullGraph>{{}, a.view()};
  else return a;
}

/// Scope guard for the thread's capture context.
struct capture_scope {
  capture_context* saved;
  explicit capture_scope(capture_context* c) : saved(current_capture()) { current_capture() = c; }
  ~capture_scope() { current_capture() = saved; }
};

/// "[64, 100], [100]": the shapes of a call's tensor arguments, for messages.
template <class... Args>
std::string argument_shapes(const Args&... args) {
  std::string s;
  auto one = [&](const auto& a) {
    if constexpr (is_tensor_v<std::remove_cvref_t<decltype(a)>> || cuda::is_tensor_v<std::remove_cvref_t<decltype(a)>>)
      s += (s.empty() ? "" : ", ") + to_string(a.extents());
  };
  (one(args), ...);
  return s.empty() ? "(no tensors)" : s;
}

template <class Out>
decltype(auto) unwrap(Out&& outs) {
  if constexpr (std::tuple_size_v<std::remove_cvref_t<Out>> == 1) return std::move(std::get<0>(outs));
  else return std::forward<Out>(outs);
}

/// Runs `prog`, the CUDA program the run-time path chose for a call bound in `f` (a frame of the
/// expression's own size), on the caller's stream: the frame widened to the merged graph's size,
/// the runtime made on the first call, and, unless in default mode or `graphs` is false, replayed
/// from a CUDA graph. Shared by compiled models and compiled gradients.
template <class D, class T, std::size_t N, class Program>
void run_cuda_program(const Program& prog, const cpu::frame<T, N>& f, const jit::call_facts& facts,
                      std::unique_ptr<jit::cuda_runtime>& rt, const options& o, bool graphs) {
  cpu::frame<T, D::NB> g;
  for (std::size_t i = 0; i < N; ++i) {
    g.loc[i] = f.loc[i];
    g.copy_to[i] = f.copy_to[i];
    g.payload[i] = f.payload[i];
  }
  if (!rt) {
    rt = std::make_unique<jit::cuda_runtime>();
    rt->graphs.set_cap(o.cudagraph_cap);
    rt->autotune = o.mode == mode::max_autotune;
  }
  // max_autotune is reduce_overhead plus tuning, as in torch.compile.
  auto concrete = [&] { return jit::specialise(prog.graph, facts.extents); };
  if (o.mode != mode::default_ && graphs) prog.run_graph(g, concrete, facts.extents, *rt);
  else prog.run(g, concrete(), *rt);
}

}  // namespace detail

template <class Model, options Static = options{}>
class compiled {
 public:
  compiled(Model model, options opts) : model_(std::move(model)), opts_(opts) {
    if constexpr (Static.fullgraph) opts_.fullgraph = true;
    if constexpr (Static.fast_math) opts_.fast_math = true;
    if constexpr (Static.backend != backend::automatic) opts_.backend = Static.backend;
    rt_->pool = &cpu::shared_pool(opts_.threads ? opts_.threads : default_threads());
  }

  const options& opts() const noexcept { return opts_; }
  unsigned threads() const noexcept { return rt_->pool->size(); }

  /// Runs the compiled model; returns its result(s) as new tensors. With device tensors
  /// (cuda::tensor) it runs on the CUDA backend and returns device tensors.
  template <class... Args>
  auto operator()(const Args&... args) {
    if constexpr ((cuda::is_tensor_v<Args> || ...))
      if (opts_.backend == backend::cpu)
        throw invalid_argument("fusebox: a function compiled with options{.backend = backend::cpu} was called with "
                               "cuda::tensor arguments " + detail::argument_shapes(args...) +
                               ": move them to the host (to_host()), or compile with backend::automatic (run where "
                               "the arguments are) or backend::cuda");
#if defined(__CUDACC__)
    // An nvcc unit: the static path when every extent is static and every kernel has a template
    // (cuda/static_kernels.cuh); the run-time path is then not instantiated at all.
    if constexpr ((cuda::is_tensor_v<Args> || ...) &&
                  cuda::static_path::supported<typename program_for_args<Args...>::type>())
      return call_cuda_static<Args...>(args...);
    else
#endif
    if constexpr ((cuda::is_tensor_v<Args> || ...)) {
      return call_cuda(args...);
    } else {
      if constexpr (Static.backend == backend::cuda) {
        return call_on_device(args...);
      } else {
        if (opts_.backend == backend::cuda && !eager_only()) refuse_host_call_on_cuda(args...);
        return call(nullptr, args...);
      }
    }
  }

  /// Rollback for this function alone: while disabled, calls run the model eagerly, as under the
  /// global switch (stance force_eager, FUSEBOX_DISABLE=1), counted in counters().rollback_calls
  /// and logged once per switch under FUSEBOX_LOGS=rollback. ab()'s verdict.apply(f) sets it.
  void disable() noexcept { switch_->disabled.store(true, std::memory_order_relaxed); }
  void enable() noexcept { switch_->disabled.store(false, std::memory_order_relaxed); }
  /// False while disabled (the global switch is rollback_active()).
  bool enabled() const noexcept { return !switch_->disabled.load(std::memory_order_relaxed); }

  /// Runs the compiled model into caller-owned outputs: no heap allocation in steady state.
  template <class Out, class... Args>
  void run(Out& out, const Args&... args) {
    if (opts_.backend == backend::cuda)
      throw invalid_argument("fusebox: compiled::run(out, args...) runs on the host into host memory, but this "
                             "function was compiled with options{.backend = backend::cuda}: call it (f(args...)) "
                             "to run on the GPU, or compile with backend::automatic or backend::cpu");
    if constexpr (!program_for_args<Args...>::type::all_static) {
      out = call(nullptr, args...);  // the run-time path allocates its result (no steady-state promise)
    } else {
      const cpu::autotune::scope tune = autotune_scope();
      auto [roots, guard] = capture(nullptr, args...);
      using Prog = typename detail::program_of<decltype(roots), Static.fast_math>::type;
      check_fast_math<Prog>();
      typename Prog::frame_t f;
      const auto targs = std::tie(args...);
      cpu::bind_inputs<Prog>(f, roots, targs);
      auto outs = std::tie(out);
      check_output(out, Prog::nodes[Prog::graph::outputs[0]].desc.shape);
      if (rolled_back(args...)) {
        out = std::get<0>(eager_outputs<std::tuple<Out>>(args...));
        return;
      }
      cpu::bind_and_run<Prog>(f, outs, *rt_);
    }
  }

  /// Bytes of the intermediate arena for these argument types: a compile-time constant.
  template <class... Args>
  static constexpr std::size_t arena_bytes() {
    return program_for<Args...>::arena_bytes;
  }

  /// The plan for these arguments, kernel by kernel (captures the model; breaks are run).
  template <class... Args>
  std::string describe(std::vector<detail::break_record>* breaks, const Args&... args) {
    auto [roots, guard] = capture(breaks, args...);
    using Prog = typename detail::program_of<decltype(roots), Static.fast_math>::type;
    if constexpr (Prog::all_static) {
      return cpu::describe<Prog>(threads());
    } else {
      // The run-time path: the specialisation this call uses (compiled now if needed), and the
      // guards of every specialisation so far.
      typename Prog::frame_t f;
      const auto targs = std::tie(args...);
      cpu::bind_inputs<Prog>(f, roots, targs);
      auto& dynamic = dynamic_for<Prog>();
      const jit::call_facts facts = dynamic.facts(f, sizeof...(Args));
      const auto prog = dynamic.select(facts, opts_, hints_, "explain");
      std::string s = "  run-time path (dyn extents), policy " +
                      std::string(opts_.dynamic == fusebox::dynamic::automatic ? "automatic"
                                  : opts_.dynamic == fusebox::dynamic::always  ? "always"
                                                                                : "never") +
                      "; guards of the specialisations (sN: symbolic):\n";
      for (const auto& g : dynamic.guards()) s += "    " + g.text() + "\n";
      if (!prog) return s + "  this call runs eagerly (recompile limit reached or its code failed to compile)\n";
      return s + jit::dynamic_function<Prog>::describe(*prog, threads());
    }
  }

  /// Per-thread capture settings (for a call in progress).
  template <class... Args>
  auto call(std::vector<detail::break_record>* breaks, const Args&... args) {
    using PO = program_for_args<Args...>;
    using Outs = typename PO::outputs;
    if (rolled_back(args...)) return detail::unwrap(eager_outputs<Outs>(args...));
    const cpu::autotune::scope tune = autotune_scope();
    auto [roots, guard] = capture(breaks, args...);
    using Prog = typename PO::type;
    typename Prog::frame_t f;
    const auto targs = std::tie(args...);
    cpu::bind_inputs<Prog>(f, roots, targs);
    if constexpr (Prog::all_static) {
      check_fast_math<Prog>();
      auto outs = make_outputs<Outs, Prog>(f);
      cpu::bind_and_run<Prog>(f, outs, *rt_);
      return detail::unwrap(std::move(outs));
    } else {
      auto& dynamic = dynamic_for<Prog>();
      const jit::call_facts facts = dynamic.facts(f, sizeof...(Args));
      if (opts_.mode != mode::default_) {
        // reduce_overhead (and max_autotune, which includes it): an exact repeat of a call
        // signature skips the guards and the specialisations (jit::dynamic_function::fast).
        auto e = dynamic.fast(facts);
        if (e) {
          if (!hints_.empty()) jit::check_hints(facts, hints_);
          jit::counters().fast_path_calls.fetch_add(1, std::memory_order_relaxed);
        } else {
          auto prog = dynamic.select(facts, opts_, hints_, "compiled function");
          if (!prog) return detail::unwrap(eager_outputs<Outs>(args...));
          e = dynamic.remember(facts, std::move(prog));
        }
        auto outs = [&]<std::size_t... R>(std::index_sequence<R...>) {
          return Outs{std::tuple_element_t<R, Outs>(e->shapes[Prog::graph::outputs[R]].desc.shape)...};
        }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
        cpu::bind_outputs<Prog>(f, outs);
        jit::dynamic_function<Prog>::execute(*e->prog, f, e->concrete, *rt_);
        cpu::copy_repeated_outputs<Prog>(outs);
        return detail::unwrap(std::move(outs));
      }
      const auto prog = dynamic.select(facts, opts_, hints_, "compiled function");
      if (!prog) return detail::unwrap(eager_outputs<Outs>(args...));
      const auto shapes = jit::specialise(Prog::graph::nodes, facts.extents);
      auto outs = [&]<std::size_t... R>(std::index_sequence<R...>) {
        return Outs{std::tuple_element_t<R, Outs>(shapes[Prog::graph::outputs[R]].desc.shape)...};
      }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
      cpu::bind_outputs<Prog>(f, outs);
      jit::dynamic_function<Prog>::execute(*prog, f, facts.extents, *rt_);
      cpu::copy_repeated_outputs<Prog>(outs);
      return detail::unwrap(std::move(outs));
    }
  }

  /// The CUDA backend: the run-time path with CUDA kernels (NVRTC) and cuBLASLt, whatever the
  /// extents (static ones are baked into the generated source like known dyn ones). The call
  /// returns once its work is queued on cuda::work_stream() (as a PyTorch op does on its current
  /// stream): reading a result (to_host) waits for it, and cuda::synchronize() waits for all.
  template <class... Args>
  auto call_cuda(const Args&... args) {
    static_assert(((!is_tensor_v<Args>) && ...),
                  "fusebox: a call mixes host tensors and device tensors (cuda::tensor); move every tensor "
                  "argument to the device, or none");
    using PO = program_for_args<Args...>;
    using Prog = typename PO::type;
    using Outs = typename PO::device_outputs;
    using T = typename Prog::value_type;
    // Runs the model op by op on the host (rollback, or past the recompile limit). bfloat16 and
    // float16 have no host arithmetic, so for them this is an error naming the reason.
    auto eager_on_host = [&](const char* why) -> Outs {
      if constexpr (std::is_same_v<T, float>) {
        (void)why;
        auto host = std::apply([&](const auto&... a) { return eager_outputs<typename PO::outputs>(to_host_arg(a)...); },
                               std::tie(args...));
        return to_device_outputs<Outs>(host);
      } else {
        throw invalid_argument(std::string("fusebox: ") + why + ", and a " + name(storage_dtype<T>()) +
                               " model cannot run eagerly on the host (no host arithmetic for 16-bit storage types)");
      }
    };
    if (rolled_back(args...))
      return detail::unwrap(eager_on_host("the model must run eagerly (f.disable(), FUSEBOX_DISABLE or force_eager)"));
    auto [roots, guard] = capture(nullptr, args...);
    typename Prog::frame_t f;
    const auto targs = std::tie(args...);
    cpu::bind_inputs<Prog>(f, roots, targs);
    auto& dynamic = cuda_dynamic_for<Prog>();
    const jit::call_facts facts = dynamic.facts(f, sizeof...(Args));
    const auto prog = dynamic.select(facts, opts_, hints_, "compiled function (CUDA)");
    if (!prog) return detail::unwrap(eager_on_host("the recompile limit is reached or the CUDA code failed to compile"));
    const auto shapes = jit::specialise(Prog::graph::nodes, facts.extents);
    auto outs = [&]<std::size_t... R>(std::index_sequence<R...>) {
      return Outs{std::tuple_element_t<R, Outs>(shapes[Prog::graph::outputs[R]].desc.shape)...};
    }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
    cpu::bind_outputs<Prog>(f, outs);
    detail::run_cuda_program<jit::dynamic_function<Prog, jit::cuda_target>>(*prog, f, facts, cuda_rt_, opts_,
                                                                            graph_size_allowed(facts));
    return detail::unwrap(std::move(outs));
  }

#if defined(__CUDACC__)
  /// A call on the static CUDA path: kernels nvcc instantiated from the constexpr plan, no guard,
  /// no NVRTC. Launched directly in every mode (no CUDA graph is recorded).
  template <class... Args>
  auto call_cuda_static(const Args&... args) {
    static_assert(((!is_tensor_v<Args>) && ...),
                  "fusebox: a call mixes host tensors and device tensors (cuda::tensor); move every tensor "
                  "argument to the device, or none");
    using Prog = typename program_for_args<Args...>::type;
    using Outs = typename program_for_args<Args...>::device_outputs;
    if (rolled_back(args...)) {  // op by op on the host, as the run-time path does for float
      auto host = std::apply(
          [&](const auto&... a) { return eager_outputs<typename program_for_args<Args...>::outputs>(to_host_arg(a)...); },
          std::tie(args...));
      return detail::unwrap(to_device_outputs<Outs>(host));
    }
    auto [roots, guard] = capture(nullptr, args...);
    typename Prog::frame_t f;
    const auto targs = std::tie(args...);
    cpu::bind_inputs<Prog>(f, roots, targs);
    auto outs = [&]<std::size_t... R>(std::index_sequence<R...>) {
      return Outs{std::tuple_element_t<R, Outs>(Prog::nodes[Prog::graph::outputs[R]].desc.shape)...};
    }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
    cpu::bind_outputs<Prog>(f, outs);
    if (!cuda_rt_) cuda_rt_ = std::make_unique<jit::cuda_runtime>();
    cuda::static_path::runner<Prog>::run(f, *cuda_rt_);
    cuda::static_path::calls().fetch_add(1, std::memory_order_relaxed);
    return detail::unwrap(std::move(outs));
  }
#endif

  /// A range (and optimisation hint) for dimension `dim` of argument `arg`: guards of symbolic
  /// specialisations accept only extents in [min, max], and an extent outside is a shape_error.
  compiled& hint(std::size_t arg, std::size_t dim, std::size_t min, std::size_t max, std::size_t opt = 0) {
    hints_.push_back(dim_hint{arg, dim, min, max, opt});
    return *this;
  }

  /// mode::reduce_overhead records one CUDA graph per call signature (jit/cuda_graphs.hpp). With
  /// this rule, only calls whose argument `arg` has dimension `dim` in `sizes` are recorded (the
  /// batch sizes a server sees most); others run as in the default mode. Rules add up: a call is
  /// recorded when it passes every rule.
  compiled& cudagraph_sizes(std::size_t arg, std::size_t dim, std::vector<std::size_t> sizes) {
    graph_sizes_.push_back(graph_size_rule{arg, dim, std::move(sizes)});
    return *this;
  }

  /// Recompiles so far (run-time path), over every argument type this function has seen.
  int recompiles() const {
    int n = 0;
    for (const auto& d : dynamic_) n += d.recompiles();
    return n;
  }

 private:
  // Declared only: the type of the captured roots for these argument types.
  template <std::size_t... I, class... Args>
  static auto roots_type(std::index_sequence<I...>, meta::type_list<Args...>)
      -> decltype(detail::as_roots(std::declval<Model&>()(
          detail::symbolic_arg<I, Static.fullgraph>(std::declval<const Args&>())...)));
  template <class... Args>
  using program_for_args =
      detail::program_of<decltype(roots_type(std::index_sequence_for<Args...>{}, meta::type_list<Args...>{})),
                         Static.fast_math>;

  /// Run-time fast_math reaches the run-time path (dyn extents: the generated kernels) and CUDA; a
  /// program whose extents are all static was instantiated when this translation unit was
  /// compiled, so it takes fast math as a build-time option only. Saying so beats ignoring it.
  template <class Prog>
  void check_fast_math() const {
    if constexpr (Prog::all_static && !Static.fast_math)
      if (opts_.fast_math)
        throw invalid_argument(
            "fusebox: compile(model, options{.fast_math = true}) on host tensors of static shapes: this "
            "program's kernels were built with the translation unit, so fast math must be a build-time "
            "option there: compile<options{.fast_math = true}>(model) (a run-time fast_math reaches "
            "dyn extents and the CUDA backend)");
  }
  template <class... Args>
  using program_for = typename program_for_args<Args...>::type;

  struct graph_size_rule {
    std::size_t arg, dim;
    std::vector<std::size_t> sizes;
  };
  bool graph_size_allowed(const jit::call_facts& facts) const {
    for (const graph_size_rule& r : graph_sizes_) {
      if (r.arg >= facts.extents.size() || r.dim >= facts.extents[r.arg].rank)
        throw invalid_argument("fusebox: cudagraph_sizes names argument " + std::to_string(r.arg) + " dimension " +
                               std::to_string(r.dim) + ", but the call's argument has shape " +
                               (r.arg < facts.extents.size() ? to_string(facts.extents[r.arg]) : std::string("(none)")));
      if (std::find(r.sizes.begin(), r.sizes.end(), facts.extents[r.arg].extent[r.dim]) == r.sizes.end()) return false;
    }
    return true;
  }

  bool eager_only() const { return rollback_active() || !enabled(); }

  /// max_autotune on the host: the kernels of this call take timed choices (cpu/autotune.hpp),
  /// persisted in the cache directory; other modes leave tuning off.
  cpu::autotune::scope autotune_scope() const {
    const bool on = opts_.mode == mode::max_autotune;
    return cpu::autotune::scope(on, on ? &jit::cpu_winner_store::instance() : nullptr);
  }

  /// eager_only(), counted and logged: the rollback switches' one check per call.
  template <class... Args>
  bool rolled_back(const Args&... args) {
    if (!eager_only()) {
      if (switch_->logged.load(std::memory_order_relaxed) != 0) switch_->logged.store(0, std::memory_order_relaxed);
      return false;
    }
    jit::counters().rollback_calls.fetch_add(1, std::memory_order_relaxed);
    const int why = detail::disabled_by_environment() ? 1 : current_stance() == stance::force_eager ? 2 : 3;
    if (jit::enabled(jit::log_category::rollback) && switch_->logged.exchange(why, std::memory_order_relaxed) != why)
      jit::log(jit::log_category::rollback,
               std::string("a compiled function called with ") + detail::argument_shapes(args...) +
                   " runs its model eagerly: " +
                   (why == 1 ? "FUSEBOX_DISABLE=1" : why == 2 ? "stance force_eager" : "f.disable()") +
                   " (counted in counters().rollback_calls)");
    return true;
  }

  /// compile<options{.backend = backend::cuda}>(model) with host tensors: upload, run on the GPU,
  /// download. Without a usable GPU, a backend_unavailable saying so (never a silent CPU run).
  template <class... Args>
  auto call_on_device(const Args&... args) -> decltype(this->call(nullptr, args...)) {
    using T = typename program_for_args<Args...>::type::value_type;
    if (eager_only()) return call(nullptr, args...);  // rolled back: eager on the host, where the tensors are
    static_assert(std::is_same_v<T, float>,
                  "fusebox: compile<options{.backend = backend::cuda}>(model) called with host tensors that are "
                  "not float: the CUDA backend computes float32 (with bfloat16 and float16 storage); pass float "
                  "tensors, or compile with backend::cpu");
    require_gpu(args...);
    auto outs = call_cuda(to_device_arg(args)...);
    if constexpr (cuda::is_tensor_v<decltype(outs)>) return outs.to_host();
    else return std::apply([](const auto&... o) { return std::make_tuple(o.to_host()...); }, outs);
  }
  /// backend::cuda on host tensors needs a GPU: a backend_unavailable saying what was tried and
  /// the fix when there is none.
  template <class... Args>
  static void require_gpu(const Args&... args) {
    try {
      (void)cuda::current_device();
    } catch (const backend_unavailable& e) {
      std::string why = e.what();  // "fusebox: the CUDA backend is unavailable: <tried>. To fix: <fix>"
      if (const auto at = why.find("unavailable: "); at != std::string::npos) why.erase(0, at + 13);
      throw backend_unavailable(
          "CUDA",
          "the function was compiled with options{.backend = backend::cuda}, so this call's host tensors " +
              detail::argument_shapes(args...) + " were to be uploaded to the GPU and the results downloaded; " + why +
              "; or, to run on the CPU, compile with backend::automatic (run where the arguments are) or "
              "backend::cpu",
          "");
    }
  }
  /// backend::cuda as a run-time option on host tensors. Running them on the GPU means building the
  /// CUDA path into every host call of every compiled function (it more than doubled the build of
  /// a two-model unit, 7 -> 18 CPU-s at -O0), so that form is asked for at build time, as
  /// fast_math is; a run-time option still never runs on the CPU unannounced.
  template <class... Args>
  static void refuse_host_call_on_cuda(const Args&... args) {
    require_gpu(args...);
    throw invalid_argument(
        "fusebox: compile(model, options{.backend = backend::cuda}) called with host tensors " +
        detail::argument_shapes(args...) +
        ": to run host tensors on the GPU (upload, run, download) give the backend at build time, "
        "compile<options{.backend = fusebox::backend::cuda}>(model), or pass cuda::tensor arguments (cuda::tensor(x)), "
        "which run on the GPU under backend::automatic as well");
  }

  template <class A>
  static decltype(auto) to_device_arg(const A& a) {
    if constexpr (is_tensor_v<A>) return cuda::tensor<typename A::value_type, typename A::shape_type>(a);
    else return (a);
  }

  /// The model run op by op, its results in the compiled function's output types.
  template <class Outs, class... Args>
  Outs eager_outputs(const Args&... args) {
    const unsigned saved = default_threads();
    set_default_threads(threads());
    struct restore {
      unsigned n;
      ~restore() { set_default_threads(n); }
    } r{saved};
    return Outs(model_(args...));
  }

  template <class A>
  static decltype(auto) to_host_arg(const A& a) {
    if constexpr (cuda::is_tensor_v<A>) return a.to_host();
    else return (a);
  }
  template <class Outs, class Host>
  static Outs to_device_outputs(const Host& host) {
    return [&]<std::size_t... R>(std::index_sequence<R...>) {
      return Outs{std::tuple_element_t<R, Outs>(std::get<R>(host))...};
    }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
  }

  /// The CUDA run-time state of one expression type.
  template <class Prog>
  jit::dynamic_function<Prog, jit::cuda_target>& cuda_dynamic_for() {
    using D = jit::dynamic_function<Prog, jit::cuda_target>;
    const void* tag = &meta::type_tag<D>;
    for (auto& [t, d] : dynamic_state_)
      if (t == tag) return *static_cast<D*>(d.get());
    auto d = std::make_shared<D>();
    dynamic_state_.emplace_back(tag, d);
    dynamic_.push_back(recompile_counter{[d] { return d->recompiles(); }});
    return *d;
  }

  /// The run-time state of one expression type (one per argument types seen).
  template <class Prog>
  jit::dynamic_function<Prog>& dynamic_for() {
    const void* tag = &meta::type_tag<Prog>;
    for (auto& [t, d] : dynamic_state_)
      if (t == tag) return *static_cast<jit::dynamic_function<Prog>*>(d.get());
    auto d = std::make_shared<jit::dynamic_function<Prog>>();
    dynamic_state_.emplace_back(tag, d);
    dynamic_.push_back(recompile_counter{[d] { return d->recompiles(); }});
    return *d;
  }
  struct recompile_counter {
    std::function<int()> count;
    int recompiles() const { return count(); }
  };

  template <class... Args>
  auto capture(std::vector<detail::break_record>* breaks, const Args&... args) {
    detail::capture_context ctx{opts_.fullgraph, breaks, rt_.get(), (cuda::is_tensor_v<Args> || ...)};
    detail::capture_scope scope(&ctx);
    auto roots = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return detail::as_roots(model_(detail::symbolic_arg<I, Static.fullgraph>(args)...));
    }(std::index_sequence_for<Args...>{});
    return std::pair{std::move(roots), 0};
  }

  template <class Outs, class Prog>
  static Outs make_outputs(const typename Prog::frame_t& f) {
    return [&]<std::size_t... R>(std::index_sequence<R...>) {
      return Outs{std::tuple_element_t<R, Outs>(
          Prog::all_static ? Prog::nodes[Prog::graph::outputs[R]].desc.shape : output_shape<Prog>(f, R))...};
    }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
  }
  template <class Prog>
  static dims output_shape(const typename Prog::frame_t& f, std::size_t r) {
    return f.loc[Prog::graph::outputs[r]].shape;
  }
  template <class Out>
  static void check_output(const Out& out, const dims& want) {
    if (!(out.extents() == want) || !out.contiguous())
      throw invalid_argument("compiled::run: the output tensor is " + to_string(out.extents()) +
                             (out.contiguous() ? "" : " (not contiguous)") + ", the model produces " +
                             to_string(want) + " (contiguous)");
  }

  /// compiled::disable(): a heap object so a compiled function stays movable.
  struct switch_state {
    std::atomic<bool> disabled{false};
    std::atomic<int> logged{0};  // the reason last logged (rolled_back), 0 after a compiled call
  };

  Model model_;
  options opts_;
  std::unique_ptr<switch_state> switch_ = std::make_unique<switch_state>();
  std::unique_ptr<cpu::runtime> rt_ = std::make_unique<cpu::runtime>();
  std::unique_ptr<jit::cuda_runtime> cuda_rt_;  // created by the first CUDA call
  std::vector<graph_size_rule> graph_sizes_;     // cudagraph_sizes()
  std::vector<dim_hint> hints_;
  std::vector<std::pair<const void*, std::shared_ptr<void>>> dynamic_state_;
  std::vector<recompile_counter> dynamic_;
};

/// Clears the in-memory kernel cache and the CPU autotune winners held in memory, zeroes the
/// counters and forgets which graph breaks were logged (compiled functions keep the programs they already hold; the disk cache is untouched).
inline void reset() {
  jit::kernel_store::instance().clear_memory();
  cpu::autotune::forget();
  jit::counters().reset();
  detail::forget_logged_breaks();
}

/// Compiles `model` (a callable over tensors built from fusebox ops) with run-time options.
template <class Model>
auto compile(Model model, options opts = {}) {
  return compiled<Model>(std::move(model), opts);
}

/// Compiles with options known at build time: `compile<options{.fullgraph = true}>(model)` turns
/// graph breaks into build errors.
template <options Static, class Model>
auto compile(Model model) {
  return compiled<Model, Static>(std::move(model), Static);
}

/// Runs `model` op by op, every intermediate materialised: the baseline to compare against.
template <class Model>
class eager_fn {
 public:
  eager_fn(Model model, unsigned threads) : model_(std::move(model)), threads_(threads) {}
  template <class... Args>
  auto operator()(const Args&... args) {
    const unsigned saved = default_threads();
    if (threads_) set_default_threads(threads_);
    struct restore {
      unsigned n;
      ~restore() { set_default_threads(n); }
    } r{saved};
    return model_(args...);
  }

 private:
  Model model_;
  unsigned threads_;
};

template <class Model>
auto eager(Model model, options opts = {}) {
  return eager_fn<Model>(std::move(model), opts.threads);
}

}  // namespace fusebox
