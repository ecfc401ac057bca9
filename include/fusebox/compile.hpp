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
// The entry point's part of a call: choose the back end (the arguments' kind and
// options::backend), rollback, capture, bind the inputs; the rest is pipeline/call.hpp's, shared
// with compiled gradients and explain(). The run-time path and the CUDA back end are not included
// here (pipeline/targets.hpp): a call that needs them says which header to include
// (fusebox/jit.hpp, fusebox/cuda.hpp), so a program of static CPU shapes compiles neither.
// Depends on: pipeline/{call,targets}.hpp (cuda::tensor declared there), backend/cpu/, ops/,
// options.hpp, graph_break.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusebox/backend/cpu/evaluate.hpp"
#include "fusebox/backend/cpu/invoke.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/low_precision.hpp"
#include "fusebox/graph_break.hpp"
#include "fusebox/options.hpp"
#include "fusebox/pipeline/call.hpp"
#include "fusebox/pipeline/targets.hpp"

namespace fusebox {

namespace detail {

template <class X>
struct is_tuple : std::false_type {};
template <class... X>
struct is_tuple<std::tuple<X...>> : std::true_type {};

/// std::tuple<A&, B&> -> std::tuple<A, B>: the results compiled::run's outputs refer to.
template <class Refs>
struct values_of;
template <class... X>
struct values_of<std::tuple<X...>> {
  using type = std::tuple<std::remove_cvref_t<X>...>;
};
template <class Refs>
using values_of_t = typename values_of<Refs>::type;

/// A model's result as a tuple: one tensor becomes a tuple of one.
template <class R>
auto as_tuple(R&& r) {
  if constexpr (is_tuple<std::remove_cvref_t<R>>::value) return std::forward<R>(r);
  else return std::make_tuple(std::forward<R>(r));
}

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

}  // namespace detail

template <class Model, options Static = options{}>
class compiled {
 public:
  compiled(Model model, options opts) : model_(std::move(model)), st_(with_static(opts)) {}

  const options& opts() const noexcept { return st_.opts; }
  unsigned threads() const noexcept { return st_.threads(); }

  /// Runs the compiled model; returns its result(s) as new tensors. With device tensors
  /// (cuda::tensor) it runs on the CUDA backend and returns device tensors.
  template <class... Args>
  auto operator()(const Args&... args) {
    if constexpr ((cuda::is_tensor_v<Args> || ...)) {
      if (st_.opts.backend == backend::cpu)
        FUSEBOX_THROW(invalid_argument("fusebox: a function compiled with options{.backend = backend::cpu} was called with "
                                       "cuda::tensor arguments " + detail::argument_shapes(args...) +
                                       ": move them to the host (to_host()), or compile with backend::automatic (run where "
                                       "the arguments are) or backend::cuda"));
      return call<backends::cuda_backend>(nullptr, args...);
    } else if constexpr (Static.backend == backend::cuda) {
      return call_on_device(args...);
    } else {
      if (st_.opts.backend == backend::cuda && !eager_only()) refuse_host_call_on_cuda(args...);
      return call<backends::cpu_backend>(nullptr, args...);
    }
  }

  /// Rollback for this function alone: while disabled, calls run the model eagerly, as under the
  /// global switch (stance force_eager, FUSEBOX_DISABLE=1), counted in counters().rollback_calls
  /// and logged once per switch under FUSEBOX_LOGS=rollback. ab()'s verdict.apply(f) sets it.
  void disable() noexcept { switch_.disabled.store(true, std::memory_order_relaxed); }
  void enable() noexcept { switch_.disabled.store(false, std::memory_order_relaxed); }
  /// False while disabled (the global switch is rollback_active()).
  bool enabled() const noexcept { return !switch_.disabled.load(std::memory_order_relaxed); }

  /// Runs the compiled model into caller-owned outputs: no heap allocation in steady state. `out` is
  /// the result's tensor, or for a model of several results std::tie(first, second, ...).
  template <class Out, class... Args>
  void run(Out&& out, const Args&... args) {
    if (st_.opts.backend == backend::cuda)
      FUSEBOX_THROW(invalid_argument("fusebox: compiled::run(out, args...) runs on the host into host memory, but this "
                                     "function was compiled with options{.backend = backend::cuda}: call it (f(args...)) "
                                     "to run on the GPU, or compile with backend::automatic or backend::cpu"));
    auto outs = [&] {
      if constexpr (detail::is_tuple<std::remove_cvref_t<Out>>::value) return out;  // references already
      else return std::tie(out);
    }();
    if constexpr (!program_for_args<Args...>::type::all_static) {
      outs = as_tuple(call<backends::cpu_backend>(nullptr, args...));  // the run-time path allocates its result (no steady-state promise)
    } else {
      const cpu::autotune::scope tune = autotune_scope();
      auto roots = capture(nullptr, args...);
      using Prog = typename detail::program_of<decltype(roots), Static.fast_math>::type;
      check_fast_math<Prog>();
      constexpr std::size_t results = std::tuple_size_v<decltype(outs)>;
      static_assert(results == Prog::graph::outputs.size(),
                    "fusebox: compiled::run(out, args...): give one output tensor per result of the model "
                    "(std::tie(first, second, ...) for several)");
      typename Prog::frame_t f;
      const auto targs = std::tie(args...);
      cpu::bind_inputs<Prog>(f, roots, targs);
      [&]<std::size_t... R>(std::index_sequence<R...>) {
        (check_output(std::get<R>(outs), Prog::nodes[Prog::graph::outputs[R]].desc.shape, R, results), ...);
      }(std::make_index_sequence<results>{});
      if (rolled_back(args...)) {
        outs = eager_outputs<detail::values_of_t<decltype(outs)>>(args...);
        return;
      }
      backends::cpu_backend::run_static<Prog>(f, outs, st_.backend_state<backends::cpu_backend>(), st_.opts);
    }
  }

  /// Bytes of the intermediate arena for these argument types: a compile-time constant.
  template <class... Args>
  static constexpr std::size_t arena_bytes() {
    return program_for<Args...>::arena_bytes;
  }

  /// Bytes a call with these argument types needs on `threads` threads for its intermediates
  /// (the arena), the weights its kernels keep under options::freezing (`freezing`; by default
  /// whether this function's template options freeze) and its kernels' scratch (the workspace):
  /// what use_memory takes. A compile-time constant of static shapes.
  template <class... Args>
  static constexpr std::size_t memory_bytes(unsigned threads, bool freezing = Static.freezing) {
    using P = program_for<Args...>;
    static_assert(P::all_static, "fusebox: compiled::memory_bytes<Args...>(): the arguments have dyn extents; the "
                                 "run-time path sizes its memory per call (use_memory is for static shapes)");
    const bool frozen = freezing && P::frozen_bytes > 0;
    return cpu::fixed_workspace_offset(P::arena_bytes) + (frozen ? P::frozen_bytes : 0) + P::workspace_bytes(threads, frozen);
  }

  /// options::freezing: forgets the weights the kernels keep, so the next call makes them again
  /// from the captured tensors' values (after the caller changed them in place).
  void refreeze() { st_.backend_state<backends::cpu_backend>().rt.frozen_for = nullptr; }

  /// Every later call keeps its arena and workspace in `memory` (the caller's: 64-byte aligned,
  /// at least memory_bytes<Args...>(threads()) bytes for the arguments it will be called with, and
  /// not used by another call at the same time) instead of memory it allocates. A call that needs
  /// more is an error naming both sizes. Calls with dyn extents and eager rollbacks still allocate.
  /// Under options::freezing the memory also holds the kept weights, made again at the next call:
  /// give each function memory of its own. An empty span gives the calls back memory of the
  /// function's own.
  void use_memory(std::span<std::byte> memory) {
    if (reinterpret_cast<std::uintptr_t>(memory.data()) % storage_alignment != 0)
      FUSEBOX_THROW(invalid_argument("fusebox: compiled::use_memory: the memory is not " +
                                     std::to_string(storage_alignment) + "-byte aligned (alignas(" +
                                     std::to_string(storage_alignment) + "), or fusebox::static_memory)"));
    auto& rt = st_.backend_state<backends::cpu_backend>().rt;
    rt.fixed = memory;
    rt.frozen_for = nullptr;  // nothing kept in this memory yet
  }

  /// The plan for these arguments, kernel by kernel, as the back end the arguments choose runs it
  /// (captures the model; breaks are run).
  template <class... Args>
  std::string describe(std::vector<detail::break_record>* breaks, const Args&... args) {
    using B = backend_for<Args...>;
    auto roots = capture(breaks, args...);
    using Prog = typename detail::program_of<decltype(roots), Static.fast_math>::type;
    typename Prog::frame_t f;
    const auto targs = std::tie(args...);
    cpu::bind_inputs<Prog>(f, roots, targs);
    return pipeline::describe<B, Prog>(st_, f, sizeof...(Args));
  }

  /// The back end a call with these arguments runs on: where its tensors are.
  template <class... Args>
  using backend_for =
      std::conditional_t<(cuda::is_tensor_v<Args> || ...), backends::cuda_backend, backends::cpu_backend>;

  /// A call on back end B: rollback, capture, bind; then the pipeline (pipeline/call.hpp). On the
  /// CUDA back end a call returns once its work is queued on cuda::work_stream() (as a PyTorch op
  /// does on its current stream): reading a result (to_host) waits for it, and
  /// cuda::synchronize() waits for all.
  template <class B, class... Args>
  auto call(std::vector<detail::break_record>* breaks, const Args&... args) {
    constexpr bool on_cuda = std::is_same_v<B, backends::cuda_backend>;
    static_assert(!on_cuda || pipeline::defined_here<B>,
                  "fusebox: device tensors (cuda::tensor) run on the CUDA back end: #include <fusebox/cuda.hpp> (or "
                  "<fusebox/fusebox.hpp>)");
    static_assert(!on_cuda || ((!is_tensor_v<Args>) && ...),
                  "fusebox: a call mixes host tensors and device tensors (cuda::tensor); move every tensor "
                  "argument to the device, or none");
    using PO = program_for_args<Args...>;
    using Prog = typename PO::type;
    using Outs = std::conditional_t<on_cuda, typename PO::device_outputs, typename PO::outputs>;
    if (rolled_back(args...))
      return detail::unwrap(
          eager_on<B, Outs>("the model must run eagerly (f.disable(), FUSEBOX_DISABLE or force_eager)", args...));
    const cpu::autotune::scope tune = autotune_scope();
    auto roots = capture(breaks, args...);
    typename Prog::frame_t f;
    const auto targs = std::tie(args...);
    cpu::bind_inputs<Prog>(f, roots, targs);
    if constexpr (!on_cuda) check_fast_math<Prog>();
    auto outs = pipeline::run<B, Prog, Outs>(st_, f, sizeof...(Args),
                                             on_cuda ? "compiled function (CUDA)" : "compiled function",
                                             [](const auto&, const auto&) {});
    if (!outs)
      return detail::unwrap(
          eager_on<B, Outs>("the recompile limit is reached or the run-time path's code failed to compile", args...));
    return detail::unwrap(std::move(*outs));
  }

  /// A range (and optimisation hint) for dimension `dim` of argument `arg`: guards of symbolic
  /// specialisations accept only extents in [min, max], and an extent outside is a shape_error.
  compiled& hint(std::size_t arg, std::size_t dim, std::size_t min, std::size_t max, std::size_t opt = 0) {
    st_.hints.push_back(dim_hint{arg, dim, min, max, opt});
    return *this;
  }

  /// mode::reduce_overhead records one CUDA graph per call signature (backend/cuda/graph_cache.hpp). With
  /// this rule, only calls whose argument `arg` has dimension `dim` in `sizes` are recorded (the
  /// batch sizes a server sees most); others run as in the default mode. Rules add up: a call is
  /// recorded when it passes every rule.
  compiled& cudagraph_sizes(std::size_t arg, std::size_t dim, std::vector<std::size_t> sizes) {
    st_.graph_sizes.push_back(pipeline::graph_size_rule{arg, dim, std::move(sizes)});
    return *this;
  }

  /// Recompiles so far (run-time path), over every argument type this function has seen.
  int recompiles() const { return st_.recompiles(); }

 private:
  static options with_static(options o) {
    if constexpr (Static.fullgraph) o.fullgraph = true;
    if constexpr (Static.fast_math) o.fast_math = true;
    if constexpr (Static.freezing) o.freezing = true;
    if constexpr (Static.backend != backend::automatic) o.backend = Static.backend;
    return o;
  }

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
      if (st_.opts.fast_math)
        FUSEBOX_THROW(invalid_argument(
            "fusebox: compile(model, options{.fast_math = true}) on host tensors of static shapes: this "
            "program's kernels were built with the translation unit, so fast math must be a build-time "
            "option there: compile<options{.fast_math = true}>(model) (a run-time fast_math reaches "
            "dyn extents and the CUDA backend)"));
  }
  template <class... Args>
  using program_for = typename program_for_args<Args...>::type;

  bool eager_only() const { return rollback_active() || !enabled(); }

  /// max_autotune on the host: the kernels of this call take timed choices (backend/cpu/autotune.hpp),
  /// persisted where the program has a store (cpu::autotune::persistent_store: the cache directory
  /// when a unit includes <fusebox/jit.hpp> or fusebox.hpp; in memory only otherwise); other modes
  /// leave tuning off.
  cpu::autotune::scope autotune_scope() const {
    const bool on = st_.opts.mode == mode::max_autotune;
    return cpu::autotune::scope(on, on && cpu::autotune::persistent_store ? cpu::autotune::persistent_store() : nullptr);
  }

  /// eager_only(), counted and logged: the rollback switches' one check per call.
  template <class... Args>
  bool rolled_back(const Args&... args) {
    if (!eager_only()) {
      if (switch_.logged.load(std::memory_order_relaxed) != 0) switch_.logged.store(0, std::memory_order_relaxed);
      return false;
    }
    jit::counters().rollback_calls.fetch_add(1, std::memory_order_relaxed);
    const int why = detail::disabled_by_environment() ? 1 : current_stance() == stance::force_eager ? 2 : 3;
    if (jit::enabled(jit::log_category::rollback) && switch_.logged.exchange(why, std::memory_order_relaxed) != why)
      jit::log(jit::log_category::rollback,
               std::string("a compiled function called with ") + detail::argument_shapes(args...) +
                   " runs its model eagerly: " +
                   (why == 1 ? "FUSEBOX_DISABLE=1" : why == 2 ? "stance force_eager" : "f.disable()") +
                   " (counted in counters().rollback_calls)");
    return true;
  }

  /// compile<options{.backend = backend::cuda}>(model) with host tensors: upload, run on the GPU,
  /// download. Without a usable GPU, a backend_unavailable saying so (never a silent CPU run).
  template <class B = backends::cuda_backend, class... Args>
  auto call_on_device(const Args&... args) -> decltype(this->template call<backends::cpu_backend>(nullptr, args...)) {
    static_assert(pipeline::defined_here<B>, "fusebox: compile<options{.backend = backend::cuda}>(model) needs the CUDA "
                                             "back end: #include <fusebox/cuda.hpp> (or <fusebox/fusebox.hpp>)");
    using T = typename program_for_args<Args...>::type::value_type;
    if (eager_only()) return call<backends::cpu_backend>(nullptr, args...);  // rolled back: eager on the host, where the tensors are
    static_assert(std::is_same_v<T, float>,
                  "fusebox: compile<options{.backend = backend::cuda}>(model) called with host tensors that are "
                  "not float: the CUDA backend computes float32 (with bfloat16 and float16 storage); pass float "
                  "tensors, or compile with backend::cpu");
    require_gpu(&B::check_device, args...);
    auto outs = call<B>(nullptr, to_device_arg(args)...);
    if constexpr (cuda::is_tensor_v<decltype(outs)>) return outs.to_host();
    else return std::apply([](const auto&... o) { return std::make_tuple(o.to_host()...); }, outs);
  }
  /// backend::cuda on host tensors needs a GPU: a backend_unavailable saying what was tried and
  /// the fix when there is none.
  template <class... Args>
  static void require_gpu(void (*check_device)(), const Args&... args) {
#if FUSEBOX_HAS_EXCEPTIONS
    try {
      check_device();
    } catch (const backend_unavailable& e) {
      std::string why = e.what();  // "fusebox: the CUDA backend is unavailable: <tried>. To fix: <fix>"
      if (const auto at = why.find("unavailable: "); at != std::string::npos) why.erase(0, at + 13);
      FUSEBOX_THROW(backend_unavailable(
          "CUDA",
          "the function was compiled with options{.backend = backend::cuda}, so this call's host tensors " +
              detail::argument_shapes(args...) + " were to be uploaded to the GPU and the results downloaded; " + why +
              "; or, to run on the CPU, compile with backend::automatic (run where the arguments are) or "
              "backend::cpu",
          ""));
    }
#else
    ((void)args, ...);
    check_device();  // the CUDA back end's headers need exceptions (core/errors.hpp): not reached
#endif
  }

  /// backend::cuda as a run-time option on host tensors. Running them on the GPU means building the
  /// CUDA path into every host call of every compiled function (it more than doubled the build of
  /// a two-model unit, 7 -> 18 CPU-s at -O0), so that form is asked for at build time, as
  /// fast_math is; a run-time option still never runs on the CPU unannounced.
  /// Where this process has tried the CUDA driver (cuda::require_device is set) a missing device
  /// is said first; the device check is not made otherwise, so that host code compiles no driver.
  template <class... Args>
  static void refuse_host_call_on_cuda(const Args&... args) {
    if (cuda::require_device) require_gpu(cuda::require_device, args...);
    FUSEBOX_THROW(invalid_argument(
        "fusebox: compile(model, options{.backend = backend::cuda}) called with host tensors " +
        detail::argument_shapes(args...) +
        ": to run host tensors on the GPU (upload, run, download) give the backend at build time, "
        "compile<options{.backend = fusebox::backend::cuda}>(model), or pass cuda::tensor arguments (cuda::tensor(x)), "
        "which run on the GPU under backend::automatic as well"));
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

  /// The model run op by op where back end B's results live: on the host; for the CUDA back end
  /// on the host from copies of the arguments, the results uploaded. bfloat16 and float16 have no
  /// host arithmetic, so for them this is an error naming `why` the call could not run compiled.
  template <class B, class Outs, class... Args>
  Outs eager_on(const char* why, const Args&... args) {
    if constexpr (std::is_same_v<B, backends::cpu_backend>) {
      (void)why;
      return eager_outputs<Outs>(args...);
    } else {
      using PO = program_for_args<Args...>;
      using T = typename PO::type::value_type;
      if constexpr (std::is_same_v<T, float>) {
        (void)why;
        auto host = std::apply([&](const auto&... a) { return eager_outputs<typename PO::outputs>(to_host_arg(a)...); },
                               std::tie(args...));
        return to_device_outputs<Outs>(host);
      } else {
        FUSEBOX_THROW(invalid_argument(std::string("fusebox: ") + why + ", and a " + name(storage_dtype<T>()) +
                                       " model cannot run eagerly on the host (no host arithmetic for 16-bit storage types)"));
      }
    }
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

  template <class... Args>
  auto capture(std::vector<detail::break_record>* breaks, const Args&... args) {
    detail::capture_context ctx{st_.opts.fullgraph, breaks, &st_.backend_state<backends::cpu_backend>().rt,
                                (cuda::is_tensor_v<Args> || ...)};
    detail::capture_scope scope(&ctx);
    auto roots = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return detail::as_roots(model_(detail::symbolic_arg<I, Static.fullgraph>(args)...));
    }(std::index_sequence_for<Args...>{});
    return roots;
  }

  template <class Out>
  static void check_output(const Out& out, const dims& want, std::size_t index, std::size_t results) {
    if (!(out.extents() == want) || !out.contiguous())
      FUSEBOX_THROW(invalid_argument("compiled::run: the output tensor" +
                                     (results > 1 ? " of result " + std::to_string(index) : std::string()) + " is " +
                                     to_string(out.extents()) + (out.contiguous() ? "" : " (not contiguous)") +
                                     ", the model produces " + to_string(want) + " (contiguous)"));
  }

  /// compiled::disable()'s switch: atomics (one thread may disable while another calls), moved
  /// by value so that a compiled function stays movable and allocates nothing when it is made.
  struct switch_state {
    std::atomic<bool> disabled{false};
    std::atomic<int> logged{0};  // the reason last logged (rolled_back), 0 after a compiled call
    switch_state() = default;
    switch_state(switch_state&& o) noexcept
        : disabled(o.disabled.load(std::memory_order_relaxed)), logged(o.logged.load(std::memory_order_relaxed)) {}
    switch_state& operator=(switch_state&& o) noexcept {
      disabled.store(o.disabled.load(std::memory_order_relaxed), std::memory_order_relaxed);
      logged.store(o.logged.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
  };

  Model model_;
  pipeline::function_state st_;
  switch_state switch_;
};

/// Memory for one compiled function's calls with arguments Args... on at most Threads threads,
/// its size fixed at compile time (compiled::memory_bytes), for compiled::use_memory: held where
/// the program likes (a global, a member beside the function), so that no call allocates.
///   static fb::static_memory<decltype(f), 1, decltype(x), decltype(w)> memory;
///   f.use_memory(memory.span());
template <class Compiled, unsigned Threads, class... Args>
struct static_memory {
  static constexpr std::size_t size = Compiled::template memory_bytes<Args...>(Threads);
  alignas(storage_alignment) std::byte bytes[size > 0 ? size : 1];
  std::span<std::byte> span() noexcept { return {bytes, size}; }
};

/// Clears the in-memory kernel cache and the CPU autotune winners held in memory, zeroes the
/// counters and forgets which graph breaks were logged (compiled functions keep the programs they already hold; the disk cache is untouched).
inline void reset() {
  if (jit::clear_kernel_memory) jit::clear_kernel_memory();
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
