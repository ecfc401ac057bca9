// autodiff/grad.hpp: fusebox::grad and fusebox::value_and_grad, eager and compiled.
//
//   auto loss = [](const auto& x, const auto& w, const auto& t) { ... return fb::mean(fb::mean(e)); };
//   auto vg = fb::value_and_grad(loss, fb::wrt<1>);       // d loss / d w; default fb::wrt<0>
//   auto [l, dw] = vg(x, w, t);                           // eager: op by op
//   auto fast = fb::compile(vg);                          // forward and backward planned together
//   auto [l2, dw2] = fast(x, w, t);
//   auto [dw3, dt3] = fb::compile(fb::grad(loss, fb::wrt<1, 2>))(x, w, t);
//
// As in JAX (jax.grad(f, argnums)) and torch.func.grad: the loss function is a model (a callable
// over tensors, here written with fusebox ops) returning one element (sum() or mean() of
// something); `wrt<I...>` names the tensor arguments to differentiate. One index gives one
// gradient tensor, several give a std::tuple in that order; value_and_grad gives
// std::pair{loss, gradients}. Every gradient has its argument's shape (zeros if the loss does not
// depend on it).
//
// How: the loss is captured on symbolic arguments (as compile() does), its payloads are lifted to
// inputs (autodiff/lift.hpp), the reverse pass builds the gradients as expression types
// (autodiff/backward.hpp, from the ops' own rules, in autodiff/sym.hpp's storage-free node types),
// and the roots (loss, gradients...) are one graph: compiled, the one planner plans forward and
// backward together (fusion across them, buffers by liveness); eager, each node runs on its own
// (autodiff/eager.hpp). The graph is never an object: it is bound from a table of input views.
//
// Cases: host tensors (float or double), or device tensors through compile() (the joint graph on
// the CUDA backend, as compile() runs a model). Static shapes take the static path; arguments with
// `dyn` extents (a variable batch) take the run-time path through compile(), as a model does: the
// joint graph is guarded, specialised and planned per call signature, recompiling only as the
// forward would, and rules' constants that depend on an extent (mean's 1 / n) are valued per call.
// A build error names anything else (eager grad on dyn extents or device tensors, a non-scalar
// loss, wrt naming a number). A loss that reads a value on the host (item()) is refused at the
// call: its gradient would silently miss that path.
// Depends on: autodiff/{lift,backward,eager}.hpp, compile.hpp (compile(), options, capture).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusebox/autodiff/backward.hpp"
#include "fusebox/autodiff/eager.hpp"
#include "fusebox/autodiff/lift.hpp"
#include "fusebox/autodiff/remat.hpp"
#include "fusebox/backend/cpu/report.hpp"
#include "fusebox/compile.hpp"
#include "fusebox/core/errors.hpp"

namespace fusebox {

/// The arguments to differentiate, by position: `fb::wrt<0>`, `fb::wrt<1, 2>`.
template <std::size_t... I>
struct wrt_t {
  static_assert(sizeof...(I) >= 1, "fusebox::wrt<I...>: name at least one argument");
};
template <std::size_t... I>
inline constexpr wrt_t<I...> wrt{};

namespace autodiff {

/// Sizes of the graphs behind a grad call (for one set of argument types).
struct graph_stats {
  std::size_t forward_nodes = 0;     ///< the loss alone (payloads lifted, as the joint graph has them)
  std::size_t joint_nodes = 0;       ///< loss and gradients, one graph: the nodes the planner sees
  double joint_tree_nodes = 0;       ///< the same roots as a tree without sharing: what merging saves
  int forward_kernels = 0, joint_kernels = 0;
  std::size_t forward_arena_bytes = 0;  ///< intermediates of the forward alone
  std::size_t joint_arena_bytes = 0;    ///< intermediates of forward + backward (the saved values)
};

namespace static_check {
template <class Result, bool Ok>
struct loss_not_expression {
  static_assert(Ok, "fusebox::grad(f): f must return an expression of its arguments built with fusebox ops (it "
                    "returned the type above: a tensor or a number does not depend on the arguments)");
  static constexpr bool value = Ok;
};
template <class LossShape, bool Ok>
struct loss_not_scalar {
  static_assert(Ok, "fusebox::grad(f): the loss must have exactly one element (its shape is above). Fix: reduce "
                    "it with sum() or mean(), once per dimension: fb::mean(fb::mean(x)) for a matrix");
  static constexpr bool value = Ok;
};
template <std::size_t I, std::size_t Arguments, bool Ok>
struct wrt_out_of_range {
  static_assert(Ok, "fusebox::grad(f, wrt<I...>): an index (I above) is not an argument position of the call "
                    "(the number of arguments is above)");
  static constexpr bool value = Ok;
};
template <std::size_t I, class Argument, bool Ok>
struct wrt_not_a_tensor {
  static_assert(Ok, "fusebox::grad(f, wrt<I...>): argument I (above) is not a tensor (its type is above): only "
                    "tensor arguments have gradients. Fix: pass the value as a tensor, or leave it out of wrt<>");
  static constexpr bool value = Ok;
};
template <bool Ok>
struct wrt_repeated {
  static_assert(Ok, "fusebox::grad(f, wrt<I...>): an argument is named twice");
  static constexpr bool value = Ok;
};
template <class Argument, bool Ok>
struct not_static {
  static_assert(Ok, "fusebox::grad: eager gradients of arguments with dyn extents (the type above) are not "
                    "supported: compile the gradient (fb::compile(fb::value_and_grad(...))), which runs them on the "
                    "run-time path, or give every extent in the tensor type");
  static constexpr bool value = Ok;
};
template <float Budget, bool Ok>
struct dyn_memory_budget {
  static_assert(Ok, "fusebox::compile(grad(...)) with dyn extents: an activation memory budget below 1 needs static "
                    "shapes (which values to recompute is chosen at build time from their sizes)");
  static constexpr bool value = Ok;
};
template <class Argument, bool Ok>
struct device_argument {
  static_assert(Ok, "fusebox::grad: device tensors (cuda::tensor, above) need the compiled gradient: eager grad "
                    "runs op by op on the host. Fix: fb::compile(fb::grad(...)), or pass host tensors");
  static constexpr bool value = Ok;
};
template <std::size_t I, class Argument, class LossElement, bool Ok>
struct wrt_element_type {
  static_assert(Ok, "fusebox::grad(f, wrt<I...>): argument I (above) holds another element type than the loss");
  static constexpr bool value = Ok;
};
}  // namespace static_check

namespace detail {

template <std::size_t I, class A>
auto symbolic(const A& a) {
  if constexpr (is_tensor_v<A> || cuda::is_tensor_v<A>) {  // a device tensor's leaf views device memory
    return input_leaf<I, typename A::value_type, typename A::shape_type>{{}, a.view()};
  } else {
    return a;
  }
}

template <class F, class... Args, std::size_t... I>
auto loss_type(std::index_sequence<I...>) -> decltype(std::declval<F&>()(symbolic<I>(std::declval<const Args&>())...));

/// Copies of the expression tree without sharing (a double: it can be astronomically large).
template <class E>
struct tree_size {
  static constexpr double value = [] {
    double n = 1;
    [&]<class... C>(meta::type_list<C...>) { ((n += tree_size<C>::value), ...); }(typename E::children{});
    return n;
  }();
};

/// An argument's element type and shape (void and rank 0 for a non-tensor, which wrt<> refuses
/// with its own message rather than a cascade of errors).
template <class A>
struct argument_traits {
  using value_type = void;
  using shape_type = shape<>;
};
template <class T, class S>
struct argument_traits<tensor<T, S>> {
  using value_type = T;
  using shape_type = S;
};

/// The host tensor type standing for a device one in the type computations (plan_of): the
/// joint graph is the same whichever memory the arguments live in.
template <class A>
struct host_type {
  using type = A;
};
template <class T, class S>
struct host_type<cuda::tensor<T, S>> {
  using type = tensor<T, S>;
};
template <class A>
using host_type_t = typename host_type<A>::type;

/// Everything about grad(f, wrt<W...>) at these argument types, as types and constants.
template <class F, class Wrt, class... Args>
struct plan_of;
template <class F, std::size_t... W, class... Args>
struct plan_of<F, wrt_t<W...>, Args...> {
  static constexpr std::size_t arguments = sizeof...(Args);
  using args = meta::type_list<Args...>;
  using loss_t = decltype(loss_type<F, Args...>(std::index_sequence_for<Args...>{}));
  static_assert(static_check::loss_not_expression<loss_t, is_expr_v<loss_t>>::value);
  static_assert((static_check::wrt_out_of_range<W, arguments, (W < arguments)>::value && ...));
  static constexpr bool distinct = [] {
    const std::size_t w[] = {W...};
    for (std::size_t i = 0; i < sizeof...(W); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (w[i] == w[j]) return false;
    return true;
  }();
  static_assert(static_check::wrt_repeated<distinct>::value);
  static_assert(static_check::loss_not_scalar<shape_of_t<loss_t>, loss_t::desc.shape.size() == 1>::value);

  using value_type = typename loss_t::value_type;
  using T = value_type;
  template <std::size_t I>
  using arg = meta::at_t<(I < arguments ? I : 0), args>;
  static_assert((static_check::wrt_not_a_tensor<W, arg<W>, is_tensor_v<arg<W>>>::value && ...));
  static_assert((static_check::wrt_element_type<W, arg<W>, T,
                                                !is_tensor_v<arg<W>> ||
                                                    std::is_same_v<typename argument_traits<arg<W>>::value_type, T>>::value &&
                 ...));

  using slots = payload_slots<loss_t>;
  static constexpr std::size_t payloads = slots::size;
  using root = lifted_t<loss_t, arguments>;
  using tape_t = tape<root, arguments + payloads>;
  static constexpr std::size_t inputs = tape_t::inputs;
  template <std::size_t I>
  using leaf = input_leaf<I, T, typename argument_traits<arg<I>>::shape_type>;
  using roots = meta::type_list<root, typename tape_t::template gradient<leaf<W>>...>;
  using program = cpu::program<T, root, typename tape_t::template gradient<leaf<W>>...>;
  using forward_program = cpu::program<T, root>;
  /// The joint program under an activation memory budget (autodiff/remat.hpp); budget 1 is `program`.
  template <float Budget>
  using budgeted_t = budgeted<T, Budget, root, typename tape_t::template gradient<leaf<W>>...>;
  using outputs = std::tuple<tensor<T, shape_of_t<root>>, tensor<T, shape_of_t<typename tape_t::template gradient<leaf<W>>>>...>;
  /// Every argument's extents are static: the static path, constants valued at build time.
  static constexpr bool all_static = ((!is_tensor_v<Args> || argument_traits<Args>::shape_type::is_static) && ...);

  /// With dyn extents: each gradient has its argument's extents in this call. The backward's sums
  /// over broadcast dimensions are fixed by the types, so a dyn extent that is 1 in this call,
  /// broadcast against another dyn extent, would give a gradient of another shape: refused by name.
  /// `site` is the user's compile() line.
  template <class Outs, class... A>
  static void check_gradient_extents(const std::source_location& site, const Outs& outs, const A&... args) {
    const auto targs = std::tie(args...);
    [&]<std::size_t... G>(std::index_sequence<G...>) {
      constexpr std::size_t w[] = {W...};
      auto check = [&](const dims& got, const dims& want, std::size_t arg) {
        if (!(got == want))
          FUSEBOX_THROW(shape_error("fusebox::grad: the gradient of argument " + std::to_string(arg) + " " + to_string(want) +
                                        " came out " + to_string(got) + " in this call: a dyn extent of 1 broadcast against "
                                        "another dyn extent. Fix: give the broadcast dimension extent 1 in the tensor type",
                                    site));
      };
      (check(std::get<G + 1>(outs).extents(), std::get<w[G]>(targs).extents(), w[G]), ...);
    }(std::make_index_sequence<sizeof...(W)>{});
  }

  static outputs eager(const fusebox::detail::bound_inputs<T, inputs>& in) {
    return evaluate_op_by_op<T, root, typename tape_t::template gradient<leaf<W>>...>(in);
  }

  static graph_stats stats() {
    graph_stats s;
    s.forward_nodes = forward_program::N;
    s.joint_nodes = program::N;
    s.joint_tree_nodes = (tree_size<root>::value + ... + tree_size<typename tape_t::template gradient<leaf<W>>>::value);
    s.forward_kernels = forward_program::plan.n_kernels;
    s.joint_kernels = program::plan.n_kernels;
    s.forward_arena_bytes = forward_program::arena_bytes;
    s.joint_arena_bytes = program::arena_bytes;
    return s;
  }
};

/// The inputs of one call: arguments, lifted payloads, constants and the seed. Scalars live in
/// `values` and are viewed there, so this object stays where it was made.
template <class P>
struct bound_call {
  using T = typename P::T;
  fusebox::detail::bound_inputs<T, P::inputs> in{};
  std::array<T, P::inputs> values{};

  template <class Loss, class... Args>
  bound_call(const Loss& loss, const Args&... args) {
    std::size_t i = 0;
    (([&] {
       if constexpr (is_tensor_v<Args>)
         if constexpr (std::is_same_v<typename Args::value_type, T>) in.views[i] = args.view();
       ++i;
     }()),
     ...);
    std::array<bool, P::payloads + 1> bound{};
    collect_lifted<typename P::slots>(loss, in.views.data() + P::arguments, values.data() + P::arguments, bound.data());
    if constexpr (P::all_static) constants(typename P::tape_t::static_shapes{});
    for (std::size_t c = P::tape_t::const_base; c < P::inputs; ++c) in.views[c] = strided<const T>{&values[c], dims{}, {}};
  }
  /// Values the rules' constants and the seed for this call's extents (autodiff/backward.hpp).
  template <class ShapeOf>
  void constants(const ShapeOf& shape_of) {
    P::tape_t::constants(values.data(), shape_of);
  }
  bound_call(const bound_call&) = delete;
  bound_call& operator=(const bound_call&) = delete;
};

/// The extents of a node type of program Prog in one call: `shapes` is Prog's graph specialised to
/// the call's extents (jit::specialise); a type is found by its position in the lowering.
template <class Prog, class Shapes>
struct call_shapes {
  const Shapes& shapes;
  template <class E>
  dims operator()() const {
    constexpr int i = ir::detail::first_index<E>(typename Prog::graph::node_types{});
    static_assert(i >= 0 || E::desc.shape.is_static(), "fusebox internal: a rule's constant reads a node outside the joint graph");
    if constexpr (i >= 0) return shapes[static_cast<std::size_t>(i)].desc.shape;
    else return E::desc.shape;
  }
};

/// The outputs of program Prog, allocated at their extents in this call.
template <class Outs, class Prog, class Shapes>
Outs outputs_at(const Shapes& shapes) {
  return [&]<std::size_t... R>(std::index_sequence<R...>) {
    return Outs{std::tuple_element_t<R, Outs>(shapes[Prog::graph::outputs[R]].desc.shape, fusebox::detail::internal_site)...};
  }(std::make_index_sequence<std::tuple_size_v<Outs>>{});
}

/// Calls f on symbolic arguments. A host read inside (item()) is refused here: it would cut the
/// gradient's path without a word.
template <class F, class... Args>
auto capture(F& f, const Args&... args) {
  fusebox::detail::capture_context ctx{true, nullptr, &fusebox::detail::eager_runtime(),
                                       (cuda::is_tensor_v<Args> || ...)};
  fusebox::detail::capture_scope scope(&ctx);
  auto call = [&]<std::size_t... I>(std::index_sequence<I...>) { return f(symbolic<I>(args)...); };
#if FUSEBOX_HAS_EXCEPTIONS
  try {
    return call(std::index_sequence_for<Args...>{});
  } catch (const graph_break& e) {
    FUSEBOX_THROW(invalid_argument(std::string("fusebox::grad(f): the loss reads a value on the host (") + e.what() +
                                   "); a gradient cannot flow through it. Fix: keep that part of the loss in fusebox ops"));
  }
#else
  return call(std::index_sequence_for<Args...>{});  // the graph break's own message, then the handler
#endif
}

/// The outputs (loss, gradients...) as the caller gets them.
template <bool WithValue, class Outs>
auto shape_result(Outs&& outs) {
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<Outs>> - 1;
  auto grads = [&]<std::size_t... G>(std::index_sequence<G...>) {
    if constexpr (n == 1) return std::move(std::get<1>(outs));
    else return std::make_tuple(std::move(std::get<G + 1>(outs))...);
  }(std::make_index_sequence<n>{});
  if constexpr (WithValue) return std::make_pair(std::move(std::get<0>(outs)), std::move(grads));
  else return grads;
}

}  // namespace detail

/// grad(f, wrt<W...>) / value_and_grad(f, wrt<W...>): call it to run eagerly (op by op), or
/// compile() it.
template <class F, class Wrt, bool WithValue>
class grad_fn {
 public:
  explicit grad_fn(F f) : f_(std::move(f)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    static_assert((static_check::device_argument<Args, !cuda::is_tensor_v<Args>>::value && ...));
    using P = detail::plan_of<F, Wrt, Args...>;
    static_assert((static_check::not_static<Args, !is_tensor_v<Args> || detail::argument_traits<Args>::shape_type::is_static>::value &&
                   ...));
    const auto loss = detail::capture(f_, args...);
    const detail::bound_call<P> b(loss, args...);
    return detail::shape_result<WithValue>(P::eager(b.in));
  }

  /// Node and kernel counts and arena sizes of the forward alone and of forward + backward.
  template <class... Args>
  static graph_stats stats(const Args&...) {
    return detail::plan_of<F, Wrt, Args...>::stats();
  }

  /// The compiled plan of forward + backward for these arguments, kernel by kernel.
  template <class... Args>
  static std::string describe(const Args&...) {
    return cpu::describe<typename detail::plan_of<F, Wrt, Args...>::program>(default_threads());
  }

  F& function() const { return f_; }

 private:
  mutable F f_;
};

/// compile(grad(...)) / compile(value_and_grad(...)): forward and backward as one planned program,
/// under activation memory budget Budget (options::activation_memory_budget; autodiff/remat.hpp).
template <class F, class Wrt, bool WithValue, float Budget = 1.0f>
class compiled_grad {
  template <class... Args>
  using program_for = typename detail::plan_of<F, Wrt, detail::host_type_t<Args>...>::template budgeted_t<Budget>;

 public:
  /// `site`: the user's compile() line, which run-time errors of the call name.
  compiled_grad(grad_fn<F, Wrt, WithValue> g, options opts, std::source_location site)
      : g_(std::move(g)), st_(opts), site_(site) {}

  /// The joint program (forward and backward, one plan) a call with these argument types runs
  /// (host or device tensors alike): what explain() reports, and what tests plan for the GPU.
  template <class... Args>
  using program_type = typename program_for<Args...>::program;

  template <class... Args>
  auto operator()(const Args&... args) {
    if constexpr ((cuda::is_tensor_v<Args> || ...)) {
      return call_cuda(args...);
    } else {
      if (fusebox::detail::disabled_by_environment() || current_stance() == stance::force_eager) {
        if constexpr (detail::plan_of<F, Wrt, Args...>::all_static) return g_(args...);
        else
          FUSEBOX_THROW(invalid_argument("fusebox::compile(grad(...)): FUSEBOX_DISABLE=1 or stance force_eager asks for the eager "
                                         "gradient, which dyn extents do not have yet (eager gradients take static shapes); "
                                         "unset it, or give every extent in the tensor types"));
      }
      return call_host(args...);
    }
  }

  const options& opts() const noexcept { return st_.opts; }
  unsigned threads() const noexcept { return st_.threads(); }

  /// Bytes of the intermediate arena (forward values the backward reads included): a constant.
  template <class... Args>
  static constexpr std::size_t arena_bytes() {
    return program_for<Args...>::program::arena_bytes;
  }
  template <class... Args>
  static graph_stats stats(const Args&... args) {
    return grad_fn<F, Wrt, WithValue>::stats(args...);
  }
  /// The joint program's kernels for these (host) arguments, as the pipeline runs them: static
  /// kernels, or on dyn extents the run-time specialisation this call selects.
  template <class... Args>
  std::string describe(const Args&... args) {
    static_assert(((!cuda::is_tensor_v<Args>) && ...),
                  "fusebox: describe() of a compiled gradient takes host tensors (the plan is the same on the GPU)");
    using P = detail::plan_of<F, Wrt, Args...>;
    using Prog = typename program_for<Args...>::program;
    const auto loss = detail::capture(g_.function(), args...);
    detail::bound_call<P> b(loss, args...);
    typename Prog::frame_t f;
    const std::tuple<input_leaf<0, typename P::T, shape<>>> no_payloads{};
    cpu::bind_inputs<Prog>(f, no_payloads, b.in);
    return pipeline::describe<backends::cpu_backend, Prog>(st_, f, P::inputs);
  }
  /// Where one call's memory goes: saved activations at this budget and at budget 1, arenas,
  /// workspace, outputs, the peak, and the values recomputed in the backward.
  template <class... Args>
  memory_report memory(const Args&...) const {
    return program_for<Args...>::report(threads());
  }
  /// memory(args...) as text, like torch.cuda.memory_summary().
  template <class... Args>
  std::string memory_summary(const Args&... args) const {
    return memory(args...).table();
  }

 private:
  /// Host tensors: the joint graph through the call pipeline (pipeline/call.hpp) on the CPU, as
  /// compile() runs a model: static kernels for static shapes; with dyn extents the run-time path
  /// (guards, specialisation, the one planner, generated kernels), where the rules' constants that
  /// depend on an extent (mean's 1 / n) are valued from the call's shapes before it runs.
  template <class... Args>
  auto call_host(const Args&... args) {
    using P = detail::plan_of<F, Wrt, Args...>;
    using Prog = typename program_for<Args...>::program;
    if constexpr (!P::all_static) static_assert(static_check::dyn_memory_budget<Budget, Budget == 1.0f>::value);
    const auto loss = detail::capture(g_.function(), args...);
    detail::bound_call<P> b(loss, args...);
    typename Prog::frame_t f;
    const std::tuple<input_leaf<0, typename P::T, shape<>>> no_payloads{};  // the joint graph holds none
    cpu::bind_inputs<Prog>(f, no_payloads, b.in);
    auto outs = pipeline::run<backends::cpu_backend, Prog, typename P::outputs>(
        st_, f, P::inputs, "compiled gradient", [&](const auto& shapes, const auto& o) {
          if constexpr (!P::all_static) {
            b.constants(detail::call_shapes<Prog, std::decay_t<decltype(shapes)>>{shapes});
            P::check_gradient_extents(site_, o, args...);
          }
        });
    if (!outs)
      FUSEBOX_THROW(invalid_argument("fusebox::compile(grad(...)) on dyn extents: the joint graph's kernels failed to compile or "
                                     "the recompile limit is reached (FUSEBOX_LOGS=recompiles,kernels says which)"));
    return detail::shape_result<WithValue>(std::move(*outs));
  }

  /// The CUDA backend: the joint graph through the same pipeline with CUDA kernels and cuBLASLt.
  /// Arguments are device tensors; the lifted numbers (the loss's constants, the rules' constants,
  /// the seed) live in a small device buffer that is uploaded only when they change. A tensor the
  /// loss captures (instead of taking it as an argument) is host memory: refused.
  template <class B = backends::cuda_backend, class... Args>
  auto call_cuda(const Args&... args) {
    static_assert(pipeline::defined_here<B>, "fusebox::grad on device tensors (cuda::tensor) runs on the CUDA back end: "
                                             "#include <fusebox/cuda.hpp> (or <fusebox/fusebox.hpp>)");
    static_assert(((!is_tensor_v<Args>) && ...),
                  "fusebox::grad: a call mixes host tensors and device tensors (cuda::tensor); move every tensor "
                  "argument to the device, or none");
    using P = detail::plan_of<F, Wrt, detail::host_type_t<Args>...>;
    using Prog = typename program_for<Args...>::program;
    using T = typename P::T;
    if constexpr (!P::all_static) static_assert(static_check::dyn_memory_budget<Budget, Budget == 1.0f>::value);
    const auto loss = detail::capture(g_.function(), args...);
    detail::bound_call<P> b(loss, args...);  // the lifted numbers, on the host
    fusebox::detail::bound_inputs<T, P::inputs> in{};
    std::size_t a = 0;
    (([&] {
       if constexpr (cuda::is_tensor_v<Args>) in.views[a] = args.view();
       ++a;
     }()),
     ...);
    for (std::size_t k = P::arguments; k < P::inputs; ++k)
      if (b.in.views[k].data != &b.values[k])
        FUSEBOX_THROW(invalid_argument("fusebox::grad on the CUDA backend: the loss captures a tensor (lifted input " +
                                       std::to_string(k) + ", " + to_string(b.in.views[k].shape) +
                                       ") instead of taking it as an argument; captured tensors are host memory. Fix: pass "
                                       "it as a device tensor argument"));
    if (!numbers_) numbers_ = B::make_numbers(P::inputs * sizeof(T));
    const T* device_numbers = reinterpret_cast<const T*>(B::numbers_address(numbers_));
    for (std::size_t k = P::arguments; k < P::inputs; ++k) in.views[k] = strided<const T>{device_numbers + k, dims{}, {}};

    typename Prog::frame_t f;
    const std::tuple<input_leaf<0, T, shape<>>> no_payloads{};  // the joint graph holds none
    cpu::bind_inputs<Prog>(f, no_payloads, in);
    using Outs = typename device_outputs<typename P::outputs>::type;
    auto outs = pipeline::run<B, Prog, Outs, /*StaticKernels=*/false>(
        st_, f, P::inputs, "compiled gradient (CUDA)", [&](const auto& shapes, const auto& o) {
          // With dyn extents the rules' constants depend on the call's extents (mean's 1 / n).
          if constexpr (!P::all_static) {
            b.constants(detail::call_shapes<Prog, std::decay_t<decltype(shapes)>>{shapes});
            P::check_gradient_extents(site_, o, args...);
          }
          upload_numbers<B, P>(b);
        });
    if (!outs)
      FUSEBOX_THROW(invalid_argument("fusebox::grad on the CUDA backend: the joint graph's CUDA code failed to compile or the "
                                     "recompile limit is reached (FUSEBOX_LOGS=recompiles,kernels says which)"));
    return detail::shape_result<WithValue>(std::move(*outs));
  }

  /// The lifted numbers to the device buffer the frame reads them from, when they changed.
  template <class B, class P>
  void upload_numbers(const detail::bound_call<P>& b) {
    using T = typename P::T;
    std::vector<std::byte> numbers(P::inputs * sizeof(T));
    for (std::size_t k = P::arguments; k < P::inputs; ++k) std::memcpy(numbers.data() + k * sizeof(T), &b.values[k], sizeof(T));
    if (numbers == uploaded_) return;
    B::upload_numbers(numbers_, numbers.data(), numbers.size());
    uploaded_ = std::move(numbers);
  }

  /// Host output tuple -> the same shapes as device tensors.
  template <class Outs>
  struct device_outputs;
  template <class... H>
  struct device_outputs<std::tuple<H...>> {
    using type = std::tuple<cuda::tensor<typename H::value_type, typename H::shape_type>...>;
  };

  grad_fn<F, Wrt, WithValue> g_;
  pipeline::function_state st_;
  std::source_location site_;
  // The lifted numbers on the device, made by the first CUDA call (backends::cuda_backend::make_numbers).
  // Held type-erased: a unique_ptr would compile the device buffer's destructor (the CUDA driver)
  // into every compiled gradient, host-only ones included (issue 22).
  std::shared_ptr<void> numbers_;
  std::vector<std::byte> uploaded_;               // what numbers_ holds
};

}  // namespace autodiff

/// The gradient of loss function f (one element) with respect to its tensor arguments W...
template <class F, std::size_t... W>
auto grad(F f, wrt_t<W...>) {
  return autodiff::grad_fn<F, wrt_t<W...>, false>(std::move(f));
}
template <class F>
auto grad(F f) {
  return grad(std::move(f), wrt<0>);
}

/// The loss and its gradient: `auto [loss, grads] = value_and_grad(f, wrt<...>)(args...)`.
template <class F, std::size_t... W>
auto value_and_grad(F f, wrt_t<W...>) {
  return autodiff::grad_fn<F, wrt_t<W...>, true>(std::move(f));
}
template <class F>
auto value_and_grad(F f) {
  return value_and_grad(std::move(f), wrt<0>);
}

/// Compiles a gradient function: one program for the loss and its gradients.
/// An activation memory budget below 1 must be given in the template form (it decides the program).
template <class F, class Wrt, bool WithValue>
auto compile(autodiff::grad_fn<F, Wrt, WithValue> g, options opts = {},
             std::source_location loc = std::source_location::current()) {
  if (opts.activation_memory_budget != 1.0f) autodiff::check_memory_budget(opts.activation_memory_budget, loc);
  return autodiff::compiled_grad<F, Wrt, WithValue>(std::move(g), opts, loc);
}
template <options Static, class F, class Wrt, bool WithValue>
auto compile(autodiff::grad_fn<F, Wrt, WithValue> g, std::source_location loc = std::source_location::current()) {
  static_assert(autodiff::valid_memory_budget(Static.activation_memory_budget),
                "fusebox::compile<options{.activation_memory_budget = b}>(grad(...)): b must be a number in [0, 1] "
                "(1: keep every value the backward reads, 0: recompute every elementwise and reduction value)");
  return autodiff::compiled_grad<F, Wrt, WithValue, (autodiff::valid_memory_budget(Static.activation_memory_budget)
                                                          ? Static.activation_memory_budget
                                                          : 1.0f)>(std::move(g), Static, loc);
}

}  // namespace fusebox
