// graph_break.hpp: the two ways a model leaves the compiled graph.
//   opaque(fn, x)  runs an arbitrary user function on a concrete tensor. Inside a captured model it
//                  is a node of its own (the kernels before it and after it form separate segments).
//   item(x)        reads a value on the host. Inside a captured model the part of the model that
//                  produces x is compiled and run as its own segment on the spot, and capture goes on.
// Under fullgraph both are errors: a build error when fullgraph is a template argument of compile,
// a fusebox::graph_break exception naming the line otherwise.
// FUSEBOX_LOGS=graph_breaks logs each break site, with its source line, once per process.
// Depends on: ops/capture.hpp, backend/cpu/report.hpp, runtime/logs.hpp, core/lock.hpp.
#pragma once

#include <functional>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>

#include "fusebox/backend/cpu/report.hpp"
#include "fusebox/core/errors.hpp"
#include "fusebox/core/lock.hpp"
#include "fusebox/ops/capture.hpp"
#include "fusebox/runtime/logs.hpp"

namespace fusebox {

namespace static_check {
template <class E, bool Ok>
struct graph_break_under_fullgraph {
  static_assert(Ok, "fusebox: graph break under fullgraph: opaque() or item() was called on a captured value "
                    "while compiling with options{.fullgraph = true} (the line is in 'required from here' below). "
                    "Fix: express the code with fusebox ops, or compile without fullgraph");
  static constexpr bool value = Ok;
};
}  // namespace static_check

namespace detail {
/// The break sites already logged (FUSEBOX_LOGS=graph_breaks logs each site once per process, not
/// once per call; fusebox::reset() forgets them).
struct logged_breaks {
  ::fusebox::detail::state_mutex mutex;
  std::set<std::string, std::less<>> sites;
};
inline logged_breaks& breaks_logged() {
  static logged_breaks* b = new logged_breaks;  // never destroyed, like the log state
  return *b;
}
inline void forget_logged_breaks() {
  auto& b = breaks_logged();
  ::fusebox::detail::state_lock lock(b.mutex);
  b.sites.clear();
}

inline void log_break(const char* what, const std::source_location& loc, bool fullgraph) {
  if (!jit::enabled(jit::log_category::graph_breaks)) return;
  std::string site = std::string(what) + " at " + where(loc);
  {
    auto& b = breaks_logged();
    ::fusebox::detail::state_lock lock(b.mutex);
    if (!b.sites.insert(site).second) return;
  }
  jit::log(jit::log_category::graph_breaks,
           "graph break: " + site +
               (fullgraph ? ": an error under fullgraph"
                          : std::string(std::string_view(what) == "item()"
                                            ? ": the part of the model before it runs as its own segment to produce "
                                              "the value read on the host"
                                            : ": a user function on a concrete tensor; the kernels before and after "
                                              "it are separate segments") +
                                " (compile with fullgraph = true to make it an error)"));
}

inline void note_break(const char* what, const std::source_location& loc, std::function<std::string()> report) {
  capture_context* c = current_capture();
  if (!c) return;
  log_break(what, loc, c->fullgraph);
  if (c->fullgraph) FUSEBOX_THROW(graph_break(std::string(what) + " under fullgraph", loc));
  if (c->breaks) c->breaks->push_back({what, loc, std::move(report)});
}
}  // namespace detail

/// Runs fn on x as a tensor. fn takes `const tensor<T, S>&` and returns a tensor.
template <class Fn, array_operand X>
auto opaque(Fn fn, const X& x, std::source_location loc = std::source_location::current()) {
  if constexpr (is_tensor_v<X>) {
    return fn(x);
  } else {
    static_assert(static_check::graph_break_under_fullgraph<X, !X::fullgraph>::value);
    using T = typename X::value_type;
    using Out = std::remove_cvref_t<std::invoke_result_t<Fn&, const tensor<T, shape_of_t<X>>&>>;
    static_assert(is_tensor_v<Out>, "fusebox: opaque(fn, x): fn must return a fusebox::tensor");
    detail::note_break("opaque()", loc, nullptr);
    return opaque_node<Fn, X, Out>{{}, std::move(fn), x, loc};
  }
}

/// The value of a one-element tensor or expression, on the host.
template <array_operand X>
auto item(const X& x, std::source_location loc = std::source_location::current()) {
  if constexpr (is_tensor_v<X>) {
    if (x.size() != 1)
      FUSEBOX_THROW(shape_error("item(): needs a tensor of one element, got " + to_string(x.extents()), loc));
    return x.flat(0);
  } else {
    static_assert(static_check::graph_break_under_fullgraph<X, !X::fullgraph>::value);
    static_assert(X::desc.shape.size() == 1, "fusebox: item(x) needs x of one element (reduce it first)");
    detail::capture_context* c = detail::current_capture();
    detail::note_break("item()", loc, [] {
      return cpu::describe<cpu::program<typename X::value_type, X>>(default_threads());
    });
    const auto t = evaluate(x, c && c->rt ? *c->rt : detail::eager_runtime());
    return t.flat(0);
  }
}

}  // namespace fusebox
